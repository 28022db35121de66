"""The consume-transform-produce loop a user writes by hand with confluent-kafka: the baseline that
sparkafka, Quix Streams and PyFlink are compared with.

exactly-once: one transactional producer; every ``--commit-interval-ms`` the consumer's positions go
into the open transaction (``send_offsets_to_transaction``) and the transaction commits, so outputs
and input offsets become visible together. at-least-once: no transactions; every interval the
producer is flushed, then the positions are committed to the group.

The count workload keeps its per-key counts in a dict and sends one update per input record. The dict
is not rebuilt after a restart (a real application would restore it from a changelog topic): the
benchmark never restarts a runner.

The consumer reads with the prefetch settings of sparkafka's source (CONSUMER_PREFETCH): with
librdkafka's defaults a reader faster than the network waits out a one-second fetch pause each time
its 100,000-record queue fills, which would hold the loop's numbers back for a reason a user tunes
away.

Stdlib and confluent-kafka only; stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from runner_args import consumer_group, runner_parser

BATCH = 10_000
POLL_TIMEOUT_S = 0.1
# As sparkafka's source reads (sparkafka.connector.source.options.executor_consumer_config).
CONSUMER_PREFETCH = {"queued.min.messages": 20_000, "fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 50}


class Stopper:
    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopping = True


def map_transform() -> Callable[[Message], tuple[bytes | None, bytes]]:
    def transform(message: Message) -> tuple[bytes | None, bytes]:
        return message.key(), b"EVENT(" + (message.value() or b"") + b")"

    return transform


def count_transform() -> Callable[[Message], tuple[bytes | None, bytes]]:
    counts: dict[bytes | None, int] = {}

    def transform(message: Message) -> tuple[bytes | None, bytes]:
        key = message.key()
        count = counts.get(key, 0) + 1
        counts[key] = count
        return key, str(count).encode()

    return transform


def produce(producer: Producer, topic: str, key: bytes | None, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)


def positions(consumer: Consumer) -> list[TopicPartition]:
    """The next offsets to read of every assigned partition that has been read from."""
    return [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]


def main() -> int:
    args = runner_parser(__doc__.split("\n\n")[0]).parse_args()
    exactly_once = args.guarantee == "exactly-once"
    group = consumer_group("handwritten", args.output_topic)
    interval_s = args.commit_interval_ms / 1000
    transform = map_transform() if args.workload == "map" else count_transform()
    stopper = Stopper()

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **CONSUMER_PREFETCH,
        }
    )
    producer_config: dict[str, object] = {"bootstrap.servers": args.bootstrap_servers, "linger.ms": 5}
    if exactly_once:
        producer_config["transactional.id"] = f"{group}-producer"
    else:
        producer_config["enable.idempotence"] = True
    producer = Producer(producer_config)
    pending = False  # records produced since the last commit

    def commit() -> None:
        nonlocal pending
        if exactly_once:
            offsets = positions(consumer)
            if offsets:
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            producer.commit_transaction()
            producer.begin_transaction()
        else:
            producer.flush()
            offsets = positions(consumer)
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=False)
        pending = False

    def on_revoke(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        # Commit what was read from the partitions before another member takes them over.
        if pending:
            commit()

    if exactly_once:
        producer.init_transactions()
        producer.begin_transaction()
    consumer.subscribe([args.input_topic], on_revoke=on_revoke)
    last_commit = time.monotonic()
    try:
        while not stopper.stopping:
            # poll() returns with the first record; consume(n, timeout) would wait for n records or the
            # whole timeout. Then take what is already queued.
            first = consumer.poll(POLL_TIMEOUT_S)
            for message in [first, *consumer.consume(BATCH, 0)] if first is not None else []:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                key, value = transform(message)
                produce(producer, args.output_topic, key, value)
                pending = True
            producer.poll(0)
            if time.monotonic() - last_commit >= interval_s:
                if pending:
                    commit()
                last_commit = time.monotonic()
        if pending:
            commit()
        if exactly_once:
            producer.abort_transaction()  # the empty transaction begun after the last commit
    finally:
        consumer.close()
        producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
