"""Crash safety of the broker: what was acknowledged survives SIGKILL, torn tails are cut, SIGTERM is clean.

Every test runs its own broker process (`fresh_broker`) so it can kill and restart it on the same port
and data directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from sparkafka.broker.records import iter_batches
from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, producer, read_all, transactional_producer, values
from tests.integration.raw_kafka import (
    RawConnection,
    idempotent_batch,
    init_idempotent_producer,
    produce_batch,
)

PARTITIONS = 4


def _segments(data_dir: Path, topic: str, partition: int) -> list[Path]:
    return sorted((data_dir / f"{topic}-{partition}").glob("*.log"))


def _positions(messages: list) -> list[tuple[int, int, bytes]]:
    return sorted((m.partition(), m.offset(), m.value()) for m in messages)


def _send_all(sender: Producer, topic: str, items: list[tuple[int, bytes | None, bytes]]) -> list[int]:
    """Produce (partition, key, value) items; assert every delivery succeeded; return their offsets."""
    offsets: dict[int, int] = {}
    errors: list[object] = []

    def on_delivery(index: int):  # type: ignore[no-untyped-def]
        def report(error, message) -> None:  # type: ignore[no-untyped-def]
            if error is not None:
                errors.append(error)
            else:
                offsets[index] = message.offset()

        return report

    for index, (partition, key, value) in enumerate(items):
        sender.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery(index))
        if index % 100 == 0:
            sender.poll(0)
    assert sender.flush(30) == 0
    assert not errors, errors[:3]
    return [offsets[i] for i in range(len(items))]


def test_acknowledged_idempotent_produces_survive_sigkill(
    fresh_broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name, partitions=PARTITIONS)
    sender = producer(fresh_broker.bootstrap_servers, acks="all", linger_ms=2, batch_num_messages=50)
    acknowledged: list[tuple[int, int, bytes]] = []

    def on_delivery(error, message) -> None:  # type: ignore[no-untyped-def]
        assert error is None, error
        acknowledged.append((message.partition(), message.offset(), message.value()))

    for i in range(2000):
        sender.produce(topic_name, value=f"v{i}".encode(), partition=i % PARTITIONS, on_delivery=on_delivery)
        if i % 100 == 0:
            sender.poll(0)
    assert sender.flush(30) == 0
    assert len(acknowledged) == 2000

    fresh_broker.kill()
    fresh_broker.start()

    stored = read_all(
        fresh_broker.bootstrap_servers, topic_name, isolation="read_uncommitted", expect=2000, partitions=4
    )
    assert _positions(stored) == sorted(acknowledged)
    for partition in range(PARTITIONS):
        # In the order sent, at the offsets acknowledged, with no gap and no duplicate.
        in_partition = [(o, v) for p, o, v in sorted(acknowledged) if p == partition]
        assert [o for o, _ in in_partition] == list(range(500))
        assert [v for _, v in in_partition] == [f"v{i}".encode() for i in range(partition, 2000, PARTITIONS)]

    # The restarted broker appends after the recovered end, and the same idempotent producer id continues.
    sender.produce(topic_name, value=b"after-restart", partition=0, on_delivery=on_delivery)
    assert sender.flush(30) == 0
    assert acknowledged[-1] == (0, 500, b"after-restart")


def test_committed_group_offsets_survive_sigkill(fresh_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name, partitions=PARTITIONS)
    group = f"g-{topic_name}"
    committed = [TopicPartition(topic_name, p, 10 * (p + 1)) for p in range(PARTITIONS)]
    consumer = Consumer(
        {"bootstrap.servers": fresh_broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(offsets=committed, asynchronous=False)
    consumer.close()

    fresh_broker.kill()
    fresh_broker.start()

    reader = Consumer(
        {"bootstrap.servers": fresh_broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False}
    )
    found = reader.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)
    reader.close()
    assert [(tp.partition, tp.offset) for tp in found] == [(tp.partition, tp.offset) for tp in committed]


def test_a_consumer_group_keeps_its_members_and_assignment_across_a_broker_sigkill(
    fresh_broker: BrokerProcess, topic_name: str
) -> None:
    """As with Kafka, whose coordinator reloads a group's members from __consumer_offsets: after the
    restart the member heartbeats on under the same member id and generation, with no rebalance."""
    create_topic(fresh_broker.bootstrap_servers, topic_name, partitions=PARTITIONS)
    rebalances: list[tuple[str, list[int]]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": fresh_broker.bootstrap_servers,
            "group.id": f"g-{topic_name}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": 300,
        }
    )
    consumer.subscribe(
        [topic_name],
        on_assign=lambda _, parts: rebalances.append(("assign", sorted(p.partition for p in parts))),
        on_revoke=lambda _, parts: rebalances.append(("revoke", sorted(p.partition for p in parts))),
    )
    try:
        deadline = time.monotonic() + 30
        while not rebalances and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert rebalances == [("assign", list(range(PARTITIONS)))]
        member_id = consumer.memberid()

        fresh_broker.kill()
        fresh_broker.start()
        sender = producer(fresh_broker.bootstrap_servers)
        sender.produce(topic_name, value=b"after-restart", partition=1)
        assert sender.flush(30) == 0
        received = []
        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                received.append(message.value())
        # Heartbeats go on for a while after the restart: every one of them is accepted.
        settle_until = time.monotonic() + 3
        while time.monotonic() < settle_until:
            consumer.poll(0.2)
        assert received == [b"after-restart"]
        assert rebalances == [("assign", list(range(PARTITIONS)))]
        assert consumer.memberid() == member_id
    finally:
        consumer.close()


@pytest.mark.parametrize("tail", ["garbage", "half-batch"])
def test_torn_tail_is_truncated_on_restart(fresh_broker: BrokerProcess, topic_name: str, tail: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name)
    sender = producer(fresh_broker.bootstrap_servers, acks="all")
    for start in range(0, 300, 100):  # several batches, so "half a batch" copies only the last one
        _send_all(
            sender, topic_name, [(0, f"k{i}".encode(), f"v{i}".encode()) for i in range(start, start + 100)]
        )
    fresh_broker.kill()

    segment = _segments(fresh_broker.data_dir, topic_name, 0)[-1]
    intact = segment.read_bytes()
    last_position, last_header = list(iter_batches(intact))[-1]
    if tail == "garbage":
        torn = os.urandom(37)
    else:
        # The first half of a batch that would follow: a write cut off by the crash.
        follow_up = bytearray(intact[last_position : last_position + last_header.size])
        follow_up[0:8] = (last_header.next_offset).to_bytes(8, "big")
        torn = bytes(follow_up[: len(follow_up) // 2])
    with open(segment, "ab") as handle:
        handle.write(torn)

    fresh_broker.start()
    assert segment.read_bytes() == intact  # the torn tail was cut off, nothing before it
    assert "truncating" in fresh_broker.log_path.read_text()
    assert values(read_all(fresh_broker.bootstrap_servers, topic_name, expect=300)) == [
        f"v{i}".encode() for i in range(300)
    ]
    # Appends continue right after the last complete batch.
    sender = producer(fresh_broker.bootstrap_servers, acks="all")
    assert _send_all(sender, topic_name, [(0, b"k", b"after")]) == [300]


def test_sigterm_shuts_down_cleanly_and_restarts_without_recovery(tmp_path: Path, topic_name: str) -> None:
    # Small segments so that several closed segments exist; a clean restart trusts their index files.
    broker = BrokerProcess(tmp_path / "data", extra_args=["--group-initial-rebalance-delay-ms", "0"])
    broker.start()
    try:
        create_topic(
            broker.bootstrap_servers, topic_name, partitions=2, config={"internal.segment.bytes": "65536"}
        )
        # Batches must fit a segment (else RECORD_LIST_TOO_LARGE, as Kafka answers).
        sender = producer(broker.bootstrap_servers, acks="all", batch_size=16384)
        _send_all(sender, topic_name, [(i % 2, None, b"x" * 100) for i in range(4000)])

        process = broker.process
        assert process is not None
        broker.terminate()
        assert process.returncode == 0
        for partition in range(2):
            directory = broker.data_dir / f"{topic_name}-{partition}"
            assert (directory / ".clean_shutdown").exists()
            segments = _segments(broker.data_dir, topic_name, partition)
            assert len(segments) > 3
            assert all(
                s.with_suffix(".index").exists() and s.with_suffix(".timeindex").exists() for s in segments
            )
        assert "Traceback" not in broker.log_path.read_text()

        started = time.monotonic()
        broker.start()
        restart_s = time.monotonic() - started
        assert restart_s < 15, f"a clean restart took {restart_s:.1f}s"
        assert not (broker.data_dir / f"{topic_name}-0" / ".clean_shutdown").exists()  # consumed on open
        assert "truncating" not in broker.log_path.read_text()
        assert len(read_all(broker.bootstrap_servers, topic_name, expect=4000, partitions=2)) == 4000
    finally:
        broker.terminate()


def test_transaction_outcomes_survive_sigkill(fresh_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name, partitions=2)
    sender = transactional_producer(fresh_broker.bootstrap_servers, f"tx-{topic_name}")
    sender.init_transactions(30)
    sender.begin_transaction()
    for i in range(10):
        sender.produce(topic_name, value=f"aborted-{i}".encode(), partition=i % 2)
    sender.flush(10)
    sender.abort_transaction(30)
    sender.begin_transaction()
    for i in range(10):
        sender.produce(topic_name, value=f"committed-{i}".encode(), partition=i % 2)
    sender.commit_transaction(30)
    fresh_broker.kill()  # right after the EndTxn(commit) response
    fresh_broker.start()

    bootstrap = fresh_broker.bootstrap_servers
    committed = read_all(bootstrap, topic_name, expect=10, partitions=2)
    assert sorted(values(committed)) == sorted(f"committed-{i}".encode() for i in range(10))
    everything = read_all(bootstrap, topic_name, isolation="read_uncommitted", expect=20, partitions=2)
    assert sorted(values(everything)) == sorted(
        [f"aborted-{i}".encode() for i in range(10)] + [f"committed-{i}".encode() for i in range(10)]
    )
    # The last stable offset reached the end on both partitions: no transaction was left open.
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "g", "isolation.level": "read_committed"}
    )
    for partition in range(2):
        # 5 aborted records + ABORT marker + 5 committed records + COMMIT marker.
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, partition), timeout=10) == (0, 12)
    consumer.close()

    # The transactional id carries on after the restart.
    successor = transactional_producer(bootstrap, f"tx-{topic_name}")
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic_name, value=b"next", partition=0)
    successor.commit_transaction(30)
    assert b"next" in values(read_all(bootstrap, topic_name, expect=11, partitions=2))


def test_duplicate_idempotent_batch_is_written_once(fresh_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name)
    with RawConnection(fresh_broker.port) as connection:
        producer_id, epoch = init_idempotent_producer(connection)
        first = idempotent_batch([b"a", b"b", b"c"], producer_id=producer_id, epoch=epoch, base_sequence=0)
        assert produce_batch(connection, topic_name, 0, first) == (0, 0)
        assert produce_batch(connection, topic_name, 0, first) == (0, 0)  # a retry: same base offset
        second = idempotent_batch([b"d"], producer_id=producer_id, epoch=epoch, base_sequence=3)
        assert produce_batch(connection, topic_name, 0, second) == (0, 3)

    # The producer state is rebuilt from the log: a retry after a crash is still recognised.
    fresh_broker.kill()
    fresh_broker.start()
    with RawConnection(fresh_broker.port) as connection:
        assert produce_batch(connection, topic_name, 0, first) == (0, 0)
        assert produce_batch(connection, topic_name, 0, second) == (0, 3)
        # A sequence gap is still refused: OUT_OF_ORDER_SEQUENCE_NUMBER.
        gap = idempotent_batch([b"e"], producer_id=producer_id, epoch=epoch, base_sequence=9)
        assert produce_batch(connection, topic_name, 0, gap)[0] == 45

    assert values(read_all(fresh_broker.bootstrap_servers, topic_name, expect=4)) == [b"a", b"b", b"c", b"d"]
    stored = b"".join(path.read_bytes() for path in _segments(fresh_broker.data_dir, topic_name, 0))
    assert [(h.base_offset, h.record_count) for _, h in iter_batches(stored)] == [(0, 3), (3, 1)]


def _flip_byte(segment: Path, batch_index: int) -> tuple[int, int, int]:
    """Flip the last byte (a record's, covered by the CRC) of a segment's `batch_index`-th batch;
    return the batch's (base offset, last offset, records after it in the segment)."""
    data = bytearray(segment.read_bytes())
    batches = list(iter_batches(bytes(data)))
    position, header = batches[batch_index]
    data[position + header.size - 1] ^= 0x40
    segment.write_bytes(bytes(data))
    return header.base_offset, header.last_offset, batches[-1][1].last_offset


def _consume_until_stuck(bootstrap: str, topic: str, expect: dict[int, int]) -> tuple[dict[int, list], dict]:
    """Read both partitions from offset 0 until each has `expect[partition]` records or reported an
    error; return (offsets read per partition, first error per partition)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "check.crcs": True,
            "fetch.error.backoff.ms": 50,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in expect])
    read: dict[int, list] = {p: [] for p in expect}
    errors: dict[int, object] = {}
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and any(
            len(read[p]) < expect[p] and p not in errors for p in expect
        ):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                errors.setdefault(message.partition(), message.error())
            else:
                read[message.partition()].append(message.offset())
    finally:
        consumer.close()
    return read, errors


@pytest.mark.parametrize("damaged", ["older", "active"])
@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
def test_a_damaged_batch_is_never_served_and_never_lost_silently(
    fresh_broker: BrokerProcess, topic_name: str, stop: str, damaged: str
) -> None:
    """One flipped byte in a partition's segment: the other partition is served as usual; the damaged
    one is served up to the damaged batch, then CORRUPT_MESSAGE (librdkafka: "Broker: Invalid
    message"). Only a crash recovery rescanning the active segment cuts it, with an ERROR naming
    what is lost."""
    create_topic(
        fresh_broker.bootstrap_servers, topic_name, partitions=2, config={"internal.segment.bytes": "4096"}
    )
    sender = producer(fresh_broker.bootstrap_servers, acks="all")
    for start in range(0, 300, 10):  # batches of 10 records, 3 or so to a segment
        _send_all(
            sender,
            topic_name,
            [(p, None, b"v%03d" % i * 25) for i in range(start, start + 10) for p in (0, 1)],
        )
    if stop == "sigkill":
        fresh_broker.kill()
    else:
        fresh_broker.terminate()
    segments = _segments(fresh_broker.data_dir, topic_name, 0)
    assert len(segments) > 3
    first, last, segment_end = _flip_byte(segments[1] if damaged == "older" else segments[-1], 0)
    fresh_broker.start()

    rescanned = stop == "sigkill" and damaged == "active"
    expect = {0: first if rescanned else 300, 1: 300}
    read, errors = _consume_until_stuck(fresh_broker.bootstrap_servers, topic_name, expect)
    assert read[1] == list(range(300)) and 1 not in errors
    log = fresh_broker.log_path.read_text()
    if rescanned:
        # Rescanned: cut from the damaged batch on, which the ERROR accounts for.
        lost = segment_end - first + 1
        assert f"{topic_name}-0: recovery found damaged data" in log
        assert f"loses {lost} records at offsets {first} to {segment_end}" in log
        assert read[0] == list(range(first)) and 0 not in errors
        # The producer's sequences are cut too: as on Kafka, only a new producer may go on.
        after = producer(fresh_broker.bootstrap_servers, acks="all")
        assert _send_all(after, topic_name, [(0, None, b"after")]) == [first]
    else:
        assert read[0] == list(range(first))
        assert errors[0].code() == KafkaError.INVALID_MSG, errors[0]
        assert f"{topic_name}-0: the batch at offsets {first} to {last}" in log
        assert "truncating" not in log
        # Appends go on after it, at new offsets.
        assert _send_all(sender, topic_name, [(0, None, b"after")]) == [300]
