"""Error paths of sparkafka.broker.records: batches whose header, framing, records or control
records are malformed, and arguments the encoders and in-place rewriters refuse."""

from __future__ import annotations

import struct

import kafka.codec
import pytest

from sparkafka.broker import record_builder, records
from sparkafka.broker.records import (
    HEADER_SIZE,
    CodecUnavailableError,
    CorruptBatchError,
    InvalidRecordError,
    Record,
)

# Positions in the v2 header (see the records module docstring).
BATCH_LENGTH_AT = 8
MAGIC_AT = 16
RECORD_COUNT_AT = 57


def one_record_batch(**options: object) -> bytes:
    return record_builder.encode_batch([Record(0, 1_000, b"key", b"value")], base_offset=0, **options)  # type: ignore[arg-type]


def with_int32(batch: bytes, at: int, value: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">i", out, at, value)
    return bytes(out)


def with_records_blob(blob: bytes, record_count: int = 1) -> bytes:
    """A valid batch header over a hand-made record section (decode_records does not check the CRC)."""
    header = bytearray(one_record_batch()[:HEADER_SIZE])
    struct.pack_into(">i", header, BATCH_LENGTH_AT, HEADER_SIZE - 12 + len(blob))
    struct.pack_into(">i", header, RECORD_COUNT_AT, record_count)
    return bytes(header) + blob


def record_blob(body: bytes) -> bytes:
    """One record: its zigzag varint length, then `body` (every test body is shorter than 64 bytes)."""
    assert len(body) < 64
    return bytes([len(body) * 2]) + body


# Record bodies are: attributes, timestampDelta, offsetDelta, keyLength, key, valueLength, value,
# headerCount, headers; all zigzag varints, so 0x00 is 0, 0x01 is -1, 0x02 is 1.
NULL_KEY_NULL_VALUE = b"\x00\x00\x00\x01\x01"


def control_batch(key: bytes | None, value: bytes | None) -> bytes:
    return record_builder.encode_batch(
        [Record(0, 1_000, key, value)],
        base_offset=0,
        producer_id=7,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
    )


# ---- parse_header


def test_a_buffer_shorter_than_a_batch_header_is_truncated() -> None:
    with pytest.raises(CorruptBatchError, match="a v2 batch header needs 61 bytes, only 20 remain") as raised:
        records.parse_header(bytes(20))
    assert raised.value.incomplete_size == HEADER_SIZE


def test_a_batch_of_another_magic_is_refused_as_unsupported() -> None:
    batch = bytearray(one_record_batch())
    batch[MAGIC_AT] = 1
    with pytest.raises(CorruptBatchError, match=r"has magic 1; only magic 2 batches \(Kafka >= 0\.11"):
        records.parse_header(bytes(batch))


def test_a_batch_length_below_the_header_minimum_is_corrupt() -> None:
    batch = with_int32(one_record_batch(), BATCH_LENGTH_AT, 10)
    with pytest.raises(CorruptBatchError, match="declares batchLength 10, below the 49-byte minimum of a v2"):
        records.parse_header(batch)


# ---- iter_batches


def test_a_short_tail_declaring_a_tiny_batch_length_is_corrupt_not_truncated() -> None:
    tail = with_int32(bytes(20), BATCH_LENGTH_AT, 10)
    with pytest.raises(
        CorruptBatchError, match="at byte 0 declares batchLength 10, below the 49-byte"
    ) as raised:
        list(records.iter_batches(tail))
    assert raised.value.incomplete_size is None


def test_a_short_tail_of_another_magic_is_corrupt_not_truncated() -> None:
    tail = bytearray(one_record_batch()[:30])
    tail[MAGIC_AT] = 0
    with pytest.raises(CorruptBatchError, match="has magic 0; only magic 2 is supported") as raised:
        list(records.iter_batches(bytes(tail)))
    assert raised.value.incomplete_size is None


def test_a_short_tail_of_a_valid_batch_is_reported_as_truncated_with_the_size_it_needs() -> None:
    batch = one_record_batch()
    buffer = batch + batch[:30]
    with pytest.raises(
        CorruptBatchError,
        match=f"at byte {len(batch)} is truncated: 30 bytes remain of at least {len(batch)}",
    ) as raised:
        list(records.iter_batches(buffer))
    assert (raised.value.valid_bytes, raised.value.incomplete_size) == (len(batch), len(batch))


def test_a_bad_header_after_valid_batches_names_its_file_position() -> None:
    batch = one_record_batch()
    bad = bytearray(batch)
    bad[MAGIC_AT] = 1
    with pytest.raises(CorruptBatchError) as raised:
        list(records.iter_batches(batch + bytes(bad), base_position=100))
    position = 100 + len(batch)
    assert str(raised.value) == (
        f"at byte {position}: record batch at byte {len(batch)} has magic 1; only magic 2 batches "
        "(Kafka >= 0.11 clients) are supported"
    )
    assert raised.value.valid_bytes == position


def test_a_batch_declaring_more_bytes_than_remain_is_truncated() -> None:
    batch = one_record_batch()
    cut = batch[:-5]
    with pytest.raises(
        CorruptBatchError,
        match=f"\\(baseOffset 0\\) is truncated: it declares {len(batch)} bytes, only {len(cut)} remain",
    ) as raised:
        list(records.iter_batches(cut))
    assert raised.value.incomplete_size == len(batch)


