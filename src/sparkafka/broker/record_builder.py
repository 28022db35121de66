"""v2 record batches built as Kafka's MemoryRecordsBuilder builds them: :func:`encode_batch` for records
(any codec, transactional or not) and :func:`build_control_batch` for a transaction's COMMIT or ABORT
marker.
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from sparkafka.broker.records import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    COMPRESSION_NAMES,
    CONTROL_FLAG,
    CONTROL_KEY,
    CRC_OFFSET,
    CREATE_TIME,
    DELETE_HORIZON_FLAG,
    END_TXN_VALUE,
    HEADER_SIZE,
    INT32_MAX,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_FLAG,
    TRANSACTIONAL_FLAG,
    UINT32,
    Record,
    compress,
    write_varint,
)


def _encode_record(record: Record, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # record attributes, unused in v2
    write_varint(timestamp_delta, body)
    write_varint(offset_delta, body)
    for field in (record.key, record.value):
        if field is None:
            write_varint(-1, body)
        else:
            write_varint(len(field), body)
            body += field
    write_varint(len(record.headers), body)
    for header_key, header_value in record.headers:
        encoded_key = header_key.encode("utf-8", "surrogateescape")
        write_varint(len(encoded_key), body)
        body += encoded_key
        if header_value is None:
            write_varint(-1, body)
        else:
            write_varint(len(header_value), body)
            body += header_value
    out = bytearray()
    write_varint(len(body), out)
    return bytes(out + body)


def _assemble_batch(
    records_blob: bytes,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    batch = bytearray(HEADER_SIZE + len(records_blob))
    BATCH_HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(records_blob),
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in below once the covered bytes are final
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    batch[HEADER_SIZE:] = records_blob
    UINT32.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    timestamp_type: int = CREATE_TIME,
    partition_leader_epoch: int = 0,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
    delete_horizon_ms: int | None = None,
    compression: int = 0,
    is_control: bool = False,
) -> bytes:
    """Encode a v2 batch; records keep their absolute offsets (gaps allowed, as after compaction).

    `last_offset_delta` defaults to the last record's delta; compaction passes the original batch's so the
    producer's last sequence survives (Kafka's overrideLastOffset). With no records it is required and an
    empty batch header is written (baseTimestamp -1, as Kafka's writeEmptyHeader). `max_timestamp` defaults to
    the records' maximum. `delete_horizon_ms` sets the delete-horizon flag and stores the horizon in
    baseTimestamp, with record timestamp deltas relative to it (KIP-534). `compression` is a codec id
    (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd); compaction keeps each batch's codec, as Kafka's cleaner does.
    """
    if not 0 <= compression < len(COMPRESSION_NAMES):
        raise ValueError(f"compression must be a codec id 0-4 (none/gzip/snappy/lz4/zstd): {compression}")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    if is_transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id >= 0")
    previous = base_offset - 1
    for record in records:
        if record.offset <= previous:
            raise ValueError(
                f"record offsets must be increasing and >= base_offset {base_offset}; got {record.offset} "
                f"after {previous}"
            )
        previous = record.offset
    if last_offset_delta is None:
        if not records:
            raise ValueError("an empty batch needs last_offset_delta (the original batch's offset range)")
        last_offset_delta = records[-1].offset - base_offset
    elif last_offset_delta < previous - base_offset:
        raise ValueError(
            f"last_offset_delta {last_offset_delta} ends before the last record offset {previous}"
        )
    if last_offset_delta > INT32_MAX:
        raise ValueError(f"a batch spans at most 2**31 offsets; last_offset_delta is {last_offset_delta}")

    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    else:
        base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    if max_timestamp is None:
        max_timestamp = max((record.timestamp for record in records), default=NO_TIMESTAMP)
    attributes = (TIMESTAMP_TYPE_FLAG if timestamp_type == LOG_APPEND_TIME else 0) | (
        TRANSACTIONAL_FLAG if is_transactional else 0
    )
    if records:  # Kafka never compresses an empty batch header
        attributes |= compression
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
    if is_control:  # a transaction marker, rewritten by compaction (its delete horizon)
        attributes |= CONTROL_FLAG
    blob = b"".join(
        _encode_record(record, record.offset - base_offset, record.timestamp - base_timestamp)
        for record in records
    )
    if records and compression:
        blob = compress(compression, blob)
    return _assemble_batch(
        blob,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=len(records),
    )


def build_control_batch(
    *,
    offset: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A COMMIT/ABORT marker batch as Kafka's MemoryRecords.withEndTransactionMarker writes it.

    One control record (key: version 0 + type, value: version 0 + coordinator epoch), CreateTime,
    uncompressed, attributes transactional|control, baseSequence -1.
    """
    key = CONTROL_KEY.pack(0, 1 if commit else 0)
    value = END_TXN_VALUE.pack(0, coordinator_epoch)
    blob = _encode_record(Record(offset, timestamp_ms, key, value), 0, 0)
    return _assemble_batch(
        blob,
        base_offset=offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
        last_offset_delta=0,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        record_count=1,
    )
