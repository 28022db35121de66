"""A partition's idempotent-producer state, as Kafka's ProducerStateManager keeps it: duplicates are
answered with the first write's offset and timestamp; a transaction marker's newer epoch starts the
producer's sequences anew, at run time and after recovery from the log."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker import record_builder, records
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log import PartitionLog
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.partition import Partition

NOW_MS = 1_800_000_000_000
PRODUCER = 7


def _batch(*, epoch: int, sequence: int, count: int = 2, timestamp: int = NOW_MS - 5_000) -> bytes:
    return record_builder.encode_batch(
        [records.Record(i, timestamp + i, b"k", b"v%d" % i) for i in range(count)],
        base_offset=0,
        producer_id=PRODUCER,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def _no_transactions(producer_id: int, epoch: int, topic: str, partition: int) -> None:
    raise AssertionError("no transactional batch is written here")


@pytest.fixture
def open_partition(tmp_path: Path) -> Iterator[type[Partition]]:
    opened: list[Partition] = []

    def make(**config: object) -> Partition:
        partition = Partition("t", 0, tmp_path / "t-0", LogConfig(**config))  # type: ignore[arg-type]
        opened.append(partition)
        return partition

    yield make  # type: ignore[misc]
    for partition in opened:
        partition.log.close()


def _append(partition: Partition, batch: bytes, now_ms: int = NOW_MS) -> tuple[int, int, bool]:
    result = partition.append_from_client(
        batch, now_ms=now_ms, max_message_bytes=1 << 20, verify_transaction=_no_transactions
    )
    return result.base_offset, result.log_append_time, result.duplicate


@pytest.mark.parametrize("log_append_time", [False, True])
def test_a_duplicate_is_answered_with_the_first_writes_offset_and_timestamp(
    open_partition: type[Partition], log_append_time: bool
) -> None:
    partition = open_partition(log_append_time=log_append_time)  # type: ignore[call-arg]
    first = _append(partition, _batch(epoch=0, sequence=0))
    again = _append(partition, _batch(epoch=0, sequence=0), now_ms=NOW_MS + 1_000)
    assert first == (0, NOW_MS if log_append_time else -1, False)
    # Kafka's UnifiedLog.append answers a duplicate with the stored batch's maxTimestamp as its log
    # append time, whatever the topic's timestamp type.
    assert again == (0, NOW_MS if log_append_time else NOW_MS - 5_000 + 1, True)
    assert partition.log.log_end_offset == 2


def test_a_markers_newer_epoch_starts_the_sequences_anew(open_partition: type[Partition]) -> None:
    partition = open_partition()
    assert _append(partition, _batch(epoch=0, sequence=0))[2] is False
    assert _append(partition, _batch(epoch=0, sequence=2))[2] is False
    # The coordinator fenced the producer: its abort marker carries the bumped epoch.
    partition.write_txn_marker(
        producer_id=PRODUCER, producer_epoch=1, commit=False, coordinator_epoch=0, now_ms=NOW_MS
    )
    for reopened in (False, True):
        if reopened:  # the same state rebuilt from the log
            partition.log.close()
            partition = open_partition()
        with pytest.raises(BrokerError) as gap:
            _append(partition, _batch(epoch=1, sequence=4))
        assert gap.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # Sequences 0-1 of epoch 0 are no duplicate of epoch 1's first batch.
        with pytest.raises(BrokerError) as stale:
            _append(partition, _batch(epoch=0, sequence=0))
        assert stale.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    offset, _, duplicate = _append(partition, _batch(epoch=1, sequence=0))
    assert (offset, duplicate) == (5, False)


def test_the_last_markers_coordinator_epoch_outlives_a_newer_producer_epoch(
    open_partition: type[Partition],
) -> None:
    """ProducerStateEntry.maybeUpdateProducerEpoch changes the epoch and nothing else, and recovery
    reads the coordinator epoch back from the marker (ProducerAppendInfo.appendEndTxnMarker), so
    DescribeProducers shows the last marker's coordinator epoch after a new epoch and after a crash."""
    partition = open_partition()
    _append(partition, _batch(epoch=0, sequence=0))
    partition.write_txn_marker(
        producer_id=PRODUCER, producer_epoch=0, commit=True, coordinator_epoch=4, now_ms=NOW_MS
    )
    _append(partition, _batch(epoch=1, sequence=0))
    assert (partition.producers[PRODUCER].epoch, partition.producers[PRODUCER].coordinator_epoch) == (1, 4)
    partition.log.close()  # no snapshot: the state comes back from the log alone
    partition = open_partition()
    assert (partition.producers[PRODUCER].epoch, partition.producers[PRODUCER].coordinator_epoch) == (1, 4)


