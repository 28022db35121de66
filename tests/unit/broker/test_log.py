"""The segmented partition log: append/read, indexes, recovery, retention, DeleteRecords and compaction."""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from sparkafka.broker import log as log_module
from sparkafka.broker import log_recovery, record_builder, records
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log import PartitionLog
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.records import Record
from tests.log_damage import flip_byte_in_batch, overrun_file_with_batch

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def open_logs() -> Iterator[list[PartitionLog]]:
    logs: list[PartitionLog] = []
    yield logs
    for log in logs:
        log.close()


class LogFactory(Protocol):
    def __call__(self, directory: Path | None = None, **config: Any) -> PartitionLog: ...


@pytest.fixture
def make_log(tmp_path: Path, open_logs: list[PartitionLog]) -> LogFactory:
    """Open a log (default directory tmp_path/topic-0) with LogConfig(**config); closed after the test."""

    def make(directory: Path | None = None, **config: Any) -> PartitionLog:
        log = PartitionLog(directory or tmp_path / "topic-0", LogConfig(**config))
        open_logs.append(log)
        return log

    return make


def append(
    log: PartitionLog,
    count: int = 1,
    *,
    timestamp: int = 1000,
    keys: list[bytes | None] | None = None,
    values: list[bytes | None] | None = None,
    producer_id: int = -1,
    transactional: bool = False,
    compression: int = 0,
    now_ms: int = 0,
) -> int:
    """Append one batch of `count` records at the log end; return its base offset."""
    base = log.log_end_offset
    batch_records = [
        Record(
            base + i,
            timestamp + i if timestamp >= 0 else timestamp,
            keys[i] if keys is not None else b"key-%d" % (base + i),
            values[i] if values is not None else b"value-%d" % (base + i),
        )
        for i in range(count)
    ]
    batch = record_builder.encode_batch(
        batch_records,
        base_offset=base,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base if producer_id >= 0 else -1,
        is_transactional=transactional,
        compression=compression,
    )
    log.append([batch], now_ms=now_ms)
    return base


def end_transaction(log: PartitionLog, producer_id: int, *, commit: bool) -> int:
    offset = log.log_end_offset
    marker = record_builder.build_control_batch(
        offset=offset,
        producer_id=producer_id,
        producer_epoch=0,
        commit=commit,
        coordinator_epoch=0,
        timestamp_ms=0,
    )
    log.append([marker], now_ms=0)
    return offset


def batch_bases(data: bytes) -> list[int]:
    return [header.base_offset for _, header in records.iter_batches(data, validate_crc=True)]


def all_records(log: PartitionLog) -> list[Record]:
    return [
        record
        for header, batch in log.iter_batches()
        if not header.is_control
        for record in records.decode_records(batch)
    ]


def crash_copy(log: PartitionLog, destination: Path) -> Path:
    """The directory as a crash would leave it: the files as they are now, no clean-shutdown marker."""
    shutil.copytree(log.directory, destination)
    return destination


# ---- append and read ---------------------------------------------------------------------------


def test_append_and_read_back(make_log: LogFactory) -> None:
    log = make_log()
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    append(log, 3)
    append(log, 2)
    assert log.log_end_offset == 5
    data = log.read(0, 1 << 20)
    assert batch_bases(data) == [0, 3]
    decoded = [records.decode_records(data[pos : pos + h.size]) for pos, h in records.iter_batches(data)]
    assert [record.offset for batch in decoded for record in batch] == [0, 1, 2, 3, 4]
    assert log.read(5, 1 << 20) == b""
    assert log.segment_files() == [log.directory / "00000000000000000000.log"]
    assert log.size_bytes() == len(data)


def test_read_outside_the_log_is_offset_out_of_range(make_log: LogFactory) -> None:
    log = make_log()
    append(log, 3)
    for offset in (4, -1):
        with pytest.raises(BrokerError, match="in the range 0 to 3") as excinfo:
            log.read(offset, 100)
        assert excinfo.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_read_from_mid_batch_returns_the_whole_batch(make_log: LogFactory) -> None:
    log = make_log()
    append(log, 5)
    append(log, 5)
    assert batch_bases(log.read(7, 1 << 20)) == [5]
    assert batch_bases(log.read(4, 1 << 20)) == [0, 5]


def test_read_respects_max_bytes_and_min_one_batch(make_log: LogFactory) -> None:
    log = make_log()
    for _ in range(4):
        append(log, 3)
    one_batch = len(log.read(0, 1))
    assert batch_bases(log.read(0, 1)) == [0]  # first batch returned whole despite max_bytes
    assert log.read(0, 1, min_one_batch=False) == b""
    assert batch_bases(log.read(0, 2 * one_batch + 10)) == [0, 3]
    assert batch_bases(log.read(3, 2 * one_batch, min_one_batch=False)) == [3, 6]


def test_read_stops_at_upper_bound(make_log: LogFactory) -> None:
    log = make_log()
    for _ in range(4):
        append(log, 2)
    assert batch_bases(log.read(0, 1 << 20, upper_bound=4)) == [0, 2]
    assert batch_bases(log.read(0, 1 << 20, upper_bound=5)) == [0, 2, 4]
    assert log.read(4, 1 << 20, upper_bound=4) == b""
    assert log.read(6, 1 << 20, upper_bound=2) == b""


def test_segments_roll_and_reads_cross_them(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=400, index_interval_bytes=0)
    bases = [append(log, 2) for _ in range(20)]
    files = log.segment_files()
    assert len(files) > 3
    assert all(path.stat().st_size <= 400 for path in files)
    assert [path.name for path in files][:2] == ["00000000000000000000.log", f"{int(files[1].stem):020d}.log"]
    assert batch_bases(log.read(0, 1 << 20)) == bases
    for offset in range(40):
        assert batch_bases(log.read(offset, 1))[0] == offset - offset % 2
    third_base = int(files[2].stem)
    assert batch_bases(log.read(third_base + 1, 1 << 20)) == [b for b in bases if b >= third_base]


def test_index_files_use_kafka_entry_format(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=1000, index_interval_bytes=0)
    for _ in range(12):
        append(log, 1, timestamp=5000)
    log.close()
    first = log.directory / "00000000000000000000"
    index = list(struct.iter_unpack(">ii", first.with_suffix(".index").read_bytes()))
    positions = [pos for pos, _ in records.iter_batches(first.with_suffix(".log").read_bytes())]
    assert index and all(pos in positions for _, pos in index)
    assert [rel for rel, _ in index] == sorted(rel for rel, _ in index)
    time_index = list(struct.iter_unpack(">qi", first.with_suffix(".timeindex").read_bytes()))
    assert time_index[-1][0] == 5000


def test_append_rejects_misnumbered_partial_and_oversized_batches(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=200)
    batch = record_builder.encode_batch([Record(0, 0, b"k", b"v")], base_offset=0)
    with pytest.raises(ValueError, match="should be 0"):
        log.append([records.assign_offset(batch, 3)], now_ms=0)
    with pytest.raises(ValueError, match="one whole batch"):
        log.append([batch + b"x"], now_ms=0)
    big = record_builder.encode_batch([Record(0, 0, b"k", b"v" * 300)], base_offset=0)
    with pytest.raises(BrokerError, match="exceeds the maximum configured segment size of 200") as excinfo:
        log.append([big], now_ms=0)
    assert excinfo.value.code == ErrorCode.RECORD_LIST_TOO_LARGE
    assert log.log_end_offset == 0 and log.size_bytes() == 0


def test_flush_every_append_and_several_batches_per_call(make_log: LogFactory) -> None:
    log = make_log(flush_messages=1)
    batches = [record_builder.encode_batch([Record(i, 0, b"k", b"v")], base_offset=i) for i in range(3)]
    assert log.append(batches, now_ms=0) == 3
    assert batch_bases(log.read(0, 1 << 20)) == [0, 1, 2]


def test_flush_messages_counts_records_not_batches(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(flush_messages=5)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(log.log_end_offset), real_fsync(fd)))
    for _ in range(6):
        append(log, 2)  # 5 or more records unsynced first at offset 6, then at 12 (4 at 10)
    assert synced == [6, 12]


def test_iter_batches_is_a_snapshot(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300)
    for _ in range(6):
        append(log, 2)
    iterator = log.iter_batches(from_offset=5)
    append(log, 2)
    assert [header.base_offset for header, _ in iterator] == [4, 6, 8, 10]


def test_closed_log_refuses_use_and_close_is_idempotent(make_log: LogFactory) -> None:
    log = make_log()
    log.close()
    log.close()
    with pytest.raises(RuntimeError, match="closed"):
        log.read(0, 10)


# ---- recovery ----------------------------------------------------------------------------------


