"""Error paths of sparkafka.broker.log: LogConfig values it refuses, use of a closed log or file
region, appends of malformed batch lists, and segment files damaged on disk as reads, scans and
compaction meet them."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker import log as log_module
from sparkafka.broker import record_builder
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log import PartitionLog
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_segment import FileRegion
from sparkafka.broker.records import CorruptBatchError, Record
from tests.log_damage import flip_byte_in_batch

FIRST_SEGMENT = "00000000000000000000.log"


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[list[PartitionLog]]:
    logs: list[PartitionLog] = []
    yield logs
    for log in logs:
        log.close()


def open_log(logs: list[PartitionLog], directory: Path, **config: Any) -> PartitionLog:
    log = PartitionLog(directory, LogConfig(**config))
    logs.append(log)
    return log


def batch(offset: int, key: bytes = b"key", **options: Any) -> bytes:
    return record_builder.encode_batch([Record(offset, 1_000, key, b"value")], base_offset=offset, **options)


def fill(log: PartitionLog, count: int, key: bytes = b"key") -> None:
    for _ in range(count):
        log.append([batch(log.log_end_offset, key)], now_ms=0)


# ---- LogConfig


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"segment_bytes": 60},
            r"segment_bytes must be between 61 and 2147483647 \(index positions are int32\), got 60",
        ),
        ({"segment_ms": 0}, "segment_ms must be >= 1, got 0"),
        ({"segment_index_bytes": 3}, "segment_index_bytes must be >= 4, got 3"),
        ({"delete_retention_ms": -1}, "delete_retention_ms must be >= 0, got -1"),
        ({"max_message_bytes": -5}, "max_message_bytes must be >= 0, got -5"),
        ({"retention_ms": -2}, "retention_ms must be >= 0, or -1 for no limit, got -2"),
        ({"retention_bytes": -2}, "retention_bytes must be >= 0, or -1 for no limit, got -2"),
        (
            {"cleanup_policy": "compact,archive"},
            r"cleanup_policy must list 'delete', 'compact', both or neither \(''\), got 'compact,archive'",
        ),
        ({"min_cleanable_dirty_ratio": 1.5}, "min_cleanable_dirty_ratio must be between 0 and 1, got 1.5"),
        (
            {"flush_messages": 0},
            r"flush_messages must be >= 1 or None \(leave flushing to the OS\), got 0",
        ),
    ],
)
def test_a_log_config_out_of_range_is_refused_naming_the_setting(
    setting: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        LogConfig(**setting)


def test_the_limits_of_the_log_config_ranges_are_accepted() -> None:
    config = LogConfig(
        segment_bytes=61,
        segment_ms=1,
        segment_index_bytes=4,
        retention_ms=-1,
        retention_bytes=-1,
        cleanup_policy="",
        min_cleanable_dirty_ratio=1,
        flush_messages=1,
    )
    assert not config.deletes and not config.compacts


# ---- closed objects


def test_a_closed_file_region_has_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"0123456789")
    region = FileRegion(os.open(path, os.O_RDONLY), 2, 5)
    assert region.read() == b"23456"
    region.close()
    with pytest.raises(ValueError, match=r"^the file region is closed$"):
        region.fileno()
    with pytest.raises(ValueError, match=r"^the file region is closed$"):
        region.read()


def test_a_closed_log_refuses_appends_and_reads(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "orders-0", LogConfig())
    fill(log, 1)
    log.close()
    message = (
        f"^the log in {re.escape(str(tmp_path / 'orders-0'))} is closed; open a new PartitionLog to use it$"
    )
    with pytest.raises(RuntimeError, match=message):
        log.append([batch(1)], now_ms=0)
    with pytest.raises(RuntimeError, match=message):
        log.read(0, 1 << 20)


# ---- append


def test_an_append_item_holding_more_than_one_batch_is_refused(
    tmp_path: Path, opened: list[PartitionLog]
) -> None:
    log = open_log(opened, tmp_path / "orders-0")
    two = batch(0) + batch(1)
    with pytest.raises(
        ValueError,
        match=f"a batch at offset 0 declares {len(batch(0))} bytes but {len(two)} were given; "
        "pass exactly one whole batch per list item",
    ):
        log.append([two], now_ms=0)
    assert log.log_end_offset == 0


# ---- damaged segment files


def test_a_batch_length_overrunning_a_closed_segment_makes_reads_fail_with_corrupt_message(
    tmp_path: Path, opened: list[PartitionLog]
) -> None:
    directory = tmp_path / "orders-0"
    log = open_log(opened, directory, segment_bytes=300)
    fill(log, 8)
    log.close()
    segment = directory / FIRST_SEGMENT
    data = bytearray(segment.read_bytes())
    struct.pack_into(">i", data, 8, 10_000)
    segment.write_bytes(bytes(data))

    reopened = open_log(opened, directory, segment_bytes=300)
    with pytest.raises(
        BrokerError, match=f"is corrupt at byte 0: 10012-byte batch overruns the {len(data)}-byte file"
    ) as raised:
        reopened.read(0, 1 << 20)
    assert raised.value.code == ErrorCode.CORRUPT_MESSAGE


def test_compaction_refuses_a_keyed_batch_whose_crc_fails(tmp_path: Path, opened: list[PartitionLog]) -> None:
    directory = tmp_path / "orders-0"
    log = open_log(opened, directory, segment_bytes=300, cleanup_policy="compact")
    fill(log, 8)
    log.close()
    flip_byte_in_batch(directory / FIRST_SEGMENT, 1)
    position = len(batch(0))

    reopened = open_log(opened, directory, segment_bytes=300, cleanup_policy="compact")
    with pytest.raises(CorruptBatchError) as raised:
        reopened.compact(now_ms=0)
    assert str(raised.value) == (
        f"{directory / FIRST_SEGMENT} is damaged: the batch at byte {position} (offsets 1 to 1) fails its "
        "CRC check"
    )
    assert raised.value.valid_bytes == position


def test_compaction_refuses_to_rewrite_a_damaged_transaction_marker(
    tmp_path: Path, opened: list[PartitionLog]
) -> None:
    directory = tmp_path / "orders-0"
    log = open_log(opened, directory, segment_bytes=300, cleanup_policy="compact")
    log.append([batch(0, producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)], now_ms=0)
    marker = record_builder.build_control_batch(
        offset=1, producer_id=5, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=1_000
    )
    log.append([marker], now_ms=0)
    fill(log, 6)
    log.close()
    # The coordinator epoch's last byte (the record's header count follows it): the marker still
    # reads as a COMMIT, and with no key the key map skips it, so only the rewrite checks its CRC.
    segment = directory / FIRST_SEGMENT
    data = bytearray(segment.read_bytes())
    position = len(batch(0))
    data[position + len(marker) - 2] ^= 0x01
    segment.write_bytes(bytes(data))

    reopened = open_log(opened, directory, segment_bytes=300, cleanup_policy="compact")
    with pytest.raises(CorruptBatchError) as raised:
        reopened.compact(now_ms=0)
    assert str(raised.value).startswith(
        f"{directory / FIRST_SEGMENT} is damaged: record batch at byte {position} (baseOffset 1) is corrupt: "
        "stored crc "
    )
    assert raised.value.valid_bytes == position


def test_a_scan_past_the_end_of_a_shrunken_file_reports_where_it_ends(tmp_path: Path) -> None:
    path = tmp_path / FIRST_SEGMENT
    path.write_bytes(batch(0) + batch(1))
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptBatchError, match=f"^file ends at byte {size}, not {size + 50}$") as raised:
            list(log_module.scan_batches(fd, 0, size + 50, validate_crc=False))
    finally:
        os.close(fd)
    assert raised.value.valid_bytes == 0