def _allow_transactions(producer_id: int, epoch: int, topic: str, partition: int) -> None:
    """The coordinator's answer for a producer that added the partition to its transaction."""


def _transactional(
    producer_id: int, *, sequence: int = 0, timestamp: int = NOW_MS, count: int = 1, value: bytes = b"t" * 120
) -> bytes:
    return record_builder.encode_batch(
        [records.Record(i, timestamp + i, b"k", value) for i in range(count)],
        base_offset=0,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
        is_transactional=True,
    )


def _write_transactional(partition: Partition, batch: bytes) -> None:
    partition.append_from_client(
        batch, now_ms=NOW_MS, max_message_bytes=1 << 20, verify_transaction=_allow_transactions
    )


@pytest.mark.parametrize("removed_by", ["DeleteRecords", "retention"])
def test_the_last_stable_offset_never_falls_below_the_log_start(
    open_partition: type[Partition], removed_by: str
) -> None:
    partition = open_partition(retention_ms=60_000)  # type: ignore[call-arg]
    _append(partition, _batch(epoch=0, sequence=0, count=2))
    _write_transactional(
        partition, _transactional(PRODUCER + 1, timestamp=NOW_MS - 5_000, count=2, value=b"t")
    )
    assert (partition.last_stable_offset, partition.high_watermark) == (2, 4)
    # The open transaction's first records go: Kafka's first unstable offset moves up to the log start.
    if removed_by == "DeleteRecords":
        partition.delete_records_before(3)
        assert partition.last_stable_offset == 3
    else:
        partition.enforce_retention(NOW_MS + 120_000)
        assert partition.log_start_offset == 4
        assert partition.last_stable_offset == 4
    partition.write_txn_marker(
        producer_id=PRODUCER + 1, producer_epoch=0, commit=True, coordinator_epoch=0, now_ms=NOW_MS
    )
    assert partition.last_stable_offset == partition.high_watermark == 5


def test_compaction_stops_at_the_last_stable_offset_when_retention_cut_an_open_transaction(
    open_partition: type[Partition],
) -> None:
    # Kafka's cleaner stops at the last stable offset: once retention removed an open transaction's
    # first batch, that is the log start, so nothing is cleaned until the transaction ends.
    partition = open_partition(  # type: ignore[call-arg]
        cleanup_policy="compact,delete", segment_bytes=200, retention_ms=60_000
    )
    old, new = NOW_MS - 120_000, NOW_MS

    def keyed(key: bytes, value: bytes, timestamp: int, *, producer: int = -1, sequence: int = -1) -> bytes:
        return record_builder.encode_batch(
            [records.Record(0, timestamp, key, value + b"." * 120)],
            base_offset=0,
            producer_id=producer,
            producer_epoch=0 if producer >= 0 else -1,
            base_sequence=sequence,
            is_transactional=producer >= 0,
        )

    def write(batch: bytes) -> None:
        partition.append_from_client(
            batch, now_ms=NOW_MS, max_message_bytes=1 << 20, verify_transaction=_allow_transactions
        )

    write(keyed(b"t", b"open-1", old, producer=PRODUCER + 1, sequence=0))
    write(keyed(b"a", b"v1", new))
    write(keyed(b"a", b"v2", new))
    write(keyed(b"t", b"open-2", new, producer=PRODUCER + 1, sequence=1))
    write(keyed(b"f", b"filler", new))
    assert len(partition.log.segment_files()) == 5  # one batch per segment
    partition.enforce_retention(NOW_MS)
    assert partition.log_start_offset == partition.last_stable_offset == 1
    cleanable = partition.cleanable_range(NOW_MS)
    assert cleanable is None or not cleanable.due(0.0)  # the cleaner does not pick it
    partition.compaction(NOW_MS)()

    def values() -> list[bytes]:
        return [
            r.value[:2]
            for header, batch in partition.log.iter_batches()
            if not header.is_control
            for r in records.decode_records(batch)
        ]

    assert values() == [b"v1", b"v2", b"op", b"fi"]  # v1 is still there: it is not below the stable offset
    partition.write_txn_marker(
        producer_id=PRODUCER + 1, producer_epoch=0, commit=True, coordinator_epoch=0, now_ms=NOW_MS
    )
    write(keyed(b"g", b"filler", new))  # rolls the segment with the marker
    cleanable = partition.cleanable_range(NOW_MS)
    assert cleanable is not None and cleanable.due(0.5)
    partition.compaction(NOW_MS)()
    assert values() == [b"v2", b"op", b"fi", b"fi"]