def test_clean_reopen_keeps_everything(make_log: LogFactory, tmp_path: Path) -> None:
    log = make_log(segment_bytes=400, index_interval_bytes=0)
    for _ in range(15):
        append(log, 2)
    expected = log.read(0, 1 << 20)
    log.close()
    assert (log.directory / ".clean_shutdown").exists()
    reopened = make_log(segment_bytes=400, index_interval_bytes=0)
    assert not (log.directory / ".clean_shutdown").exists()
    assert reopened.log_end_offset == 30
    assert reopened.read(0, 1 << 20) == expected
    assert batch_bases(reopened.read(17, 1)) == [16]


def test_clean_reopen_reads_only_the_tail_of_the_active_segment(
    make_log: LogFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Kafka after a clean shutdown: the active segment's index files are trusted and only the
    batches after its last index entry are read (LogSegment.readNextOffset), never the whole file."""
    log = make_log(index_interval_bytes=512)
    for _ in range(200):
        append(log, 3)
    log.close()
    segment_size = (log.directory / "00000000000000000000.log").stat().st_size
    scanned: list[int] = []
    scan = log_recovery.scan_batches

    def counting_scan(fd: int, start: int, end: int, *, validate_crc: bool) -> Iterator[Any]:
        for position, header, batch in scan(fd, start, end, validate_crc=validate_crc):
            scanned.append(header.size)
            yield position, header, batch

    monkeypatch.setattr(log_recovery, "scan_batches", counting_scan)
    reopened = make_log(index_interval_bytes=512)
    assert reopened.log_end_offset == 600
    assert 0 < sum(scanned) < 2 * 512 < segment_size


def test_clean_reopen_of_the_active_segment_continues_it_as_if_it_had_never_closed(
    make_log: LogFactory, tmp_path: Path
) -> None:
    """Appending after a clean reopen gives the same log and index files, byte for byte, as appending
    without the restart: the bytes since the last index entry and the segment's max timestamp are
    restored, not reset."""
    for name, restart in (("straight-0", False), ("restarted-0", True)):
        log = make_log(tmp_path / name, index_interval_bytes=300)
        for step in range(40):
            append(log, 2, timestamp=1000 + 7 * (step % 5))
            if restart and step == 22:
                log.close()
                log = make_log(tmp_path / name, index_interval_bytes=300)
        log.close()
    for suffix in (".log", ".index", ".timeindex"):
        name = f"00000000000000000000{suffix}"
        assert (tmp_path / "straight-0" / name).read_bytes() == (tmp_path / "restarted-0" / name).read_bytes()


def test_segment_ms_after_a_clean_reopen_still_counts_from_the_first_batch(make_log: LogFactory) -> None:
    log = make_log(segment_ms=1000, index_interval_bytes=100)
    append(log, 1, timestamp=5000, now_ms=10**9)
    for _ in range(20):  # index entries, so that the reopen does not read the first batch as tail
        append(log, 1, timestamp=5500, now_ms=10**9)
    log.close()
    reopened = make_log(segment_ms=1000, index_interval_bytes=100)
    append(reopened, 1, timestamp=6001, now_ms=10**9)
    assert [int(path.stem) for path in reopened.segment_files()] == [0, 21]


def test_clean_reopen_rescans_an_active_segment_whose_tail_is_damaged(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(index_interval_bytes=200)
    for _ in range(30):
        append(log, 2)
    good = log.read(0, 1 << 20)
    log.close()
    with open(log.directory / "00000000000000000000.log", "ab") as handle:
        handle.write(os.urandom(41))  # written after the index files: not what a clean close leaves
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log(index_interval_bytes=200)
    assert "truncating 41 bytes" in caplog.text
    assert reopened.log_end_offset == 60
    assert reopened.read(0, 1 << 20) == good


@pytest.mark.parametrize("tail", ["half_batch", "garbage", "bad_crc"])
def test_torn_tail_is_truncated_and_every_complete_batch_survives(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: str
) -> None:
    log = make_log()
    for _ in range(5):
        append(log, 3)
    good = log.read(0, 1 << 20)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    segment = crashed / "00000000000000000000.log"
    next_batch = record_builder.encode_batch([Record(15, 0, b"k", b"v" * 50)], base_offset=15)
    with open(segment, "r+b") as handle:
        if tail == "half_batch":
            handle.seek(0, os.SEEK_END)
            handle.write(next_batch[: len(next_batch) // 2])
        elif tail == "garbage":
            handle.seek(0, os.SEEK_END)
            handle.write(os.urandom(37))
        else:  # a complete last batch whose bytes were not all written
            handle.seek(0, os.SEEK_END)
            corrupt = bytearray(next_batch)
            corrupt[-5:] = b"\x00" * 5
            handle.write(corrupt)
    torn_size = segment.stat().st_size
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        recovered = make_log(crashed)
    assert f"truncating {torn_size - len(good)} bytes" in caplog.text
    assert str(segment) in caplog.text
    assert segment.stat().st_size == len(good)
    assert recovered.log_end_offset == 15
    assert recovered.read(0, 1 << 20) == good
    append(recovered, 1)
    assert batch_bases(recovered.read(14, 1 << 20)) == [12, 15]


def test_unclean_open_rescans_all_segments_and_rebuilds_indexes(make_log: LogFactory, tmp_path: Path) -> None:
    log = make_log(segment_bytes=400, index_interval_bytes=0)
    for _ in range(15):
        append(log, 2)
    expected = log.read(0, 1 << 20)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    (crashed / "00000000000000000000.index").write_bytes(b"\x00\x00\x00\x05\x00\x00\x10\x00")  # a wrong entry
    recovered = make_log(crashed, segment_bytes=400, index_interval_bytes=0)
    assert recovered.read(0, 1 << 20) == expected
    for offset in range(30):
        assert batch_bases(recovered.read(offset, 1))[0] == offset - offset % 2


def test_corrupt_middle_segment_is_cut_and_later_segments_kept(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(segment_bytes=400)
    for _ in range(15):
        append(log, 2)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    first = crashed / "00000000000000000000.log"
    size = first.stat().st_size
    with open(first, "r+b") as handle:
        handle.truncate(size - 10)
    # Torn only if the crash came before the log rolled past it (then the recovery point is lower).
    (crashed / "recovery-point").write_text("0\n")
    with caplog.at_level(logging.WARNING):
        recovered = make_log(crashed, segment_bytes=400)
    assert "truncating" in caplog.text
    assert recovered.log_end_offset == 30
    second_base = int(recovered.segment_files()[1].stem)
    assert batch_bases(recovered.read(0, 1 << 20))[-1] == 28
    assert second_base in batch_bases(recovered.read(0, 1 << 20))


def test_an_unclean_start_rescans_only_the_segments_from_the_recovery_point(
    make_log: LogFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's recovery point: a rolled segment was fsynced with its index files, so after a crash
    its index files are trusted; the segments from the last roll on are scanned."""
    log = make_log(segment_bytes=400)
    for _ in range(15):
        append(log, 2)
    expected = log.read(0, 1 << 20)
    bases = [int(path.stem) for path in log.segment_files()]
    assert (log.directory / "recovery-point").read_text().strip() == str(bases[-1])
    crashed = crash_copy(log, tmp_path / "crashed-0")
    crashed_again = crash_copy(log, tmp_path / "crashed-1")
    scanned: list[int] = []
    scanning = PartitionLog._recover_segment

    def spy(self: PartitionLog, segment: Any, next_base: int | None) -> None:
        scanned.append(segment.base_offset)
        scanning(self, segment, next_base)

    monkeypatch.setattr(PartitionLog, "_recover_segment", spy)
    recovered = make_log(crashed, segment_bytes=400)
    assert scanned == [bases[-1]]
    assert recovered.read(0, 1 << 20) == expected
    assert recovered.log_end_offset == 30
    # Without index files a rolled segment is scanned too.
    (crashed_again / f"{bases[1]:020d}.index").unlink()
    scanned.clear()
    assert make_log(crashed_again, segment_bytes=400).read(0, 1 << 20) == expected
    assert scanned == [bases[1], bases[-1]]


def test_a_roll_whose_new_segment_cannot_be_made_durable_leaves_no_empty_segment(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time retention rolls the active segment before deleting it; if the new segment cannot be
    made durable, no empty segment file may stay behind: at the next start it would end the
    previous segment at its base, cutting what was appended there since."""
    log = make_log(retention_ms=60_000)
    append(log, 2, timestamp=1000)
    real = log_module.fsync_directory

    def failing(directory: Path) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(log_module, "fsync_directory", failing)
    with pytest.raises(OSError):
        log.enforce_retention(1000 + 120_000)
    monkeypatch.setattr(log_module, "fsync_directory", real)
    append(log, 2, timestamp=200_000)  # into the segment that stayed active
    assert len(log.segment_files()) == 1
    expected = all_records(log)
    log.close()
    assert all_records(make_log(retention_ms=60_000)) == expected


@pytest.mark.parametrize("content", ["garbage", "\u00b2", "\udcff"])
def test_an_unreadable_recovery_point_means_rescanning_everything(
    make_log: LogFactory, tmp_path: Path, content: str
) -> None:
    log = make_log(segment_bytes=400)
    for _ in range(15):
        append(log, 2)
    expected = all_records(log)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    (crashed / "recovery-point").write_bytes(content.encode("utf-8", errors="surrogateescape"))
    assert all_records(make_log(crashed, segment_bytes=400)) == expected


def test_clean_open_rebuilds_inconsistent_index_files(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=400, index_interval_bytes=0)
    for _ in range(15):
        append(log, 2)
    expected = log.read(0, 1 << 20)
    log.close()
    (log.directory / "00000000000000000000.index").write_bytes(b"\x01\x02\x03")
    (log.directory / "00000000000000000000.timeindex").unlink()
    reopened = make_log(segment_bytes=400, index_interval_bytes=0)
    assert reopened.read(0, 1 << 20) == expected
    assert reopened.offset_for_timestamp(1001) == (1, 1001)


def test_leftovers_of_interrupted_work_are_removed(make_log: LogFactory) -> None:
    log = make_log()
    append(log, 3)
    log.close()
    (log.directory / "00000000000000000000.log.cleaned").write_bytes(b"half written")
    (log.directory / "00000000000000000099.index").write_bytes(b"")
    (log.directory / "log-start-offset.tmp").write_bytes(b"7")
    reopened = make_log()
    names = sorted(path.name for path in reopened.directory.iterdir())
    assert names == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "log-start-offset",
    ]
    assert reopened.log_end_offset == 3


def test_bad_checkpoint_and_config_are_rejected_with_a_fix(make_log: LogFactory, tmp_path: Path) -> None:
    directory = tmp_path / "bad-0"
    directory.mkdir()
    (directory / "log-start-offset").write_text("twelve")
    with pytest.raises(ValueError, match="fix or delete it"):
        make_log(directory)
    with pytest.raises(ValueError, match="cleanup_policy"):
        LogConfig(cleanup_policy="forever")
    with pytest.raises(ValueError, match="segment_bytes"):
        LogConfig(segment_bytes=10)
    with pytest.raises(ValueError, match="retention_ms"):
        LogConfig(retention_ms=-2)
    with pytest.raises(ValueError, match="flush_messages"):
        LogConfig(flush_messages=0)


# ---- lookups by time ---------------------------------------------------------------------------


def test_offset_for_timestamp(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300, index_interval_bytes=0)
    for timestamp in (100, 200, 150, 400, 300, 500):  # two records each: t and t+1
        append(log, 2, timestamp=timestamp)
    assert log.offset_for_timestamp(0) == (0, 100)
    assert log.offset_for_timestamp(101) == (1, 101)
    assert log.offset_for_timestamp(102) == (2, 200)
    assert log.offset_for_timestamp(250) == (6, 400)
    assert log.offset_for_timestamp(401) == (7, 401)
    assert log.offset_for_timestamp(402) == (10, 500)
    assert log.offset_for_timestamp(502) is None
    log.delete_records_before(3)
    assert log.offset_for_timestamp(0) == (3, 201)


def test_max_timestamp_offset(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300, index_interval_bytes=0)
    assert log.max_timestamp_offset() is None
    for timestamp in (100, 900, 150, 899):
        append(log, 2, timestamp=timestamp)
    assert log.max_timestamp_offset() == (3, 901)
    log.close()
    assert make_log(segment_bytes=300, index_interval_bytes=0).max_timestamp_offset() == (3, 901)


# ---- DeleteRecords and retention ---------------------------------------------------------------


def test_a_log_start_that_cannot_be_checkpointed_does_not_move(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteRecords and retention checkpoint the new log start before serving from it: when the
    write fails (disk full) the request fails and fetches still start where they did."""
    log = make_log(segment_bytes=300, retention_ms=1000)
    for _ in range(5):
        append(log, 2, timestamp=1000)
    append(log, 2, timestamp=10_000)  # the newest segment is not expired: retention deletes a prefix

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(log_module, "write_file_atomically", disk_full)
    with pytest.raises(BrokerError) as refused:
        log.delete_records_before(3)
    assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert log.log_start_offset == 0
    with pytest.raises(BrokerError):
        log.enforce_retention(10_000)
    assert log.log_start_offset == 0
    assert batch_bases(log.read(0, 1 << 20))[0] == 0


def test_delete_records_before(make_log: LogFactory, tmp_path: Path) -> None:
    log = make_log(segment_bytes=300)
    for _ in range(10):
        append(log, 2)
    files_before = log.segment_files()
    second_base = int(files_before[1].stem)
    assert log.delete_records_before(second_base + 1) == second_base + 1
    assert log.segment_files() == files_before[1:]
    assert batch_bases(log.read(second_base + 1, 1))[0] <= second_base + 1
    with pytest.raises(BrokerError) as below:
        log.read(second_base, 10)
    assert below.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.delete_records_before(1) == second_base + 1  # never moves back
    with pytest.raises(BrokerError, match="larger than the log end offset 20") as past_end:
        log.delete_records_before(21)
    assert past_end.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    crashed = crash_copy(log, tmp_path / "crashed-0")
    assert make_log(crashed, segment_bytes=300).log_start_offset == second_base + 1
    assert log.delete_records_before(20) == 20
    assert log.read(20, 10) == b""
    log.close()
    reopened = make_log(segment_bytes=300)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 20)


def test_retention_by_time_drops_the_oldest_expired_segments(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300, retention_ms=DAY_MS)
    for i in range(10):
        append(log, 2, timestamp=1000 + i)
    now = 1000 + DAY_MS + 5  # segments whose newest record is older than 1005 are expired
    files = log.segment_files()
    removed = log.enforce_retention(now)
    assert 1 <= removed < len(files)
    assert log.segment_files() == files[removed:]
    assert log.log_start_offset == int(files[removed].stem)


def test_retention_by_time_expires_the_active_segment_too_and_rolls_an_empty_one(
    make_log: LogFactory, tmp_path: Path
) -> None:
    # Kafka deletes a quiet topic's records once they expire, the active segment's included.
    log = make_log(segment_bytes=300, retention_ms=DAY_MS)
    for i in range(10):
        append(log, 2, timestamp=1000 + i)
    files = log.segment_files()
    # The newest record (1010) is exactly retention_ms old: every segment but the active one expired.
    assert log.enforce_retention(1010 + DAY_MS) == len(files) - 1
    assert log.segment_files() == files[-1:]
    assert log.enforce_retention(1011 + DAY_MS) == 1
    assert (log.log_start_offset, log.log_end_offset) == (20, 20)
    assert [int(path.stem) for path in log.segment_files()] == [20]
    assert log.read(20, 1 << 20) == b""
    with pytest.raises(BrokerError) as below:
        log.read(19, 10)
    assert below.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.enforce_retention(10 * DAY_MS) == 0  # an empty active segment is never deleted
    assert append(log, 1) == 20
    log.close()
    reopened = make_log(segment_bytes=300, retention_ms=DAY_MS)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 21)


