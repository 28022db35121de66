"""Hand-written codecs for the two hot APIs: ProduceRequest/Response v3-v9 and FetchRequest/Response v4-v12.

The general codec (kafka-python's generated classes, see protocol.py) builds an object per topic, per
partition and per field and copies every record batch; on the produce and fetch paths that costs more
than the broker's own work. Beyond the batch header, record batches are opaque bytes here: a Produce
request's records are handed on as memoryviews into the request frame, and a Fetch response's records
are written as the log's own bytes (or file regions sent with sendfile) between hand-encoded pieces.

Contract with the general codec, checked by tests/unit/broker/test_fastpath_codec.py:

- a decoder returns None for anything it does not take on itself (tagged fields, null arrays or names,
  lengths that overrun the frame, bytes left over, invalid UTF-8); the caller then uses the general
  codec, which produces the same result or the same error as before;
- an encoder produces exactly the bytes the general codec produces for the same response, frame size and
  response header included.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

Buffer = bytes | bytearray | memoryview

PRODUCE_VERSIONS = (3, 9)
FETCH_VERSIONS = (4, 12)
_PRODUCE_FLEXIBLE = 9
_FETCH_FLEXIBLE = 12

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16_I32 = struct.Struct(">hi")  # acks, timeout_ms
_I32_I64 = struct.Struct(">iq")


class _Unusual(Exception):
    """Internal: the request needs the general codec."""


# ---------------------------------------------------------------------------------------------------
# reading


def _uvarint(data: Buffer, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's readUnsignedVarint) at `pos`."""
    result = shift = 0
    for end in range(pos, pos + 5):
        byte = data[end]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, end + 1
        shift += 7
    raise _Unusual


def _no_tagged_fields(data: Buffer, pos: int) -> int:
    """Skip an empty tagged-field section; any tagged field sends the request to the general codec."""
    if data[pos] != 0:
        raise _Unusual
    return pos + 1


def _string(data: Buffer, pos: int, end: int, compact: bool) -> tuple[str, int]:
    """A non-null string (topic name): int16 length, or unsigned varint length + 1 when compact."""
    if compact:
        length, pos = _uvarint(data, pos)
        length -= 1
    else:
        (length,) = _I16.unpack_from(data, pos)
        pos += 2
    if length < 0 or pos + length > end:
        raise _Unusual
    try:
        return str(data[pos : pos + length], "utf-8"), pos + length
    except UnicodeDecodeError:
        raise _Unusual from None


def _nullable_string(data: Buffer, pos: int, end: int, compact: bool) -> tuple[str | None, int]:
    if compact:
        if data[pos] == 0:
            return None, pos + 1
    elif _I16.unpack_from(data, pos)[0] == -1:
        return None, pos + 2
    return _string(data, pos, end, compact)


def _array_length(data: Buffer, pos: int, end: int, compact: bool, min_item_bytes: int) -> tuple[int, int]:
    """A non-null array's element count, refused when the frame cannot hold that many elements."""
    if compact:
        count, pos = _uvarint(data, pos)
        count -= 1
    else:
        (count,) = _I32.unpack_from(data, pos)
        pos += 4
    if count < 0 or count * min_item_bytes > end - pos:
        raise _Unusual
    return count, pos


def _body_start(frame: Buffer, flexible: bool) -> int:
    """Where the body starts: after api key, version, correlation id, client id (int16 length, never
    compact) and, in flexible versions, the header's tagged fields. peek_header checked the client id."""
    (client_id_length,) = _I16.unpack_from(frame, 8)
    pos = 10 + max(client_id_length, 0)
    return _no_tagged_fields(frame, pos) if flexible else pos


# ---------------------------------------------------------------------------------------------------
# Produce


