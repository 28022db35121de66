"""Kafka v2 record batches (magic 2): parse, validate, re-offset, encode, decode and dump them.

The format is Kafka's `DefaultRecordBatch` (all integers big-endian)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (=2) | crc uint32
    | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64
    | producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records...

`batchLength` counts the bytes after itself; the CRC32C covers everything from `attributes` to the end,
so the broker can rewrite `baseOffset` and `partitionLeaderEpoch` without recomputing it.
Records (possibly compressed as one blob) are::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value
    | headersCount varint | [headerKeyLength varint | headerKey utf8 | headerValueLength varint | headerValue]

All varints are zigzag encoded. Error codes and messages follow Kafka's `ProduceRequest.validateRecords`,
`UnifiedLog.analyzeAndValidateRecords`, `LogValidator` and `DefaultRecord.readFrom`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from sparkafka.broker.errors import BrokerError, ErrorCode

Buffer = bytes | bytearray | memoryview

HEADER_SIZE = 61  # bytes of the v2 batch header incl. baseOffset+batchLength
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
MAGIC = 2

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
_ATTRIBUTES = struct.Struct(">h")
_PARTITION_LEADER_EPOCH_OFFSET = 12
_MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
_MAX_TIMESTAMP_OFFSET = 35
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
# Kafka's ByteBufferLogInputStream rejects any batch length below the smallest legacy (v0) record.
_MIN_ANY_FORMAT_LENGTH = 14

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

COMPRESSION_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
_CODEC_PIP_PACKAGES = {2: "python-snappy", 3: "lz4", 4: "zstandard"}
CONTROL_TYPE_NAMES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
CONTROL_KEY = struct.Struct(">hh")  # version, type
END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


class CorruptBatchError(ValueError):
    """Bytes that are not a complete, valid v2 batch.

    `valid_bytes` is the length of the prefix made of complete valid batches (what a log keeps when
    it truncates a torn tail). `incomplete_size` is set when the bytes merely stop short, to the number
    of bytes the cut-off batch needs from its start; it is None when the bytes are wrong, not short.
    """

    def __init__(self, message: str, *, valid_bytes: int = 0, incomplete_size: int | None = None) -> None:
        super().__init__(message)
        self.valid_bytes = valid_bytes
        self.incomplete_size = incomplete_size


class DecompressionError(CorruptBatchError):
    """A batch whose compressed record blob cannot be decompressed."""


class InvalidRecordError(ValueError):
    """A record inside a batch is malformed (Kafka's InvalidRecordException); the message is Kafka's."""


class CodecUnavailableError(RuntimeError):
    """The Python library needed for a batch's compression codec is not installed."""


class ProduceRequestRecordsError(BrokerError):
    """Kafka's ProduceRequest.validateRecords refused a partition's records (no batch, a magic other
    than 2, more than one batch): KafkaApis answers that before the partition's log is involved, so the
    Produce response carries no log start offset for it, unlike errors found while appending."""


class RecordValidationError(BrokerError):
    """Some records of a batch were rejected; `record_errors` holds (batch index, message) per record.

    The Produce response reports these per record (ProduceResponse RecordErrors), as Kafka does.
    """

    def __init__(self, code: ErrorCode, message: str, record_errors: Sequence[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.record_errors = tuple(record_errors)


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from 2**31-1 to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_FLAG else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def delete_horizon_ms(self) -> int | None:
        """Set by compaction on batches holding tombstones; Kafka stores it in baseTimestamp."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    # Header keys are decoded with surrogateescape so that invalid UTF-8 survives a re-encode unchanged.
    headers: tuple[tuple[str, bytes | None], ...] = ()


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte v2 header at `pos`; CorruptBatchError if it is short, not magic 2 or too small."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptBatchError(
            f"record batch at byte {pos} is truncated: a v2 batch header needs {HEADER_SIZE} bytes, "
            f"only {available} remain",
            valid_bytes=pos,
            incomplete_size=HEADER_SIZE,
        )
    header = BatchHeader(*BATCH_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptBatchError(
            f"record batch at byte {pos} has magic {header.magic}; only magic 2 batches (Kafka >= 0.11 "
            "clients) are supported",
            valid_bytes=pos,
        )
    if header.batch_length < _MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            f"record batch at byte {pos} declares batchLength {header.batch_length}, below the "
            f"{_MIN_BATCH_LENGTH}-byte minimum of a v2 header",
            valid_bytes=pos,
        )
    return header


def compute_crc(batch: Buffer, header: BatchHeader) -> int:
    return int(crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET : header.size]))


def crc_is_valid(batch: Buffer, header: BatchHeader) -> bool:
    return len(batch) >= header.size and compute_crc(batch, header) == header.crc


def iter_batches(
    buf: Buffer, *, validate_crc: bool = False, base_position: int = 0
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch in `buf`, in order.

    Stops cleanly when the batches end exactly at the end of `buf`. Otherwise raises CorruptBatchError
    once the complete valid prefix has been yielded: `valid_bytes` is that prefix's length, and
    `incomplete_size` tells a caller reading a file in chunks how many bytes the cut-off batch needs.
    `base_position` is where `buf` sits in its file: it is added to positions, messages and valid_bytes.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    while pos < end:
        at = base_position + pos
        remaining = end - pos
        if remaining < HEADER_SIZE:
            needed = HEADER_SIZE
            if remaining >= LOG_OVERHEAD:
                (length,) = INT32.unpack_from(view, pos + 8)
                if length < _MIN_BATCH_LENGTH:
                    raise CorruptBatchError(
                        f"record batch at byte {at} declares batchLength {length}, below the "
                        f"{_MIN_BATCH_LENGTH}-byte minimum of a v2 header",
                        valid_bytes=at,
                    )
                needed = LOG_OVERHEAD + length
            if remaining > _MAGIC_OFFSET and view[pos + _MAGIC_OFFSET] != MAGIC:
                raise CorruptBatchError(
                    f"record batch at byte {at} has magic {view[pos + _MAGIC_OFFSET]}; only magic 2 is "
                    "supported",
                    valid_bytes=at,
                )
            raise CorruptBatchError(
                f"record batch at byte {at} is truncated: {remaining} bytes remain of at least {needed}",
                valid_bytes=at,
                incomplete_size=needed,
            )
        try:
            header = parse_header(view, pos)
        except CorruptBatchError as exc:
            raise CorruptBatchError(f"at byte {at}: {exc}", valid_bytes=at) from None
        if header.size > remaining:
            raise CorruptBatchError(
                f"record batch at byte {at} (baseOffset {header.base_offset}) is truncated: it declares "
                f"{header.size} bytes, only {remaining} remain",
                valid_bytes=at,
                incomplete_size=header.size,
            )
        if validate_crc:
            actual = compute_crc(view[pos : pos + header.size], header)
            if actual != header.crc:
                raise CorruptBatchError(
                    f"record batch at byte {at} (baseOffset {header.base_offset}) is corrupt: stored crc "
                    f"{header.crc}, computed crc {actual}",
                    valid_bytes=at,
                )
        yield at, header
        pos += header.size


def first_batch_is_transactional(buf: Buffer | None) -> bool:
    """Whether the first batch of a Produce partition entry is marked transactional (Kafka's
    RequestUtils.hasTransactionalRecords looks at that batch only; magic 0 and 1 have no such flag)."""
    if buf is None or len(buf) < ATTRIBUTES_OFFSET + _ATTRIBUTES.size:
        return False
    view = memoryview(buf)
    if view[_MAGIC_OFFSET] != MAGIC:
        return False
    return bool(_ATTRIBUTES.unpack_from(view, ATTRIBUTES_OFFSET)[0] & TRANSACTIONAL_FLAG)


def _produce_batch_size(view: memoryview, pos: int) -> int | None:
    """Size of the complete batch at `pos`, or None if none fits (Kafka's ByteBufferLogInputStream)."""
    remaining = len(view) - pos
    if remaining < LOG_OVERHEAD:
        return None
    (length,) = INT32.unpack_from(view, pos + 8)
    if length < _MIN_ANY_FORMAT_LENGTH:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"Record size {length} is less than the minimum record overhead ({_MIN_ANY_FORMAT_LENGTH})",
        )
    if remaining <= _MAGIC_OFFSET:
        return None
    magic = struct.unpack_from(">b", view, pos + _MAGIC_OFFSET)[0]
    if magic < 0 or magic > MAGIC:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"Invalid magic found in record: {magic}")
    size = LOG_OVERHEAD + length
    return size if remaining >= size else None


def check_produce_request_records(buf: Buffer, produce_version: int | None = None) -> int:
    """Step 1 of :func:`validate_produce_payload` alone (Kafka's ProduceRequest.validateRecords, which
    KafkaApis runs before anything else looks at the records): the size of the one v2 batch."""
    view = memoryview(buf)
    invalid = ErrorCode.INVALID_RECORD
    requests = "Produce requests" + ("" if produce_version is None else f" with version {produce_version}")
    size = _produce_batch_size(view, 0)
    if size is None:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} must have at least one record batch per partition"
        )
    if view[_MAGIC_OFFSET] != MAGIC:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} are only allowed to contain record batches with magic version 2"
        )
    if _produce_batch_size(view, size) is not None:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} are only allowed to contain exactly one record batch per partition"
        )
    return size


