"""Retention (cleanup.policy=delete) and compaction (cleanup.policy=compact) through a running broker,
observed with real clients: ListOffsets earliest, OFFSET_OUT_OF_RANGE handling, what a reader sees."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, producer, read_all, transactional_producer
from tests.integration.raw_kafka import RawConnection, produce_batch


@pytest.fixture(scope="module")
def cleaning_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("retention") / "data"
    args = ["--group-initial-rebalance-delay-ms", "0", "--retention-check-interval-ms", "200"]
    args += ["--log-cleaner-backoff-ms", "200"]
    with BrokerProcess(data_dir, extra_args=args) as process:
        yield process


def _deliver(sender: Producer, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    errors: list[KafkaError] = []
    for key, value in records:
        sender.produce(topic, key=key, value=value, on_delivery=lambda e, _m: e and errors.append(e))
    assert sender.flush(30) == 0
    assert not errors, errors


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def _wait_for(condition, timeout_s: float = 15.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _read_to_end(bootstrap: str, topic: str, isolation: str) -> list[tuple[str, bytes | None, int]]:
    """(key, value, offset) of every record from the start to the end of partition 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[tuple[str, bytes | None, int]] = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return found
            found.append((message.key().decode(), message.value(), message.offset()))
    finally:
        consumer.close()
    raise AssertionError(f"did not reach the end of {topic}-0 in 10 s")