@dataclass(slots=True)
class ProduceRequestData:
    """What the produce handler needs of a ProduceRequest; records are views into the request frame."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, memoryview | None]]]]


def decode_produce_request(frame: Buffer, version: int) -> ProduceRequestData | None:
    """Decode a whole ProduceRequest frame (header included, size prefix excluded), or None.

    Steps: skip the header; transactional id, acks, timeout; per topic its name and per partition its
    index and records (int32 length, or unsigned varint length + 1 in flexible v9; -1/0 is null). In v9
    each partition, topic and the body end with tagged fields, which must be empty. The body must end
    exactly at the frame's end.
    """
    if not PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1]:
        return None
    compact = version >= _PRODUCE_FLEXIBLE
    view = memoryview(frame)
    end = len(view)
    try:
        pos = _body_start(view, compact)
        transactional_id, pos = _nullable_string(view, pos, end, compact)
        acks, timeout_ms = _I16_I32.unpack_from(view, pos)
        pos += 6
        topic_count, pos = _array_length(view, pos, end, compact, 3 if compact else 6)
        topics: list[tuple[str, list[tuple[int, memoryview | None]]]] = []
        for _ in range(topic_count):
            name, pos = _string(view, pos, end, compact)
            partition_count, pos = _array_length(view, pos, end, compact, 6 if compact else 8)
            partitions: list[tuple[int, memoryview | None]] = []
            for _ in range(partition_count):
                (index,) = _I32.unpack_from(view, pos)
                pos += 4
                if compact:
                    length, pos = _uvarint(view, pos)
                    length -= 1
                else:
                    (length,) = _I32.unpack_from(view, pos)
                    pos += 4
                records: memoryview | None = None
                if length >= 0:
                    if pos + length > end:
                        raise _Unusual
                    records = view[pos : pos + length]
                    pos += length
                elif length != -1:
                    raise _Unusual
                if compact:
                    pos = _no_tagged_fields(view, pos)
                partitions.append((index, records))
            if compact:
                pos = _no_tagged_fields(view, pos)
            topics.append((name, partitions))
        if compact:
            pos = _no_tagged_fields(view, pos)
    except (_Unusual, IndexError, struct.error):
        return None
    if pos != end:
        return None
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


@dataclass(slots=True)
class PartitionProduceResult:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: Sequence[tuple[int, str | None]] = ()
    error_message: str | None = None


class _Writer:
    """Appends Kafka wire types to a bytearray."""

    __slots__ = ("buf", "compact")

    def __init__(self, compact: bool) -> None:
        self.buf = bytearray(4)  # the frame size, filled in by frame()
        self.compact = compact

    def uvarint(self, value: int) -> None:
        buf = self.buf
        while value >= 0x80:
            buf.append((value & 0x7F) | 0x80)
            value >>= 7
        buf.append(value)

    def array_length(self, count: int | None) -> None:
        if self.compact:
            self.uvarint(0 if count is None else count + 1)
        else:
            self.buf += _I32.pack(-1 if count is None else count)

    def string(self, value: str | None) -> None:
        if value is None:
            if self.compact:
                self.buf.append(0)
            else:
                self.buf += b"\xff\xff"
            return
        encoded = value.encode("utf-8")
        if self.compact:
            self.uvarint(len(encoded) + 1)
        else:
            self.buf += _I16.pack(len(encoded))
        self.buf += encoded

    def bytes_length(self, length: int) -> None:
        """The length prefix of a non-null records/bytes field."""
        if self.compact:
            self.uvarint(length + 1)
        else:
            self.buf += _I32.pack(length)

    def tagged_fields(self) -> None:
        if self.compact:
            self.buf.append(0)


def _response_start(correlation_id: int, compact: bool) -> _Writer:
    """A response frame: size (filled in later), correlation id, and in flexible versions the response
    header's (empty) tagged fields."""
    out = _Writer(compact)
    out.buf += _I32.pack(correlation_id)
    out.tagged_fields()
    return out


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[PartitionProduceResult]]],
    throttle_time_ms: int = 0,
) -> bytes:
    """The framed ProduceResponse (v3-v9): what protocol.encode_response gives for the same content.

    Fields per partition: index, error code, base offset, log append time (v2+), log start offset
    (v5+), record errors and error message (v8+), tagged fields (v9+); then the throttle time."""
    compact = version >= _PRODUCE_FLEXIBLE
    out = _response_start(correlation_id, compact)
    buf = out.buf
    out.array_length(len(topics))
    for name, partitions in topics:
        out.string(name)
        out.array_length(len(partitions))
        for result in partitions:
            buf += struct.pack(
                ">ihqq", result.index, result.error_code, result.base_offset, result.log_append_time_ms
            )
            if version >= 5:
                buf += _I64.pack(result.log_start_offset)
            if version >= 8:
                out.array_length(len(result.record_errors))
                for batch_index, message in result.record_errors:
                    buf += _I32.pack(batch_index)
                    out.string(message)
                    out.tagged_fields()
                out.string(result.error_message)
            out.tagged_fields()
        out.tagged_fields()
    buf += _I32.pack(throttle_time_ms)
    out.tagged_fields()
    _I32.pack_into(buf, 0, len(buf) - 4)
    return bytes(buf)


# ---------------------------------------------------------------------------------------------------
# Fetch


@dataclass(slots=True)
class FetchRequestData:
    """What the fetch handler needs of a FetchRequest: per topic, (partition, fetch offset, max bytes)."""

    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: list[tuple[str, list[tuple[int, int, int]]]]
    session_id: int = 0
    session_epoch: int = -1
    forgotten: list[tuple[str, list[int]]] = field(default_factory=list)


# KIP-227: fetch requests carry a session id and epoch, and the partitions a session is to forget,
# from this version on (fetch_sessions.py).
FIRST_FETCH_SESSION_VERSION = 7


