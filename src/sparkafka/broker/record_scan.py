"""The records of a produced v2 batch walked without decoding them: which have no key, and the extremes
of their timestamps (what the produce path checks), for the cost of a scan of their bytes.

:func:`scan_records` accepts exactly what :func:`~sparkafka.broker.records.decode_records` accepts, with
the same errors: whatever the fast walk does not take on itself goes to the full decoder. Kafka has no
counterpart (its LogValidator decodes every record); the walk exists because decoding each record in
Python cost more than the rest of an append.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import cast

from sparkafka.broker.records import (
    HEADER_SIZE,
    INT64_MAX,
    INT64_MIN,
    LOG_APPEND_TIME,
    NO_TIMESTAMP,
    BatchHeader,
    Buffer,
    decode_record_bytes,
    decode_records,
    decompress,
)


class _NotFast(Exception):
    """Internal: the fast record walk met something only the full decoder may judge."""


def _varint_end(data: bytes | bytearray, pos: int, max_bytes: int) -> int:
    """Position after the varint at `pos` (no value needed); _NotFast if it is longer than max_bytes."""
    for end in range(pos, pos + max_bytes):
        if data[end] < 0x80:
            return end + 1
    raise _NotFast


def _varint_value(data: bytes | bytearray, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """(zigzag-decoded value, next position) of the varint at `pos`; _NotFast past `max_bytes` (5 for an
    int32, 10 for a long)."""
    result = shift = 0
    for end in range(pos, pos + max_bytes):
        byte = data[end]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), end + 1
        shift += 7
    raise _NotFast


# Bytes sets for bytes.lstrip: how many leading bytes of a strided slice satisfy one run constraint.
_CONTINUATION_BYTES = bytes(range(0x80, 0x100))  # a varint byte with more to follow
_FINAL_BYTES = bytes(range(0x80))  # the last byte of a varint
_EXACT_BYTES = tuple(bytes([value]) for value in range(256))
# One-byte zigzag varints: the value of each byte, and (for bytes.translate over a column of them) a
# byte that sorts as the value does: value + 64.
_ONE_BYTE_VALUE = tuple((byte >> 1) ^ -(byte & 1) for byte in range(0x80))
_ONE_BYTE_RANK = bytes(value + 64 for value in _ONE_BYTE_VALUE) + bytes(0x80)
_AT_MOST = tuple(bytes(range(value + 1)) for value in range(256))  # translate(None, delete=...) keeps > value
_ABOVE = tuple(bytes(range(value + 1, 256)) for value in range(256))  # ... keeps <= value


def _byte_extremes(column: bytes | bytearray) -> tuple[int, int]:
    """(smallest, largest) byte of a non-empty column. Bisected with bytes.translate, a pass in C each
    (14 at most), as min() and max() take a Python object per byte: a third of their time on 2,000 bytes."""
    low, high = 0, 255
    while low < high:  # the smallest: is some byte <= mid?
        mid = (low + high) // 2
        if column.translate(None, _ABOVE[mid]):
            high = mid
        else:
            low = mid + 1
    smallest = low
    low, high = smallest, 255
    while low < high:  # the largest: is some byte > mid?
        mid = (low + high) // 2
        if column.translate(None, _AT_MOST[mid]):
            low = mid + 1
        else:
            high = mid
    return smallest, low


@functools.cache
def _two_byte_values() -> tuple[int, ...]:
    """The value of every two-byte zigzag varint, indexed by its bytes read as a little-endian uint16
    (first byte | second << 8); other indexes hold 0."""
    values = [0] * 65536
    for second in range(0x80):
        for first in range(0x80, 0x100):
            raw = (first & 0x7F) | (second << 7)
            values[first | second << 8] = (raw >> 1) ^ -(raw & 1)
    return tuple(values)


# The walk tries a run after the first _FIRST_RUN_TRY records and _RUN_INTERVAL records after each run
# that paid (at least _MIN_RUN records); after one that did not it waits _RUN_BACKOFF records, doubling
# each time, so that batches of varied sizes pay for O(log records) tries only.
_FIRST_RUN_TRY = 3
_RUN_INTERVAL = 16
_MIN_RUN = 16
_RUN_BACKOFF = 64


@dataclass(frozen=True)
class _Template:
    size: int  # the record's bytes, its length varint included
    shape: list[tuple[int, bytes]]  # (byte position relative to its start, bytes that byte may be)
    keyless: bool
    timestamp_at: int  # where its timestamp delta starts, relative to its start
    timestamp_width: int  # the bytes of that varint


def _record_template(data: bytes | bytearray, pos: int, end: int) -> _Template | None:
    """Parse the record at `pos` the way decode_record_bytes does and describe its shape, or None if it
    is malformed or unusual.

    A record whose bytes at those positions are in those sets parses the same way: the varints whose value
    matters (lengths, key and value sizes, header count and sizes) have identical bytes, the two it only
    skips (timestamp and offset delta) have the same width, and everything else is payload."""
    shape: list[tuple[int, bytes]] = []
    start = pos

    def varint(exact: bool, max_bytes: int) -> int:
        nonlocal pos
        result = shift = 0
        for i in range(max_bytes):
            byte = data[pos + i]
            result |= (byte & 0x7F) << shift
            if exact:
                shape.append((pos + i - start, _EXACT_BYTES[byte]))
            else:
                shape.append((pos + i - start, _CONTINUATION_BYTES if byte >= 0x80 else _FINAL_BYTES))
            if byte < 0x80:
                pos += i + 1
                return (result >> 1) ^ -(result & 1)
            shift += 7
        raise _NotFast

    try:
        size = varint(True, 5)
        record_end = pos + size
        if size < 0 or record_end > end:
            return None
        pos += 1  # attributes
        timestamp_at = pos - start
        varint(False, 10)  # timestamp delta
        timestamp_width = pos - start - timestamp_at
        varint(False, 5)  # offset delta
        key_size = varint(True, 5)
        pos += max(key_size, 0)
        value_size = varint(True, 5)
        pos += max(value_size, 0)
        if pos >= record_end:
            return None
        header_count = varint(True, 5)
        if header_count < 0 or header_count > record_end - pos:
            return None
        for _ in range(header_count):
            header_key_size = varint(True, 5)
            if header_key_size < 0:
                return None
            pos += header_key_size
            header_value_size = varint(True, 5)
            pos += max(header_value_size, 0)
            if pos > record_end:
                return None
    except (_NotFast, IndexError):
        return None
    if pos != record_end:
        return None
    return _Template(record_end - start, shape, key_size < 0, timestamp_at, timestamp_width)


@dataclass(frozen=True)
class _Run:
    count: int  # records
    period: int  # bytes of each
    keyless: bool
    min_timestamp_delta: int
    max_timestamp_delta: int


_NO_RUN = _Run(0, 0, False, 0, 0)


def _uniform_run(data: bytes | bytearray, pos: int, end: int, limit: int) -> _Run:
    """The run of same-shaped records starting at `pos`, at most `limit`; a run of 0 records if the
    record at `pos` is not one the fast walk accepts.

    Each constrained byte position is checked for the whole run at once: a strided slice picks that byte
    out of every record and lstrip counts how many leading records have an allowed value there. The
    timestamp deltas of the run's records sit at one position of each: one-byte deltas are ranked
    through a table and their extremes taken in C; wider ones are decoded one by one."""
    template = _record_template(data, pos, end)
    if template is None:
        return _NO_RUN
    period = template.size
    count = min(limit, (end - pos) // period)
    for relative, allowed in template.shape:
        if count <= 1:
            break
        first = pos + relative
        column = data[first : first + (count - 1) * period + 1 : period]
        count = min(count, len(column) - len(column.lstrip(allowed)))
    first = pos + template.timestamp_at
    last = first + (count - 1) * period + 1
    if template.timestamp_width == 1:
        low, high = _byte_extremes(data[first:last:period].translate(_ONE_BYTE_RANK))
        low, high = low - 64, high - 64
    elif template.timestamp_width == 2:
        pairs = bytearray(2 * count)  # each delta's two bytes as one native uint16, first | second << 8
        little = sys.byteorder == "little"
        pairs[0 if little else 1 :: 2] = data[first:last:period]
        pairs[1 if little else 0 :: 2] = data[first + 1 : last + 1 : period]
        deltas = list(map(_two_byte_values().__getitem__, memoryview(pairs).cast("H")))
        low, high = min(deltas), max(deltas)
    else:
        deltas = [_varint_value(data, at, 10)[0] for at in range(first, last, period)]
        low, high = min(deltas), max(deltas)
    return _Run(count, period, template.keyless, low, high)


def _skip_headers(data: bytes | bytearray, pos: int, record_end: int) -> int:
    """Position after a record's headers (count, then per header key size, key, value size, value), or
    -1 when they are malformed; _NotFast for an overlong varint."""
    if pos >= record_end:
        return -1  # the header count must still follow
    header_count, pos = _varint_value(data, pos)
    if header_count < 0 or header_count > record_end - pos:
        return -1
    for _ in range(header_count):
        header_key_size, pos = _varint_value(data, pos)
        if header_key_size < 0:
            return -1
        header_value_size, pos = _varint_value(data, pos + header_key_size)
        if header_value_size > 0:
            pos += header_value_size
        if pos > record_end:
            return -1
    return pos


def _scan_fast(data: bytes | bytearray, count: int, start: int = 0) -> tuple[list[int], int, int] | None:
    """The produce hot path: walk the `count` records in data[start:] without building them and return
    (the indexes of the keyless ones, the smallest and the largest timestamp delta), or None when
    anything is unusual (malformed, overlong varint, bytes left over), in which case the full decoder
    must run and raise Kafka's exact error.

    It accepts exactly the records decode_record_bytes accepts: the same fields in the same order, the
    record and the batch ending exactly where declared (a read past its record's end always leaves the
    position past that end, since every field read advances it). One- and two-byte varints, nearly all
    of them, are decoded inline.

    Batches of same-sized records (fixed-size values: common, and what benchmarks send) are checked a run
    at a time: now and then (see _FIRST_RUN_TRY) _uniform_run takes the next record as a template and
    checks, column by column in C (strided slices), how many following records have exactly its shape;
    those are valid for the same reason the template is. Runs that do not pay back off exponentially, so
    batches of varied sizes cost little more than the per-record walk."""
    keyless: list[int] = []
    end = len(data)
    pos = start
    index = 0
    next_try = _FIRST_RUN_TRY
    backoff = _RUN_BACKOFF
    low, high = INT64_MAX, INT64_MIN  # timestamp deltas (varlongs)
    try:
        while index < count:
            tried = False
            for current in range(index, count):
                # Zigzag varints: a one-byte varint is negative iff its low bit is set, else its value is
                # byte >> 1; for two bytes the same holds for raw = low 7 bits | second byte << 7.
                # length (varint), then the record attributes (one byte, unused)
                byte = data[pos]
                if byte < 0x80:
                    if byte & 1:
                        return None
                    record_end = pos + 1 + (byte >> 1)
                    pos += 2
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    if raw & 1:
                        return None
                    record_end = pos + 2 + (raw >> 1)
                    pos += 3
                else:
                    size, pos = _varint_value(data, pos)
                    if size < 0:
                        return None
                    record_end = pos + size
                    pos += 1
                if record_end > end:
                    return None
                # timestamp delta (varlong): its extremes are what the timestamp checks need
                byte = data[pos]
                if byte < 0x80:
                    delta = _ONE_BYTE_VALUE[byte]
                    pos += 1
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    delta = (raw >> 1) ^ -(raw & 1)
                    pos += 2
                else:
                    delta, pos = _varint_value(data, pos, 10)
                if delta < low:
                    low = delta
                if delta > high:
                    high = delta
                # offset delta (varint): only skipped; past 8191 it takes three bytes
                if data[pos] < 0x80:
                    pos += 1
                elif data[pos + 1] < 0x80:
                    pos += 2
                elif data[pos + 2] < 0x80:
                    pos += 3
                else:
                    pos = _varint_end(data, pos, 5)
                # key length and key (a negative length is a null key)
                byte = data[pos]
                if byte < 0x80:
                    if byte & 1:
                        keyless.append(current)
                        pos += 1
                    else:
                        pos += 1 + (byte >> 1)
                else:
                    length, pos = _varint_value(data, pos)
                    if length < 0:
                        keyless.append(current)
                    else:
                        pos += length
                # value length and value (a negative length is a null value)
                byte = data[pos]
                if byte < 0x80:
                    pos += 1 if byte & 1 else 1 + (byte >> 1)
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    pos += 2 if raw & 1 else 2 + (raw >> 1)
                else:
                    length, pos = _varint_value(data, pos)
                    if length > 0:
                        pos += length
                # headers: none, the common case, is one zero byte that ends the record
                if (pos + 1 != record_end or data[pos] != 0) and _skip_headers(
                    data, pos, record_end
                ) != record_end:
                    return None
                pos = record_end
                if current != next_try:
                    continue
                tried = True
                break
            if not tried:
                break  # every record walked
            index = current + 1
            run = _uniform_run(data, pos, end, count - index)
            if run.count:
                if run.keyless:
                    keyless.extend(range(index, index + run.count))
                low = min(low, run.min_timestamp_delta)
                high = max(high, run.max_timestamp_delta)
            index += run.count
            pos += run.count * run.period
            if run.count >= _MIN_RUN:
                next_try = index + _RUN_INTERVAL
            else:
                next_try = index + backoff
                backoff *= 2
    except (_NotFast, IndexError):
        return None
    return (keyless, low, high) if pos == end else None


@dataclass(frozen=True)
class RecordScan:
    """What the produce path needs of a batch's records: which have no key, and the smallest and the
    largest of their timestamps as Kafka reads them (``Record.timestamp()``: base timestamp plus delta,
    as a Java long; every record's is maxTimestamp in a LogAppendTime batch)."""

    keyless: list[int]
    min_timestamp: int
    max_timestamp: int


def as_long(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as Java's long arithmetic does."""
    return (value - INT64_MIN) % 2**64 + INT64_MIN


def scan_records(batch: Buffer, header: BatchHeader) -> RecordScan:
    """Validate every record of one whole batch as decode_records does (same errors) and return what the
    produce path needs of them; cheap for well-formed batches, which are not decoded into Records.

    An uncompressed batch given as exactly its own bytes is walked where it is; otherwise the records
    are copied out (and decompressed) first. Whatever the fast walk does not accept goes to the full
    decoder, which raises Kafka's error for it."""
    in_place = isinstance(batch, bytes | bytearray) and len(batch) == header.size and not header.compression
    fast = None
    if in_place and header.record_count >= 0:
        fast = _scan_fast(cast(bytes | bytearray, batch), header.record_count, HEADER_SIZE)
    if fast is None:
        blob = bytes(memoryview(batch)[HEADER_SIZE : header.size])
        if header.compression:
            blob = decompress(header, blob)
        if header.record_count >= 0 and not in_place:
            fast = _scan_fast(blob, header.record_count)
        if fast is None:
            records = decode_record_bytes(header, blob)
            keyless = [index for index, record in enumerate(records) if record.key is None]
            deltas = [record.timestamp - header.base_timestamp for record in records] or [0]
            fast = keyless, min(deltas), max(deltas)
    keyless, low, high = fast
    if header.timestamp_type == LOG_APPEND_TIME:
        return RecordScan(keyless, header.max_timestamp, header.max_timestamp)
    if header.record_count <= 0:
        return RecordScan(keyless, NO_TIMESTAMP, NO_TIMESTAMP)
    base = header.base_timestamp
    if base + low >= INT64_MIN and base + high <= INT64_MAX:
        return RecordScan(keyless, base + low, base + high)
    # A sum past a long wraps in Kafka: the extremes are those of the wrapped timestamps.
    records = decode_records(batch)
    wrapped = [as_long(base + (record.timestamp - base)) for record in records]
    return RecordScan(keyless, min(wrapped), max(wrapped))
