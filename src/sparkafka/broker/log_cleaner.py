"""Compaction of a partition's log, as Kafka's LogCleaner does it: which log is due
(:class:`CleanableRange`, Kafka's LogToClean), the pass over its dirty segments that keeps the latest
record of each key and drops aborted data and markers past their horizons (:class:`RecordFilter`),
and the swap of the cleaned segments into the log.

:class:`LogCompaction` is a part of :class:`~sparkafka.broker.log.PartitionLog`, whose segments,
lock and checkpoints it works on; the steps and invariants of a pass are in :meth:`LogCompaction.compact`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkafka.broker.files import fsync_directory, write_all, write_file_atomically
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SCAN_CHUNK,
    TIMEINDEX_SUFFIX,
    Segment,
    SegmentView,
    describe_damage,
    scan_batches,
)
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import (
    HEADER_SIZE,
    INT32_MAX,
    LOG_APPEND_TIME,
    BatchHeader,
    CorruptBatchError,
    Record,
    control_marker,
    crc_is_valid,
    decode_records,
    parse_header,
)

# The log's own logger: what compaction reports is the log's.
logger = logging.getLogger("sparkafka.broker.log")

# Kafka's cleaner-offset-checkpoint (one per log directory there, one per partition here): the
# first offset the last cleaning pass did not reach, where the dirty part of the log starts.
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
# A cleaned copy of a segment, renamed over the segment once whole.
CLEANED_SUFFIX = ".cleaned"


@dataclass(frozen=True)
class CleanableRange:
    """How dirty a compacted log is: what Kafka's LogCleanerManager weighs to pick the next log to
    clean (its LogToClean). The dirty part starts at the cleaner checkpoint; it ends at the first
    uncleanable offset, the base of the segment holding the lowest of: the last stable offset, the
    active segment's base, and (min.compaction.lag.ms) the first segment with records that young."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int  # segments below the first dirty offset
    cleanable_bytes: int  # segments from the one holding the first dirty offset to the uncleanable one
    overdue: bool  # a dirty closed segment's first batch is older than max.compaction.lag.ms

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    def due(self, min_cleanable_dirty_ratio: float) -> bool:
        """Kafka's rule: overdue with something to clean, or dirtier than min.cleanable.dirty.ratio."""
        return (self.overdue and self.cleanable_bytes > 0) or self.cleanable_ratio > min_cleanable_dirty_ratio


