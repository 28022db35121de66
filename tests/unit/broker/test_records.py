"""v2 record batches, cross-checked against kafka-python 3's own record builder and parser."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from sparkafka.broker import dumplog, log_validator, record_builder, records
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.records import (
    HEADER_SIZE,
    BatchHeader,
    CorruptBatchError,
    InvalidRecordError,
    Record,
    RecordValidationError,
)

CODECS = {
    1: ("gzip", kafka_codec.has_gzip),
    2: ("snappy", kafka_codec.has_snappy),
    3: ("lz4", kafka_codec.has_lz4),
    4: ("zstd", kafka_codec.has_zstd),
}


def sample_records(count: int = 5, base_offset: int = 0, timestamp: int = 1_700_000_000_000) -> list[Record]:
    return [
        Record(
            offset=base_offset + i,
            timestamp=timestamp + i * 7,
            key=None if i % 3 == 0 else f"key-{i}".encode(),
            value=None if i % 4 == 3 else f"value-{i}".encode() * 10,
            headers=(("trace", b"abc"), ("empty", None)) if i % 2 else (),
        )
        for i in range(count)
    ]


def kafka_python_batch(
    batch_records: list[Record],
    *,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=is_transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for record in batch_records:
        builder.append(record.offset, record.timestamp, record.key, record.value, list(record.headers))
    return bytes(builder.build())


def refresh_crc(batch: bytes | bytearray) -> bytes:
    """Recompute the CRC after deliberately editing CRC-covered bytes (to reach checks behind the CRC)."""
    out = bytearray(batch)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def patched(batch: bytes, fmt: str, offset: int, value: int, *, fix_crc: bool = True) -> bytes:
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    return refresh_crc(out) if fix_crc else bytes(out)


def error_code(excinfo: pytest.ExceptionInfo[BrokerError]) -> ErrorCode:
    return excinfo.value.code


# ---- header and encoding against kafka-python ---------------------------------------------------


def test_parse_header_matches_kafka_python() -> None:
    batch = kafka_python_batch(sample_records(), producer_id=2000, producer_epoch=3, base_sequence=17)
    header = records.parse_header(batch)
    theirs = DefaultRecordBatch(batch)
    assert (header.base_offset, header.size) == (theirs.base_offset, theirs.size_in_bytes)
    assert header.crc == theirs.crc
    assert header.attributes == theirs.attributes
    assert header.last_offset_delta == theirs.last_offset_delta
    assert (header.base_timestamp, header.max_timestamp) == (theirs.first_timestamp, theirs.max_timestamp)
    assert (header.producer_id, header.producer_epoch) == (2000, 3)
    assert (header.base_sequence, header.last_sequence) == (17, theirs.last_sequence)
    assert header.record_count == theirs.records_count == 5
    assert header.last_offset == 4
    assert header.size == len(batch)
    assert records.crc_is_valid(batch, header)


def test_encode_batch_is_byte_identical_to_kafka_python() -> None:
    batch_records = sample_records(8)
    theirs = kafka_python_batch(batch_records, producer_id=7, producer_epoch=1, base_sequence=5)
    ours = record_builder.encode_batch(
        batch_records, base_offset=0, producer_id=7, producer_epoch=1, base_sequence=5
    )
    assert ours == theirs
    transactional = kafka_python_batch(
        batch_records, producer_id=7, producer_epoch=1, base_sequence=5, is_transactional=True
    )
    assert transactional == record_builder.encode_batch(
        batch_records, base_offset=0, producer_id=7, producer_epoch=1, base_sequence=5, is_transactional=True
    )


def test_decode_records_round_trips_kafka_python_batch() -> None:
    batch_records = sample_records(10)
    assert records.decode_records(kafka_python_batch(batch_records)) == batch_records


@pytest.mark.parametrize("compression", sorted(CODECS))
def test_compressed_batches_from_kafka_python_decode_and_validate(compression: int) -> None:
    name, available = CODECS[compression]
    if not available():
        pytest.skip(f"{name} library not installed")
    batch_records = sample_records(40)
    batch = kafka_python_batch(
        batch_records, compression=compression, producer_id=1, producer_epoch=0, base_sequence=0
    )
    header = records.parse_header(batch)
    assert header.compression == compression
    assert records.decode_records(batch) == batch_records
    accepted = log_validator.validate_produce_payload(batch, max_batch_bytes=1 << 20)
    assert [a.header for a in accepted] == [header]
    assert accepted[0].max_record_timestamp == max(r.timestamp for r in batch_records)


@pytest.mark.parametrize("compression", sorted(CODECS))
def test_compressed_encode_batch_is_readable_by_kafka_python(compression: int) -> None:
    name, available = CODECS[compression]
    if not available():
        pytest.skip(f"{name} library not installed")
    batch_records = sample_records(40, base_offset=100)
    batch = record_builder.encode_batch(batch_records, base_offset=100, compression=compression)
    theirs = DefaultRecordBatch(batch)
    assert theirs.compression_type == compression
    assert theirs.validate_crc()
    decoded = [
        Record(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in theirs
    ]
    assert decoded == batch_records
    assert records.decode_records(batch) == batch_records


def test_last_sequence_wraps_like_kafka() -> None:
    batch = kafka_python_batch(sample_records(4), producer_id=1, producer_epoch=0, base_sequence=2**31 - 2)
    header = records.parse_header(batch)
    assert header.last_sequence == DefaultRecordBatch(batch).last_sequence == 1
    assert records.parse_header(kafka_python_batch(sample_records(4))).last_sequence == -1


def test_assign_offset_rewrites_offset_and_epoch_and_keeps_crc_valid() -> None:
    batch = kafka_python_batch(sample_records(3))
    moved = records.assign_offset(batch, 1234, partition_leader_epoch=7)
    header = records.parse_header(moved)
    assert (header.base_offset, header.partition_leader_epoch, header.last_offset) == (1234, 7, 1236)
    assert records.crc_is_valid(moved, header)
    assert DefaultRecordBatch(moved).validate_crc()
    assert [r.offset for r in records.decode_records(moved)] == [1234, 1235, 1236]
    with pytest.raises(ValueError, match=">= 61 bytes"):
        records.assign_offset(batch[:20], 5)


# ---- control batches --------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_build_control_batch_matches_kafka_end_txn_marker(commit: bool) -> None:
    batch = record_builder.build_control_batch(
        offset=42, producer_id=2000, producer_epoch=5, commit=commit, coordinator_epoch=9, timestamp_ms=1234
    )
    header = records.parse_header(batch)
    # DefaultRecordBatch.RECORD_BATCH_OVERHEAD (61) + EndTransactionMarker's 17-byte record.
    assert header.size == len(batch) == 78
    assert header.attributes == records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (42, 0, 1)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (2000, 5, -1)
    assert (header.base_timestamp, header.max_timestamp) == (1234, 1234)
    assert records.crc_is_valid(batch, header)
    [record] = records.decode_records(batch)
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)
    assert record.value == struct.pack(">hi", 0, 9)
    theirs = DefaultRecordBatch(batch)
    assert theirs.is_control_batch and theirs.is_transactional and theirs.validate_crc()
    assert [control.type for control in theirs] == [1 if commit else 0]
    assert records.control_marker(batch) == ("COMMIT" if commit else "ABORT", 9)


def test_control_marker_is_none_for_data_and_rejects_bad_keys() -> None:
    assert records.control_marker(kafka_python_batch(sample_records(1))) is None
    marker = record_builder.build_control_batch(
        offset=0, producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=0
    )
    short_key = record_builder.encode_batch(
        [Record(0, 0, b"\x00", b"x")], base_offset=0, producer_id=1, producer_epoch=0, is_transactional=True
    )
    as_control = patched(short_key, ">h", 21, records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG)
    with pytest.raises(CorruptBatchError, match="key"):
        records.control_marker(as_control)
    assert records.control_marker(marker) == ("COMMIT", 0)


# ---- parse_header and iter_batches --------------------------------------------------------------


def test_parse_header_rejects_short_bad_magic_and_tiny_length() -> None:
    batch = kafka_python_batch(sample_records(1))
    with pytest.raises(CorruptBatchError, match="truncated") as short:
        records.parse_header(batch[:40])
    assert short.value.incomplete_size == HEADER_SIZE
    with pytest.raises(CorruptBatchError, match="magic 1"):
        records.parse_header(patched(batch, ">b", 16, 1, fix_crc=False))
    with pytest.raises(CorruptBatchError, match="batchLength 20"):
        records.parse_header(patched(batch, ">i", 8, 20, fix_crc=False))


def three_batches() -> tuple[bytes, list[int]]:
    parts, positions, pos = [], [], 0
    for i in range(3):
        batch = records.assign_offset(kafka_python_batch(sample_records(2 + i)), 10 * i)
        parts.append(batch)
        positions.append(pos)
        pos += len(batch)
    return b"".join(parts), positions


def test_iter_batches_yields_every_complete_batch() -> None:
    buf, positions = three_batches()
    found = list(records.iter_batches(buf, validate_crc=True))
    assert [pos for pos, _ in found] == positions
    assert [header.base_offset for _, header in found] == [0, 10, 20]
    assert [pos for pos, _ in records.iter_batches(buf, base_position=1000)] == [p + 1000 for p in positions]


@pytest.mark.parametrize("cut", [5, 30, HEADER_SIZE + 3])
def test_iter_batches_stops_at_torn_tail_with_valid_prefix(cut: int) -> None:
    buf, positions = three_batches()
    torn = buf[: positions[2] + cut]
    seen: list[int] = []
    with pytest.raises(CorruptBatchError, match="truncated") as excinfo:
        for _, header in records.iter_batches(torn):
            seen.append(header.base_offset)
    assert seen == [0, 10]
    assert excinfo.value.valid_bytes == positions[2]
    assert excinfo.value.incomplete_size is not None and excinfo.value.incomplete_size >= cut


def test_iter_batches_reports_garbage_and_crc_mismatch_as_corrupt_not_short() -> None:
    buf, positions = three_batches()
    garbage = buf[: positions[2]] + b"\xff" * 100
    with pytest.raises(CorruptBatchError) as excinfo:
        list(records.iter_batches(garbage))
    assert (excinfo.value.valid_bytes, excinfo.value.incomplete_size) == (positions[2], None)

    flipped = bytearray(buf)
    flipped[positions[1] + HEADER_SIZE + 2] ^= 0xFF
    assert len(list(records.iter_batches(bytes(flipped)))) == 3  # CRC not checked unless asked
    with pytest.raises(CorruptBatchError, match="crc") as crc_error:
        list(records.iter_batches(bytes(flipped), validate_crc=True))
    assert crc_error.value.valid_bytes == positions[1]


# ---- produce validation -------------------------------------------------------------------------


def valid_batch(**kwargs: Any) -> bytes:
    return kafka_python_batch(sample_records(3), **kwargs)


def validate(buf: bytes, **kwargs: Any) -> list[BatchHeader]:
    accepted = log_validator.validate_produce_payload(
        buf, max_batch_bytes=1 << 20, topic_partition="orders-0", **kwargs
    )
    return [a.header for a in accepted]


def test_validate_accepts_a_plain_and_an_idempotent_batch() -> None:
    assert validate(valid_batch())[0].record_count == 3
    assert validate(valid_batch(producer_id=5, producer_epoch=0, base_sequence=0))[0].producer_id == 5


@pytest.mark.parametrize(
    ("payload", "code", "message"),
    [
        (b"", ErrorCode.INVALID_RECORD, "Produce requests with version 9 must have at least one record"),
        (b"\x00" * 11, ErrorCode.INVALID_RECORD, "must have at least one record batch per partition"),
        (b"\x00" * 8 + struct.pack(">i", 13), ErrorCode.CORRUPT_MESSAGE, "less than the minimum record"),
    ],
)
def test_validate_rejects_missing_batches(payload: bytes, code: ErrorCode, message: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        validate(payload, produce_version=9)
    assert excinfo.value.code == code
    assert message in excinfo.value.message


def test_validate_rejects_a_lone_partial_batch_as_missing() -> None:
    with pytest.raises(BrokerError, match="at least one record batch") as excinfo:
        validate(valid_batch()[:-1])
    assert error_code(excinfo) == ErrorCode.INVALID_RECORD


def test_validate_rejects_old_and_unknown_magic() -> None:
    with pytest.raises(BrokerError, match="record batches with magic version 2") as old:
        validate(patched(valid_batch(), ">b", 16, 1, fix_crc=False))
    assert error_code(old) == ErrorCode.INVALID_RECORD
    with pytest.raises(BrokerError, match="Invalid magic found in record: 5") as unknown:
        validate(patched(valid_batch(), ">b", 16, 5, fix_crc=False))
    assert error_code(unknown) == ErrorCode.CORRUPT_MESSAGE


def test_validate_requires_exactly_one_whole_batch() -> None:
    with pytest.raises(BrokerError, match="exactly one record batch per partition") as two:
        validate(valid_batch() + valid_batch())
    assert error_code(two) == ErrorCode.INVALID_RECORD
    with pytest.raises(BrokerError, match="3 bytes after the record batch") as trailing:
        validate(valid_batch() + b"abc")
    assert error_code(trailing) == ErrorCode.CORRUPT_MESSAGE


def test_validate_rejects_nonzero_base_offset_oversize_and_bad_crc() -> None:
    with pytest.raises(BrokerError, match="should be 0, but it is 9") as offset:
        validate(records.assign_offset(valid_batch(), 9))
    assert error_code(offset) == ErrorCode.INVALID_RECORD

    batch = valid_batch()
    too_large = f"is {len(batch)} bytes which exceeds the maximum configured value of 100"
    with pytest.raises(BrokerError, match=too_large):
        log_validator.validate_produce_payload(batch, max_batch_bytes=100, topic_partition="orders-0")

    corrupt = bytearray(batch)
    corrupt[-1] ^= 0x01
    corrupt_message = r"Record is corrupt \(stored crc = \d+\) in topic partition orders-0\."
    with pytest.raises(BrokerError, match=corrupt_message) as crc:
        validate(bytes(corrupt))
    assert error_code(crc) == ErrorCode.CORRUPT_MESSAGE


def test_validate_rejects_inconsistent_counts() -> None:
    batch = valid_batch()  # 3 records: lastOffsetDelta 2, recordsCount 3
    cases = [
        (patched(batch, ">i", 57, 2), "Inconsistent batch offset range [0, 2] and count of records 2"),
        (patched(patched(batch, ">i", 23, -1), ">i", 57, 0), "Batch has an invalid offset range: [0, -1]"),
        (patched(batch, ">i", 57, 0), "Invalid reported count for record batch: 0"),
        (patched(patched(batch, ">i", 23, 3), ">i", 57, 4), "Incorrect declared batch size, premature EOF"),
        (patched(patched(batch, ">i", 23, 1), ">i", 57, 2), "records still remaining"),
    ]
    for payload, message in cases:
        with pytest.raises(BrokerError) as excinfo:
            validate(payload)
        assert excinfo.value.code == ErrorCode.INVALID_RECORD, message
        assert message in excinfo.value.message


def test_validate_checks_counts_of_compressed_batches_after_decompressing() -> None:
    batch = kafka_python_batch(sample_records(20), compression=1)
    with pytest.raises(BrokerError, match="premature EOF") as more:
        validate(patched(patched(batch, ">i", 23, 20), ">i", 57, 21))
    assert error_code(more) == ErrorCode.INVALID_RECORD
    with pytest.raises(BrokerError, match="records still remaining") as fewer:
        validate(patched(patched(batch, ">i", 23, 18), ">i", 57, 19))
    assert error_code(fewer) == ErrorCode.INVALID_RECORD


def test_validate_rejects_control_batches_and_missing_sequence() -> None:
    control = record_builder.build_control_batch(
        offset=0, producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=0
    )
    with pytest.raises(BrokerError, match="Clients are not allowed to write control records") as excinfo:
        validate(control)
    assert error_code(excinfo) == ErrorCode.INVALID_RECORD
    no_sequence = record_builder.encode_batch(
        sample_records(2), base_offset=0, producer_id=4, producer_epoch=0
    )
    with pytest.raises(BrokerError, match="Invalid sequence number -1 in record batch with producerId 4"):
        validate(no_sequence)


def test_validate_reports_keyless_records_for_compacted_topics_per_record() -> None:
    batch = kafka_python_batch(sample_records(7))  # records 0, 3 and 6 have no key
    with pytest.raises(RecordValidationError) as excinfo:
        validate(batch, require_keys=True)
    assert excinfo.value.code == ErrorCode.INVALID_RECORD
    assert [index for index, _ in excinfo.value.record_errors] == [0, 3, 6]
    assert excinfo.value.message.startswith("One or more records have been rejected due to 3 record errors")
    first_error = "RecordError(batchIndex=0, message='Compacted topic cannot accept message without key"
    assert first_error in str(excinfo.value)


NOW_MS = 1_800_000_000_000
HOUR_MS = 3_600_000
CREATE_TIME_RULES = log_validator.TimestampRules()  # Kafka 4's defaults: no lower bound, one hour ahead
LOG_APPEND_TIME_RULES = log_validator.TimestampRules(log_append_time=True)


def stamped_records(*timestamps: int) -> list[Record]:
    return [Record(i, ts, f"k{i}".encode(), b"v" * 10) for i, ts in enumerate(timestamps)]


def rejected(batch: bytes, **kwargs: Any) -> RecordValidationError:
    with pytest.raises(RecordValidationError) as excinfo:
        validate(batch, now_ms=NOW_MS, **kwargs)
    return excinfo.value


@pytest.mark.parametrize("compression", [0, 1])
def test_create_time_records_more_than_an_hour_ahead_are_rejected_one_by_one(compression: int) -> None:
    batch = record_builder.encode_batch(
        stamped_records(NOW_MS, NOW_MS + HOUR_MS + 1, NOW_MS - 10 * HOUR_MS, NOW_MS + 2 * HOUR_MS),
        base_offset=0,
        compression=compression,
    )
    error = rejected(batch, timestamps=CREATE_TIME_RULES)
    assert error.code == ErrorCode.INVALID_TIMESTAMP
    assert error.message == "One or more records have been rejected due to invalid timestamp"
    assert [index for index, _ in error.record_errors] == [1, 3]
    assert error.record_errors[0][1] == (
        f"Timestamp {NOW_MS + HOUR_MS + 1} of message with offset 1 is out of range. The timestamp should be "
        f"within [{NOW_MS - records.INT64_MAX}, {NOW_MS + HOUR_MS}]"
    )


def test_an_hour_ahead_exactly_and_any_past_time_are_accepted_with_their_largest_timestamp() -> None:
    batch = record_builder.encode_batch(stamped_records(NOW_MS + HOUR_MS, 0, -5), base_offset=0)
    (accepted,) = log_validator.validate_produce_payload(
        batch, max_batch_bytes=1 << 20, now_ms=NOW_MS, timestamps=CREATE_TIME_RULES
    )
    assert accepted.max_record_timestamp == NOW_MS + HOUR_MS


def test_before_max_ms_rejects_old_records_but_never_ones_without_a_timestamp() -> None:
    rules = log_validator.TimestampRules(before_max_ms=HOUR_MS, after_max_ms=records.INT64_MAX)
    batch = record_builder.encode_batch(
        stamped_records(NOW_MS, records.NO_TIMESTAMP, NOW_MS - HOUR_MS - 1, NOW_MS + 10**9), base_offset=0
    )
    error = rejected(batch, timestamps=rules)
    assert [index for index, _ in error.record_errors] == [2]
    # Kafka prints the bounds with Java's long arithmetic: now + Long.MAX_VALUE wraps around.
    assert error.record_errors[0][1].endswith(
        f"within [{NOW_MS - HOUR_MS}, {NOW_MS + records.INT64_MAX - 2**64}]"
    )
    only_unstamped = record_builder.encode_batch(stamped_records(NOW_MS, records.NO_TIMESTAMP), base_offset=0)
    (accepted,) = log_validator.validate_produce_payload(
        only_unstamped, max_batch_bytes=1 << 20, now_ms=NOW_MS, timestamps=rules
    )
    assert accepted.max_record_timestamp == NOW_MS


def test_a_log_append_time_topic_checks_no_range_but_refuses_batches_the_producer_marked() -> None:
    far_ahead = record_builder.encode_batch(stamped_records(NOW_MS + 100 * HOUR_MS), base_offset=0)
    assert validate(far_ahead, now_ms=NOW_MS, timestamps=LOG_APPEND_TIME_RULES)
    marked = record_builder.encode_batch(
        stamped_records(NOW_MS, NOW_MS), base_offset=0, timestamp_type=records.LOG_APPEND_TIME
    )
    error = rejected(marked, timestamps=LOG_APPEND_TIME_RULES)
    assert error.code == ErrorCode.INVALID_TIMESTAMP
    assert [index for index, _ in error.record_errors] == [0, 1]
    assert error.record_errors[1][1] == (
        f"Invalid timestamp type in message DefaultRecord(offset=1, timestamp={NOW_MS}, key=2 bytes, "
        "value=10 bytes). Producer should not set timestamp type to LogAppendTime."
    )


def test_a_create_time_topic_takes_a_marked_batch_by_its_max_timestamp_unless_that_is_missing() -> None:
    marked = record_builder.encode_batch(
        stamped_records(NOW_MS - 5, NOW_MS - 9), base_offset=0, timestamp_type=records.LOG_APPEND_TIME
    )
    (accepted,) = log_validator.validate_produce_payload(
        marked, max_batch_bytes=1 << 20, now_ms=NOW_MS, timestamps=CREATE_TIME_RULES
    )
    assert accepted.max_record_timestamp == NOW_MS - 5  # what a reader saw as every record's timestamp
    unstamped = record_builder.encode_batch(
        stamped_records(NOW_MS), base_offset=0, timestamp_type=records.LOG_APPEND_TIME, max_timestamp=-1
    )
    error = rejected(unstamped, timestamps=CREATE_TIME_RULES)
    assert "Producer should not set timestamp type to LogAppendTime" in error.record_errors[0][1]


def test_the_largest_record_timestamp_is_the_records_not_the_producers_claim() -> None:
    batch = record_builder.encode_batch(
        stamped_records(NOW_MS - 3, NOW_MS - 1, NOW_MS - 2), base_offset=0, max_timestamp=7
    )
    (accepted,) = log_validator.validate_produce_payload(
        batch, max_batch_bytes=1 << 20, now_ms=NOW_MS, timestamps=CREATE_TIME_RULES
    )
    assert accepted.max_record_timestamp == NOW_MS - 1
    lying_low = record_builder.encode_batch(
        stamped_records(NOW_MS, NOW_MS + 2 * HOUR_MS), base_offset=0, max_timestamp=NOW_MS
    )
    assert [index for index, _ in rejected(lying_low, timestamps=CREATE_TIME_RULES).record_errors] == [1]


def test_key_and_timestamp_errors_are_reported_together_as_invalid_timestamp() -> None:
    recs = stamped_records(NOW_MS, NOW_MS + 2 * HOUR_MS, NOW_MS)
    recs[2] = Record(2, NOW_MS + 2 * HOUR_MS, None, b"v")  # no key: the key error is its only error
    error = rejected(
        record_builder.encode_batch(recs, base_offset=0), require_keys=True, timestamps=CREATE_TIME_RULES
    )
    assert error.code == ErrorCode.INVALID_TIMESTAMP
    assert [index for index, _ in error.record_errors] == [1, 2]
    assert error.record_errors[1][1].startswith("Compacted topic cannot accept message without key")


def test_validate_maps_undecompressable_and_unknown_codecs_to_unknown_server_error() -> None:
    batch = bytearray(kafka_python_batch(sample_records(5), compression=1))
    batch[HEADER_SIZE + 12 : HEADER_SIZE + 20] = b"\x00" * 8  # inside the gzip stream, CRC then recomputed
    with pytest.raises(BrokerError, match="Failed to decompress record stream") as broken:
        validate(refresh_crc(batch))
    assert error_code(broken) == ErrorCode.UNKNOWN_SERVER_ERROR
    with pytest.raises(BrokerError, match="Unknown compression type id: 5") as unknown:
        validate(patched(valid_batch(), ">h", 21, 5))
    assert error_code(unknown) == ErrorCode.UNKNOWN_SERVER_ERROR


# ---- decoding errors and encoding edge cases -----------------------------------------------------


def test_decode_records_reports_malformed_records() -> None:
    batch = record_builder.encode_batch([Record(0, 0, b"k", b"v")], base_offset=0)
    body_length_at = HEADER_SIZE  # first byte of the record: its length varint (zigzag)
    too_long = bytearray(batch)
    too_long[body_length_at] = 2 * 40  # claims 40 bytes of record body
    with pytest.raises(InvalidRecordError, match="Invalid record size: expected 40 bytes"):
        records.decode_records(bytes(too_long))
    negative_headers = bytearray(batch)
    negative_headers[-1] = 1  # header count -1
    with pytest.raises(InvalidRecordError, match="invalid number of record headers -1"):
        records.decode_records(bytes(negative_headers))
    with pytest.raises(CorruptBatchError, match="truncated"):
        records.decode_records(batch[:-2])


def test_encode_batch_preserves_gaps_empty_batches_horizon_and_raw_header_keys() -> None:
    gappy = [Record(103, 50, b"a", b"1"), Record(107, 40, b"b", None, (("bad\udcff", b"v"),))]
    batch = record_builder.encode_batch(gappy, base_offset=100, last_offset_delta=9, delete_horizon_ms=99_000)
    header = records.parse_header(batch)
    assert (header.base_offset, header.last_offset, header.record_count) == (100, 109, 2)
    assert header.delete_horizon_ms == 99_000 and header.base_timestamp == 99_000
    assert header.max_timestamp == 50
    assert records.decode_records(batch) == gappy

    empty = record_builder.encode_batch(
        [],
        base_offset=200,
        last_offset_delta=4,
        max_timestamp=77,
        producer_id=3,
        producer_epoch=1,
        base_sequence=40,
    )
    empty_header = records.parse_header(empty)
    assert (empty_header.record_count, empty_header.base_timestamp, empty_header.max_timestamp) == (0, -1, 77)
    assert (empty_header.last_offset, empty_header.last_sequence) == (204, 44)
    assert records.decode_records(empty) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"records": [Record(5, 0, b"k", b"v")], "base_offset": 6}, "increasing and >= base_offset"),
        ({"records": [Record(1, 0, b"k", b"v"), Record(1, 0, b"k", b"v")], "base_offset": 0}, "increasing"),
        ({"records": [], "base_offset": 0}, "empty batch needs last_offset_delta"),
        ({"records": [Record(0, 0, b"k", b"v")], "base_offset": 0, "is_transactional": True}, "producer id"),
        ({"records": [Record(0, 0, b"k", b"v")], "base_offset": 0, "compression": 9}, "codec id"),
        ({"records": [Record(3, 0, b"k", b"v")], "base_offset": 0, "last_offset_delta": 1}, "ends before"),
    ],
)
def test_encode_batch_rejects_bad_input(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        record_builder.encode_batch(**kwargs)


def test_log_append_time_records_take_the_batch_max_timestamp() -> None:
    two = [Record(0, 5, b"a", b"1"), Record(1, 6, b"b", b"2")]
    batch = record_builder.encode_batch(two, base_offset=0, timestamp_type=1, max_timestamp=999)
    assert records.parse_header(batch).timestamp_type == records.LOG_APPEND_TIME
    assert [r.timestamp for r in records.decode_records(batch)] == [999, 999]


# ---- kafka-dump-log.sh format --------------------------------------------------------------------


def test_format_batch_dump_matches_kafka_dump_log() -> None:
    batch = record_builder.encode_batch(
        [
            Record(0, 1571987538865, None, b"EVENT(aa,bb)"),
            Record(1, 1571987538866, b"k1", b"v", (("h1", b"x"),)),
        ],
        base_offset=0,
        producer_id=2000,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    header = records.parse_header(batch)
    lines = dumplog.format_batch_dump(header, batch, position=0)
    assert lines == [
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 0 lastSequence: 1 producerId: 2000 "
        "producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1571987538866 size: {len(batch)} "
        f"magic: 2 compresscodec: none crc: {header.crc} isvalid: true",
        "| offset: 0 CreateTime: 1571987538865 keySize: -1 valueSize: 12 sequence: 0 headerKeys: [] "
        "payload: EVENT(aa,bb)",
        "| offset: 1 CreateTime: 1571987538866 keySize: 2 valueSize: 1 sequence: 1 headerKeys: [h1] key: k1 "
        "payload: v",
    ]
    no_payload = dumplog.format_batch_dump(header, batch, position=0, print_payload=False)
    assert no_payload[1].endswith("headerKeys: []")
    assert len(dumplog.format_batch_dump(header, batch, position=0, print_records=False)) == 1


def test_format_batch_dump_of_control_compressed_corrupt_and_horizon_batches() -> None:
    marker = record_builder.build_control_batch(
        offset=2,
        producer_id=2000,
        producer_epoch=0,
        commit=True,
        coordinator_epoch=0,
        timestamp_ms=1571987538900,
    )
    lines = dumplog.format_batch_dump(records.parse_header(marker), marker, position=80)
    assert "isControl: true" in lines[0] and "position: 80 CreateTime: 1571987538900" in lines[0]
    assert lines[1] == (
        "| offset: 2 CreateTime: 1571987538900 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 0"
    )
    gzipped = kafka_python_batch(sample_records(2), compression=1)
    gzip_lines = dumplog.format_batch_dump(records.parse_header(gzipped), gzipped, position=0)
    assert "compresscodec: gzip" in gzip_lines[0]
    corrupt = bytearray(gzipped)
    corrupt[-3] ^= 0xFF
    corrupt_lines = dumplog.format_batch_dump(records.parse_header(corrupt), bytes(corrupt), position=0)
    assert corrupt_lines[0].endswith("isvalid: false")
    horizon = record_builder.encode_batch(
        [Record(0, 1, b"k", None)], base_offset=0, delete_horizon_ms=86_400_000
    )
    assert (
        "deleteHorizonMs: OptionalLong[86400000]"
        in dumplog.format_batch_dump(records.parse_header(horizon), horizon, position=0)[0]
    )


@pytest.mark.parametrize("transactional", [False, True])
def test_log_append_time_stamp_rewrites_type_max_timestamp_and_crc(transactional: bool) -> None:
    batch = record_builder.encode_batch(
        sample_records(5),
        base_offset=0,
        producer_id=7,
        producer_epoch=1,
        base_sequence=0,
        is_transactional=transactional,
    )
    stamped = bytearray(batch)
    records.set_max_timestamp_in_place(stamped, records.LOG_APPEND_TIME, 1_800_000_000_000)
    header = records.parse_header(stamped)
    before = records.parse_header(batch)
    assert header.timestamp_type == records.LOG_APPEND_TIME
    assert header.max_timestamp == 1_800_000_000_000
    assert header.is_transactional == transactional
    assert (header.base_timestamp, header.producer_id, header.record_count) == (
        before.base_timestamp,
        before.producer_id,
        before.record_count,
    )
    assert records.crc_is_valid(stamped, header)
    theirs = DefaultRecordBatch(bytes(stamped))
    assert theirs.validate_crc()
    assert theirs.timestamp_type == 1
    # A reader takes the batch's max timestamp as every record's timestamp.
    assert {r.timestamp for r in theirs} == {1_800_000_000_000}
    assert {r.timestamp for r in records.decode_records(stamped)} == {1_800_000_000_000}


def test_create_time_stamp_clears_a_producers_log_append_time_mark_and_fixes_max_timestamp() -> None:
    batch = record_builder.encode_batch(
        sample_records(4), base_offset=0, timestamp_type=records.LOG_APPEND_TIME
    )
    stamped = bytearray(batch)
    records.set_max_timestamp_in_place(stamped, records.CREATE_TIME, 1_700_000_000_123)
    header = records.parse_header(stamped)
    assert (header.timestamp_type, header.max_timestamp) == (records.CREATE_TIME, 1_700_000_000_123)
    assert records.crc_is_valid(stamped, header)
    assert DefaultRecordBatch(bytes(stamped)).validate_crc()
    # The records' own timestamps show again once the mark is gone.
    assert [r.timestamp for r in records.decode_records(stamped)] == [r.timestamp for r in sample_records(4)]


def test_a_stamp_that_changes_nothing_leaves_the_bytes_alone() -> None:
    batch = record_builder.encode_batch(sample_records(3), base_offset=0)
    header = records.parse_header(batch)
    stamped = bytearray(batch)
    records.set_max_timestamp_in_place(stamped, records.CREATE_TIME, header.max_timestamp)
    assert stamped == batch


def test_a_stamp_needs_a_whole_header_and_a_known_type() -> None:
    with pytest.raises(ValueError, match="v2 batch"):
        records.set_max_timestamp_in_place(bytearray(HEADER_SIZE - 1), records.LOG_APPEND_TIME, 1)
    with pytest.raises(ValueError, match="timestamp_type"):
        records.set_max_timestamp_in_place(
            bytearray(record_builder.encode_batch(sample_records(1), base_offset=0)), 2, 1
        )