# -- state whose batches are gone: snapshots ------------------------------------------------------


def _reopened(partition: Partition, open_partition: type[Partition], **config: object) -> Partition:
    partition.log.close()
    return open_partition(**config)  # type: ignore[call-arg]


def test_a_producer_stays_fenced_after_its_batches_expired_and_the_broker_restarted(
    open_partition: type[Partition],
) -> None:
    config = {"retention_ms": 60_000, "segment_bytes": 200}
    partition = open_partition(**config)  # type: ignore[arg-type]
    _append(partition, _batch(epoch=3, sequence=0, timestamp=NOW_MS - 120_000))
    other = record_builder.encode_batch([records.Record(0, NOW_MS, b"k", b"p" * 120)], base_offset=0)
    _append(partition, other)  # a second segment, not expired
    partition.enforce_retention(NOW_MS)
    assert (partition.log_start_offset, partition.high_watermark) == (2, 3)
    partition = _reopened(partition, open_partition, **config)
    with pytest.raises(BrokerError) as stale:
        _append(partition, _batch(epoch=2, sequence=0))
    assert stale.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    # A retry of the removed batch is still known as a duplicate, answered with its first offset.
    assert _append(partition, _batch(epoch=3, sequence=0, timestamp=NOW_MS - 120_000)) == (
        0,
        NOW_MS - 120_000 + 1,
        True,
    )
    assert _append(partition, _batch(epoch=3, sequence=2))[0] == 3


def test_once_the_whole_log_expired_a_restart_forgets_its_producers_as_kafka_does(
    open_partition: type[Partition],
) -> None:
    # Kafka's loader deletes snapshots at or below the log start (truncateAndReload).
    partition = open_partition(retention_ms=60_000)  # type: ignore[call-arg]
    _append(partition, _batch(epoch=3, sequence=0))
    partition.enforce_retention(NOW_MS + 120_000)
    assert (partition.log_start_offset, partition.high_watermark) == (2, 2)
    with pytest.raises(BrokerError):  # still fenced while the broker runs
        _append(partition, _batch(epoch=2, sequence=0))
    partition = _reopened(partition, open_partition, retention_ms=60_000)
    assert partition.producers == {}
    assert not list(partition.log.directory.glob("*.snapshot"))
    assert _append(partition, _batch(epoch=2, sequence=0)) == (2, -1, False)


def test_producers_that_expired_while_the_broker_was_down_are_not_restored(
    open_partition: type[Partition],
) -> None:
    config = {"retention_ms": 60_000, "segment_bytes": 200}
    partition = open_partition(**config)  # type: ignore[arg-type]
    long_ago = 1_000_000  # far more than producer.id.expiration.ms before the real clock
    _append(partition, _batch(epoch=3, sequence=0, timestamp=long_ago))
    _append(
        partition, record_builder.encode_batch([records.Record(0, NOW_MS, b"k", b"p" * 120)], base_offset=0)
    )
    partition.enforce_retention(long_ago + 120_000)
    assert partition.log_start_offset == 2 and PRODUCER in partition.producers
    partition = _reopened(partition, open_partition, **config)
    assert PRODUCER not in partition.producers