def test_retention_by_size_counts_the_active_segment(make_log: LogFactory) -> None:
    log = make_log(retention_ms=-1, retention_bytes=0)
    append(log, 3)
    assert len(log.segment_files()) == 1
    assert log.enforce_retention(0) == 1
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes()) == (3, 3, 0)


# ---- time-based rolling (segment.ms) -------------------------------------------------------------


def test_segment_ms_rolls_once_the_records_are_that_much_newer_than_the_first_batch(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_ms=1000)
    append(log, 1, timestamp=5000, now_ms=10**9)  # the wall clock plays no part while records have times
    append(log, 1, timestamp=6000, now_ms=10**9)  # exactly segment_ms newer: no roll (Kafka's `>`)
    append(log, 1, timestamp=4000)  # older records never roll
    assert len(log.segment_files()) == 1
    append(log, 1, timestamp=6001)
    assert [int(path.stem) for path in log.segment_files()] == [0, 3]
    append(log, 1, timestamp=7001)  # measured from the new segment's first batch (6001)
    assert [int(path.stem) for path in log.segment_files()] == [0, 3]


def test_segment_ms_without_record_timestamps_counts_from_when_the_segment_was_opened(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_ms=1000, segment_bytes=10_000)
    append(log, 1, timestamp=-1, now_ms=50_000)
    append(log, 1, timestamp=-1, now_ms=50_500)
    assert len(log.segment_files()) == 1  # opened at the wall clock's now, long after 50_000 ms
    append(log, 1, timestamp=-1, now_ms=int(1e13))
    rolled_at = int(1e13)
    assert [int(path.stem) for path in log.segment_files()] == [0, 2]
    append(log, 1, timestamp=-1, now_ms=rolled_at + 1000)
    assert len(log.segment_files()) == 2
    append(log, 1, timestamp=-1, now_ms=rolled_at + 1001)  # the rolled segment was opened at rolled_at
    assert [int(path.stem) for path in log.segment_files()] == [0, 2, 4]