def _consume_from_zero(bootstrap: str, topic: str, reset: str) -> list[object]:
    """What a consumer assigned at offset 0 sees with auto.offset.reset=`reset`: (offset, value) pairs up to
    the end of the partition, or the error it stopped at."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reset-{reset}-{time.monotonic_ns()}",
            "auto.offset.reset": reset,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[object] = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    seen.append(message.error())
                return seen
            seen.append((message.offset(), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"auto.offset.reset={reset}: neither the end of {topic}-0 nor an error in 10 s")


def _segment_bases(broker: BrokerProcess, topic: str) -> list[int]:
    return sorted(int(path.stem) for path in (broker.data_dir / f"{topic}-0").glob("*.log"))


def test_size_retention_deletes_old_segments_and_moves_the_log_start(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = cleaning_broker.bootstrap_servers
    config = {"retention.ms": "-1", "retention.bytes": "2048", "internal.segment.bytes": "1024"}
    create_topic(bootstrap, topic_name, config=config)
    sender = producer(bootstrap, acks="all", linger_ms=0, batch_num_messages=5)
    for start in range(0, 100, 5):
        _deliver(sender, topic_name, [(None, f"v{i:03d}".encode() * 10) for i in range(start, start + 5)])

    directory = cleaning_broker.data_dir / f"{topic_name}-0"

    def retention_done() -> bool:
        # Kafka's size rule has nothing more to delete once dropping the oldest segment would leave
        # less than retention.bytes (checks that ran while records arrived deleted some already).
        sizes = [path.stat().st_size for path in sorted(directory.glob("*.log"))]
        return sum(sizes) - sizes[0] < 2048

    _wait_for(retention_done, what="retention to delete the oldest segments")
    low, high = _watermarks(bootstrap, topic_name)
    assert high == 100
    assert 0 < low == _segment_bases(cleaning_broker, topic_name)[0] < high  # earliest: first offset stored
    assert "retention deletes segment" in cleaning_broker.log_path.read_text()

    # Offset 0 is out of range now; each auto.offset.reset policy handles it as Kafka's clients do.
    earliest = _consume_from_zero(bootstrap, topic_name, "earliest")
    assert earliest == [(o, f"v{o:03d}".encode() * 10) for o in range(low, high)]
    assert _consume_from_zero(bootstrap, topic_name, "latest") == []
    [failed] = _consume_from_zero(bootstrap, topic_name, "error")
    assert isinstance(failed, KafkaError) and failed.code() == KafkaError._AUTO_OFFSET_RESET, failed
    assert "out of range" in failed.str().lower()

    # The moved log start is checkpointed: a restart keeps it.
    cleaning_broker.terminate()
    cleaning_broker.start()
    assert _watermarks(cleaning_broker.bootstrap_servers, topic_name) == (low, high)


def test_time_retention_expires_a_quiet_topic_entirely_as_kafka_does(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    # Kafka deletes the active segment too once its newest record is past retention.ms: a topic that
    # stopped receiving records ends up empty, its log start at its log end.
    bootstrap = cleaning_broker.bootstrap_servers
    create_topic(bootstrap, topic_name, config={"retention.ms": "300"})
    sender = producer(bootstrap, acks="all", linger_ms=0)
    _deliver(sender, topic_name, [(None, b"soon expired %d" % i) for i in range(10)])

    _wait_for(lambda: _watermarks(bootstrap, topic_name) == (10, 10), what="the whole log to expire")
    assert _segment_bases(cleaning_broker, topic_name) == [10]
    assert _consume_from_zero(bootstrap, topic_name, "earliest") == []
    [failed] = _consume_from_zero(bootstrap, topic_name, "error")
    assert isinstance(failed, KafkaError) and failed.code() == KafkaError._AUTO_OFFSET_RESET, failed

    cleaning_broker.terminate()  # the moved log start is checkpointed
    cleaning_broker.start()
    bootstrap = cleaning_broker.bootstrap_servers
    assert _watermarks(bootstrap, topic_name) == (10, 10)
    _deliver(producer(bootstrap, acks="all", linger_ms=0), topic_name, [(None, b"after")])
    low, high = _watermarks(bootstrap, topic_name)
    assert high == 11 and low in (10, 11)  # appends go on at the log end (and expire in turn)


def test_segment_ms_rolls_by_record_time_and_follows_a_config_change(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = cleaning_broker.bootstrap_servers
    create_topic(bootstrap, topic_name, config={"segment.ms": "50"})
    sender = producer(bootstrap, acks="all", linger_ms=0)
    for i in range(3):
        _deliver(sender, topic_name, [(None, b"r%d" % i)])
        time.sleep(0.1)  # the next record's CreateTime is more than segment.ms after this one's
    assert _segment_bases(cleaning_broker, topic_name) == [0, 1, 2]

    alter = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic_name,
        incremental_configs=[
            ConfigEntry("segment.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    alter.incremental_alter_configs([resource])[resource].result(30)
    for i in range(3, 5):
        _deliver(sender, topic_name, [(None, b"r%d" % i)])
        time.sleep(0.1)
    assert _segment_bases(cleaning_broker, topic_name) == [0, 1, 2]  # the live log took the new value


def test_compaction_keeps_the_latest_committed_value_per_key(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = cleaning_broker.bootstrap_servers
    # Any dirty closed segment is due: each pass sees what the writes so far left.
    config = {
        "cleanup.policy": "compact",
        "internal.segment.bytes": "300",
        "min.cleanable.dirty.ratio": "0.01",
    }
    create_topic(bootstrap, topic_name, config=config)
    plain = producer(bootstrap, acks="all", linger_ms=0)
    for version in range(3):  # three generations of k-plain-0..2, each key in its own batch
        for key in range(3):
            _deliver(plain, topic_name, [(f"plain-{key}".encode(), f"plain-{key}-v{version}".encode())])
    _deliver(plain, topic_name, [(b"deleted", b"soon gone"), (b"deleted", None)])  # a tombstone

    transactional = transactional_producer(bootstrap, f"tx-{topic_name}", linger_ms=0)
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce(topic_name, key=b"txn", value=b"txn-committed")
    transactional.commit_transaction(30)
    transactional.begin_transaction()
    transactional.produce(topic_name, key=b"txn", value=b"txn-aborted")  # must not supersede
    transactional.produce(topic_name, key=b"plain-0", value=b"plain-0-aborted")
    transactional.flush(10)
    transactional.abort_transaction(30)
    # Later writes roll the segments above, so they are closed and can be cleaned (never the active one).
    for i in range(4):
        _deliver(plain, topic_name, [(f"filler-{i}".encode(), b"x" * 100)])

    expected = {
        "plain-0": b"plain-0-v2",
        "plain-1": b"plain-1-v2",
        "plain-2": b"plain-2-v2",
        "deleted": None,  # the tombstone stays until delete.retention.ms (a day by default)
        "txn": b"txn-committed",
        **{f"filler-{i}": b"x" * 100 for i in range(4)},
    }

    def compacted() -> bool:
        return len(_read_to_end(bootstrap, topic_name, "read_uncommitted")) == len(expected)

    _wait_for(compacted, what="compaction", timeout_s=20)
    for isolation in ("read_committed", "read_uncommitted"):
        # One record per key, the latest committed value; the aborted transaction's records are gone too.
        seen = _read_to_end(bootstrap, topic_name, isolation)
        assert len(seen) == len(expected), seen
        assert {key: value for key, value, _ in seen} == expected
        offsets = [offset for *_, offset in seen]
        assert offsets == sorted(offsets)
    # Compaction never changes offsets: 9 + 2 plain records, 1 committed record and its marker, 2 aborted
    # records and their marker, 4 fillers.
    assert _watermarks(bootstrap, topic_name) == (0, 20)
    assert "compaction removed" in cleaning_broker.log_path.read_text()


def test_compaction_removes_the_markers_of_transactions_it_emptied(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    """A compacted topic written transactionally (Kafka Streams' changelogs, sparkafka's commit
    markers) does not keep a marker per transaction forever: once a transaction's records are gone,
    its marker gets a delete horizon (delete.retention.ms, here 0) and goes with a later pass. The
    latest transaction's marker stays; readers of either isolation level see the latest value."""
    from sparkafka.broker.dumplog import dump_topic

    bootstrap = cleaning_broker.bootstrap_servers
    config = {
        "cleanup.policy": "compact",
        "internal.segment.bytes": "300",
        "delete.retention.ms": "0",
        "min.cleanable.dirty.ratio": "0.01",
    }
    create_topic(bootstrap, topic_name, config=config)
    writer = transactional_producer(bootstrap, f"tx-{topic_name}", linger_ms=0)
    writer.init_transactions(30)
    for version in range(6):
        writer.begin_transaction()
        writer.produce(topic_name, key=b"state", value=b"v%d" % version)
        writer.commit_transaction(30)
    plain = producer(bootstrap, acks="all", linger_ms=0)
    fillers = 0

    def markers() -> int:
        # The cleaner replaces segments while the broker runs: one listed a moment ago may be gone by
        # the time it is read, and the count is then taken again from the files there now.
        for _ in range(50):
            try:
                dumped = list(dump_topic(cleaning_broker.data_dir, topic_name, 0, print_records=False))
            except FileNotFoundError:
                continue
            return sum(1 for line in dumped if "isControl: true" in line)
        raise AssertionError("the segments kept changing under 50 dumps in a row")

    def markers_gone_after_a_write() -> bool:
        # A pass runs once writes left a dirty closed segment (as in Kafka); it takes three: the
        # records go, their markers get a horizon, the markers go.
        nonlocal fillers
        _deliver(plain, topic_name, [(f"filler-{fillers}".encode(), b"x" * 100)])
        fillers += 1
        return markers() == 1

    _wait_for(markers_gone_after_a_write, what="the emptied transactions' markers to go", timeout_s=20)
    for isolation in ("read_committed", "read_uncommitted"):
        seen = {key: value for key, value, _ in _read_to_end(bootstrap, topic_name, isolation)}
        assert seen == {"state": b"v5", **{f"filler-{i}": b"x" * 100 for i in range(fillers)}}, isolation
    assert _watermarks(bootstrap, topic_name) == (0, 12 + fillers)
    cleaning_broker.terminate()
    cleaning_broker.start()
    assert markers() == 1
    seen = {
        key: value
        for key, value, _ in _read_to_end(cleaning_broker.bootstrap_servers, topic_name, "read_committed")
    }
    assert seen["state"] == b"v5"


