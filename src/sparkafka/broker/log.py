"""A disk-backed segmented partition log, laid out like Kafka's (UnifiedLog, LogSegment, OffsetIndex).

Files in a partition directory:

    {base:020d}.log        batches back to back, exactly as appended (offsets already assigned)
    {base:020d}.index      sparse offset index: (batch lastOffset - base int32, position int32) entries
    {base:020d}.timeindex  time index: (max timestamp so far int64, lastOffset - base int32) entries
    log-start-offset       checkpoint of log_start_offset (DeleteRecords and retention move it)
    .clean_shutdown        exists only between close() and the next open; holds the log end offset then

Durability: append() has called write() before it returns, so a killed process loses nothing the page
cache holds; fsync happens on segment roll, on close and once `flush_messages` records were appended
since the last fsync. After a crash
(no clean-shutdown marker) the segments from the recovery point on are scanned with CRC checks, torn
tails are cut and the indexes are rebuilt; cutting anything but a torn last write is an ERROR that
says what was lost. Index files are a cache, trusted only after a clean shutdown or below the recovery
point. Batches not scanned since the log was opened have their CRC checked when first fetched, so a
damaged batch is refused (CORRUPT_MESSAGE), never served. After a clean shutdown nothing is cut:
every write was fsynced before the marker, so nothing can be torn, and damage a start finds (a
batch that does not parse, or whose length runs past the end of the file) is kept and refused.

Every public method takes the log's lock, so one PartitionLog may be shared between threads.
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.files import fsync_directory, write_all, write_file_atomically
from sparkafka.broker.log_cleaner import LogCompaction
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_recovery import CLEAN_SHUTDOWN, LOG_START_CHECKPOINT, RECOVERY_POINT, LogRecovery
from sparkafka.broker.log_retention import LogRetention
from sparkafka.broker.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    OFFSET_ENTRY,
    TIME_ENTRY,
    TIMEINDEX_SUFFIX,
    FileRegion,
    Segment,
    SegmentView,
    open_segment_file,
    scan_batches,
    segment_path,
)
from sparkafka.broker.records import (
    HEADER_SIZE,
    INT32_MAX,
    BatchHeader,
    CorruptBatchError,
    compute_crc,
    crc_is_valid,
    decode_records,
    iter_batches,
    parse_header,
)

logger = logging.getLogger(__name__)

_HEADER_CHUNK = 64 * 1024


@dataclass(frozen=True)
class UnreadableRange:
    """Where `PartitionLog.iter_batches` stopped: the bytes of the segment file `path` from
    `position` on do not read as whole batches (`reason` says why), so what it holds of the
    offsets from `first_offset` up to `end_offset` (exclusive: where the next segment begins, or
    the log end) was not yielded."""

    path: Path
    position: int
    first_offset: int
    end_offset: int
    reason: str


class UnreadableLogError(BrokerError):
    """KAFKA_STORAGE_ERROR from `PartitionLog.iter_batches`, with the `UnreadableRange` it met."""

    def __init__(self, damage: UnreadableRange) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, f"{damage.path} is corrupt: {damage.reason}")
        self.damage = damage


@dataclass(frozen=True)
class _IterSegment:
    """A segment as `PartitionLog.iter_batches` took it: a dup of its descriptor, the byte to
    start at, its size and where its offsets end then."""

    fd: int
    start: int
    size: int
    path: Path
    base_offset: int
    end_offset: int


class _DamagedBatchError(BrokerError):
    """A batch of a segment that does not parse, or whose CRC or offsets are wrong."""

    def __init__(self, code: ErrorCode, message: str, *, position: int) -> None:
        super().__init__(code, message)
        self.position = position


class PartitionLog(LogRecovery, LogCompaction, LogRetention):
    """The log of one partition: append, read by offset or time, retention, DeleteRecords, compaction."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        """Open the log in `directory`, creating it, or recovering it after a crash.

        Recovery steps: drop leftovers of interrupted work (*.cleaned, *.tmp, index files without a .log);
        load every segment; if the clean-shutdown marker is absent, scan every segment from the
        recovery point on, validating each batch's CRC and offsets, cutting anything after the last
        valid batch (see `_report_cut` for what is logged how) and rebuilding its indexes; trust the
        index files of the other segments after sanity checks, and read the active segment's batch
        headers after its last index entry (a segment whose index files are missing or fail them,
        or whose tail does not read as whole batches or ends at another offset than the log end
        offset the clean-shutdown marker recorded, is scanned too). Then log_start_offset =
        max(checkpoint, first segment base) and log_end_offset = next offset after the last batch
        (or the last segment's base if it is empty).

        Invariant after a clean shutdown (the marker holds the log end offset then): no byte the
        log held is cut, since nothing can be torn. A scan that meets a damaged batch whose segment
        held records past it keeps the file as it is, logs an ERROR naming the file, the byte and
        the offsets, and leaves the batch to fetches to refuse (CORRUPT_MESSAGE); a damaged active
        segment is closed and a new one started at the recorded log end offset, so that no append
        lands after bytes a scan cannot get past (see `_keep_damage`), and so is one whose whole
        batches end short of it (`_end_at_clean_stop`): the start gives no offset the log had
        at the stop to a new record.
        """
        self.directory = Path(directory)
        self.config = config
        self.log_start_offset = 0
        self.log_end_offset = 0
        self._segments: list[Segment] = []
        self._lock = threading.RLock()
        # One cleaning pass at a time; it holds _lock only to take its views and to swap segments.
        self._cleaning = threading.Lock()
        self._closed = False
        self._needs_recovery = False  # set when the disk may hold what only a full recovery sorts out
        self.rolls = 0  # how many times the log rolled a new segment since it was opened
        # Set by _load for the scans of the start: whether the clean-shutdown marker was there, and the
        # log end offset it recorded (None after a crash, or from a marker written without it).
        self._after_clean_stop = False
        self._clean_stop_end: int | None = None
        self._load()
        self._first_dirty_offset = self._read_cleaner_checkpoint()
        # Kafka's recovery point: records past it were written but not yet fsynced.
        self._flushed_offset = self.log_end_offset

    # ---- the log start checkpoint --------------------------------------------------------------------

    def _write_log_start_checkpoint(self, offset: int | None = None) -> None:
        offset = self.log_start_offset if offset is None else offset
        write_file_atomically(self.directory / LOG_START_CHECKPOINT, f"{offset}\n".encode())

    def _move_log_start(self, offset: int) -> None:
        """Checkpoint ``offset`` as the log start, then start serving from it: a failed checkpoint
        write (disk full) leaves the log start, on disk and as fetches see it, where it was, and is
        KAFKA_STORAGE_ERROR to the request that asked for it, as in Kafka."""
        try:
            self._write_log_start_checkpoint(offset)
        except OSError as exc:
            raise BrokerError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"{self.directory.name}: could not checkpoint log start offset {offset}: {exc}",
            ) from exc
        self.log_start_offset = offset

    # ---- segment files -----------------------------------------------------------------------------

    def _create_segment(self, base_offset: int, opened_ms: int | None = None) -> Segment:
        path = segment_path(self.directory, base_offset)
        if path.exists() and path.stat().st_size > 0:
            raise RuntimeError(f"cannot start a segment at offset {base_offset}: {path} already holds data")
        segment = Segment(
            base_offset,
            path,
            open_segment_file(path),
            next_offset=base_offset,
            roll_jitter_ms=self._random_roll_jitter(),
        )
        if opened_ms is not None:
            segment.opened_ms = opened_ms
        try:
            fsync_directory(self.directory)
        except OSError:
            # An empty segment left behind would end the previous one at its base on the next
            # start, cutting whatever was appended there since.
            os.close(segment.fd)
            path.unlink(missing_ok=True)
            raise
        return segment

    def _random_roll_jitter(self) -> int:
        # Kafka's LogConfig.randomSegmentJitter, drawn for every segment opened.
        jitter = min(self.config.segment_jitter_ms, self.config.segment_ms)
        return random.randrange(jitter) if jitter > 0 else 0

    def _write_indexes(self, segment: Segment) -> None:
        base = segment.base_offset
        write_file_atomically(
            segment.sibling(INDEX_SUFFIX),
            b"".join(
                OFFSET_ENTRY.pack(offset - base, pos)
                for offset, pos in zip(segment.index_offsets, segment.index_positions, strict=True)
            ),
        )
        write_file_atomically(
            segment.sibling(TIMEINDEX_SUFFIX),
            b"".join(
                TIME_ENTRY.pack(ts, offset - base)
                for ts, offset in zip(segment.time_timestamps, segment.time_offsets, strict=True)
            ),
        )
        segment.indexes_dirty = False

    def _seal(self, segment: Segment) -> None:
        """Make a segment durable with up-to-date index files (on roll, compaction and close)."""
        segment.seal_time_index()
        os.fsync(segment.fd)
        if segment.indexes_dirty:
            self._write_indexes(segment)

    def _roll(self, base_offset: int, opened_ms: int | None = None) -> Segment:
        self._seal(self._segments[-1])
        segment = self._create_segment(base_offset, opened_ms)
        self._segments.append(segment)
        self.rolls += 1
        self._flushed_offset = base_offset
        try:
            if not self._needs_recovery:
                write_file_atomically(self.directory / RECOVERY_POINT, f"{base_offset}\n".encode())
        except OSError as exc:
            # Only how much a start after a crash rescans depends on it.
            logger.warning("%s: could not checkpoint the recovery point %d: %s", self, base_offset, exc)
        return segment

    def _delete_segment(self, segment: Segment) -> None:
        os.close(segment.fd)
        # The .log goes first: index files without a .log are removed as leftovers on the next open.
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            segment.sibling(suffix).unlink(missing_ok=True)
        self._segments.remove(segment)

    def _delete_segments_below(self, offset: int) -> int:
        """Delete leading segments whose every offset is below `offset`; never the active segment."""
        removed = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            self._delete_segment(self._segments[0])
            removed += 1
        if removed:
            fsync_directory(self.directory)
        return removed

    def _headers(self, segment: Segment | SegmentView, start: int) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of the segment's batches from byte `start`, reading headers only."""
        pos, chunk, chunk_start = start, b"", start
        while pos < segment.size:
            if pos + HEADER_SIZE > chunk_start + len(chunk):
                chunk, chunk_start = os.pread(segment.fd, _HEADER_CHUNK, pos), pos
            try:
                header = parse_header(chunk, pos - chunk_start)
                if pos + header.size > segment.size:
                    raise CorruptBatchError(f"{header.size}-byte batch overruns the {segment.size}-byte file")
            except CorruptBatchError as exc:
                raise _DamagedBatchError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"{segment.path} is corrupt at byte {pos}: {exc}",
                    position=pos,
                ) from exc
            yield pos, header
            pos += header.size

    def _segment_slot(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._segments, offset, key=lambda s: s.base_offset) - 1)

    @property
    def closed(self) -> bool:
        return self._closed

    def _ensure_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the log in {self.directory} is closed; open a new PartitionLog to use it")

    def __repr__(self) -> str:
        return f"PartitionLog({str(self.directory)!r})"

    # ---- append and read ---------------------------------------------------------------------------

    def append(self, batches: Sequence[bytes | bytearray], *, now_ms: int) -> int:
        """Write batches that already carry their offsets (starting at log_end_offset); return the new end.

        Steps: check every batch (whole, contiguous offsets, no larger than a segment) before writing any;
        then per batch roll a new segment if the active one holds data and the batch would overflow
        segment_bytes, an index of the segment is full (segment_index_bytes), its relative offsets would
        overflow int32, or its records are segment_ms (less the
        segment's jitter) newer than the active segment's first batch (see `Segment.waited_for_roll`;
        `now_ms` counts when that batch has no timestamp); write() it, update the indexes and
        log_end_offset; fsync once flush_messages records were appended since the last fsync.
        """
        with self._lock:
            self._ensure_open()
            headers: list[BatchHeader] = []
            expected = self.log_end_offset
            for batch in batches:
                header = parse_header(batch)
                if header.size != len(batch):
                    raise ValueError(
                        f"a batch at offset {header.base_offset} declares {header.size} bytes but "
                        f"{len(batch)} were given; pass exactly one whole batch per list item"
                    )
                if header.base_offset != expected:
                    raise ValueError(
                        f"batch base offset {header.base_offset} should be {expected}, the next offset of "
                        f"{self.directory.name}; assign offsets with records.assign_offset from there"
                    )
                if header.size > self.config.segment_bytes:
                    raise BrokerError(
                        ErrorCode.RECORD_LIST_TOO_LARGE,
                        f"Message batch size is {header.size} bytes in append to partition "
                        f"{self.directory.name}, which exceeds the maximum configured segment size of "
                        f"{self.config.segment_bytes}.",
                    )
                headers.append(header)
                expected = header.next_offset
            for header, batch in zip(headers, batches, strict=True):
                segment = self._segments[-1]
                if segment.size > 0 and self._should_roll(segment, header, now_ms):
                    segment = self._roll(header.base_offset, now_ms)
                position = segment.size
                try:
                    write_all(segment.fd, batch)
                except OSError as exc:
                    # Cut the partial write so the next append does not land after garbage.
                    os.ftruncate(segment.fd, position)
                    raise BrokerError(
                        ErrorCode.KAFKA_STORAGE_ERROR,
                        f"writing {len(batch)} bytes to {segment.path} failed: {exc}",
                    ) from exc
                segment.track(header, position, self.config.index_interval_bytes)
                self.log_end_offset = header.next_offset
            flush_every = self.config.flush_messages
            if flush_every is not None and self.log_end_offset - self._flushed_offset >= flush_every:
                try:
                    os.fsync(self._segments[-1].fd)
                except OSError as exc:
                    # The batches are in the log (readable, replayed at a start) but not durable.
                    raise BrokerError(
                        ErrorCode.KAFKA_STORAGE_ERROR, f"fsync of {self._segments[-1].path} failed: {exc}"
                    ) from exc
                self._flushed_offset = self.log_end_offset
            return self.log_end_offset

    def _should_roll(self, segment: Segment, header: BatchHeader, now_ms: int) -> bool:
        """Kafka's LogSegment.shouldRoll for a non-empty active segment and the batch to append. Kafka
        decides once per append, for all of its batches; a client's append is one batch here."""
        return (
            segment.size + header.size > self.config.segment_bytes
            or len(segment.index_offsets) >= self.config.max_offset_index_entries
            or len(segment.time_timestamps) >= self.config.max_time_index_entries
            or header.last_offset - segment.base_offset > INT32_MAX
            or segment.waited_for_roll(header.max_timestamp, now_ms)
            > self.config.max_segment_ms - segment.roll_jitter_ms
        )

    def read(
        self, offset: int, max_bytes: int, *, upper_bound: int | None = None, min_one_batch: bool = True
    ) -> bytes:
        """Bytes of whole batches, starting with the batch that contains `offset`.

        Stops before a batch whose base offset is >= upper_bound (high watermark / last stable offset) and
        before exceeding max_bytes, except that with min_one_batch the first batch is returned whole (KIP-74).
        Raises OFFSET_OUT_OF_RANGE outside [log_start_offset, log_end_offset]; returns b"" at the end.
        """
        chunks, _, _ = self.read_chunks(
            offset, max_bytes, upper_bound=upper_bound, min_one_batch=min_one_batch
        )
        return b"".join(cast(list[bytes], chunks))

    def read_chunks(
        self,
        offset: int,
        max_bytes: int,
        *,
        upper_bound: int | None = None,
        min_one_batch: bool = True,
        region_min_bytes: int | None = None,
    ) -> tuple[list[bytes | FileRegion], int, int]:
        """What read() returns, as (chunks, their total size, last offset of the last batch or offset - 1).

        One chunk per segment touched: its bytes, or, when it is at least `region_min_bytes` long, a
        FileRegion on a dup() of the segment file that the caller must close (after sending it with
        sendfile). A region stays valid whatever happens to the log meanwhile: segment files are only
        appended to, and a deleted or compacted segment's old file lives on while the dup is open.

        Steps: find the segment holding `offset`; from its offset-index position scan batch headers only
        (never the records), skipping batches that end before `offset`; stop at the bound or the byte
        budget; then read (or reference) each segment's contiguous byte span once. Batches not
        verified since the log was opened (see `Segment.verified_starts`) are read and checked
        first: the response stops before a damaged one, and is CORRUPT_MESSAGE if that is the first
        batch it would hold (Kafka's answer to a read that hits a CorruptRecordException), logged
        at ERROR once per damaged batch.
        """
        with self._lock:
            self._ensure_open()
            if offset < self.log_start_offset or offset > self.log_end_offset:
                raise BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"Received request for offset {offset} for partition {self.directory.name}, but we only "
                    f"have log segments in the range {self.log_start_offset} to {self.log_end_offset}.",
                )
            bound = self.log_end_offset if upper_bound is None else min(upper_bound, self.log_end_offset)
            chunks: list[bytes | FileRegion] = []
            total = 0
            last_offset = offset - 1
            done = offset >= bound
            for segment in self._segments[self._segment_slot(offset) :]:
                if done:
                    break
                span: list[tuple[int, BatchHeader]] = []
                span_bytes = 0
                damage: _DamagedBatchError | None = None
                try:
                    for position, header in self._headers(segment, segment.position_for(offset)):
                        if header.last_offset < offset:
                            continue
                        size = total + span_bytes + header.size
                        too_big = size > max_bytes and not (min_one_batch and total + span_bytes == 0)
                        if header.base_offset >= bound or too_big:
                            done = True
                            break
                        span.append((position, header))
                        span_bytes += header.size
                except _DamagedBatchError as exc:
                    after = span[-1][1].last_offset if span else max(offset, segment.base_offset) - 1
                    damage = _DamagedBatchError(
                        ErrorCode.CORRUPT_MESSAGE,
                        f"{self.directory.name}: the batch after offset {after} is damaged: {exc}",
                        position=exc.position,
                    )
                    done = True
                data: bytes | None = None
                if span:
                    start = span[0][0]
                    end = span[-1][0] + span[-1][1].size
                    if segment.unverified(start, end):
                        data = os.pread(segment.fd, end - start, start)
                        good_end = self._verify(segment, data, start, span[0][1].base_offset)
                        if good_end < end:
                            damage, done = self._damage_at(segment, data, start, good_end), True
                            span = [(position, header) for position, header in span if position < good_end]
                            data = data[: good_end - start]
                if damage is not None:
                    self._report_damage(segment, damage)
                    if not chunks and not span:
                        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(damage)) from damage
                if not span:
                    continue
                start = span[0][0]
                end = span[-1][0] + span[-1][1].size
                total += end - start
                last_offset = span[-1][1].last_offset
                if data is not None:
                    chunks.append(data)
                elif region_min_bytes is not None and end - start >= region_min_bytes:
                    chunks.append(FileRegion(os.dup(segment.fd), start, end - start))
                else:
                    chunks.append(os.pread(segment.fd, end - start, start))
            return chunks, total, last_offset

    @staticmethod
    def _verify(segment: Segment, data: bytes, start: int, first_offset: int) -> int:
        """Check the CRC and offsets of the unverified batches in `data` (the segment's bytes from
        `start`, whole batches); mark those that pass verified and return where the first that
        fails starts (or where `data` ends)."""
        end = start + len(data)
        for gap_start, gap_end in segment.unverified(start, end):
            expected = first_offset if gap_start == start else segment.base_offset
            view = memoryview(data)[gap_start - start : gap_end - start]
            good = gap_start
            try:
                for position, header in iter_batches(view, validate_crc=True, base_position=gap_start):
                    if header.base_offset < expected or header.last_offset >= segment.next_offset:
                        break
                    expected = header.next_offset
                    good = position + header.size
            except CorruptBatchError:
                pass
            segment.mark_verified(gap_start, good)
            if good < gap_end:
                return good
        return end

    def _damage_at(self, segment: Segment, data: bytes, start: int, position: int) -> _DamagedBatchError:
        header = parse_header(data, position - start)
        batch = memoryview(data)[position - start : position - start + header.size]
        if crc_is_valid(batch, header):
            why = "its offsets do not follow the batch before it"
        else:
            why = f"its CRC does not match (stored {header.crc}, computed {compute_crc(batch, header)})"
        return _DamagedBatchError(
            ErrorCode.CORRUPT_MESSAGE,
            f"{self.directory.name}: the batch at offsets {header.base_offset} to {header.last_offset} "
            f"in {segment.path} at byte {position} is damaged: {why}",
            position=position,
        )

    def _report_damage(self, segment: Segment, damage: _DamagedBatchError) -> None:
        if damage.position in segment.reported_damage:
            return
        segment.reported_damage.add(damage.position)
        logger.error(
            "%s; fetches of the partition stop before it with CORRUPT_MESSAGE. Restore the partition "
            "directory from a backup, or move consumers past the damaged offsets (DeleteRecords "
            "or a committed offset beyond them) to accept losing them",
            damage,
        )

    def iter_batches(self, from_offset: int = 0) -> Iterator[tuple[BatchHeader, bytes]]:
        """(header, batch bytes) of every stored batch whose last offset is >= from_offset, in order.

        Sees the log as it was when called: the segment files are dup()ed, so appends, compaction and
        retention running meanwhile neither disturb nor appear in the iteration. Headers are read
        without CRC checks. Bytes that do not read as whole batches (damage a start kept, or one it
        never scanned) end the iteration with `UnreadableLogError` (KAFKA_STORAGE_ERROR), which
        says what they hide; the next segment's base offset, where it ends, is where a caller
        that can do without them may iterate on from (without a CRC-checked scan of the rest of
        the damaged segment, where its next batch starts would be a guess).
        """
        with self._lock:
            self._ensure_open()
            snapshot = [
                _IterSegment(
                    os.dup(segment.fd),
                    segment.position_for(from_offset),
                    segment.size,
                    segment.path,
                    segment.base_offset,
                    segment.next_offset,
                )
                for segment in self._segments
                if segment.next_offset > from_offset
            ]
        return self._iter_snapshot(snapshot, from_offset)

    @staticmethod
    def _iter_snapshot(snapshot: list[_IterSegment], from_offset: int) -> Iterator[tuple[BatchHeader, bytes]]:
        try:
            for segment in snapshot:
                next_offset = max(from_offset, segment.base_offset)  # the first not yielded yet
                try:
                    for _, header, batch in scan_batches(
                        segment.fd, segment.start, segment.size, validate_crc=False
                    ):
                        if header.last_offset >= from_offset:
                            yield header, batch
                            next_offset = header.next_offset
                except CorruptBatchError as exc:
                    damage = UnreadableRange(
                        segment.path, exc.valid_bytes, next_offset, segment.end_offset, str(exc)
                    )
                    raise UnreadableLogError(damage) from exc
        finally:
            for segment in snapshot:
                os.close(segment.fd)

    def _read_batch(self, segment: Segment | SegmentView, position: int, header: BatchHeader) -> bytes:
        return os.pread(segment.fd, header.size, position)

    # ---- lookups by time ---------------------------------------------------------------------------

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record from log_start_offset on with timestamp >= timestamp_ms.

        As Kafka's fetchOffsetByTimestamp: skip segments whose max timestamp is older, start inside a
        segment where its time index says, and decode only batches whose max timestamp qualifies.
        """
        with self._lock:
            self._ensure_open()
            for segment in self._segments:
                if segment.max_timestamp < timestamp_ms or segment.next_offset <= self.log_start_offset:
                    continue
                start_offset = max(segment.offset_for_time(timestamp_ms), self.log_start_offset)
                for position, header in self._headers(segment, segment.position_for(start_offset)):
                    if header.max_timestamp < timestamp_ms or header.last_offset < self.log_start_offset:
                        continue
                    for record in decode_records(self._read_batch(segment, position, header)):
                        if record.timestamp >= timestamp_ms and record.offset >= self.log_start_offset:
                            return record.offset, record.timestamp
            return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record with the log's largest timestamp (ListOffsets -3)."""
        with self._lock:
            self._ensure_open()
            best: Segment | None = None
            for segment in self._segments:
                if segment.max_timestamp > (best.max_timestamp if best else -1):
                    best = segment
            if best is None:
                return None
            target = best.max_timestamp
            for position, header in self._headers(best, best.position_for(best.offset_of_max_timestamp)):
                if header.max_timestamp == target:
                    for record in decode_records(self._read_batch(best, position, header)):
                        if record.timestamp == target:
                            return record.offset, target
            return None

    # ---- housekeeping ------------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the active segment (closed segments were fsynced when they were rolled or rewritten)."""
        with self._lock:
            self._ensure_open()
            os.fsync(self._segments[-1].fd)
            self._flushed_offset = self.log_end_offset

    def size_bytes(self) -> int:
        with self._lock:
            return sum(segment.size for segment in self._segments)

    def segment_files(self) -> list[Path]:
        with self._lock:
            return [segment.path for segment in self._segments]

    def close(self) -> None:
        """Flush everything, write the index files and the clean-shutdown marker. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            for segment in self._segments:
                self._seal(segment)
            for segment in self._segments:
                os.close(segment.fd)
            if not self._needs_recovery:
                # The log end offset: where the next start resumes if damage hides the end of the
                # active segment from its scan (see _keep_damage).
                write_file_atomically(self.directory / CLEAN_SHUTDOWN, f"{self.log_end_offset}\n".encode())
            fsync_directory(self.directory)
            self._closed = True
