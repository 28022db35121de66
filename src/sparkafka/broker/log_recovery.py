"""Opening a partition's log, and recovering it after a crash, as Kafka's LogLoader does: leftovers
of interrupted work removed, each segment loaded, the segments past the recovery point scanned with
CRC checks after an unclean shutdown (torn tails cut, indexes rebuilt), damage a clean start meets
kept and refused rather than cut, and the log's checkpoints (log start, recovery point) read and
written.

:class:`LogRecovery` is a part of :class:`~sparkafka.broker.log.PartitionLog`; the steps and the
invariants of a start are in :meth:`~sparkafka.broker.log.PartitionLog.__init__`'s docstring.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from sparkafka.broker.files import TEMPORARY_SUFFIX, fsync_directory, write_file_atomically
from sparkafka.broker.log_cleaner import CLEANED_SUFFIX, CLEANER_CHECKPOINT
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    OFFSET_ENTRY,
    SCAN_CHUNK,
    TIME_ENTRY,
    TIMEINDEX_SUFFIX,
    Segment,
    is_offset,
    open_segment_file,
    read_offset_text,
    scan_batches,
    segment_path,
)
from sparkafka.broker.records import (
    HEADER_SIZE,
    INT32_MAX,
    MAGIC,
    BatchHeader,
    CorruptBatchError,
    crc_is_valid,
    parse_header,
)

_MAGIC_AT = 16  # where the magic byte sits in a v2 batch header
CLEAN_SHUTDOWN = ".clean_shutdown"
LOG_START_CHECKPOINT = "log-start-offset"
# Kafka's recovery-point-offset-checkpoint (per log directory there, per partition here): every
# segment below it was fsynced with its index files when the log rolled past it, so a start after
# an unclean shutdown trusts their index files and rescans only the segments from it on.
RECOVERY_POINT = "recovery-point"
# The log's own logger: what a start reports is the log's.
logger = logging.getLogger("sparkafka.broker.log")


class LogRecovery:
    """The opening and recovery half of a partition's log (mixed into PartitionLog)."""

    if TYPE_CHECKING:  # what the log this is a part of holds and does
        directory: Path
        config: LogConfig
        log_start_offset: int
        log_end_offset: int
        _segments: list[Segment]
        _after_clean_stop: bool
        _clean_stop_end: int | None
        _needs_recovery: bool

        def _roll(self, base_offset: int, opened_ms: int | None = None) -> Segment: ...
        def _create_segment(self, base_offset: int, opened_ms: int | None = None) -> Segment: ...
        def _random_roll_jitter(self) -> int: ...
        def _delete_segments_below(self, offset: int) -> int: ...
        def _write_log_start_checkpoint(self, offset: int | None = None) -> None: ...

    # ---- opening and recovery ----------------------------------------------------------------------

    def _load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / CLEAN_SHUTDOWN
        clean = marker.exists()
        self._after_clean_stop = clean
        self._clean_stop_end = self._read_clean_stop_end(marker) if clean else None
        self._remove_leftovers()
        checkpoint = self._read_log_start_checkpoint()
        recovery_point = 0 if clean else self._read_recovery_point()
        bases = sorted(
            int(path.stem)
            for path in self.directory.glob(f"*{LOG_SUFFIX}")
            if path.stem.isdigit() and len(path.stem) == 20
        )
        try:
            for i, base in enumerate(bases):
                next_base = bases[i + 1] if i + 1 < len(bases) else None
                path = segment_path(self.directory, base)
                segment = Segment(
                    base, path, open_segment_file(path), roll_jitter_ms=self._random_roll_jitter()
                )
                self._segments.append(segment)
                trusted = clean or (next_base is not None and next_base <= recovery_point)
                if not (trusted and self._load_indexes(segment, next_base)):
                    self._recover_segment(segment, next_base)
        except BaseException:
            for segment in self._segments:
                os.close(segment.fd)
            raise
        # Removed only now, so a failed open does not cost the next one a full rescan.
        marker.unlink(missing_ok=True)
        if not self._segments:
            self._segments.append(self._create_segment(checkpoint or 0))
        first_base = self._segments[0].base_offset
        self.log_start_offset = max(checkpoint if checkpoint is not None else first_base, first_base)
        last = self._segments[-1]
        self.log_end_offset = last.next_offset
        if self.log_start_offset > self.log_end_offset:
            # The data up to the checkpointed start was deleted; what is left ends before it (a torn tail).
            logger.warning(
                "%s: log start offset %d is past the recovered log end offset %d; starting an empty segment "
                "at %d",
                self.directory,
                self.log_start_offset,
                self.log_end_offset,
                self.log_start_offset,
            )
            self._roll(self.log_start_offset)
            self.log_end_offset = self.log_start_offset
            self._delete_segments_below(self.log_start_offset)
        self._write_log_start_checkpoint()

    def _remove_leftovers(self) -> None:
        for path in self.directory.iterdir():
            if path.name.endswith(CLEANED_SUFFIX):
                logger.warning("%s: removing %s, left by an interrupted compaction", self, path)
                path.unlink()
                continue
            is_index = path.suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX)
            if (is_index and not path.with_suffix(LOG_SUFFIX).exists()) or path.name.endswith(
                TEMPORARY_SUFFIX
            ):
                path.unlink()

    @staticmethod
    def _read_clean_stop_end(marker: Path) -> int | None:
        """The log end offset the clean-shutdown marker recorded; None if it holds none (an empty
        marker, as written before it recorded one): then a damaged active segment is cut as before."""
        text = read_offset_text(marker)
        return int(text) if is_offset(text) else None

    def _read_log_start_checkpoint(self) -> int | None:
        path = self.directory / LOG_START_CHECKPOINT
        if not path.exists():
            return None
        text = read_offset_text(path)
        if not is_offset(text):
            raise ValueError(
                f"{path} should hold one non-negative integer (the log start offset) but holds {text!r}; "
                "fix or delete it (deleting makes the first segment's base offset the log start)"
            )
        return int(text)

    def _read_recovery_point(self) -> int:
        path = self.directory / RECOVERY_POINT
        text = read_offset_text(path) if path.exists() else "0"
        if not is_offset(text):
            # Only how much is rescanned depends on it.
            logger.warning("%s holds %r, not an offset; ignored: every segment is rescanned", path, text)
            return 0
        return int(text)

    def _require_full_recovery(self) -> None:
        """Make the next start scan every segment: no clean-shutdown marker, recovery point 0."""
        self._needs_recovery = True
        try:
            write_file_atomically(self.directory / RECOVERY_POINT, b"0\n")
        except OSError:
            with contextlib.suppress(OSError):
                (self.directory / RECOVERY_POINT).unlink()
                fsync_directory(self.directory)

    def _read_cleaner_checkpoint(self) -> int | None:
        path = self.directory / CLEANER_CHECKPOINT
        if not path.exists():
            return None
        text = read_offset_text(path)
        if not is_offset(text):
            # Only the cleaner's schedule depends on it: the next pass cleans the whole log.
            logger.warning(
                "%s should hold one non-negative integer (the first dirty offset) but holds %r; "
                "ignored: the whole log counts as dirty",
                path,
                text,
            )
            return None
        return int(text)

    def _recover_segment(self, segment: Segment, next_base: int | None) -> None:
        """Rebuild a segment's indexes from its batches, cutting a torn or corrupt tail (Kafka's recover).

        Steps: scan the file with CRC and offset checks, tracking every valid batch; at the first
        one that fails, after a clean stop, keep the file if the segment held records from there
        on (`_keep_damage`); otherwise report what goes (`_report_cut`) and cut the file there. An
        active segment that reads as whole valid batches to its end, but ending at another offset
        than the log end offset a clean stop recorded, goes to `_end_at_clean_stop`."""
        segment.reset_indexes()
        file_size = os.fstat(segment.fd).st_size
        try:
            for position, header, _ in scan_batches(segment.fd, 0, file_size, validate_crc=True):
                limit = next_base if next_base is not None else segment.base_offset + INT32_MAX + 1
                if header.base_offset < segment.next_offset or header.last_offset >= limit:
                    raise CorruptBatchError(
                        f"batch at byte {position} holds offsets [{header.base_offset}, "
                        f"{header.last_offset}], outside [{segment.next_offset}, {limit})",
                        valid_bytes=position,
                    )
                segment.track(header, position, self.config.index_interval_bytes)
        except CorruptBatchError as exc:
            # Where the segment's records ended when the log was stopped: a closed segment's at the
            # next one's base, the active segment's at the log end offset the marker recorded.
            end = next_base if next_base is not None else self._clean_stop_end
            if self._after_clean_stop and end is not None and end > segment.next_offset:
                self._keep_damage(segment, next_base, exc, file_size, end)
                return
            self._report_cut(segment, next_base, exc, file_size)
            os.ftruncate(segment.fd, exc.valid_bytes)
            os.fsync(segment.fd)
        else:
            end = self._clean_stop_end
            if next_base is None and end is not None and segment.next_offset != end:
                self._end_at_clean_stop(segment, file_size, end)
                return
        segment.size = os.fstat(segment.fd).st_size

    def _end_at_clean_stop(self, segment: Segment, file_size: int, end: int) -> None:
        """Settle an active segment whose batches, every CRC checked, end at another offset than
        ``end``, the log end offset the clean-shutdown marker recorded.

        Short of ``end``: the file lost whole batches after the stop (or was shortened or replaced),
        and the records at those offsets, acknowledged, are gone. Giving their offsets to new records
        would make a consumer that read the old ones skip the new ones, or take them for the old:
        log an ERROR naming the offsets, close the segment at ``end`` (fetches of the missing offsets
        get the records after them, as after a compacted gap) and start a new one there, as
        `_keep_damage` does. Past ``end``: whole valid batches a closed log cannot have appended
        mean the marker is what is damaged; the batches are kept, with a WARNING."""
        if segment.next_offset > end:
            logger.warning(
                "%s: %s holds whole batches with valid CRCs up to offset %d, past the log end offset %d "
                "that the clean-shutdown marker recorded; the marker is taken for damaged and the batches "
                "are kept",
                self.directory.name,
                segment.path,
                segment.next_offset - 1,
                end,
            )
            segment.size = file_size
            return
        first = segment.next_offset
        segment.size = file_size
        segment.next_offset = end
        logger.error(
            "%s: %s ends at offset %d with whole valid batches, but the log ended at offset %d when it was "
            "stopped cleanly: the records at offsets %d to %d are missing from the file (acknowledged "
            "records, unless the producer got an error). New records are appended from offset %d on, in a "
            "new segment, so that those offsets are not given to other records. Restore the partition "
            "directory from a backup to get them back",
            self.directory.name,
            segment.path,
            first,
            end,
            first,
            end - 1,
            end,
        )
        self._roll(end)

    def _keep_damage(
        self, segment: Segment, next_base: int | None, exc: CorruptBatchError, file_size: int, end: int
    ) -> None:
        """Keep a segment that a start after a clean stop found damaged at byte ``exc.valid_bytes``,
        though it held records past it (offsets up to ``end``), instead of cutting them.

        Every write was fsynced before the clean-shutdown marker, so the damage is not a torn
        write, whatever it looks like (a length running past the end of the file included):
        cutting there would drop acknowledged records that may well be intact after it. As for a
        damaged batch no start scans, fetches stop before it with CORRUPT_MESSAGE.

        Steps: the segment keeps its whole file and ends at ``end`` (its indexes cover the batches
        before the damage; a fetch of a later offset walks the headers from there and so meets the
        damage too); log an ERROR naming the file, byte and offsets, once (fetches do not repeat
        it); an active segment is then closed and a new one started at ``end``, since an append
        after bytes no scan gets past could never be read back."""
        position, first = exc.valid_bytes, segment.next_offset
        segment.size = file_size
        segment.next_offset = end
        segment.reported_damage.add(position)
        if next_base is None:
            after = f"; new records are appended from offset {end} on, in a new segment"
        else:
            after = ""
        logger.error(
            "%s: %s is damaged at byte %d (%s), found at a start after a clean stop, which leaves no "
            "torn write: the file is kept as it is, not cut. What it holds of offsets %d to %d lies from "
            "that byte on; a fetch of them stops before the damaged batch with CORRUPT_MESSAGE%s. Restore "
            "the partition directory from a backup, or move consumers past the damaged offsets "
            "(DeleteRecords or a committed offset of %d) to accept losing them",
            self.directory.name,
            segment.path,
            position,
            exc,
            first,
            end - 1,
            after,
            end,
        )
        if next_base is None:
            self._roll(end)

    def _report_cut(
        self, segment: Segment, next_base: int | None, exc: CorruptBatchError, file_size: int
    ) -> None:
        """Log what recovery is about to cut from `segment`: a torn last write (a batch whose bytes
        stop short, never acknowledged) at WARNING; anything else, which may hold acknowledged
        records, at ERROR with how many records and which offsets are lost.

        What counts as torn (invariants):
          - only in the active segment, and only after a crash: a clean stop fsynced every write
            before its marker, so then only bytes holding no offset the log had at the stop (its
            recorded log end offset is where the valid batches end) go at WARNING;
          - a batch whose declared length runs past the end of the file, with no whole batch
            holding the offsets the scan expected next (or later ones) inside the bytes it claims
            (`_batch_inside`): a damaged length with the batches written after it still there is
            damage, not a torn write, whatever its other header fields say;
          - a closed segment was complete when the log rolled past it: only copies of the next
            segment's batches may go from it without loss.

        Kafka's LogSegment.recover cuts the same bytes; the count comes from the batch headers
        after the cut, read without CRC checks. Past a batch with a damaged length the count goes
        on from the batch found inside it, and the damaged batch counts as the offsets between
        the one the scan expected and that batch's first (its own offset fields may be damaged
        too, so they are not read). Batches at or past `next_base` are not lost (an interrupted
        compaction leaves them in both files; the next segment keeps them)."""
        cut = exc.valid_bytes
        limit = next_base if next_base is not None else segment.base_offset + INT32_MAX + 1
        overruns = exc.incomplete_size is not None and cut + exc.incomplete_size > file_size
        inside = self._batch_inside(segment, cut, file_size) if overruns and next_base is None else None
        lost_records = lost_batches = 0
        last_lost = -1
        pos = cut
        if inside is not None:
            pos, resumed = inside
            if resumed.base_offset > segment.next_offset:
                lost_batches = 1
                # An offset per record: the active segment is never compacted.
                lost_records = resumed.base_offset - segment.next_offset
                last_lost = resumed.base_offset - 1
        while pos < file_size:
            try:
                header = parse_header(os.pread(segment.fd, HEADER_SIZE, pos))
            except CorruptBatchError:
                break
            if pos + header.size > file_size:
                break
            if header.base_offset < limit:
                lost_batches += 1
                lost_records += header.record_count
                last_lost = max(last_lost, min(header.last_offset, limit - 1))
            pos += header.size
        described_to_end = pos >= file_size
        torn = overruns and inside is None
        if next_base is not None:
            benign = described_to_end and not torn
        elif self._after_clean_stop:
            benign = self._clean_stop_end == segment.next_offset
        else:
            benign = torn
        if inside is not None:
            exc = CorruptBatchError(
                f"{exc}; a whole batch with a valid CRC, holding offsets {inside[1].base_offset} to "
                f"{inside[1].last_offset}, starts inside it at byte {inside[0]}, so its length is damaged, "
                "not torn",
                valid_bytes=cut,
            )
        if lost_batches == 0 and benign:
            logger.warning(
                "%s: truncating %d bytes after byte %d, the end of the last complete valid batch (%s)",
                segment.path,
                file_size - cut,
                cut,
                exc,
            )
            return
        first_lost = segment.next_offset
        if next_base is not None:
            last_lost = max(last_lost, next_base - 1)
        if lost_batches == 0:
            count = "an unknown number of records"
        else:
            count = f"{'' if described_to_end else 'at least '}{lost_records} records"
        if last_lost >= first_lost:
            span = f"offsets {first_lost} to {last_lost}"
        else:
            span = f"offsets from {first_lost} on"
        consequence = (
            "new records will be written at these offsets again"
            if next_base is None
            else f"the log now has a gap before offset {next_base}"
        )
        logger.error(
            "%s: recovery found damaged data in %s at byte %d (%s); truncating %d bytes after byte %d "
            "loses %s at %s (acknowledged records, unless the producer got an error); %s. "
            "Restore the partition directory from a backup to get them back",
            self.directory.name,
            segment.path,
            cut,
            exc,
            file_size - cut,
            cut,
            count,
            span,
            consequence,
        )

    @staticmethod
    def _batch_inside(segment: Segment, position: int, file_size: int) -> tuple[int, BatchHeader] | None:
        """The first whole batch with a valid CRC holding the offsets the scan expected next, or
        later ones, inside the bytes that the batch at `position` claims past the end of the file:
        (its position, its header), or None if none is there.

        A torn write ends the file, so nothing of a later append can follow the batch it cut
        short; a batch whose length field was damaged to run past the end still has the batches
        appended after it behind its real end, the first holding the offset the scan expected
        after the damaged one's. The damaged header's own fields are not used: a damaged base
        offset or lastOffsetDelta would send the search after the wrong offset.

        Steps: from the end of the damaged batch's header on, find with a regular expression over
        1 MiB chunks every place where a header could start (the high four bytes of a base offset
        in [segment.next_offset, the segment's offset limit), magic 2 sixteen bytes in); take the
        first that parses, holds offsets in that range, fits in the file and passes its CRC check.
        Invariant (the false-positive guard): the record bytes of a torn write would have to hold
        a whole valid batch with such offsets to pass, and even then the cut is the same, only
        logged at ERROR, as damage."""
        expected = segment.next_offset
        limit = segment.base_offset + INT32_MAX + 1
        # A segment spans at most 2**31 + 1 offsets, so the base offsets in range share one of
        # two high words.
        highs = sorted({expected >> 32, (limit - 1) >> 32})
        prefixes = b"|".join(re.escape(struct.pack(">I", high)) for high in highs)
        # A lookahead, so that overlapping candidates are all seen; the bytes between the high word
        # and the magic byte (the rest of the offset, the length, the leader epoch) may be anything.
        candidate = re.compile(
            b"(?=(?:%b).{%d}%b)" % (prefixes, _MAGIC_AT - 4, re.escape(bytes([MAGIC]))), re.DOTALL
        )
        reach = _MAGIC_AT + 1  # bytes a candidate needs from its start
        # The real batch holds at least a header; a whole batch after it needs one too.
        start = position + HEADER_SIZE
        while start + HEADER_SIZE <= file_size:
            chunk = os.pread(segment.fd, min(SCAN_CHUNK, file_size - start), start)
            for match in candidate.finditer(chunk):
                at = start + match.start()
                try:
                    found = parse_header(os.pread(segment.fd, HEADER_SIZE, at))
                except CorruptBatchError:
                    continue
                if (
                    expected <= found.base_offset
                    and found.last_offset < limit
                    and at + found.size <= file_size
                    and crc_is_valid(os.pread(segment.fd, found.size, at), found)
                ):
                    return at, found
            if start + len(chunk) >= file_size:
                break
            # The next chunk repeats the bytes a candidate starting here could not be seen in whole.
            start += len(chunk) - (reach - 1)
        return None

    def _load_indexes(self, segment: Segment, next_base: int | None) -> bool:
        """Load a segment's index files after a clean shutdown; False if they are missing or
        inconsistent (the segment is then rescanned).

        A closed segment ends where the next one begins. The active segment (``next_base`` None) is
        read only from its last indexed batch to its end, as Kafka's LogSegment.readNextOffset does,
        so that a clean restart never scans a whole segment; if that tail ends at another offset
        than the log end offset the clean-shutdown marker recorded, the segment is rescanned too
        (its headers were read without CRC checks, and a damaged offset field must neither move
        the log end back, which would give acknowledged offsets to new records, nor go unnoticed)."""
        index_path, time_path = segment.sibling(INDEX_SUFFIX), segment.sibling(TIMEINDEX_SUFFIX)
        if not (index_path.exists() and time_path.exists()):
            return False
        size = os.fstat(segment.fd).st_size
        index_data, time_data = index_path.read_bytes(), time_path.read_bytes()
        if len(index_data) % OFFSET_ENTRY.size or len(time_data) % TIME_ENTRY.size:
            return False
        limit = next_base if next_base is not None else segment.base_offset + INT32_MAX + 1
        index = [(segment.base_offset + rel, pos) for rel, pos in OFFSET_ENTRY.iter_unpack(index_data)]
        times = [(ts, segment.base_offset + rel) for ts, rel in TIME_ENTRY.iter_unpack(time_data)]
        offsets_ok = all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(index)) and all(
            segment.base_offset <= offset < limit and 0 <= pos < size for offset, pos in index
        )
        times_ok = all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(times)) and all(
            segment.base_offset <= offset < limit for _, offset in times
        )
        if not (offsets_ok and times_ok) or (size > 0 and not times):
            return False
        segment.size = size
        segment.index_offsets = [offset for offset, _ in index]
        segment.index_positions = [pos for _, pos in index]
        segment.time_timestamps = [ts for ts, _ in times]
        segment.time_offsets = [offset for _, offset in times]
        segment.max_timestamp, segment.offset_of_max_timestamp = times[-1] if times else (-1, -1)
        if next_base is None:
            if not self._read_active_tail(segment, limit):
                return False
            if self._clean_stop_end is not None and segment.next_offset != self._clean_stop_end:
                # The tail's headers are read without CRC checks: a damaged offset field there
                # would move the log end back (giving offsets again to new records) or forward.
                # The whole segment is rescanned, so that the scan finds the damage and keeps it
                # (`_keep_damage`), or finds whole batches ending elsewhere than the log did
                # (`_end_at_clean_stop`).
                return False
        else:
            segment.next_offset = next_base
        segment.indexes_dirty = False
        return True

    def _read_active_tail(self, segment: Segment, limit: int) -> bool:
        """Find the active segment's next offset from the batches after its last index entry, and
        what appending needs: the bytes since that entry and the first batch's timestamp. False if
        that tail is not a run of whole batches with increasing offsets (the segment is then
        rescanned).

        CRCs are left to fetches, as for every segment after a clean shutdown (Kafka's
        readNextOffset does not check them either): a rescan reads the whole segment and, at a
        damaged batch, has to close it there (`_keep_damage`), where a fetch refuses just that
        batch. A tail that does not read as whole batches (a length running past the end of the
        file, say) is rescanned, and, after a clean stop, kept rather than cut as a torn write."""
        start = segment.index_positions[-1] if segment.index_positions else 0
        segment.next_offset = segment.base_offset
        segment.bytes_since_index = 0
        try:
            for position, header, _ in scan_batches(segment.fd, start, segment.size, validate_crc=False):
                if header.base_offset < segment.next_offset or header.last_offset >= limit:
                    return False
                if position == 0:
                    segment.first_batch_timestamp = header.max_timestamp
                segment.next_offset = header.next_offset
                segment.bytes_since_index += header.size
            if start > 0:
                first = next(scan_batches(segment.fd, 0, segment.size, validate_crc=False))
                segment.first_batch_timestamp = first[1].max_timestamp
        except CorruptBatchError:
            return False
        return True
