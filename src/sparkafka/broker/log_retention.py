"""Deleting a partition's oldest records, as Kafka's UnifiedLog does: DeleteRecords moving the log
start offset (deleteRecordsOnLocalLog), and retention by time and size (deleteOldSegments), whole
segments only and never the active one unless it is empty.

:class:`LogRetention` is a part of :class:`~sparkafka.broker.log.PartitionLog`, working on its
segments under its lock.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.files import fsync_directory
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_segment import Segment, SegmentView

logger = logging.getLogger("sparkafka.broker.log")


class LogRetention:
    """DeleteRecords and retention (mixed into PartitionLog)."""

    if TYPE_CHECKING:  # what the log this is a part of holds and does
        directory: Path
        config: LogConfig
        log_start_offset: int
        log_end_offset: int
        _segments: list[Segment]
        _lock: threading.RLock

        def _ensure_open(self) -> None: ...
        def _roll(self, base_offset: int, opened_ms: int | None = None) -> Segment: ...
        def _delete_segment(self, segment: Segment) -> None: ...
        def _delete_segments_below(self, offset: int) -> int: ...
        def _move_log_start(self, offset: int) -> None: ...
        def size_bytes(self) -> int: ...

    def delete_records_before(self, offset: int, *, before_deleting: Callable[[], None] | None = None) -> int:
        """DeleteRecords: raise log_start_offset to `offset` (never lower it), drop segments wholly below.
        `before_deleting` runs first whenever the log start moves (see :meth:`enforce_retention`)."""
        with self._lock:
            self._ensure_open()
            if offset < 0 or offset > self.log_end_offset:
                raise BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"Cannot increment the log start offset to {offset} of partition {self.directory.name} "
                    f"since it is larger than the log end offset {self.log_end_offset}",
                )
            if offset > self.log_start_offset:
                if before_deleting is not None:
                    before_deleting()
                self._move_log_start(offset)
                self._delete_segments_below(offset)
            return self.log_start_offset

    def _largest_timestamp(self, segment: Segment | SegmentView) -> int:
        if segment.max_timestamp >= 0:
            return segment.max_timestamp
        return int(os.fstat(segment.fd).st_mtime * 1000)  # Kafka falls back to the file's mtime too

    def enforce_retention(self, now_ms: int, *, before_deleting: Callable[[], None] | None = None) -> int:
        """Delete-policy retention (Kafka's UnifiedLog.deleteOldSegments): the size limit first, then
        the time limit on what is left; return how many segments were removed. A no-op unless
        cleanup_policy includes "delete".

        - size: while the log is larger than retention_bytes, drop the oldest segments as long as
          dropping one leaves at least retention_bytes;
        - time: drop the oldest segments whose largest timestamp is more than retention_ms old.
        Each rule removes a prefix of the segments (see :meth:`_delete_oldest_while`). `before_deleting`
        runs before the first segment goes: the partition saves the state that the removed batches
        can no longer rebuild.
        """
        with self._lock:
            self._ensure_open()
            if not self.config.deletes:
                return 0
            removed = 0
            if self.config.retention_bytes >= 0:
                excess = self.size_bytes() - self.config.retention_bytes

                def over_size(segment: Segment) -> bool:
                    nonlocal excess
                    if excess - segment.size < 0:
                        return False
                    excess -= segment.size
                    return True

                removed += self._delete_oldest_while(over_size, now_ms, before_deleting)
            if self.config.retention_ms >= 0:
                retention_ms = self.config.retention_ms
                removed += self._delete_oldest_while(
                    lambda segment: now_ms - self._largest_timestamp(segment) > retention_ms,
                    now_ms,
                    None if removed else before_deleting,
                )
            return removed

    def _delete_oldest_while(
        self,
        deletable: Callable[[Segment], bool],
        now_ms: int,
        before_deleting: Callable[[], None] | None,
    ) -> int:
        """Delete the longest prefix of segments that are all `deletable` (Kafka's deletableSegments
        and deleteSegments); return how many.

        Steps:
          1. Candidates are the segments oldest first, the active one included unless it is empty: on a
             single replica the high watermark is the log end, so every record is below it.
          2. If every segment goes, an empty segment is rolled at the log end first: a log always has
             an active segment, and a quiet topic's records expire as on Kafka.
          3. log_start_offset moves to the first remaining segment's base (checkpointed), then the
             doomed segments' files are deleted.
        """
        candidates = self._segments if self._segments[-1].size > 0 else self._segments[:-1]
        doomed = list(itertools.takewhile(deletable, candidates))
        if not doomed:
            return 0
        if before_deleting is not None:
            before_deleting()
        if len(doomed) == len(self._segments):
            self._roll(self.log_end_offset, now_ms)
        new_start = max(self.log_start_offset, self._segments[len(doomed)].base_offset)
        if new_start != self.log_start_offset:
            self._move_log_start(new_start)
        for segment in doomed:
            logger.info("%s: retention deletes segment %s", self, segment.path.name)
            self._delete_segment(segment)
        fsync_directory(self.directory)
        return len(doomed)