def transactional_producer(buf: Buffer) -> tuple[int, int] | None:
    """(producer id, epoch) of a v2 batch at the start of ``buf`` marked transactional, else None;
    None too for a batch whose header does not hold together: validation refuses it (CORRUPT_MESSAGE,
    as any other batch), with no transaction to verify first."""
    if len(buf) < HEADER_SIZE or not first_batch_is_transactional(buf):
        return None
    try:
        header = parse_header(memoryview(buf))
    except CorruptBatchError:
        return None
    return header.producer_id, header.producer_epoch


def assign_offset_in_place(batch: bytearray, base_offset: int, *, partition_leader_epoch: int = 0) -> None:
    """Rewrite baseOffset and partitionLeaderEpoch of the batch at the start of `batch` (CRC unaffected)."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(
            f"cannot assign an offset to {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes"
        )
    INT64.pack_into(batch, 0, base_offset)
    INT32.pack_into(batch, _PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_max_timestamp_in_place(batch: bytearray, timestamp_type: int, max_timestamp: int) -> None:
    """Kafka's DefaultRecordBatch.setMaxTimestamp on the v2 batch at the start of `batch`, as LogValidator
    applies it to every produced batch: LogAppendTime topics stamp the broker's append time, CreateTime
    topics the largest record timestamp (which also clears a LogAppendTime mark a producer set).

    Steps: nothing if the batch already has this type and maxTimestamp; else set or clear the
    timestamp-type bit of the attributes, write `max_timestamp`, recompute the CRC32C (it covers the
    attributes onwards). The base timestamp and the records' deltas stay as the producer wrote them: in
    a LogAppendTime batch every reader takes maxTimestamp as each record's timestamp."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(f"cannot stamp {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    (attributes,) = _ATTRIBUTES.unpack_from(batch, ATTRIBUTES_OFFSET)
    stamped = (attributes & ~TIMESTAMP_TYPE_FLAG) | (TIMESTAMP_TYPE_FLAG if timestamp_type else 0)
    (current,) = INT64.unpack_from(batch, _MAX_TIMESTAMP_OFFSET)
    if stamped == attributes and current == max_timestamp:
        return
    _ATTRIBUTES.pack_into(batch, ATTRIBUTES_OFFSET, stamped)
    INT64.pack_into(batch, _MAX_TIMESTAMP_OFFSET, max_timestamp)
    (batch_length,) = INT32.unpack_from(batch, 8)
    end = LOG_OVERHEAD + batch_length
    UINT32.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:end]))