def test_the_cleaner_waits_for_min_cleanable_dirty_ratio_or_max_compaction_lag(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    """Kafka's LogCleanerManager: a compacted log is cleaned once its dirty part is more than
    min.cleanable.dirty.ratio of it, or once a dirty segment is older than max.compaction.lag.ms."""
    bootstrap = cleaning_broker.bootstrap_servers
    eager, patient = f"{topic_name}-eager", f"{topic_name}-patient"
    create_topic(bootstrap, eager, config={"cleanup.policy": "compact", "internal.segment.bytes": "300"})
    # A ratio can never be more than 1: only max.compaction.lag.ms can make this one due.
    config = {"cleanup.policy": "compact", "internal.segment.bytes": "300", "min.cleanable.dirty.ratio": "1"}
    create_topic(bootstrap, patient, config=config)
    sender = producer(bootstrap, acks="all", linger_ms=0)
    for topic in (eager, patient):
        for version in range(6):
            _deliver(sender, topic, [(b"key", b"v%d" % version)])
        _deliver(sender, topic, [(b"filler", b"x" * 100)])  # rolls the segment of the last version

    def records_of(topic: str) -> int:
        return len(_read_to_end(bootstrap, topic, "read_uncommitted"))

    _wait_for(lambda: records_of(eager) == 2, what="the eager topic's compaction", timeout_s=20)
    # A witness that the cleaner went on choosing, weighing the patient topic each round: a topic
    # made dirty only now is cleaned, and the patient one is still not.
    later = f"{topic_name}-later"
    create_topic(bootstrap, later, config={"cleanup.policy": "compact", "internal.segment.bytes": "300"})
    for version in range(6):
        _deliver(sender, later, [(b"key", b"v%d" % version)])
    _deliver(sender, later, [(b"filler", b"x" * 100)])
    _wait_for(lambda: records_of(later) == 2, what="the later topic's compaction", timeout_s=20)
    assert records_of(patient) == 7
    alter = AdminClient({"bootstrap.servers": bootstrap})
    lag = ConfigEntry("max.compaction.lag.ms", "1", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, patient, incremental_configs=[lag])
    alter.incremental_alter_configs([resource])[resource].result(30)
    _wait_for(lambda: records_of(patient) == 2, what="the overdue topic's compaction", timeout_s=20)


def test_keyless_records_are_rejected_on_compacted_topics(
    cleaning_broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = cleaning_broker.bootstrap_servers
    create_topic(bootstrap, topic_name, config={"cleanup.policy": "compact"})
    errors: list[KafkaError] = []
    sender = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "retries": 0})
    sender.produce(topic_name, value=b"no key", on_delivery=lambda e, _m: errors.append(e))
    sender.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.INVALID_RECORD

    # On the wire: Kafka's message, and the rejected record's index (Produce v8 record errors).
    batch = encode_batch([Record(0, int(time.time() * 1000), None, b"no key")], base_offset=0)
    with RawConnection(cleaning_broker.port) as connection:
        from kafka.protocol.producer import ProduceRequest, ProduceResponse

        partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=5000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=topic_name, partition_data=[partition_class(index=0, records=batch)]
                )
            ],
        )
        response = connection.roundtrip(request, ProduceResponse, version=8)
        result = response.responses[0].partition_responses[0]
        assert result.error_code == 87  # INVALID_RECORD
        message = f"Compacted topic cannot accept message without key in topic partition {topic_name}-0"
        assert message in result.error_message
        assert [(e.batch_index, e.batch_index_error_message) for e in result.record_errors] == [(0, message)]
        keyed = encode_batch([Record(0, int(time.time() * 1000), b"k", b"keyed")], base_offset=0)
        assert produce_batch(connection, topic_name, 0, keyed) == (0, 0)  # keyed records still go in
    assert [m.value() for m in read_all(bootstrap, topic_name, expect=1)] == [b"keyed"]
    assert not list(Path(cleaning_broker.data_dir).glob(f"{topic_name}-1"))