def test_an_open_transaction_whose_records_expired_holds_the_lso_after_a_restart(
    open_partition: type[Partition],
) -> None:
    partition = open_partition(retention_ms=60_000, segment_bytes=200)  # type: ignore[call-arg]
    _write_transactional(partition, _transactional(PRODUCER, timestamp=NOW_MS - 120_000))
    _append(
        partition, record_builder.encode_batch([records.Record(0, NOW_MS, b"k", b"p" * 120)], base_offset=0)
    )
    partition.delete_records_before(1)
    partition = _reopened(partition, open_partition, retention_ms=60_000, segment_bytes=200)
    assert partition.has_open_txn(PRODUCER)
    assert (partition.log_start_offset, partition.last_stable_offset, partition.high_watermark) == (1, 1, 2)
    partition.write_txn_marker(
        producer_id=PRODUCER, producer_epoch=0, commit=False, coordinator_epoch=0, now_ms=NOW_MS
    )
    assert partition.last_stable_offset == partition.high_watermark == 3


def test_aborted_transactions_survive_in_the_snapshot_while_their_records_remain(
    open_partition: type[Partition],
) -> None:
    partition = open_partition(segment_bytes=200)  # type: ignore[call-arg]

    _append(
        partition, record_builder.encode_batch([records.Record(0, NOW_MS, b"k", b"p" * 120)], base_offset=0)
    )
    for sequence in (0, 1):
        _write_transactional(partition, _transactional(PRODUCER, sequence=sequence))
    partition.write_txn_marker(
        producer_id=PRODUCER, producer_epoch=0, commit=False, coordinator_epoch=0, now_ms=NOW_MS
    )
    partition.delete_records_before(2)  # the abort's first record is gone, its second and marker remain
    before = list(partition.aborted)
    assert [(t.first_offset, t.last_offset) for t in before] == [(1, 3)]
    partition = _reopened(partition, open_partition, segment_bytes=200)
    assert partition.aborted == before
    assert partition.is_aborted(PRODUCER, 2)


def test_a_snapshot_past_the_log_end_is_deleted_and_an_unreadable_one_is_reported(
    open_partition: type[Partition], caplog: pytest.LogCaptureFixture
) -> None:
    partition = open_partition()
    _append(partition, _batch(epoch=1, sequence=0))
    directory = partition.log.directory
    partition.log.close()
    (directory / f"{99:020d}.snapshot").write_text(
        '{"producers": {}, "open_transactions": {}, "aborted": []}'
    )
    (directory / f"{1:020d}.snapshot").write_text("{not json")
    with caplog.at_level("WARNING"):
        partition = open_partition()
    assert not (directory / f"{99:020d}.snapshot").exists()
    assert not (directory / f"{1:020d}.snapshot").exists()  # unreadable: deleted, as Kafka does
    assert "is past the log end 2" in caplog.text and "is unreadable" in caplog.text
    assert partition.producers[PRODUCER].epoch == 1  # recovered from the log alone


# -- producer expiration ------------------------------------------------------------------------------


def test_an_idle_producer_without_an_open_transaction_expires(open_partition: type[Partition]) -> None:
    partition = open_partition()
    partition.producer_id_expiration_ms = 10_000
    _append(partition, _batch(epoch=0, sequence=0, timestamp=NOW_MS - 10_000))  # last timestamp 9_999 ago
    _write_transactional(partition, _transactional(PRODUCER + 1, timestamp=NOW_MS - 50_000))
    partition.expire_producers(NOW_MS)
    assert set(partition.producers) == {PRODUCER, PRODUCER + 1}  # 9_999 ms < 10_000: not yet
    partition.expire_producers(NOW_MS + 1)
    assert set(partition.producers) == {PRODUCER + 1}  # an open transaction keeps its producer
    # An expired producer is one never seen: any sequence is taken (Kafka's ProducerAppendInfo).
    assert _append(partition, _batch(epoch=0, sequence=7))[2] is False