def assign_offset(batch: Buffer, base_offset: int, *, partition_leader_epoch: int = 0) -> bytes:
    """Return `batch` with baseOffset and partitionLeaderEpoch rewritten; the CRC does not cover them."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(
            f"cannot assign an offset to {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes"
        )
    out = bytearray(batch)
    INT64.pack_into(out, 0, base_offset)
    INT32.pack_into(out, _PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)
    return bytes(out)


# ---------------------------------------------------------------------------------------------------
# varints


class _Underflow(Exception):
    """Internal: a read ran past the bytes it was allowed to use."""


def write_varint(value: int, out: bytearray) -> None:
    # Zigzag over 64 bits equals Kafka's 32-bit zigzag for every value that fits in an int32.
    unsigned = (value << 1) ^ (value >> 63)
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)


def _read_varint(data: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(max_bytes):
        if pos >= end:
            raise _Underflow
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise InvalidRecordError(f"Varint is too long: more than {max_bytes} bytes at byte {pos - max_bytes}")


def _read_bytes(data: bytes, pos: int, end: int, length: int) -> tuple[bytes | None, int]:
    if length < 0:
        return None, pos
    if pos + length > end:
        raise _Underflow
    return data[pos : pos + length], pos + length


# ---------------------------------------------------------------------------------------------------
# decoding


def decompress(header: BatchHeader, blob: bytes) -> bytes:
    compression = header.compression
    if compression >= len(COMPRESSION_NAMES):
        raise CorruptBatchError(
            f"batch at offset {header.base_offset} uses unknown compression id {compression}"
        )
    name = COMPRESSION_NAMES[compression]
    codec = _codec_module(compression, f"batch at offset {header.base_offset}")
    decoders = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}
    try:
        return bytes(decoders[compression](blob))
    except Exception as exc:  # each codec library raises its own exception types
        raise DecompressionError(
            f"Failed to decompress record stream: {name} batch at offset {header.base_offset}: {exc}"
        ) from exc


def _codec_module(compression: int, what: str) -> Any:
    """kafka-python's codec helpers, after checking the codec's library is installed."""
    from kafka import codec

    available = {2: codec.has_snappy, 3: codec.has_lz4, 4: codec.has_zstd}.get(compression, codec.has_gzip)
    if not available():
        name = COMPRESSION_NAMES[compression]
        raise CodecUnavailableError(
            f"{what} is {name}-compressed but the Python library for {name} is missing; install it with "
            f"`pip install {_CODEC_PIP_PACKAGES[compression]}`"
        )
    return codec


def compress(compression: int, blob: bytes) -> bytes:
    codec = _codec_module(compression, "the batch being encoded")
    encoders = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
    return bytes(encoders[compression](blob))


def decode_record_bytes(header: BatchHeader, data: bytes) -> list[Record]:
    """Decode `record_count` records from the (decompressed) record bytes, with Kafka's error messages."""
    if header.record_count < 0:
        raise InvalidRecordError(f"Found invalid record count {header.record_count} in magic v2 batch")
    log_append_time = header.max_timestamp if header.timestamp_type == LOG_APPEND_TIME else None
    records: list[Record] = []
    end = len(data)
    pos = 0
    for _ in range(header.record_count):
        try:
            body_size, pos = _read_varint(data, pos, end, 5)
        except _Underflow:
            raise InvalidRecordError("Incorrect declared batch size, premature EOF reached") from None
        if body_size < 0 or end - pos < body_size:
            raise InvalidRecordError(
                f"Invalid record size: expected {body_size} bytes in record payload, but instead the buffer "
                f"has only {end - pos} remaining bytes."
            )
        record_end = pos + body_size
        try:
            pos += 1  # record attributes: unused in v2
            timestamp_delta, pos = _read_varint(data, pos, record_end, 10)
            offset_delta, pos = _read_varint(data, pos, record_end, 5)
            key_length, pos = _read_varint(data, pos, record_end, 5)
            key, pos = _read_bytes(data, pos, record_end, key_length)
            value_length, pos = _read_varint(data, pos, record_end, 5)
            value, pos = _read_bytes(data, pos, record_end, value_length)
            header_count, pos = _read_varint(data, pos, record_end, 5)
            if header_count < 0:
                raise InvalidRecordError(f"Found invalid number of record headers {header_count}")
            if header_count > record_end - pos:
                raise InvalidRecordError(
                    f"Found invalid number of record headers. {header_count} is larger than the remaining "
                    "size of the buffer"
                )
            headers: list[tuple[str, bytes | None]] = []
            for _ in range(header_count):
                key_size, pos = _read_varint(data, pos, record_end, 5)
                if key_size < 0:
                    raise InvalidRecordError(f"Invalid negative header key size {key_size}")
                header_key, pos = _read_bytes(data, pos, record_end, key_size)
                header_value_size, pos = _read_varint(data, pos, record_end, 5)
                header_value, pos = _read_bytes(data, pos, record_end, header_value_size)
                headers.append(((header_key or b"").decode("utf-8", "surrogateescape"), header_value))
        except _Underflow:
            raise InvalidRecordError("Found invalid record structure") from None
        if pos != record_end:
            raise InvalidRecordError(
                f"Invalid record size: expected to read {body_size} bytes in record payload, but instead "
                f"read {pos - (record_end - body_size)}"
            )
        timestamp = header.base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        records.append(Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers)))
    if pos != end:
        raise InvalidRecordError("Incorrect declared batch size, records still remaining in file")
    return records