def decode_fetch_request(frame: Buffer, version: int) -> FetchRequestData | None:
    """Decode a whole FetchRequest frame (v4-v12, header included), or None.

    Steps: skip the header; replica id, max wait, min bytes, max bytes, isolation level, then session id
    and epoch (v7+); per topic its name and per partition: index, current leader epoch (v9+), fetch
    offset, last fetched epoch (v12+), log start offset (v5+), max bytes; forgotten topics (v7+), each
    a name and partition indexes; rack id (v11+). In v12 partitions, topics and the body end
    with tagged fields, which must be empty. The body must end exactly at the frame's end.
    """
    if not FETCH_VERSIONS[0] <= version <= FETCH_VERSIONS[1]:
        return None
    compact = version >= _FETCH_FLEXIBLE
    partition_format = ">i" + ("i" if version >= 9 else "") + "q" + ("i" if version >= 12 else "")
    partition_format += ("q" if version >= 5 else "") + "i"
    partition_struct = struct.Struct(partition_format)
    view = memoryview(frame)
    end = len(view)
    try:
        pos = _body_start(view, compact)
        _replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level = struct.unpack_from(
            ">iiiib", view, pos
        )
        pos += 17
        session_id, session_epoch = 0, -1
        if version >= FIRST_FETCH_SESSION_VERSION:
            session_id, session_epoch = struct.unpack_from(">ii", view, pos)
            pos += 8
        topic_count, pos = _array_length(view, pos, end, compact, 3 if compact else 6)
        topics: list[tuple[str, list[tuple[int, int, int]]]] = []
        for _ in range(topic_count):
            name, pos = _string(view, pos, end, compact)
            partition_count, pos = _array_length(view, pos, end, compact, partition_struct.size)
            partitions: list[tuple[int, int, int]] = []
            for _ in range(partition_count):
                fields = partition_struct.unpack_from(view, pos)
                pos += partition_struct.size
                if compact:
                    pos = _no_tagged_fields(view, pos)
                partitions.append((fields[0], fields[2 if version >= 9 else 1], fields[-1]))
            if compact:
                pos = _no_tagged_fields(view, pos)
            topics.append((name, partitions))
        forgotten: list[tuple[str, list[int]]] = []
        if version >= FIRST_FETCH_SESSION_VERSION:
            forgotten_count, pos = _array_length(view, pos, end, compact, 3 if compact else 6)
            for _ in range(forgotten_count):
                name, pos = _string(view, pos, end, compact)
                index_count, pos = _array_length(view, pos, end, compact, 4)
                forgotten.append((name, list(struct.unpack_from(f">{index_count}i", view, pos))))
                pos += 4 * index_count
                if compact:
                    pos = _no_tagged_fields(view, pos)
        if version >= 11:
            _rack, pos = _string(view, pos, end, compact)
        if compact:
            pos = _no_tagged_fields(view, pos)
    except (_Unusual, IndexError, struct.error):
        return None
    if pos != end:
        return None
    return FetchRequestData(
        max_wait_ms, min_bytes, max_bytes, isolation_level, topics, session_id, session_epoch, forgotten
    )


class RecordsChunk(Protocol):
    """A piece of a partition's records in a fetch response: bytes, or a file region (log.FileRegion)
    that the connection sends with sendfile."""

    def __len__(self) -> int: ...


@dataclass(slots=True)
class PartitionFetchResult:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[tuple[int, int]] | None = None  # (producer id, first offset)
    preferred_read_replica: int = -1
    records: Sequence[RecordsChunk] = ()


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[PartitionFetchResult]]],
    *,
    error_code: int = 0,
    session_id: int = 0,
    throttle_time_ms: int = 0,
) -> list[bytes | RecordsChunk]:
    """The framed FetchResponse (v4-v12) as pieces to write in order: hand-encoded bytes between each
    partition's records chunks, which are passed through untouched. Joined (file regions read), the
    pieces are exactly what protocol.encode_response gives for the same content.

    Fields: throttle time, then error code and session id (v7+); per topic its name, per partition:
    index, error code, high watermark, last stable offset, log start offset (v5+), aborted transactions
    (null when not read_committed), preferred read replica (v11+), records (non-null, possibly empty),
    tagged fields (v12+). The frame size counts every piece."""
    compact = version >= _FETCH_FLEXIBLE
    out = _response_start(correlation_id, compact)
    out.buf += _I32.pack(throttle_time_ms)
    if version >= 7:
        out.buf += struct.pack(">hi", error_code, session_id)
    pieces: list[bytes | RecordsChunk] = []
    size = 0
    out.array_length(len(topics))
    for name, partitions in topics:
        out.string(name)
        out.array_length(len(partitions))
        for result in partitions:
            buf = out.buf
            buf += struct.pack(
                ">ihqq",
                result.partition_index,
                result.error_code,
                result.high_watermark,
                result.last_stable_offset,
            )
            if version >= 5:
                buf += _I64.pack(result.log_start_offset)
            aborted = result.aborted_transactions
            out.array_length(None if aborted is None else len(aborted))
            for producer_id, first_offset in aborted or ():
                buf += struct.pack(">qq", producer_id, first_offset)
                out.tagged_fields()
            if version >= 11:
                buf += _I32.pack(result.preferred_read_replica)
            records_size = sum(len(chunk) for chunk in result.records)
            out.bytes_length(records_size)
            if records_size:
                pieces.append(bytes(buf))
                size += len(buf)
                pieces.extend(chunk for chunk in result.records if len(chunk))
                size += records_size
                out.buf = bytearray()
            out.tagged_fields()
        out.tagged_fields()
    out.tagged_fields()
    pieces.append(bytes(out.buf))
    size += len(out.buf)
    first = pieces[0]
    assert isinstance(first, bytes)
    pieces[0] = _I32.pack(size - 4) + first[4:]
    return pieces
