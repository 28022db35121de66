"""A segment of a partition's log and its indexes, laid out like Kafka's LogSegment, OffsetIndex and
TimeIndex: the ``{base:020d}.log`` file of batches back to back, its sparse offset index
(``.index``: batch lastOffset - base, position) and time index (``.timeindex``: max timestamp so far,
lastOffset - base), kept in memory and mirrored to their files; the scan of a segment's bytes into
batches; and the file regions a fetch sends with sendfile.

:class:`~sparkafka.broker.log.PartitionLog` owns the segments and their locking; nothing here takes a
lock.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sparkafka.broker.records import BatchHeader, CorruptBatchError, iter_batches

OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position (Kafka's OffsetIndex entry)
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset (Kafka's TimeIndex entry)
SCAN_CHUNK = 1 << 20
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"


class FileRegion:
    """`count` bytes at `offset` of a file this object holds open (a dup of a segment's descriptor).

    What a fetch response sends with sendfile instead of copying the bytes through Python; close() it
    once sent (or if it never will be). `fileno()` makes it usable as the file of loop.sendfile."""

    __slots__ = ("count", "fd", "offset")

    def __init__(self, fd: int, offset: int, count: int) -> None:
        self.fd = fd
        self.offset = offset
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, count={self.count})"

    def fileno(self) -> int:
        if self.fd < 0:
            raise ValueError("the file region is closed")
        return self.fd

    def read(self) -> bytes:
        """The region's bytes (what sendfile would send)."""
        data = os.pread(self.fileno(), self.count, self.offset)
        if len(data) != self.count:
            raise OSError(f"{self!r} is shorter than it was: {len(data)} bytes")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@dataclass(eq=False)
class Segment:
    """One .log file with its in-memory indexes (the .index/.timeindex files mirror them)."""

    base_offset: int
    path: Path
    fd: int
    size: int = 0
    next_offset: int = -1  # no batch in this segment reaches this offset (exact for scanned segments)
    index_offsets: list[int] = field(default_factory=list)  # absolute lastOffset of an indexed batch
    index_positions: list[int] = field(default_factory=list)
    time_timestamps: list[int] = field(default_factory=list)
    time_offsets: list[int] = field(default_factory=list)  # absolute lastOffset of the batch that set it
    max_timestamp: int = -1
    offset_of_max_timestamp: int = -1
    bytes_since_index: int = 0
    indexes_dirty: bool = True
    # Time-based rolling (Kafka's LogSegment.timeWaitedForRoll): the max timestamp of the first batch,
    # or, while the segment is empty or its first batch has none, the time the segment was opened.
    first_batch_timestamp: int = -1
    opened_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    roll_jitter_ms: int = 0
    # Byte ranges [start, end) whose batches passed their CRC check since the log was opened
    # (scanned by recovery, appended, or served once): only the others are checked when fetched, so
    # that a clean start reads nothing and a damaged batch is still never served.
    verified_starts: list[int] = field(default_factory=list)
    verified_ends: list[int] = field(default_factory=list)
    # Positions of damaged batches already reported, so a consumer retrying does not flood the log.
    reported_damage: set[int] = field(default_factory=set)

    def sibling(self, suffix: str) -> Path:
        return self.path.with_suffix(suffix)

    def position_for(self, offset: int) -> int:
        """Byte position of a batch at or before the one containing `offset` (Kafka's OffsetIndex.lookup)."""
        slot = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[slot] if slot >= 0 else 0

    def offset_for_time(self, timestamp: int) -> int:
        """An offset before which every record is older than `timestamp` (Kafka's TimeIndex.lookup)."""
        slot = bisect.bisect_right(self.time_timestamps, timestamp) - 1
        return self.time_offsets[slot] if slot >= 0 else self.base_offset

    def mark_verified(self, start: int, end: int) -> None:
        if start >= end:
            return
        first = bisect.bisect_left(self.verified_ends, start)
        after = bisect.bisect_right(self.verified_starts, end)
        if first < after:
            start = min(start, self.verified_starts[first])
            end = max(end, self.verified_ends[after - 1])
        self.verified_starts[first:after] = [start]
        self.verified_ends[first:after] = [end]

    def unverified(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of bytes [start, end) outside every verified range."""
        gaps: list[tuple[int, int]] = []
        slot = bisect.bisect_right(self.verified_ends, start)
        pos = start
        while pos < end:
            if slot < len(self.verified_starts) and self.verified_starts[slot] <= pos:
                pos = self.verified_ends[slot]
                slot += 1
                continue
            gap_end = min(end, self.verified_starts[slot]) if slot < len(self.verified_starts) else end
            gaps.append((pos, gap_end))
            pos = gap_end
        return gaps

    def reset_indexes(self) -> None:
        self.size = 0
        self.next_offset = self.base_offset
        self.index_offsets, self.index_positions = [], []
        self.time_timestamps, self.time_offsets = [], []
        self.max_timestamp = self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = -1
        self.bytes_since_index = 0
        self.indexes_dirty = True
        self.verified_starts, self.verified_ends = [], []

    def waited_for_roll(self, appended_max_timestamp: int, now_ms: int) -> int:
        """How long the segment has waited to roll, for records with `appended_max_timestamp` arriving
        at `now_ms`: the gap between their timestamp and the first batch's, or, if the first batch has
        no timestamp, the time since the segment was opened (Kafka's LogSegment.timeWaitedForRoll)."""
        if self.first_batch_timestamp >= 0:
            return appended_max_timestamp - self.first_batch_timestamp
        return now_ms - self.opened_ms

    def track(self, header: BatchHeader, position: int, index_interval_bytes: int) -> None:
        """Account for a batch just stored at `position`, as Kafka's LogSegment.append does.

        The max timestamp is updated first; an index entry (this batch's lastOffset -> position, and the
        max timestamp so far -> the batch that set it) is added once more than index_interval_bytes were
        appended since the previous entry.
        """
        if position == 0:
            self.first_batch_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if self.bytes_since_index > index_interval_bytes:
            self.index_offsets.append(header.last_offset)
            self.index_positions.append(position)
            self.seal_time_index()
            self.bytes_since_index = 0
        self.bytes_since_index += header.size
        self.size = position + header.size
        self.next_offset = header.next_offset
        self.indexes_dirty = True
        # Every caller passes a checked batch: recovery and compaction scan with CRC checks, appends
        # come from produce validation or the broker's own encoder.
        self.mark_verified(position, self.size)

    def adopt(self, rewritten: Segment) -> None:
        """Take over the file and indexes of a compacted copy of this segment."""
        self.fd, self.size = rewritten.fd, rewritten.size
        # Compaction may empty the tail; the offset range the segment covers stays the same.
        self.next_offset = max(self.next_offset, rewritten.next_offset)
        self.index_offsets, self.index_positions = rewritten.index_offsets, rewritten.index_positions
        self.time_timestamps, self.time_offsets = rewritten.time_timestamps, rewritten.time_offsets
        self.max_timestamp = rewritten.max_timestamp
        self.offset_of_max_timestamp = rewritten.offset_of_max_timestamp
        self.first_batch_timestamp = rewritten.first_batch_timestamp
        self.verified_starts, self.verified_ends = rewritten.verified_starts, rewritten.verified_ends
        self.reported_damage = set()
        self.indexes_dirty = True

    def seal_time_index(self) -> None:
        """Make the last time-index entry carry the segment's max timestamp (Kafka does this on roll)."""
        last = self.time_timestamps[-1] if self.time_timestamps else -1
        if self.max_timestamp > last:
            self.time_timestamps.append(self.max_timestamp)
            self.time_offsets.append(self.offset_of_max_timestamp)
            self.indexes_dirty = True


@dataclass(frozen=True)
class SegmentView:
    """A segment as a cleaning pass saw it under the log's lock: a dup of its descriptor and its
    size then, readable without the lock (appends, fetches and retention go on meanwhile)."""

    segment: Segment
    fd: int
    size: int

    @property
    def base_offset(self) -> int:
        return self.segment.base_offset

    @property
    def path(self) -> Path:
        return self.segment.path

    @property
    def max_timestamp(self) -> int:
        return self.segment.max_timestamp  # a closed segment's is only changed by a pass


def read_offset_text(path: Path) -> str:
    """A checkpoint file's text, stripped; undecodable bytes come back as U+FFFD (not an offset)."""
    return path.read_bytes().decode("utf-8", errors="replace").strip()


def is_offset(text: str) -> bool:
    return text.isascii() and text.isdigit()


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{LOG_SUFFIX}"


def open_segment_file(path: Path) -> int:
    # O_APPEND: every write lands at the end even if something else moved the file offset.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)


def scan_batches(
    fd: int, start: int, end: int, *, validate_crc: bool
) -> Iterator[tuple[int, BatchHeader, bytes]]:
    """Yield (position, header, batch bytes) for the batches in bytes [start, end) of a segment file.

    Reads 1 MiB at a time (more for a larger batch). Raises CorruptBatchError, with valid_bytes set to
    the file position where the last complete valid batch ends, if the range ends torn or corrupt.
    """
    pos = start
    want = SCAN_CHUNK
    while pos < end:
        requested = min(want, end - pos)
        chunk = os.pread(fd, requested, pos)
        if len(chunk) < requested:
            raise CorruptBatchError(f"file ends at byte {pos + len(chunk)}, not {end}", valid_bytes=pos)
        want = SCAN_CHUNK
        try:
            for position, header in iter_batches(chunk, validate_crc=validate_crc, base_position=pos):
                yield position, header, chunk[position - pos : position - pos + header.size]
            pos += len(chunk)
        except CorruptBatchError as exc:
            cut_short_by_chunk = (
                exc.incomplete_size is not None
                and pos + len(chunk) < end
                and exc.valid_bytes + exc.incomplete_size <= end
            )
            if not cut_short_by_chunk:
                raise
            # The chunk boundary, not the data, cut this batch: read again from its start, big enough for it.
            assert exc.incomplete_size is not None
            pos, want = exc.valid_bytes, max(SCAN_CHUNK, exc.incomplete_size)


def describe_damage(
    batches: Iterator[tuple[int, BatchHeader, bytes]], path: Path
) -> Iterator[tuple[int, BatchHeader, bytes]]:
    try:
        yield from batches
    except CorruptBatchError as exc:
        raise CorruptBatchError(f"{path} is damaged: {exc}", valid_bytes=exc.valid_bytes) from exc