def test_a_batch_whose_crc_does_not_match_is_corrupt_when_crcs_are_checked() -> None:
    damaged = bytearray(one_record_batch())
    damaged[-1] ^= 0x40
    assert [position for position, _ in records.iter_batches(bytes(damaged))] == [0]
    with pytest.raises(CorruptBatchError, match=r"\(baseOffset 0\) is corrupt: stored crc \d+, computed crc"):
        list(records.iter_batches(bytes(damaged), validate_crc=True))


# ---- decode_records


def test_a_record_length_varint_longer_than_five_bytes_is_invalid() -> None:
    batch = with_records_blob(b"\xff" * 6)
    with pytest.raises(InvalidRecordError, match="Varint is too long: more than 5 bytes at byte 0"):
        records.decode_records(batch)


def test_a_negative_record_count_is_invalid() -> None:
    batch = with_int32(one_record_batch(), RECORD_COUNT_AT, -1)
    with pytest.raises(InvalidRecordError, match="Found invalid record count -1 in magic v2 batch"):
        records.decode_records(batch)


def test_a_negative_record_header_count_is_invalid() -> None:
    batch = with_records_blob(record_blob(NULL_KEY_NULL_VALUE + b"\x01"))
    with pytest.raises(InvalidRecordError, match=r"Found invalid number of record headers -1$"):
        records.decode_records(batch)


def test_a_record_header_count_larger_than_the_record_is_invalid() -> None:
    batch = with_records_blob(record_blob(NULL_KEY_NULL_VALUE + b"\x0a"))
    with pytest.raises(
        InvalidRecordError,
        match=r"Found invalid number of record headers\. 5 is larger than the remaining size of the buffer",
    ):
        records.decode_records(batch)


def test_a_negative_record_header_key_size_is_invalid() -> None:
    batch = with_records_blob(record_blob(NULL_KEY_NULL_VALUE + b"\x02\x01"))
    with pytest.raises(InvalidRecordError, match="Invalid negative header key size -1"):
        records.decode_records(batch)


def test_a_key_running_past_its_record_is_an_invalid_record_structure() -> None:
    batch = with_records_blob(record_blob(b"\x00\x00\x00\x14"))  # a 10-byte key, with no bytes left
    with pytest.raises(InvalidRecordError, match=r"^Found invalid record structure$"):
        records.decode_records(batch)


def test_a_batch_of_a_codec_whose_library_is_missing_names_the_package_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The library is installed here: make it look absent, as on a machine without it.
    monkeypatch.setattr(kafka.codec, "has_zstd", lambda: False)
    with pytest.raises(
        CodecUnavailableError,
        match="the batch being encoded is zstd-compressed but the Python library for zstd is missing; "
        "install it with `pip install zstandard`",
    ):
        one_record_batch(compression=4)


# ---- control_marker


def test_a_control_record_key_shorter_than_four_bytes_is_corrupt() -> None:
    with pytest.raises(
        CorruptBatchError,
        match="control batch at offset 0 has a 2-byte key; a control record key needs at least 4 bytes",
    ):
        records.control_marker(control_batch(b"\x00\x00", b""))


def test_a_control_record_key_of_negative_version_is_corrupt() -> None:
    with pytest.raises(CorruptBatchError, match=r"^control batch at offset 0 has key version -1$"):
        records.control_marker(control_batch(struct.pack(">hh", -1, 1), struct.pack(">hi", 0, 0)))


def test_a_transaction_marker_without_a_value_is_corrupt() -> None:
    with pytest.raises(
        CorruptBatchError,
        match="transaction marker at offset 0 has a 0-byte value; it needs at least 6 bytes",
    ):
        records.control_marker(control_batch(struct.pack(">hh", 0, 1), None))


def test_a_transaction_marker_value_of_negative_version_is_corrupt() -> None:
    with pytest.raises(CorruptBatchError, match=r"^transaction marker at offset 0 has value version -1$"):
        records.control_marker(control_batch(struct.pack(">hh", 0, 0), struct.pack(">hi", -1, 3)))


# ---- encode_batch and the in-place rewriters


def test_encoding_with_an_unknown_compression_id_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"compression must be a codec id 0-4 \(none/gzip/snappy/lz4/zstd\): 5"
    ):
        one_record_batch(compression=5)


def test_encoding_with_an_unknown_timestamp_type_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"timestamp_type must be 0 \(CreateTime\) or 1 \(LogAppendTime\), got 2"
    ):
        one_record_batch(timestamp_type=2)


def test_encoding_a_transactional_batch_without_a_producer_id_is_refused() -> None:
    with pytest.raises(ValueError, match="a transactional batch needs a producer id >= 0"):
        one_record_batch(is_transactional=True)


def test_assigning_an_offset_to_less_than_a_batch_header_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot assign an offset to 60 bytes: a v2 batch has >= 61 bytes"):
        records.assign_offset(bytes(60), 5)
    with pytest.raises(ValueError, match="cannot assign an offset to 0 bytes: a v2 batch has >= 61 bytes"):
        records.assign_offset_in_place(bytearray(), 5)


def test_stamping_less_than_a_batch_header_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot stamp 12 bytes: a v2 batch has >= 61 bytes"):
        records.set_max_timestamp_in_place(bytearray(12), records.CREATE_TIME, 0)


def test_stamping_an_unknown_timestamp_type_is_refused_and_leaves_the_batch_unchanged() -> None:
    batch = bytearray(one_record_batch())
    original = bytes(batch)
    with pytest.raises(
        ValueError, match=r"timestamp_type must be 0 \(CreateTime\) or 1 \(LogAppendTime\), got 3"
    ):
        records.set_max_timestamp_in_place(batch, 3, 5_000)
    assert bytes(batch) == original