def decode_records(batch: Buffer) -> list[Record]:
    """Decode every record of one batch (any codec). Does not check the CRC: see crc_is_valid.

    Raises CorruptBatchError for a bad header or undecompressable blob, InvalidRecordError for malformed
    records, CodecUnavailableError when the codec's Python library is missing.
    """
    header = parse_header(batch)
    if len(batch) < header.size:
        raise CorruptBatchError(
            f"batch at offset {header.base_offset} is truncated: {len(batch)} of {header.size} bytes",
            incomplete_size=header.size,
        )
    blob = bytes(memoryview(batch)[HEADER_SIZE : header.size])
    if header.compression:
        blob = decompress(header, blob)
    return decode_record_bytes(header, blob)


def control_marker(batch: Buffer) -> tuple[str, int] | None:
    """("COMMIT" | "ABORT", coordinator_epoch) for a transaction marker batch, else None."""
    header = parse_header(batch)
    if not header.is_control:
        return None
    records = decode_records(batch)
    if not records:
        return None  # an emptied control batch kept only for its producer epoch
    key, value = records[0].key, records[0].value
    if key is None or len(key) < CONTROL_KEY.size:
        raise CorruptBatchError(
            f"control batch at offset {header.base_offset} has a {0 if key is None else len(key)}-byte key; "
            f"a control record key needs at least {CONTROL_KEY.size} bytes"
        )
    key_version, control_type = CONTROL_KEY.unpack_from(key)
    if key_version < 0:
        raise CorruptBatchError(f"control batch at offset {header.base_offset} has key version {key_version}")
    if control_type not in (0, 1):
        return None
    if value is None or len(value) < END_TXN_VALUE.size:
        raise CorruptBatchError(
            f"transaction marker at offset {header.base_offset} has a "
            f"{0 if value is None else len(value)}-byte value; it needs at least {END_TXN_VALUE.size} bytes"
        )
    value_version, coordinator_epoch = END_TXN_VALUE.unpack_from(value)
    if value_version < 0:
        raise CorruptBatchError(
            f"transaction marker at offset {header.base_offset} has value version {value_version}"
        )
    return CONTROL_TYPE_NAMES[control_type], coordinator_epoch