def test_size_retention_runs_first_and_time_retention_on_what_it_left(make_log: LogFactory) -> None:
    # One batch per segment (each batch is larger than half a segment); timestamps out of order.
    log = make_log(segment_bytes=400, retention_ms=DAY_MS)
    for timestamp in (5 * DAY_MS, 1000, 1000, 5 * DAY_MS):
        append(log, 1, timestamp=timestamp, values=[b"x" * 250])
    files = log.segment_files()
    assert len(files) == 4
    log.config.retention_bytes = log.size_bytes() - os.path.getsize(files[0])
    # Size takes the first segment; then the next two are the oldest and past retention_ms.
    assert log.enforce_retention(1001 + DAY_MS) == 3
    assert log.segment_files() == files[3:]


def test_max_compaction_lag_counts_among_the_configs_the_broker_acts_on() -> None:
    """It rolls a compacted topic's segments (next test), so a topic created with it is not told
    that the broker ignores it."""
    from sparkafka.broker.topic_configs import inert_configs

    configs = {"max.compaction.lag.ms": "1000", "compression.type": "zstd", "retention.ms": "1"}
    assert inert_configs(configs) == ["compression.type"]


def test_a_compacted_topic_also_rolls_by_max_compaction_lag(make_log: LogFactory) -> None:
    compacted = make_log(cleanup_policy="compact", segment_ms=10_000, max_compaction_lag_ms=1000)
    deleting = make_log(compacted.directory.parent / "d-0", segment_ms=10_000, max_compaction_lag_ms=1000)
    for log in (compacted, deleting):
        append(log, 1, timestamp=5000)
        append(log, 1, timestamp=6001)
    assert (len(compacted.segment_files()), len(deleting.segment_files())) == (2, 1)


