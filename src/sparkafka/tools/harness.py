"""What `sparkafka demo` and `sparkafka verify` share: a cluster (the embedded broker or the user's),
background readers of the output topic at both isolation levels, and the exactly-once verdict."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from sparkafka.connector.api import error_reason, quiet_librdkafka_logger
from sparkafka.errors import KafkaUnavailableError, SparkafkaError

if TYPE_CHECKING:
    from sparkafka.broker.runner import BrokerProcess

# The proofs restart the broker on purpose and report trouble themselves (a reader's error, a
# record not delivered, output that never arrived): their clients' retries stay off the screen,
# and the last connection failure is kept for those reports.
CLIENT_LOGGER, CLIENT_FAILURES = quiet_librdkafka_logger("sparkafka.tools.harness.librdkafka")


def client_config(bootstrap_servers: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A harness client's configuration: the cluster, the quiet logger, ``settings`` on top."""
    return {"bootstrap.servers": bootstrap_servers, "logger": CLIENT_LOGGER, **(settings or {})}


def last_connection_failure() -> str:
    """What the harness clients last failed to connect with, as a clause for an error message."""
    reason = CLIENT_FAILURES.last
    return f"; the last connection failure of its Kafka clients: {reason}" if reason else ""


class Cluster:
    """The embedded broker in a work directory (default), or an existing cluster; topic names get a
    unique prefix on an existing cluster so runs never clash."""

    def __init__(
        self, work_dir: Path, bootstrap_servers: str | None = None, *, broker_args: list[str] | None = None
    ):
        self.work_dir = work_dir
        self.external = bootstrap_servers
        self.broker_args = broker_args or []
        self.broker: BrokerProcess | None = None
        self.prefix = f"sparkafka-demo-{uuid.uuid4().hex[:8]}-" if bootstrap_servers else ""

    @property
    def embedded(self) -> bool:
        return self.external is None

    @property
    def bootstrap_servers(self) -> str:
        if self.external is not None:
            return self.external
        assert self.broker is not None
        return self.broker.bootstrap_servers

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "broker-data"

    def start(self) -> Cluster:
        if self.embedded:
            from sparkafka.broker.runner import BrokerProcess

            self.broker = BrokerProcess(
                self.data_dir, extra_args=["--group-initial-rebalance-delay-ms", "0", *self.broker_args]
            ).start()
        else:
            self.check_reachable()
        return self

    def restart_broker(self, *, kill: bool) -> None:
        """SIGKILL (or SIGTERM) the embedded broker and start it again on the same port and data."""
        assert self.broker is not None
        if kill:
            self.broker.kill()
        else:
            self.broker.terminate()
        self.broker.start()

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.terminate()
            self.broker = None

    def check_reachable(self, timeout_s: float = 15) -> None:
        admin = AdminClient(client_config(self.bootstrap_servers))
        try:
            admin.list_topics(timeout=timeout_s)
        except KafkaException as error:
            raise KafkaUnavailableError(
                f"Kafka at {self.bootstrap_servers} did not answer within {timeout_s:.0f} s "
                f"({error_reason(error)}); check --bootstrap-servers and that the brokers are reachable"
            ) from None

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def create_topics(self, names: list[str], partitions: int) -> None:
        admin = AdminClient(client_config(self.bootstrap_servers))
        futures = admin.create_topics([NewTopic(n, partitions, -1) for n in names], operation_timeout=30)
        for future in futures.values():
            future.result(60)

    def producer(self) -> Producer:
        return Producer(client_config(self.bootstrap_servers, {"enable.idempotence": True, "linger.ms": 5}))


@dataclass(frozen=True)
class Seen:
    """One record as a reader saw it (seed 001's ConsumerRecord line)."""

    arrived: float
    partition: int
    offset: int
    create_time_ms: int
    key: bytes | None
    value: bytes


def latest_offsets(
    bootstrap_servers: str, topic: str, partitions: int, isolation_level: str
) -> dict[int, int]:
    """Each partition's latest offset for a reader of ``isolation_level``: the high watermark for
    read_uncommitted, the last stable offset (the first offset of the oldest open transaction) for
    read_committed."""
    admin = AdminClient(client_config(bootstrap_servers))
    committed = isolation_level == "read_committed"
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    answers = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
        isolation_level=level,
        request_timeout=30,
    )
    return {tp.partition: answer.result().offset for tp, answer in answers.items()}