class LogCompaction:
    """The compaction half of a partition's log (mixed into PartitionLog)."""

    if TYPE_CHECKING:  # what the log this is a part of holds and does
        directory: Path
        config: LogConfig
        log_start_offset: int
        log_end_offset: int
        _segments: list[Segment]
        _lock: threading.RLock
        _cleaning: threading.Lock
        _closed: bool
        _first_dirty_offset: int | None

        def _segment_slot(self, offset: int) -> int: ...
        def _largest_timestamp(self, segment: Segment | SegmentView) -> int: ...
        def _read_batch(
            self, segment: Segment | SegmentView, position: int, header: BatchHeader
        ) -> bytes: ...
        def _headers(
            self, segment: Segment | SegmentView, start: int
        ) -> Iterator[tuple[int, BatchHeader]]: ...
        def _seal(self, segment: Segment) -> None: ...
        def _require_full_recovery(self) -> None: ...
        def _ensure_open(self) -> None: ...

    # ---- compaction --------------------------------------------------------------------------------

    def cleanable_range(self, now_ms: int, last_stable_offset: int) -> CleanableRange | None:
        """How dirty the log is (Kafka's LogCleanerManager.cleanableOffsets and LogToClean), or None
        when it is not compacted or holds no bytes.

        The first dirty offset is the cleaner checkpoint, or the log start when there is none or it
        lies outside [log start, log end) (retention or DeleteRecords moved past it, or the log was
        cut at recovery). `last_stable_offset` is the partition's: nothing at or past it is cleanable.
        """
        with self._lock:
            self._ensure_open()
            if not self.config.compacts:
                return None
            first_dirty = self._valid_first_dirty()
            active = self._segments[-1]
            uncleanable = min(last_stable_offset, active.base_offset)
            dirty_closed = self._segments[self._segment_slot(first_dirty) : -1]
            lag_ms = self.config.min_compaction_lag_ms
            if lag_ms > 0:
                for segment in dirty_closed:
                    if self._largest_timestamp(segment) > now_ms - lag_ms:
                        uncleanable = min(uncleanable, segment.base_offset)
                        break
            uncleanable = max(first_dirty, uncleanable)
            first_uncleanable = self._segments[self._segment_slot(uncleanable)].base_offset
            low = min(first_dirty, first_uncleanable)
            cleanable_bytes = sum(
                segment.size
                for segment in self._segments[self._segment_slot(low) :]
                if segment.base_offset < first_uncleanable
            )
            clean_bytes = sum(segment.size for segment in self._segments if segment.base_offset < first_dirty)
            if clean_bytes + cleanable_bytes == 0:
                return None
            first_timestamps = [self._first_batch_timestamp(segment) for segment in dirty_closed]
            earliest = min((ts for ts in first_timestamps if ts > 0), default=None)
            overdue = earliest is not None and earliest < now_ms - self.config.max_compaction_lag_ms
            return CleanableRange(first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, overdue)

    def _valid_first_dirty(self) -> int:
        """The cleaner checkpoint, or the log start when there is none or it lies outside
        [log start, log end] (Kafka's cleanableOffsets resets it the same way)."""
        first_dirty = self._first_dirty_offset
        if first_dirty is None or not self.log_start_offset <= first_dirty <= self.log_end_offset:
            return self.log_start_offset
        return first_dirty

    def _first_batch_timestamp(self, segment: Segment) -> int:
        """The max timestamp of the segment's first batch (Kafka's LogSegment.getFirstBatchTimestamp);
        a segment loaded from its index files has not read it yet."""
        if segment.first_batch_timestamp < 0 and segment.size >= HEADER_SIZE:
            segment.first_batch_timestamp = parse_header(os.pread(segment.fd, HEADER_SIZE, 0)).max_timestamp
        return segment.first_batch_timestamp

    def compact(
        self,
        *,
        now_ms: int,
        is_aborted: Callable[[int, int], bool] | None = None,
        last_stable_offset: int | None = None,
        up_to: int | None = None,
    ) -> int:
        """Compact-policy cleaning (Kafka's LogCleaner); return the number of records removed.

        Safe to run on a thread of its own: appends, fetches and retention wait only while it takes
        its views of the segments (step 1) and while it swaps one cleaned segment in (step 5).

        Steps:
          1. Under the lock: a view (a dup of the descriptor and the size) of every segment, the
             first dirty offset and the config; the active segment is read (for transactions) but
             never cleaned.
          2. Read batch headers (and transaction markers) of the whole log: which transactions aborted,
             the first offset of a still-open transaction, and each producer's last data batch. The
             bound of the pass is the lowest of that offset, `last_stable_offset`, `up_to` and (with
             min_compaction_lag_ms) the first segment from the dirty part on holding records that
             young, lowered to its segment's base as Kafka's firstUncleanableOffset: only whole
             segments below it are cleaned, and nothing at or past it is removed or can supersede.
          3. Map every key to its newest offset among records below the stable bound that are not in an
             aborted transaction (an aborted record never supersedes a committed one).
          4. Rewrite closed segments below the bound, oldest first, keeping: control batches; records at or
             past the bound; the newest record of each key; a newest tombstone until its batch's delete
             horizon (set to now + delete_retention_ms the first time it is compacted) has passed. Records
             of aborted transactions and keyless records are removed, as Kafka does. Changed batches are
             re-encoded with their original offsets, producer fields, sequence range and codec; a batch
             left empty keeps an empty header only if it is its producer's last data batch. Consecutive
             segments are cleaned into one file while they fit segment.bytes together (Kafka's
             groupSegmentsBySize), which goes to .log.cleaned and is fsynced.
          5. Under the lock, per group: if the log is open and still holds its segments (retention or
             DeleteRecords may have deleted one meanwhile; the cleaned copy is then dropped), rename
             the copy over the first segment (a crash leaves either file; a stray .cleaned is deleted
             on open), delete the others and adopt it. Last, checkpoint the bound as where the dirty
             part of the log now starts (never below where it started).
        `is_aborted(producer_id, batch_base_offset)` may mark more transactional batches as aborted than the
        log's own markers do; `last_stable_offset` is the partition's, which knows transactions whose
        first batches retention removed; `up_to` is the first uncleanable offset the cleaner chose
        the log by (CleanableRange), so the pass cleans what was weighed.
        Invariant: closed segments change only here and one pass runs at a time, so a view's bytes stay
        what the segment holds until step 5 swaps it. A no-op unless cleanup_policy includes "compact".
        """
        with self._cleaning:
            prepared = self._views_to_clean()
            if prepared is None:
                return 0
            views, first_dirty, config = prepared
            bounds = [b for b in (last_stable_offset, up_to) if b is not None]
            try:
                return self._clean(views, first_dirty, config, now_ms, is_aborted, bounds)
            except OSError:
                if self._closed:  # deleted or closed meanwhile (its directory may be gone)
                    return 0
                raise
            finally:
                for view in views:
                    os.close(view.fd)

    def _views_to_clean(self) -> tuple[list[SegmentView], int, LogConfig] | None:
        """Step 1 of :meth:`compact`: (views, first dirty offset, config), or None if there is
        nothing to clean."""
        with self._lock:
            # A pass scheduled just before its topic was deleted finds the log closed: nothing to do.
            if self._closed or not self.config.compacts or len(self._segments) < 2:
                return None
            views: list[SegmentView] = []
            try:
                for segment in self._segments:
                    views.append(SegmentView(segment, os.dup(segment.fd), segment.size))
            except OSError:
                for view in views:
                    os.close(view.fd)
                raise
            return views, self._valid_first_dirty(), self.config

    def _clean(
        self,
        views: list[SegmentView],
        first_dirty: int,
        config: LogConfig,
        now_ms: int,
        is_aborted: Callable[[int, int], bool] | None,
        bounds: list[int],
    ) -> int:
        aborted, open_from, last_entries = self._transaction_outline(views, is_aborted)
        bound = min([open_from, *bounds])
        closed = views[:-1]
        if config.min_compaction_lag_ms > 0:
            dirty_from = max((v.base_offset for v in views if v.base_offset <= first_dirty), default=0)
            for view in closed:
                if (
                    view.base_offset >= dirty_from
                    and self._largest_timestamp(view) > now_ms - config.min_compaction_lag_ms
                ):
                    bound = min(bound, view.base_offset)
                    break
        # Whole segments only: the bound drops to the base of the segment holding it.
        bound = max((v.base_offset for v in views if v.base_offset <= bound), default=views[0].base_offset)
        latest = self._latest_offsets(views, aborted, bound)
        cleaner = RecordFilter(latest, aborted, last_entries, bound, now_ms, config)
        removed = 0
        cleaned_up_to = bound
        for group in self._merge_groups([view for view in closed if view.base_offset < bound], config):
            dropped, installed = self._clean_group(group, cleaner)
            removed += dropped
            if not installed:  # retention or DeleteRecords took part of it meanwhile: still dirty
                cleaned_up_to = min(cleaned_up_to, group[0].base_offset)
        if cleaner.keyless:
            logger.warning(
                "%s: compaction removed %d records without a key (a compacted topic needs keys)",
                self,
                cleaner.keyless,
            )
        self._checkpoint_first_dirty(max(first_dirty, cleaned_up_to))
        return removed

    def _checkpoint_first_dirty(self, offset: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._first_dirty_offset = offset
            try:
                write_file_atomically(self.directory / CLEANER_CHECKPOINT, f"{offset}\n".encode())
            except OSError as exc:
                # Only the schedule depends on it: after a restart the whole log counts as dirty.
                logger.warning("%s: could not checkpoint the first dirty offset %d: %s", self, offset, exc)

    def _transaction_outline(
        self, views: list[SegmentView], is_aborted: Callable[[int, int], bool] | None
    ) -> tuple[set[int], int, dict[int, tuple[int | None, int]]]:
        """(base offsets of aborted transactional batches, stable bound, each producer's last entry).

        A producer's last entry is (its last data batch's last offset, epoch), or (None, epoch) when a
        marker of a newer epoch followed its data: Kafka's producer state then holds no batch
        (ProducerStateEntry.maybeUpdateProducerEpoch), and the cleaner keeps that marker instead."""
        aborted: set[int] = set()
        open_batches: dict[int, list[int]] = {}  # producer id -> its transactional batches awaiting a marker
        last_entries: dict[int, tuple[int | None, int]] = {}
        log_end = views[-1].base_offset
        for view in views:
            for position, header in self._headers(view, 0):
                log_end = header.next_offset
                producer_id = header.producer_id
                if header.is_control:
                    marker = control_marker(self._read_batch(view, position, header))
                    ended = open_batches.pop(producer_id, [])
                    if marker is not None and marker[0] == "ABORT":
                        aborted.update(ended)
                    elif is_aborted is not None:
                        aborted.update(base for base in ended if is_aborted(producer_id, base))
                    previous = last_entries.get(producer_id)
                    if previous is None or header.producer_epoch > previous[1]:
                        last_entries[producer_id] = (None, header.producer_epoch)
                    continue
                if header.is_transactional:
                    open_batches.setdefault(producer_id, []).append(header.base_offset)
                if header.has_producer_id:
                    last_entries[producer_id] = (header.last_offset, header.producer_epoch)
        stable_bound = min((bases[0] for bases in open_batches.values()), default=log_end)
        return aborted, stable_bound, last_entries

    def _latest_offsets(
        self, views: list[SegmentView], aborted: set[int], stable_bound: int
    ) -> dict[bytes, int]:
        latest: dict[bytes, int] = {}
        for view in views:
            if view.base_offset >= stable_bound:
                break
            for position, header in self._headers(view, 0):
                if header.base_offset >= stable_bound:
                    break
                if header.is_control or header.base_offset in aborted:
                    continue
                batch = self._read_batch(view, position, header)
                if not crc_is_valid(batch, header):
                    # Its keys could be anything: a pass must not drop records by them.
                    raise CorruptBatchError(
                        f"{view.path} is damaged: the batch at byte {position} (offsets "
                        f"{header.base_offset} to {header.last_offset}) fails its CRC check",
                        valid_bytes=position,
                    )
                for record in decode_records(batch):
                    if record.key is not None and record.offset < stable_bound:
                        latest[record.key] = record.offset
        return latest

    @staticmethod
    def _merge_groups(views: list[SegmentView], config: LogConfig) -> list[list[SegmentView]]:
        """Consecutive segments to clean into one file each (Kafka's groupSegmentsBySize), so that
        segments compaction shrank or emptied do not pile up: a group grows while its segments'
        sizes before cleaning add up to at most segment.bytes, their index entries fit
        segment.index.bytes, and its offsets stay within an int32 of its first segment's base
        (index entries hold relative offsets)."""
        groups: list[list[SegmentView]] = []
        size = offset_entries = time_entries = 0  # of the last group
        for view in views:
            entries = len(view.segment.index_offsets), len(view.segment.time_timestamps)
            if groups and (
                size + view.size <= config.segment_bytes
                and offset_entries + entries[0] <= config.max_offset_index_entries
                and time_entries + entries[1] <= config.max_time_index_entries
                and (view.size == 0 or view.segment.next_offset - 1 - groups[-1][0].base_offset <= INT32_MAX)
            ):
                groups[-1].append(view)
                size, offset_entries, time_entries = (
                    size + view.size,
                    offset_entries + entries[0],
                    time_entries + entries[1],
                )
            else:
                groups.append([view])
                size, (offset_entries, time_entries) = view.size, entries
        return groups

    def _clean_group(self, views: list[SegmentView], cleaner: RecordFilter) -> tuple[int, bool]:
        """Rewrite consecutive closed segments through `cleaner` into one file named after the first
        and swap it in; return (records removed, whether the log now holds the cleaned file or the
        group needed no change)."""
        head = views[0].segment
        cleaned_path = head.path.with_name(head.path.name + CLEANED_SUFFIX)
        # Kafka's Cleaner gives the cleaned file the last-modified time of the group's last segment:
        # time retention falls back to it when no record with a timestamp is left, and the cleaning
        # time would restart that clock.
        newest = os.fstat(views[-1].fd)
        fd = os.open(cleaned_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        rewritten = Segment(head.base_offset, head.path, fd, next_offset=head.base_offset)
        installed = False
        try:
            removed, changed = 0, len(views) > 1
            for view in views:
                dropped, view_changed = self._write_cleaned(view, cleaner, rewritten)
                removed += dropped
                changed = changed or view_changed
            if not changed:
                return 0, True
            os.fsync(fd)
            os.utime(cleaned_path, ns=(newest.st_atime_ns, newest.st_mtime_ns))
            installed = self._install_cleaned(views, cleaned_path, rewritten)
        finally:
            if not installed and rewritten.fd >= 0:  # (-1: the log adopted the file)
                os.close(fd)
                cleaned_path.unlink(missing_ok=True)
        if not installed:
            return 0, False
        merged = f" (merged with the {len(views) - 1} segments after it)" if len(views) > 1 else ""
        logger.info("%s: compaction removed %d records from %s%s", self, removed, head.path.name, merged)
        return removed, True

    def _install_cleaned(self, views: list[SegmentView], cleaned_path: Path, rewritten: Segment) -> bool:
        """Step 5 of :meth:`compact` for one group; False when the log no longer holds all of it.

        Steps, under the lock:
          1. Rename the cleaned file over the first segment's and fsync the directory. From here the
             log adopts it, whatever fails next.
          2. Drop the other segments from the log (memory) and delete their files first to last,
             fsyncing the directory after each: at any crash, the segments left on disk still hold
             what the cleaned file holds past their base offsets, and recovery cuts the first
             segment at the next one's base (keeping every record once). A deletion that fails
             leaves such a file for that recovery; it is logged.
          3. Write the first segment's index files (a failure is logged: closing the log tries
             again)."""
        segments = [view.segment for view in views]
        with self._lock:
            if self._closed or not all(any(s is segment for s in self._segments) for segment in segments):
                return False
            for view in views:
                if view.segment.size != view.size:
                    # Closed segments change only in a pass, and one runs at a time: a broken invariant.
                    raise RuntimeError(
                        f"{view.path} changed while it was being cleaned; its cleaned copy is dropped"
                    )
            head = segments[0]
            # Its old index files must not describe the new file after a crash: without them a
            # start rebuilds them by scanning (they are written again below).
            for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                head.sibling(suffix).unlink(missing_ok=True)
            fsync_directory(self.directory)  # gone before the rename, whatever a power loss keeps
            os.replace(cleaned_path, head.path)
            # From here the log holds the cleaned file: memory follows it whatever fails next.
            os.close(head.fd)
            head.next_offset = max(segment.next_offset for segment in segments)
            head.adopt(rewritten)
            rewritten.fd = -1
            for segment in segments[1:]:
                os.close(segment.fd)
                self._segments.remove(segment)
            try:
                fsync_directory(self.directory)  # the rename is durable before any deletion
                for segment in segments[1:]:
                    self._remove_merged_files(segment)
                self._seal(head)
            except OSError as exc:
                # Files of merged segments may be left: the next start must rescan and cut them,
                # not trust index files, so this log will not be marked cleanly shut down.
                self._require_full_recovery()
                logger.warning(
                    "%s: compaction could not finish removing the segments merged into %s (%s); "
                    "the next start recovers them",
                    self,
                    head.path.name,
                    exc,
                )
            return True

    def _remove_merged_files(self, segment: Segment) -> None:
        """Delete a merged segment's files, durably before the next one's (the .log first: index
        files without it are removed as leftovers on the next open)."""
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            segment.sibling(suffix).unlink(missing_ok=True)
        fsync_directory(self.directory)

    def _write_cleaned(
        self, view: SegmentView, cleaner: RecordFilter, rewritten: Segment
    ) -> tuple[int, bool]:
        """Write the batches `cleaner` keeps to rewritten.fd; return (records removed, anything changed)."""
        removed = 0
        changed = False
        pending: list[bytes] = []
        pending_bytes = 0
        # CRC checks: re-encoding a damaged batch would give it a valid CRC, hiding the damage.
        batches = scan_batches(view.fd, 0, view.size, validate_crc=True)
        for _, header, batch in describe_damage(batches, view.path):
            kept, dropped = cleaner.filter(header, batch)
            removed += dropped
            changed = changed or kept is not batch
            if kept is None:
                continue
            kept_header = header if kept is batch else parse_header(kept)
            config = cleaner.config
            # A merged file's index gets no more entries than segment.index.bytes holds (sparser
            # instead: a lookup lands on an earlier batch and reads forward).
            full = (
                len(rewritten.index_offsets) >= config.max_offset_index_entries
                or len(rewritten.time_timestamps) >= config.max_time_index_entries
            )
            rewritten.track(kept_header, rewritten.size, INT32_MAX if full else config.index_interval_bytes)
            pending.append(kept)
            pending_bytes += len(kept)
            if pending_bytes >= SCAN_CHUNK:
                write_all(rewritten.fd, b"".join(pending))
                pending, pending_bytes = [], 0
        write_all(rewritten.fd, b"".join(pending))
        return removed, changed


class RecordFilter:
    """The per-batch decisions of one compaction pass (Kafka's LogCleaner record and batch filters),
    fed the batches in offset order.

    Transaction markers, as Kafka's CleanedTransactionMetadata and Cleaner.checkBatchRetention:
    1. a COMMIT marker may go once this pass traversed no data batch of its transaction, an ABORT
       marker once it traversed no aborted batch of its transaction (their records are all gone);
       an empty marker batch may always go;
    2. such a marker first gets a delete horizon (now + delete.retention.ms), like a tombstone, and
       goes in the first pass after it, so a reader that saw the transaction's records still sees
       how it ended;
    3. a marker that is its producer's last entry (a newer epoch than its data) stays: it carries the
       epoch that fences the producer's older instances."""

    def __init__(
        self,
        latest: dict[bytes, int],
        aborted: set[int],
        last_entries: dict[int, tuple[int | None, int]],
        stable_bound: int,
        now_ms: int,
        config: LogConfig,
    ) -> None:
        self.latest = latest
        self.aborted = aborted
        self.last_entries = last_entries
        self.stable_bound = stable_bound
        self.now_ms = now_ms
        self.config = config
        self.keyless = 0
        # Producers whose committed data batches this pass traversed since their last marker, and
        # those of which it traversed an aborted batch.
        self._committed_data: set[int] = set()
        self._aborted_data: set[int] = set()

    def _keep(self, record: Record, horizon: int | None) -> bool:
        if record.offset >= self.stable_bound:
            return True
        if record.key is None:
            self.keyless += 1
            return False
        if self.latest.get(record.key, -1) > record.offset:
            return False
        return record.value is not None or horizon is None or self.now_ms < horizon

    def filter(self, header: BatchHeader, batch: bytes) -> tuple[bytes | None, int]:
        """(batch to keep, or None to drop it; records removed). Returns `batch` itself when unchanged."""
        if header.is_control:
            return self._filter_marker(header, batch)
        if header.is_transactional:
            if header.base_offset in self.aborted:
                self._aborted_data.add(header.producer_id)
            else:
                self._committed_data.add(header.producer_id)
        records = decode_records(batch)
        horizon = header.delete_horizon_ms
        if header.is_transactional and header.base_offset in self.aborted:
            kept = [record for record in records if record.offset >= self.stable_bound]
        else:
            kept = [record for record in records if self._keep(record, horizon)]
        needs_horizon = horizon is None and any(record.value is None for record in kept)
        if len(kept) == len(records) and not needs_horizon:
            return batch, 0
        removed = len(records) - len(kept)
        last_entry = self.last_entries.get(header.producer_id)
        is_last_of_producer = last_entry is not None and last_entry[0] == header.last_offset
        # CreateTime: the max of the records left; LogAppendTime and emptied batches keep the original.
        keep_max_timestamp = not kept or header.timestamp_type == LOG_APPEND_TIME
        if not kept and not (header.has_producer_id and is_last_of_producer):
            return None, removed
        # An emptied last batch of a producer keeps its header: it carries the producer's last sequence.
        return (
            encode_batch(
                kept,
                base_offset=header.base_offset,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                is_transactional=header.is_transactional,
                timestamp_type=header.timestamp_type,
                partition_leader_epoch=header.partition_leader_epoch,
                last_offset_delta=header.last_offset_delta,
                max_timestamp=header.max_timestamp if keep_max_timestamp else None,
                delete_horizon_ms=self.now_ms + self.config.delete_retention_ms if needs_horizon else horizon,
                compression=header.compression,
            ),
            removed,
        )

    def _filter_marker(self, header: BatchHeader, batch: bytes) -> tuple[bytes | None, int]:
        """Steps 1-3 of the class docstring for one control batch."""
        producer_id = header.producer_id
        marker = control_marker(batch)
        if marker is None:
            discardable = True
        elif marker[0] == "ABORT":
            discardable = producer_id not in self._aborted_data
            self._aborted_data.discard(producer_id)
        else:
            discardable = producer_id not in self._committed_data
            self._committed_data.discard(producer_id)
        if header.base_offset >= self.stable_bound or not discardable:
            return batch, 0
        last_entry = self.last_entries.get(producer_id)
        if last_entry is not None and last_entry[0] is None and last_entry[1] == header.producer_epoch:
            return batch, 0
        horizon = header.delete_horizon_ms
        if horizon is not None:
            return (None, header.record_count) if horizon <= self.now_ms else (batch, 0)
        records = decode_records(batch)
        return (
            encode_batch(
                records,
                base_offset=header.base_offset,
                producer_id=producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                is_transactional=True,
                is_control=True,
                timestamp_type=header.timestamp_type,
                partition_leader_epoch=header.partition_leader_epoch,
                last_offset_delta=header.last_offset_delta,
                max_timestamp=header.max_timestamp,
                delete_horizon_ms=self.now_ms + self.config.delete_retention_ms,
            ),
            0,
        )