def test_segment_jitter_rolls_earlier_by_a_random_amount_per_segment(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[int] = []

    def randrange(stop: int) -> int:
        drawn.append(stop)
        return stop - 1

    monkeypatch.setattr("sparkafka.broker.log.random.randrange", randrange)
    log = make_log(segment_ms=1000, segment_jitter_ms=5000)
    assert drawn == [1000]  # the jitter is drawn below min(segment_jitter_ms, segment_ms)
    append(log, 1, timestamp=5000)
    append(log, 1, timestamp=5002)  # 2 ms newer > 1000 - 999
    assert len(log.segment_files()) == 2
    assert drawn == [1000, 1000]
    make_log(log.directory.parent / "other-0", segment_ms=1000)
    assert drawn == [1000, 1000]  # no jitter configured, none drawn


def test_retention_by_size(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300, retention_ms=-1, retention_bytes=700)
    for _ in range(12):
        append(log, 2)
    assert log.enforce_retention(0) > 0
    assert log.size_bytes() >= 700
    assert log.size_bytes() - os.path.getsize(log.segment_files()[0]) < 700
    compact_only = make_log(log.directory.parent / "other-0", cleanup_policy="compact", retention_bytes=0)
    assert compact_only.enforce_retention(0) == 0


def test_a_full_index_rolls_the_segment(make_log: LogFactory) -> None:
    """Kafka's LogSegment.shouldRoll: a segment whose offset or time index is full (segment.index.bytes)
    rolls, whatever its size."""
    log = make_log(segment_index_bytes=24, index_interval_bytes=0)  # 3 offset, 2 time index entries
    for i in range(12):
        append(log, 1, timestamp=1000 + i)
    segments = log.segment_files()
    assert len(segments) == 4
    log.close()
    assert all(os.path.getsize(path.with_suffix(".timeindex")) <= 24 for path in segments)
    assert [r.offset for r in all_records(make_log(segment_index_bytes=24, index_interval_bytes=0))] == list(
        range(12)
    )


# ---- compaction --------------------------------------------------------------------------------


def compacted_log(make_log: LogFactory, **config: Any) -> PartitionLog:
    return make_log(segment_bytes=250, cleanup_policy="compact", **config)


def test_compaction_keeps_only_the_newest_value_per_key_with_original_offsets(make_log: LogFactory) -> None:
    log = compacted_log(make_log)
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    before = all_records(log)
    active_base = int(log.segment_files()[-1].stem)
    removed = log.compact(now_ms=0)
    after = all_records(log)
    # Kafka maps keys up to the first uncleanable offset (here the active segment's base): newer
    # records in the active segment do not supersede yet.
    newest = {record.key: record.offset for record in before if record.offset < active_base}
    expected = [r for r in before if r.offset >= active_base or newest[r.key] == r.offset]
    assert after == expected
    assert removed == len(before) - len(after)
    assert log.log_end_offset == 12
    assert batch_bases(log.read(0, 1 << 20))[0] == after[0].offset
    assert log.compact(now_ms=0) == 0  # already clean
    log.close()
    assert all_records(make_log(segment_bytes=250, cleanup_policy="compact")) == expected


def test_a_segment_emptied_by_compaction_keeps_its_age_for_time_retention(make_log: LogFactory) -> None:
    """Kafka's Cleaner keeps a cleaned segment's last-modified time. Time retention falls back to it
    for a segment with no record left, so the segment emptied by compaction still expires on time
    instead of holding back retention for another retention.ms."""
    hour_ms = 3_600_000
    log = make_log(segment_bytes=250, cleanup_policy="compact,delete", retention_ms=hour_ms)
    for i in range(4):
        append(log, 1, keys=[b"gone"], values=[b"v%d" % i])
    append(log, 1, keys=[b"gone"], values=[None])  # the key's tombstone, newer than all of them
    for i in range(8):
        append(log, 1, keys=[b"other%d" % i], values=[b"x"])
    fifty_minutes_ago_s = time.time() - 50 * 60
    for path in log.directory.glob("*.log"):
        os.utime(path, (fifty_minutes_ago_s, fifty_minutes_ago_s))
    first_segment = log.segment_files()[0]
    log.compact(now_ms=0)
    assert os.path.getsize(first_segment) == 0, "the test needs a segment compaction emptied"
    assert abs(os.path.getmtime(first_segment) - fifty_minutes_ago_s) < 1
    now_ms = int(time.time() * 1000)
    assert log.enforce_retention(now_ms) == 0  # 50 minutes old: kept
    assert log.enforce_retention(now_ms + 15 * 60 * 1000) > 0  # 65 minutes old: gone
    assert log.log_start_offset > 0


def test_compaction_keeps_tombstones_until_their_delete_horizon(make_log: LogFactory) -> None:
    log = compacted_log(make_log, delete_retention_ms=1000)
    append(log, 1, keys=[b"gone"], values=[b"old"])
    append(log, 1, keys=[b"gone"], values=[None])
    for i in range(8):
        append(log, 1, keys=[b"other%d" % i], values=[b"x"])
    log.compact(now_ms=50_000)
    tombstone = [r for r in all_records(log) if r.key == b"gone"]
    assert tombstone == [Record(1, 1000, b"gone", None)]
    [horizon] = [h.delete_horizon_ms for h, _ in log.iter_batches() if h.base_offset == 1]
    assert horizon == 51_000
    log.compact(now_ms=50_999)
    assert [r.key for r in all_records(log)].count(b"gone") == 1
    log.compact(now_ms=51_000)
    assert b"gone" not in [r.key for r in all_records(log)]


def test_compaction_removes_aborted_data_without_losing_committed_values(make_log: LogFactory) -> None:
    log = compacted_log(make_log)
    append(log, 1, keys=[b"k"], values=[b"committed"])
    append(log, 1, keys=[b"k"], values=[b"aborted"], producer_id=7, transactional=True)
    end_transaction(log, 7, commit=False)
    append(log, 1, keys=[b"j"], values=[b"txn-committed"], producer_id=8, transactional=True)
    end_transaction(log, 8, commit=True)
    for i in range(10):
        append(log, 1, keys=[b"filler%d" % i], values=[b"x"])
    log.compact(now_ms=0)
    kept = {(r.key, r.value) for r in all_records(log)}
    assert (b"k", b"committed") in kept
    assert (b"k", b"aborted") not in kept
    assert (b"j", b"txn-committed") in kept
    markers = [records.control_marker(b) for h, b in log.iter_batches() if h.is_control]
    assert markers == [("ABORT", 0), ("COMMIT", 0)]  # control batches are kept
    # The aborted batch was producer 7's last data batch: an empty header keeps its sequence range.
    [empty] = [h for h, _ in log.iter_batches() if h.producer_id == 7 and not h.is_control]
    assert (empty.record_count, empty.base_offset, empty.last_offset, empty.base_sequence) == (0, 1, 1, 1)


def test_markers_of_transactions_whose_records_are_gone_are_removed_after_their_horizon(
    make_log: LogFactory,
) -> None:
    """Kafka's CleanedTransactionMetadata and checkBatchRetention: a pass that traverses none of a
    transaction's data batches gives its marker a delete horizon (now + delete.retention.ms); the
    first pass after the horizon removes it. Markers of transactions with data left stay."""
    log = compacted_log(make_log, delete_retention_ms=1000)
    append(log, 1, keys=[b"k"], values=[b"v1"], producer_id=7, transactional=True)
    end_transaction(log, 7, commit=True)  # offset 1
    append(log, 1, keys=[b"a"], values=[b"aborted"], producer_id=8, transactional=True)
    end_transaction(log, 8, commit=False)  # offset 3
    append(log, 1, keys=[b"k"], values=[b"v2"], producer_id=7, transactional=True)
    end_transaction(log, 7, commit=True)  # offset 5
    append(log, 1, keys=[b"b"], values=[b"kept"], producer_id=8, transactional=True)
    end_transaction(log, 8, commit=True)  # offset 7
    for i in range(10):
        append(log, 1, keys=[b"f%d" % i], values=[b"x"])

    def markers() -> list[tuple[int, int | None]]:
        return [(h.base_offset, h.delete_horizon_ms) for h, _ in log.iter_batches() if h.is_control]

    log.compact(now_ms=10_000)  # removes v1 and the aborted record; this pass still traversed them
    assert markers() == [(1, None), (3, None), (5, None), (7, None)]
    log.compact(now_ms=20_000)  # nothing of those two transactions left: their markers get horizons
    assert markers() == [(1, 21_000), (3, 21_000), (5, None), (7, None)]
    log.compact(now_ms=20_999)
    assert [offset for offset, _ in markers()] == [1, 3, 5, 7]
    log.compact(now_ms=21_000)
    assert markers() == [(5, None), (7, None)]
    assert {(r.key, r.value) for r in all_records(log) if r.key in (b"k", b"a", b"b")} == {
        (b"k", b"v2"),
        (b"b", b"kept"),
    }
    log.close()
    reopened = compacted_log(make_log, delete_retention_ms=1000)
    assert [h.base_offset for h, _ in reopened.iter_batches() if h.is_control] == [5, 7]
    assert reopened.log_end_offset == 18


def test_is_aborted_callback_marks_more_batches_aborted(make_log: LogFactory) -> None:
    log = compacted_log(make_log)
    append(log, 1, keys=[b"k"], values=[b"old"])
    append(log, 1, keys=[b"k"], values=[b"new"], producer_id=3, transactional=True)
    end_transaction(log, 3, commit=True)
    for i in range(10):
        append(log, 1, keys=[b"f%d" % i], values=[b"x"])
    calls: list[tuple[int, int]] = []

    def is_aborted(producer_id: int, offset: int) -> bool:
        calls.append((producer_id, offset))
        return True

    log.compact(now_ms=0, is_aborted=is_aborted)
    assert calls == [(3, 1)]
    assert {(r.key, r.value) for r in all_records(log) if r.key == b"k"} == {(b"k", b"old")}


def test_open_transaction_neither_supersedes_nor_is_removed(make_log: LogFactory) -> None:
    log = compacted_log(make_log)
    append(log, 1, keys=[b"k"], values=[b"committed"])
    append(log, 1, keys=[b"k"], values=[b"pending"], producer_id=5, transactional=True)
    for i in range(10):
        append(log, 1, keys=[b"k"], values=[b"later-%d" % i])  # past the stable bound: cannot supersede yet
    assert log.compact(now_ms=0) == 0
    assert len(all_records(log)) == 12


def test_compaction_keeps_each_batch_codec(make_log: LogFactory) -> None:
    log = compacted_log(make_log)
    append(log, 4, keys=[b"a", b"b", b"c", b"d"], values=[b"1" * 40] * 4, compression=1)
    for _ in range(6):
        append(log, 2, keys=[b"a", b"b"], values=[b"2", b"3"])
    log.compact(now_ms=0)
    first_header, first_batch = next(iter(log.iter_batches()))
    assert first_header.compression == 1
    assert [r.key for r in records.decode_records(first_batch)] == [b"c", b"d"]
    assert first_header.last_offset == 3  # original offset range kept


def test_compaction_respects_min_compaction_lag(make_log: LogFactory) -> None:
    log = compacted_log(make_log, min_compaction_lag_ms=10_000)
    for i in range(12):
        append(log, 1, keys=[b"k"], values=[b"v%d" % i], timestamp=1000 + i * 1000)
    assert log.compact(now_ms=1000 + 4_000 + 10_000) > 0
    remaining = [r.value for r in all_records(log)]
    assert b"v0" not in remaining and b"v5" in remaining  # records younger than the lag stay
    assert make_log(log.directory.parent / "delete-0").compact(now_ms=0) == 0  # delete policy: no-op


def test_how_dirty_a_compacted_log_is_follows_kafkas_cleaner_checkpoint(make_log: LogFactory) -> None:
    """Kafka's LogCleanerManager: the dirty part runs from the cleaner checkpoint to the segment
    holding the first uncleanable offset; a pass moves the checkpoint, and it survives a restart."""
    log = compacted_log(make_log)
    for i in range(4):
        append(log, 1, keys=[b"kept%d" % i], values=[b"x"])  # stay in the cleaned part
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    segments = log.segment_files()
    active_base = int(segments[-1].stem)
    closed_bytes = sum(os.path.getsize(path) for path in segments[:-1])
    never_cleaned = log.cleanable_range(0, log.log_end_offset)
    assert never_cleaned is not None
    assert (never_cleaned.first_dirty_offset, never_cleaned.first_uncleanable_offset) == (0, active_base)
    assert (never_cleaned.clean_bytes, never_cleaned.cleanable_bytes) == (0, closed_bytes)
    assert never_cleaned.cleanable_ratio == 1.0 and never_cleaned.due(0.5) and not never_cleaned.overdue
    log.compact(now_ms=0)
    cleaned = log.cleanable_range(0, log.log_end_offset)
    assert cleaned is not None and cleaned.first_dirty_offset == active_base
    assert cleaned.cleanable_bytes == 0 and not cleaned.due(0.0)
    # New closed segments are dirty; how dirty against the cleaned part decides whether it is due.
    while len(log.segment_files()) < len(segments) + 2:
        append(log, 1, keys=[b"k%d" % (log.log_end_offset % 3)], values=[b"new"])
    dirtier = log.cleanable_range(0, log.log_end_offset)
    assert dirtier is not None and dirtier.first_dirty_offset == active_base and dirtier.cleanable_bytes > 0
    ratio = dirtier.cleanable_ratio
    assert 0 < ratio < 1 and dirtier.due(ratio - 0.01) and not dirtier.due(ratio)
    # Nothing at or past the last stable offset is cleanable: an open transaction holds the rest.
    held = log.cleanable_range(0, active_base)
    assert held is not None and held.cleanable_bytes == 0
    log.close()
    reopened = compacted_log(make_log)
    assert reopened.cleanable_range(0, reopened.log_end_offset) == dirtier
    # Retention or DeleteRecords past the checkpoint: the dirty part starts at the log start.
    reopened.delete_records_before(active_base + 1)
    moved = reopened.cleanable_range(0, reopened.log_end_offset)
    assert moved is not None and moved.first_dirty_offset == active_base + 1


def test_a_pass_cleans_what_the_cleaner_weighed_and_never_moves_the_checkpoint_back(
    make_log: LogFactory,
) -> None:
    """min.compaction.lag.ms counts only from the dirty part on, as in Kafka's cleanableOffsets: a
    cleaned segment holding a record stamped in the future does not hold the pass back."""
    log = compacted_log(make_log)
    append(log, 1, keys=[b"future"], values=[b"x"], timestamp=10**12)
    for i in range(6):
        append(log, 1, keys=[b"k%d" % (i % 2)], values=[b"old%d" % i])
    log.compact(now_ms=0)
    weighed = log.cleanable_range(0, log.log_end_offset)
    assert weighed is not None
    cleaned_up_to = weighed.first_dirty_offset
    for i in range(6):
        append(log, 1, keys=[b"k%d" % (i % 2)], values=[b"new%d" % i])
    log.config = LogConfig(segment_bytes=250, cleanup_policy="compact", min_compaction_lag_ms=60_000)
    now_ms = 10_000 + 60_000  # the new records (timestamp 1000) are old enough, the future one is not
    dirty = log.cleanable_range(now_ms, log.log_end_offset)
    assert dirty is not None and dirty.first_dirty_offset == cleaned_up_to and dirty.cleanable_bytes > 0
    assert log.compact(now_ms=now_ms, up_to=dirty.first_uncleanable_offset) > 0
    after = log.cleanable_range(now_ms, log.log_end_offset)
    assert after is not None and after.first_dirty_offset == dirty.first_uncleanable_offset > cleaned_up_to
    values = [r.value for r in all_records(log) if r.offset < dirty.first_uncleanable_offset]
    assert not any(v.startswith(b"old") for v in values if v is not None)


def test_a_compacted_log_is_overdue_once_a_dirty_segment_is_older_than_max_compaction_lag(
    make_log: LogFactory,
) -> None:
    log = compacted_log(make_log, max_compaction_lag_ms=60_000)
    for i in range(6):
        append(log, 1, keys=[b"k"], values=[b"v%d" % i], timestamp=10_000 + i)
    assert len(log.segment_files()) > 1
    young = log.cleanable_range(70_000, log.log_end_offset)
    old = log.cleanable_range(70_001, log.log_end_offset)
    assert young is not None and not young.overdue
    assert old is not None and old.overdue and old.due(1.0)  # due whatever the ratio
    log.close()
    reopened = compacted_log(make_log, max_compaction_lag_ms=60_000)  # first batches read from disk
    again = reopened.cleanable_range(70_001, reopened.log_end_offset)
    assert again is not None and again.overdue


def test_an_unreadable_cleaner_checkpoint_makes_the_whole_log_dirty(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    log = compacted_log(make_log)
    for i in range(8):
        append(log, 1, keys=[b"k%d" % i], values=[b"v%d" % i])
    log.compact(now_ms=0)
    log.close()
    (log.directory / "cleaner-offset-checkpoint").write_text("garbage\n")
    with caplog.at_level(logging.WARNING):
        reopened = compacted_log(make_log)
    assert "cleaner-offset-checkpoint should hold one non-negative integer" in caplog.text
    dirty = reopened.cleanable_range(0, reopened.log_end_offset)
    assert dirty is not None and dirty.first_dirty_offset == 0


def test_appends_and_retention_go_on_while_a_cleaning_pass_runs(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass holds the log's lock only to take its views and to swap a cleaned segment in. A
    segment DeleteRecords removed meanwhile is not brought back: its cleaned copy is dropped."""
    log = compacted_log(make_log)
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    first, second = (int(path.stem) for path in log.segment_files()[:2])
    active_base = int(log.segment_files()[-1].stem)
    appended: list[int] = []
    mapping_keys = PartitionLog._latest_offsets

    def meanwhile(self: PartitionLog, *args: Any) -> dict[bytes, int]:
        other = threading.Thread(
            target=lambda: appended.append(append(log, 1, keys=[b"late"], values=[b"x"]))
        )
        other.start()
        other.join(10)
        assert not other.is_alive(), "an append waited for the cleaning pass"
        log.delete_records_before(second)  # the first segment goes
        return mapping_keys(self, *args)

    monkeypatch.setattr(PartitionLog, "_latest_offsets", meanwhile)
    log.compact(now_ms=0)
    assert appended == [12]
    assert int(log.segment_files()[0].stem) == second != first
    assert not (log.directory / f"{first:020d}.log").exists()
    assert not list(log.directory.glob("*.cleaned"))
    kept = all_records(log)
    assert [r.value for r in kept if r.key == b"late"] == [b"x"]
    cleaned = [r for r in kept if r.offset < active_base]  # the pass's active segment was not cleaned
    assert cleaned and len({r.key for r in cleaned}) == len(cleaned)  # one record per key


def test_a_log_closed_during_a_cleaning_pass_is_left_as_it_was(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = compacted_log(make_log)
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    before = all_records(log)
    mapping_keys = PartitionLog._latest_offsets

    def closing(self: PartitionLog, *args: Any) -> dict[bytes, int]:
        log.close()
        return mapping_keys(self, *args)

    monkeypatch.setattr(PartitionLog, "_latest_offsets", closing)
    assert log.compact(now_ms=0) == 0
    assert not list(log.directory.glob("*.cleaned"))
    monkeypatch.undo()
    assert all_records(compacted_log(make_log)) == before


def shrunk_log(make_log: LogFactory) -> PartitionLog:
    """A compacted log cleaned once: many closed segments, each left with one record of its own."""
    log = compacted_log(make_log)
    for i in range(36):  # three records a segment: one with a key of its own, two overwritten later
        append(log, 1, keys=[b"own%d" % i if i % 3 == 0 else b"k%d" % (i % 2)], values=[b"v%d" % i])
    log.compact(now_ms=0)
    for i in range(8):  # the log is dirty again; these roll the segments above
        append(log, 1, keys=[b"new%d" % i], values=[b"x"])
    return log


def test_compaction_merges_the_segments_it_shrank(make_log: LogFactory) -> None:
    """Kafka's groupSegmentsBySize: consecutive segments whose sizes add up to at most segment.bytes
    are cleaned into one, named after the first; offsets, records and reads stay as they were."""
    log = shrunk_log(make_log)
    before = all_records(log)
    segments_before = log.segment_files()
    active_base = int(segments_before[-1].stem)
    start, end = log.log_start_offset, log.log_end_offset
    log.compact(now_ms=0)
    after = all_records(log)
    newest = {r.key: r.offset for r in before if r.offset < active_base}
    assert after == [r for r in before if r.offset >= active_base or newest[r.key] == r.offset]
    assert len(log.segment_files()) < len(segments_before) - 3
    assert int(log.segment_files()[0].stem) == int(segments_before[0].stem)
    assert all(os.path.getsize(path) <= 250 for path in log.segment_files())
    assert (log.log_start_offset, log.log_end_offset) == (start, end)
    for record in after:  # every record is found where a fetch from its offset starts
        assert batch_bases(log.read(record.offset, 1 << 20))[0] <= record.offset
    log.close()
    assert all_records(compacted_log(make_log)) == after


def test_a_merge_whose_deletions_fail_keeps_the_log_readable_and_recovers_on_the_next_start(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = shrunk_log(make_log)
    reference = all_records(log)

    def failing(self: PartitionLog, segment: Any) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(PartitionLog, "_remove_merged_files", failing)
    log.compact(now_ms=0)
    monkeypatch.undo()
    after = all_records(log)  # the log reads its merged files (the old ones are still on disk)
    assert {(r.offset, r.key) for r in after} <= {(r.offset, r.key) for r in reference}
    log.close()
    assert not (log.directory / ".clean_shutdown").exists()  # the next start must recover
    reopened = compacted_log(make_log)
    found = [(r.offset, r.key, r.value) for r in all_records(reopened)]
    assert len(found) == len(set(found)) and [o for o, *_ in found] == sorted(o for o, *_ in found)
    assert {(r.offset, r.key, r.value) for r in after} <= set(found)


def test_a_merged_index_holds_no_more_entries_than_segment_index_bytes(make_log: LogFactory) -> None:
    """Segments written without index entries (a large index.interval.bytes), then merged once the
    interval was lowered: the merged file's index is made sparser rather than overflow."""
    log = make_log(segment_bytes=400, cleanup_policy="compact", index_interval_bytes=1 << 20)
    for i in range(60):
        append(log, 1, keys=[b"own%d" % i if i % 2 else b"k"], values=[b"v%d" % i])
    log.config = LogConfig(
        segment_bytes=2000, cleanup_policy="compact", index_interval_bytes=0, segment_index_bytes=40
    )
    log.compact(now_ms=0)
    log.close()
    merged = [path for path in log.segment_files() if os.path.getsize(path) > 400]
    assert merged, "the test needs a merged segment"
    for path in log.segment_files():
        assert os.path.getsize(path.with_suffix(".index")) <= 40
        assert os.path.getsize(path.with_suffix(".timeindex")) <= 40 + 12  # Kafka's roll adds one


def test_a_group_retention_took_meanwhile_stays_dirty(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of a group the pass could not install were not cleaned: the checkpoint stays
    before them."""
    log = compacted_log(make_log)
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    second = int(log.segment_files()[1].stem)
    mapping_keys = PartitionLog._latest_offsets

    def meanwhile(self: PartitionLog, *args: Any) -> dict[bytes, int]:
        log.delete_records_before(second)  # the first group loses its first segment
        return mapping_keys(self, *args)

    monkeypatch.setattr(PartitionLog, "_latest_offsets", meanwhile)
    log.compact(now_ms=0)
    dirty = log.cleanable_range(0, log.log_end_offset)
    assert dirty is not None and dirty.first_dirty_offset == log.log_start_offset == second


@pytest.mark.parametrize("deleted_before_the_crash", [0, 1])
def test_a_merge_cut_short_by_a_crash_loses_and_repeats_nothing(
    make_log: LogFactory,
    open_logs: list[PartitionLog],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    deleted_before_the_crash: int,
) -> None:
    """The merged file is in place before the segments it replaces go, first to last: recovery cuts
    it at the next remaining segment's base, and each record is there once."""
    log = shrunk_log(make_log)
    before = {(r.offset, r.key, r.value) for r in all_records(log)}
    reference = make_log(
        crash_copy(log, tmp_path / "reference-0"), segment_bytes=250, cleanup_policy="compact"
    )
    reference.compact(now_ms=0)
    kept = {(r.offset, r.key, r.value) for r in all_records(reference)}
    deleting = PartitionLog._remove_merged_files
    deleted: list[int] = []

    def crash_while_deleting(self: PartitionLog, segment: Any) -> None:
        if len(deleted) == deleted_before_the_crash:
            crash_copy(self, tmp_path / "crashed-0")
            raise KeyboardInterrupt  # what is on disk now is the crash's
        deleted.append(segment.base_offset)
        deleting(self, segment)

    monkeypatch.setattr(PartitionLog, "_remove_merged_files", crash_while_deleting)
    with pytest.raises(KeyboardInterrupt):
        log.compact(now_ms=0)
    monkeypatch.undo()
    open_logs.remove(log)  # "crashed": never closed
    recovered = make_log(tmp_path / "crashed-0", segment_bytes=250, cleanup_policy="compact")
    found = [(r.offset, r.key, r.value) for r in all_records(recovered)]
    assert len(found) == len(set(found)), "a record is there twice"
    offsets = [offset for offset, *_ in found]
    assert offsets == sorted(offsets)
    assert kept <= set(found) <= before  # all the pass keeps; at worst some it was removing
    assert recovered.log_end_offset == log.log_end_offset


def test_crash_during_compaction_loses_nothing(make_log: LogFactory, tmp_path: Path) -> None:
    log = compacted_log(make_log)
    for i in range(12):
        append(log, 1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i])
    before = all_records(log)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    # Interrupted before the rename: a half-written .cleaned next to the intact original.
    (crashed / "00000000000000000000.log.cleaned").write_bytes(log.read(0, 1)[:30])
    recovered = make_log(crashed, segment_bytes=250, cleanup_policy="compact")
    assert all_records(recovered) == before
    assert not (crashed / "00000000000000000000.log.cleaned").exists()
    # Interrupted after the rename, before clean shutdown: rescanned, and compaction can simply run again.
    log.compact(now_ms=0)
    after = all_records(log)
    crashed_after = crash_copy(log, tmp_path / "crashed-1")
    (crashed_after / "00000000000000000000.index").write_bytes(b"\x00\x00\x00\x09\x00\x00\x01\x00")
    recovered_after = make_log(crashed_after, segment_bytes=250, cleanup_policy="compact")
    assert all_records(recovered_after) == after
    assert recovered_after.compact(now_ms=0) == 0


def test_recovery_and_reads_across_scan_chunk_boundaries(make_log: LogFactory, tmp_path: Path) -> None:
    log = make_log(index_interval_bytes=64 * 1024)
    for i in range(2500):  # ~1.2 KB batches: some straddle every 64 KiB header chunk and 1 MiB scan chunk
        append(log, 1, values=[b"%05d" % i * 240])
    big = append(log, 1, values=[os.urandom(1_500_000)])  # larger than one scan chunk
    append(log, 1)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    recovered = make_log(crashed, index_interval_bytes=64 * 1024)
    assert recovered.log_end_offset == 2502
    assert [header.base_offset for header, _ in recovered.iter_batches()] == list(range(2502))
    assert recovered.read(0, 1 << 30) == log.read(0, 1 << 30)
    assert batch_bases(recovered.read(big, 1)) == [big]
    assert batch_bases(recovered.read(1777, 1)) == [1777]


# ---- damaged batches -----------------------------------------------------------------------------


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_a_damaged_batch_in_the_active_segment_after_a_crash_is_cut_with_an_error_naming_the_loss(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log()
    for _ in range(10):
        append(log, 100)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    segment = crashed / "00000000000000000000.log"
    position = flip_byte_in_batch(segment, 600)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        recovered = make_log(crashed)
    assert recovered.log_end_offset == 600
    assert segment.stat().st_size == position
    (message,) = errors_logged(caplog)
    assert message.startswith("crashed-0: recovery found damaged data")
    assert f"at byte {position}" in message
    assert "loses 400 records at offsets 600 to 999" in message
    assert "written at these offsets again" in message


def test_a_torn_last_write_is_only_a_warning(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log()
    for _ in range(3):
        append(log, 10)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    segment = crashed / "00000000000000000000.log"
    segment.write_bytes(segment.read_bytes()[:-20])
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        assert make_log(crashed).log_end_offset == 20
    assert "truncating" in caplog.text
    assert not errors_logged(caplog)


def test_a_damaged_closed_segment_rescanned_after_a_crash_reports_the_gap(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(segment_bytes=2000)
    for _ in range(20):
        append(log, 10)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    (crashed / "recovery-point").write_text("0\n")
    first = crashed / "00000000000000000000.log"
    next_base = int(sorted(crashed.glob("*.log"))[1].stem)
    flip_byte_in_batch(first, 10)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        recovered = make_log(crashed, segment_bytes=2000)
    (message,) = errors_logged(caplog)
    assert f"records at offsets 10 to {next_base - 1}" in message
    assert f"gap before offset {next_base}" in message
    assert batch_bases(recovered.read(0, 1 << 20))[:2] == [0, next_base]


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_a_fetch_never_serves_a_damaged_batch_of_an_older_segment(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, stop: str
) -> None:
    """An older segment is not rescanned at a start (Kafka trusts it below the recovery point, and
    everything after a clean shutdown): its batches are checked when first fetched."""
    log = make_log(segment_bytes=2000)
    for _ in range(20):
        append(log, 10)
    if stop == "clean":
        log.close()
        directory = log.directory
    else:
        directory = crash_copy(log, tmp_path / "crashed-0")
    assert len(list(directory.glob("*.log"))) > 2
    position = flip_byte_in_batch(directory / "00000000000000000000.log", 30)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log(directory, segment_bytes=2000)
        assert not errors_logged(caplog)  # nothing read it yet
        assert reopened.log_end_offset == 200
        # The batches before it are served; the response stops there.
        assert batch_bases(reopened.read(0, 1 << 20)) == [0, 10, 20]
        for offset in (30, 35):
            with pytest.raises(BrokerError) as refused:
                reopened.read(offset, 1 << 20)
            assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
        # What follows it is still served.
        assert batch_bases(reopened.read(40, 1 << 20))[0] == 40
    (message,) = errors_logged(caplog)  # once, not per fetch
    assert f"{directory.name}: the batch at offsets 30 to 39" in message
    assert f"at byte {position}" in message and "CRC" in message


def test_a_fetch_checks_each_unverified_byte_once(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(segment_bytes=2000)
    for _ in range(20):
        append(log, 10)
    checked: list[int] = []
    real = log_module.iter_batches

    def spy(view: Any, **kwargs: Any) -> Any:
        if kwargs.get("validate_crc"):
            checked.append(len(view))
        return real(view, **kwargs)

    monkeypatch.setattr(log_module, "iter_batches", spy)
    log.read(0, 1 << 20)
    assert checked == []  # appended in this process: already checked
    log.close()
    reopened = make_log(segment_bytes=2000)
    closed_bytes = sum(path.stat().st_size for path in reopened.segment_files()[:-1])
    first = reopened.read(0, 1 << 20)
    assert closed_bytes < sum(checked) == len(first)
    checked.clear()
    for offset in (0, 55, 120, 199):
        assert first.endswith(reopened.read(offset, 1 << 20))
    assert checked == []


def test_verified_ranges_merge_and_report_gaps() -> None:
    segment = log_module.Segment(0, Path("x.log"), -1)
    segment.mark_verified(10, 20)
    segment.mark_verified(30, 40)
    assert segment.unverified(0, 50) == [(0, 10), (20, 30), (40, 50)]
    assert segment.unverified(12, 18) == []
    segment.mark_verified(20, 30)
    assert (segment.verified_starts, segment.verified_ends) == ([10], [40])
    segment.mark_verified(0, 5)
    segment.mark_verified(45, 60)
    assert segment.unverified(0, 60) == [(5, 10), (40, 45)]
    segment.mark_verified(2, 50)
    assert (segment.verified_starts, segment.verified_ends) == ([0], [60])


def test_compaction_refuses_to_rewrite_a_damaged_batch(make_log: LogFactory) -> None:
    log = make_log(segment_bytes=300, cleanup_policy="compact")
    for _ in range(12):
        append(log, 2, keys=[b"k", b"k"])
    log.close()
    flip_byte_in_batch(log.directory / "00000000000000000000.log", 0)
    reopened = make_log(segment_bytes=300, cleanup_policy="compact")
    with pytest.raises(records.CorruptBatchError, match=r"00000000000000000000\.log is damaged"):
        reopened.compact(now_ms=0)
    with pytest.raises(BrokerError) as refused:
        reopened.read(0, 1 << 20)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE


def test_a_damaged_batch_in_the_active_segment_after_a_clean_stop_is_refused_not_cut(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A clean start does not rescan: cutting the damaged batch would take every acknowledged batch
    after it along; a fetch refuses that batch alone."""
    log = make_log()
    for _ in range(10):
        append(log, 10)
    log.close()
    flip_byte_in_batch(log.directory / "00000000000000000000.log", 95)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log()
        assert reopened.log_end_offset == 100
        append(reopened, 10)
        assert batch_bases(reopened.read(0, 1 << 20))[-1] == 80
        with pytest.raises(BrokerError) as refused:
            reopened.read(90, 1 << 20)
        assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
        assert batch_bases(reopened.read(100, 1 << 20)) == [100]
    assert "truncating" not in caplog.text
    assert len(errors_logged(caplog)) == 1


# A batch whose length field was damaged to run past the end of the file looks like a torn write.
# Only a crash can tear a write: after a clean stop it is damage, kept and refused, not cut.


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("damaged", [0, 1, 2])
def test_a_batch_length_running_past_the_end_of_the_active_segment_after_a_clean_stop_is_kept_not_cut(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture, damaged: int
) -> None:
    """Every write was fsynced before the clean-shutdown marker, so nothing is torn: the three
    acknowledged records stay on disk, fetches of the damaged offsets answer CORRUPT_MESSAGE, and
    new records go to a new segment from the log end offset the marker recorded."""
    log = make_log()
    for _ in range(3):
        append(log, 1)
    log.close()
    segment = log.directory / "00000000000000000000.log"
    position = overrun_file_with_batch(segment, damaged)
    stored = segment.read_bytes()
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log()
        assert reopened.log_end_offset == 3
        assert segment.read_bytes() == stored  # not cut: the three records are still there
        if damaged:
            assert batch_bases(reopened.read(0, 1 << 20)) == list(range(damaged))
        for offset in range(damaged, 3):
            with pytest.raises(BrokerError) as refused:
                reopened.read(offset, 1 << 20)
            assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
            assert f"{segment} is corrupt at byte {position}" in str(refused.value)
        append(reopened, 1)
        assert batch_bases(reopened.read(3, 1 << 20)) == [3]
    assert [int(path.stem) for path in reopened.segment_files()] == [0, 3]
    (message,) = errors_logged(caplog)  # at the start, not again per fetch
    assert message.startswith(f"topic-0: {segment} is damaged at byte {position} (")
    assert "the file is kept as it is, not cut" in message
    assert f"offsets {damaged} to 2 lies from that byte on" in message
    assert "CORRUPT_MESSAGE; new records are appended from offset 3 on, in a new segment" in message
    assert not warnings_logged(caplog)
    assert "truncating" not in caplog.text
    # Still there, and still refused, after the next clean restart.
    reopened.close()
    again = make_log()
    assert again.log_end_offset == 4
    assert segment.read_bytes() == stored
    with pytest.raises(BrokerError) as refused:
        again.read(damaged, 1 << 20)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
    assert batch_bases(again.read(3, 1 << 20)) == [3]


@pytest.mark.parametrize(
    ("damaged", "lost"),
    [(2, None), (1, "loses 2 records at offsets 1 to 2"), (0, "loses 3 records at offsets 0 to 2")],
)
def test_a_batch_length_running_past_the_end_of_the_active_segment_after_a_crash(
    make_log: LogFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged: int, lost: str | None
) -> None:
    """After a crash the last batch running past the end of the file is the torn last write: cut
    with a warning. A batch before it is not: the batches written after it are still there, inside
    the bytes its length claims, so it is cut with an ERROR naming what is lost."""
    log = make_log()
    for _ in range(3):
        append(log, 1)
    crashed = crash_copy(log, tmp_path / "crashed-0")
    segment = crashed / "00000000000000000000.log"
    position = overrun_file_with_batch(segment, damaged)
    size = segment.stat().st_size
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        recovered = make_log(crashed)
    assert recovered.log_end_offset == damaged
    assert segment.stat().st_size == position
    if lost is None:
        (warning,) = warnings_logged(caplog)
        assert warning.startswith(f"{segment}: truncating {size - position} bytes after byte {position}")
        assert not errors_logged(caplog)
        return
    (message,) = errors_logged(caplog)
    assert f"recovery found damaged data in {segment} at byte {position}" in message
    assert "so its length is damaged, not torn" in message
    assert lost in message and "new records will be written at these offsets again" in message
    assert not warnings_logged(caplog)


def test_a_clean_stop_marker_without_the_log_end_offset_still_never_takes_damage_for_a_torn_write(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty marker (written before it recorded the log end offset) does not say where the log
    continued past the damage, so the batch is cut, but with an ERROR naming what is lost."""
    log = make_log()
    for _ in range(3):
        append(log, 1)
    log.close()
    assert (log.directory / ".clean_shutdown").read_text() == "3\n"
    (log.directory / ".clean_shutdown").write_bytes(b"")
    segment = log.directory / "00000000000000000000.log"
    overrun_file_with_batch(segment, 0)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log()
    assert reopened.log_end_offset == 0
    (message,) = errors_logged(caplog)
    assert f"recovery found damaged data in {segment} at byte 0" in message
    assert "loses 3 records at offsets 0 to 2" in message
    assert not warnings_logged(caplog)


def test_a_half_batch_appended_after_a_clean_stop_holds_no_record_and_is_cut_with_a_warning(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The log end offset the marker recorded is where the whole batches end: what follows was
    added to the file after the stop and holds nothing the log acknowledged."""
    log = make_log()
    for _ in range(3):
        append(log, 1)
    good = log.read(0, 1 << 20)
    log.close()
    segment = log.directory / "00000000000000000000.log"
    half = record_builder.encode_batch([Record(3, 0, b"k", b"v" * 50)], base_offset=3)[:40]
    with open(segment, "ab") as handle:
        handle.write(half)
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log()
    assert reopened.log_end_offset == 3
    assert reopened.read(0, 1 << 20) == good
    (warning,) = warnings_logged(caplog)
    assert warning.startswith(f"{segment}: truncating 40 bytes after byte {len(good)}")
    assert not errors_logged(caplog)


def test_a_closed_segment_rescanned_after_a_clean_stop_keeps_a_damaged_batch_for_fetches_to_refuse(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Without its index files a segment is rescanned even after a clean stop; the damage found
    then is kept, not cut with everything after it: only the damaged batch is refused."""
    log = make_log(segment_bytes=2000)
    for _ in range(20):
        append(log, 10)
    log.close()
    first = log.directory / "00000000000000000000.log"
    next_base = int(sorted(log.directory.glob("*.log"))[1].stem)
    for suffix in (".index", ".timeindex"):
        first.with_suffix(suffix).unlink()
    position = flip_byte_in_batch(first, 30)
    stored = first.read_bytes()
    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.log"):
        reopened = make_log(segment_bytes=2000)
        assert reopened.log_end_offset == 200
        assert first.read_bytes() == stored
        assert batch_bases(reopened.read(0, 1 << 20)) == [0, 10, 20]
        with pytest.raises(BrokerError) as refused:
            reopened.read(30, 1 << 20)
        assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
        assert batch_bases(reopened.read(40, 1 << 20))[0] == 40
    (message,) = errors_logged(caplog)
    assert message.startswith(f"topic-0: {first} is damaged at byte {position} (")
    assert f"offsets 30 to {next_base - 1} lies from that byte on" in message
    assert "new segment" not in message
    assert not warnings_logged(caplog)