@dataclass
class TopicReader:
    """Reads every partition of a topic from the beginning in a background thread.

    A count of records is no proof that no more will come: a duplicate can arrive after it. Once
    the writer has stopped, :meth:`read_to_latest` reads on until the reader's position reaches the
    broker's latest offsets, so everything the topic holds for this isolation level has been seen."""

    bootstrap_servers: str
    topic: str
    partitions: int
    isolation_level: str
    records: list[Seen] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _targets: dict[int, int] | None = None
    _reached: threading.Event = field(default_factory=threading.Event)

    def start(self) -> TopicReader:
        self._thread = threading.Thread(target=self._run, name=f"reader-{self.isolation_level}", daemon=True)
        self._thread.start()
        return self

    def read_to_latest(self, timeout_s: float = 60) -> None:
        """Until this reader has read up to the latest offsets the broker answers now (see
        :func:`latest_offsets`); raises :class:`SparkafkaError` naming the partitions it could not
        reach within ``timeout_s``."""
        targets = latest_offsets(self.bootstrap_servers, self.topic, self.partitions, self.isolation_level)
        self._reached.clear()
        self._targets = targets
        if not self._reached.wait(timeout_s) and self.error is None:
            raise SparkafkaError(
                f"the {self.isolation_level} reader of {self.topic} did not reach the latest offsets "
                f"{targets} within {timeout_s} s" + last_connection_failure()
            )

    def _check_reached(self, consumer: Consumer) -> None:
        targets = self._targets
        if targets is None or self._reached.is_set():
            return
        positions = consumer.position([TopicPartition(self.topic, p) for p in targets])
        # A partition nothing was read from has no position yet (a negative logical offset): it has
        # reached its latest offset only when that is 0.
        if all(max(tp.offset, 0) >= targets[tp.partition] for tp in positions):
            self._reached.set()

    def _run(self) -> None:
        consumer = Consumer(
            client_config(
                self.bootstrap_servers,
                {
                    "group.id": f"sparkafka-reader-{self.isolation_level}-{uuid.uuid4().hex[:6]}",
                    "isolation.level": self.isolation_level,
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                },
            )
        )
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                self._check_reached(consumer)
                if message is None:
                    continue
                failure = message.error()
                if failure is not None:
                    if failure.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        continue  # the broker is being restarted on purpose: keep trying
                    raise KafkaException(failure)
                self.records.append(
                    Seen(
                        time.time(),
                        message.partition() or 0,
                        message.offset() or 0,
                        message.timestamp()[1],
                        message.key(),
                        message.value() or b"",
                    )
                )
        except BaseException as error:  # reported by the caller, never lost in the thread
            self.error = error
            self._reached.set()  # nobody waits for a reader that has failed
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def values(self) -> list[bytes]:
        return [r.value for r in self.records]


@contextlib.contextmanager
def readers(cluster: Cluster, topic: str, partitions: int) -> Iterator[tuple[TopicReader, TopicReader]]:
    uncommitted = TopicReader(cluster.bootstrap_servers, topic, partitions, "read_uncommitted").start()
    committed = TopicReader(cluster.bootstrap_servers, topic, partitions, "read_committed").start()
    try:
        yield uncommitted, committed
    finally:
        uncommitted.stop()
        committed.stop()


@dataclass(frozen=True)
class Verdict:
    inputs: int
    committed: int
    duplicates: int
    lost: int
    reordered: int
    uncommitted_duplicates: int

    @property
    def exactly_once(self) -> bool:
        return (
            self.committed == self.inputs and self.duplicates == 0 and self.lost == 0 and self.reordered == 0
        )

    def line(self) -> str:
        state = "verified" if self.exactly_once else "VIOLATED"
        return (
            f"exactly-once {state}: in={self.inputs} out(read_committed)={self.committed} "
            f"duplicates={self.duplicates} lost={self.lost} "
            f"(read_uncommitted saw {self.uncommitted_duplicates} duplicates)"
        )


def judge(
    expected: list[bytes], committed: list[bytes], uncommitted: list[bytes], reordered: int = 0
) -> Verdict:
    """Compare output multisets with the expected one: every expected value exactly once."""
    want = Counter(expected)
    got = Counter(committed)
    duplicates = sum(max(got[v] - want[v], 0) for v in got)
    lost = sum(max(want[v] - got[v], 0) for v in want)
    uncommitted_counts = Counter(uncommitted)
    uncommitted_duplicates = sum(max(uncommitted_counts[v] - want[v], 0) for v in uncommitted_counts)
    return Verdict(len(expected), len(committed), duplicates, lost, reordered, uncommitted_duplicates)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