def test_the_broker_expires_producers_periodically(tmp_path: Path) -> None:
    from sparkafka.broker import server
    from sparkafka.broker.config import BrokerConfig

    async def run() -> set[int]:
        broker = server.Broker(
            BrokerConfig(
                port=0,
                data_dir=tmp_path / "data",
                producer_id_expiration_ms=1,
                producer_id_expiration_check_interval_ms=20,
            )
        )
        broker.topic_controller.create_topic("t", 1, {})
        partition = broker.partitions[("t", 0)]
        _append(partition, _batch(epoch=0, sequence=0, timestamp=1_000_000))  # long ago
        assert set(partition.producers) == {PRODUCER}
        await broker.start()
        try:
            await asyncio.sleep(0.2)
            return set(partition.producers)
        finally:
            await broker.stop()

    assert asyncio.run(run()) == set()


def test_a_batch_the_log_failed_to_write_is_no_duplicate_when_retried(
    open_partition: type[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's UnifiedLog.append updates the producer state only after the write: the retry of a
    batch whose write failed (disk full, or larger than a segment) is written, or refused again,
    never acknowledged as a duplicate of records that are not in the log."""
    partition = open_partition(segment_bytes=400)  # type: ignore[call-arg]
    _append(partition, _batch(epoch=0, sequence=0))
    real_append = partition.log.append

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise BrokerError(ErrorCode.KAFKA_STORAGE_ERROR, "No space left on device (injected)")

    monkeypatch.setattr(partition.log, "append", disk_full)
    with pytest.raises(BrokerError) as failed:
        _append(partition, _batch(epoch=0, sequence=2))
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    monkeypatch.setattr(partition.log, "append", real_append)
    assert _append(partition, _batch(epoch=0, sequence=2)) == (2, -1, False)
    assert partition.log.log_end_offset == 4

    too_large = record_builder.encode_batch(
        [records.Record(0, NOW_MS - 5_000, b"k", b"x" * 500)],
        base_offset=0,
        producer_id=PRODUCER,
        producer_epoch=0,
        base_sequence=4,
    )
    for _ in range(2):
        with pytest.raises(BrokerError) as refused:
            _append(partition, too_large)
        assert refused.value.code == ErrorCode.RECORD_LIST_TOO_LARGE
    assert partition.log.log_end_offset == 4


def test_the_log_is_fsynced_before_the_snapshot_that_relies_on_it(
    open_partition: type[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparkafka.broker.partition as partition_module

    partition = open_partition(retention_ms=60_000, segment_bytes=200)  # type: ignore[call-arg]
    _append(partition, _batch(epoch=0, sequence=0, timestamp=NOW_MS - 120_000))
    _append(
        partition, record_builder.encode_batch([records.Record(0, NOW_MS, b"k", b"p" * 120)], base_offset=0)
    )
    events: list[str] = []
    flush, write = partition.log.flush, partition_module.write_file_atomically
    monkeypatch.setattr(partition.log, "flush", lambda: (events.append("log fsynced"), flush())[1])
    monkeypatch.setattr(
        partition_module,
        "write_file_atomically",
        lambda path, data: (events.append(f"wrote {path.name}"), write(path, data))[1],
    )
    partition.enforce_retention(NOW_MS)
    assert events == ["log fsynced", f"wrote {3:020d}.snapshot"]  # as of the log end


def test_a_deleted_topics_files_never_reach_a_topic_created_again_under_its_name(tmp_path: Path) -> None:
    from sparkafka.broker import server
    from sparkafka.broker.config import BrokerConfig

    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    broker = server.Broker(config)
    broker.topic_controller.create_topic("t", 1, {})
    _append(broker.partitions[("t", 0)], _batch(epoch=0, sequence=0))
    _delete_topic(broker, "t")
    assert sorted(path.name for path in config.data_dir.iterdir() if path.name.startswith("t-")) == []
    broker.topic_controller.create_topic("t", 1, {})
    assert broker.partitions[("t", 0)].log.log_end_offset == 0
    # What a crash left of a deletion in progress goes when the broker starts.
    leftover = config.data_dir / "t-0.0123abcd-delete"
    leftover.mkdir()
    (leftover / f"{5:020d}.snapshot").write_text("{}")
    broker.partitions[("t", 0)].close()
    broker._lock_file.close()
    server.Broker(config)
    assert not leftover.exists()


def _delete_topic(broker: Any, name: str) -> None:
    """DeleteTopics' way: the topic's files closed, renamed and removed off the event loop."""
    failure = asyncio.run(broker.topic_controller.delete_topics([name]))[name]
    if failure is not None:
        raise failure


def _broker(tmp_path: Path) -> Any:
    from sparkafka.broker import server
    from sparkafka.broker.config import BrokerConfig

    return server.Broker(BrokerConfig(port=0, data_dir=tmp_path / "data"))


def test_a_topic_with_the_longest_legal_name_is_deleted_and_created_again_empty(tmp_path: Path) -> None:
    """249 characters, Kafka's limit: the renamed directory would exceed 255 bytes uncut."""
    broker = _broker(tmp_path)
    name = "n" * 249
    broker.topic_controller.create_topic(name, 2, {})
    _append(broker.partitions[(name, 1)], _batch(epoch=0, sequence=0))
    _delete_topic(broker, name)
    assert name not in broker.topics.topics
    assert [path for path in broker.config.data_dir.iterdir() if path.name.startswith("nnn")] == []
    broker.topic_controller.create_topic(name, 2, {})
    assert broker.partitions[(name, 1)].log.log_end_offset == 0


def test_a_deletion_whose_rename_fails_leaves_the_topic_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    broker.topic_controller.create_topic("t", 2, {})
    _append(broker.partitions[("t", 1)], _batch(epoch=0, sequence=0))
    real_rename = Path.rename

    def rename(self: Path, target: Any) -> Any:
        if self.name == "t-1":
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(BrokerError, match="could not be deleted, and is left as it was") as failed:
        _delete_topic(broker, "t")
    monkeypatch.undo()
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "t" in broker.topics.topics
    assert sorted(path.name for path in broker.config.data_dir.iterdir() if path.name.startswith("t-")) == [
        "t-0",
        "t-1",
    ]
    assert broker.partitions[("t", 1)].log.log_end_offset == 2, "the records are still there"
    _append(broker.partitions[("t", 0)], _batch(epoch=0, sequence=0))  # and it takes writes


def test_a_directory_left_by_an_earlier_topic_is_never_opened_by_a_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = _broker(tmp_path)
    broker.topic_controller.create_topic("t", 1, {})
    _append(broker.partitions[("t", 0)], _batch(epoch=0, sequence=0))
    broker.partitions[("t", 0)].close()
    # The registry lost the topic (restored from a backup, say), its directory stayed.
    del broker.topics.topics["t"]
    broker.topics.save()
    broker._lock_file.close()
    with caplog.at_level("WARNING"):
        restarted = _broker(tmp_path)
    assert "orphan directory" in caplog.text and "t-0" in caplog.text
    assert (restarted.config.data_dir / "t-0").exists(), "an orphan is reported, not removed"
    restarted.topic_controller.create_topic("t", 1, {})
    assert restarted.partitions[("t", 0)].log.log_end_offset == 0
    assert "left by an earlier topic t" in caplog.text


def test_partitions_beyond_the_open_file_limit_are_refused_before_any_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    from sparkafka.broker import topic_controller

    broker = _broker(tmp_path)
    broker.topic_controller.create_topic("t", 1, {})
    open_now = len(os.listdir("/proc/self/fd"))
    limit = open_now + topic_controller.FILE_DESCRIPTOR_RESERVE + 10  # room for 10 more partitions
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (limit, resource.RLIM_INFINITY))
    with pytest.raises(BrokerError, match=r"raise the broker's limit \(ulimit -n\)") as refused:
        broker.topic_controller.create_topic("big", 50, {})
    assert refused.value.code == ErrorCode.POLICY_VIOLATION
    assert "big" not in broker.topics.topics
    assert not any(path.name.startswith("big-") for path in broker.config.data_dir.iterdir())
    with pytest.raises(BrokerError, match="new partition"):
        asyncio.run(broker.topic_controller.add_partitions("t", 60, validate_only=False))
    assert broker.topics.topics["t"].partitions == 1
    broker.topic_controller.create_topic("small", 5, {})  # within the limit


def test_a_batch_written_whose_fsync_failed_is_recorded_so_its_retry_is_a_duplicate(
    open_partition: type[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With flush.messages the append fsyncs after writing; if that fails the batch is still in the
    log (readable, replayed at the next start), so its producer state must be recorded too."""
    from sparkafka.broker import log as log_module

    partition = open_partition(flush_messages=1)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(log_module.os, "fsync", failing_fsync)
    with pytest.raises(BrokerError) as failed:
        _append(partition, _batch(epoch=0, sequence=0))
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    monkeypatch.setattr(log_module.os, "fsync", real_fsync)
    assert partition.high_watermark == 2
    base, _, duplicate = _append(partition, _batch(epoch=0, sequence=0))  # the retry
    assert (base, duplicate) == (0, True)


def _count_replayed_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The base offsets of the batches partitions read from their logs from now on (recovery)."""
    replayed: list[int] = []
    iter_batches = PartitionLog.iter_batches

    def counting(log: PartitionLog, start: int = 0) -> Iterator[Any]:
        for header, batch in iter_batches(log, start):
            replayed.append(header.base_offset)
            yield header, batch

    monkeypatch.setattr(PartitionLog, "iter_batches", counting)
    return replayed


def test_a_clean_close_snapshots_the_state_so_the_next_open_replays_nothing(
    open_partition: type[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's UnifiedLog.close takes a producer-state snapshot at the log end: the next start loads
    it instead of reading the log again, and ends up with the same state."""
    partition = open_partition()
    _append(partition, _batch(epoch=0, sequence=0))
    _write_transactional(partition, _transactional(11))
    partition.write_txn_marker(
        producer_id=11, producer_epoch=0, commit=False, coordinator_epoch=0, now_ms=NOW_MS
    )
    _write_transactional(partition, _transactional(12))  # left open
    state = (partition.producers, partition.open_txn_first_offset, partition.aborted)
    lso, end = partition.last_stable_offset, partition.high_watermark
    partition.close()
    assert [p.name for p in partition.log.directory.glob("*.snapshot")] == [f"{end:020d}.snapshot"]

    replayed = _count_replayed_batches(monkeypatch)
    reopened = open_partition()
    assert replayed == []
    assert (reopened.producers, reopened.open_txn_first_offset, reopened.aborted) == state
    assert (reopened.last_stable_offset, reopened.high_watermark) == (lso, end)
    assert _append(reopened, _batch(epoch=0, sequence=0))[2] is True  # still a known duplicate


def test_a_roll_snapshots_the_state_so_a_start_after_a_crash_replays_only_the_new_segment(
    open_partition: type[Partition], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka snapshots the producer state whenever the log rolls."""
    partition = open_partition(segment_bytes=200)
    for sequence in range(0, 12, 2):
        _append(partition, _batch(epoch=0, sequence=sequence))
    active = int(partition.log.segment_files()[-1].stem)
    assert active > 0, "the test needs a rolled log"
    snapshots = sorted(int(p.stem) for p in partition.log.directory.glob("*.snapshot"))
    assert len(snapshots) == 2 and snapshots[-1] >= active  # the newest and the one before
    state = (partition.producers, partition.open_txn_first_offset, partition.aborted)
    crashed = tmp_path / "crashed" / "t-0"
    shutil.copytree(partition.log.directory, crashed)  # as a SIGKILL leaves it: no close

    replayed = _count_replayed_batches(monkeypatch)
    recovered = Partition("t", 0, crashed, LogConfig(segment_bytes=200))
    try:
        assert all(offset >= snapshots[-1] for offset in replayed)
        assert (recovered.producers, recovered.open_txn_first_offset, recovered.aborted) == state
        assert _append(recovered, _batch(epoch=0, sequence=10))[2] is True  # still a known duplicate
    finally:
        recovered.log.close()


def test_closing_a_partition_of_a_deleted_topic_writes_no_snapshot(open_partition: type[Partition]) -> None:
    partition = open_partition()
    _append(partition, _batch(epoch=0, sequence=0))
    partition.close(keep_state=False)
    assert not list(partition.log.directory.glob("*.snapshot"))
