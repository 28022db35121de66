"""A small durable append-only journal of JSON entries.

The broker keeps state that must survive a restart but is too small and too structured to deserve a
Kafka log of its own (committed consumer-group offsets, transaction-coordinator state).  Each owner
keeps its state in memory, appends one entry per change, replays the entries on start-up and, once the
journal has grown, compacts it by rewriting it with a snapshot of the live state.

File format (all integers big-endian)::

    file   := MAGIC frame*
    MAGIC  := b"SPKJRNL1"                      (8 bytes; identifies the file and the format version)
    frame  := length:uint32 crc:uint32 payload
    payload:= UTF-8 JSON text of one object    (`length` bytes, never empty)
    crc    := CRC32C (Castagnoli) of payload

Crash safety:

* ``append`` hands each frame to the kernel with a single ``os.write`` loop before returning, so a
  process killed right after ``append`` (even by SIGKILL) loses nothing; with ``fsync=True`` the
  frame is also forced to stable storage, which additionally survives power loss.
* A crash *during* ``append`` can leave a partial frame at the end of the file (a "torn tail").
  Opening the journal detects it, logs a warning naming the file and the number of bytes dropped, and
  truncates it: the entry was never acknowledged, so dropping it is correct.
* Damage anywhere else (a bad frame followed by valid frames) cannot come from a crash; it means the
  file was corrupted, and opening raises :class:`JournalCorruptError` rather than guess.
* ``rewrite`` writes a temporary file, fsyncs it, renames it over the journal and fsyncs the
  directory, so a crash leaves either the complete old journal or the complete new one.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import crc32c

from sparkafka.broker.files import fsync_directory, write_all

_LOG = logging.getLogger(__name__)

MAGIC = b"SPKJRNL1"
_FRAME_HEADER = struct.Struct(">II")
_MAX_PAYLOAD_BYTES = 0xFFFFFFFF
_TEMP_SUFFIX = ".rewrite-tmp"


class JournalError(Exception):
    """The journal cannot be used (closed, failed write, or an entry that cannot be stored)."""


# What each journal of a broker holds, for the advice on a damaged one.
_HOLDS = {
    "__consumer_offsets.journal": "the consumer groups' committed offsets: consumers then start from "
    "their auto.offset.reset",
    "__transaction_state.journal": "the transactional ids' state: producers then start anew, and a "
    "transaction left open in a partition keeps read_committed readers of it waiting; list those "
    "with sparkafka transactions list",
}


class JournalCorruptError(JournalError):
    """The journal file is damaged somewhere other than a torn tail, or is not a journal at all."""

    def __init__(self, path: Path, position: int, reason: str) -> None:
        holds = _HOLDS.get(path.name, "its entries")
        super().__init__(
            f"journal {path} is corrupt at byte {position}: {reason}. The broker does not start on a "
            "journal it cannot read whole (guessing could resurrect or lose committed state). Restore "
            f"the file from a backup; or move it away to start without what it holds ({holds})"
        )
        self.path = path
        self.position = position
        self.reason = reason


def _encode_frame(entry: dict[str, Any], path: Path) -> bytes:
    if not isinstance(entry, dict):
        raise JournalError(f"journal {path}: entries must be dicts, got {type(entry).__name__}")
    try:
        payload = json.dumps(entry, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise JournalError(f"journal {path}: entry is not JSON-serialisable ({exc}): {entry!r}") from exc
    if len(payload) > _MAX_PAYLOAD_BYTES:
        raise JournalError(f"journal {path}: entry of {len(payload)} bytes exceeds the 4 GiB frame limit")
    return _FRAME_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload


def _frame_at(data: bytes | memoryview, position: int) -> tuple[int, int] | None:
    """Return (payload_start, payload_end) if a complete, checksum-valid frame starts at `position`."""
    header_end = position + _FRAME_HEADER.size
    if header_end > len(data):
        return None
    length, expected_crc = _FRAME_HEADER.unpack_from(data, position)
    payload_end = header_end + length
    # Entries are JSON objects, so a valid payload is non-empty and starts with "{"; checking that
    # first also keeps a zero-filled tail (whose CRC of nothing is 0) from parsing as frames.
    if length == 0 or payload_end > len(data) or data[header_end] != ord("{"):
        return None
    if crc32c.crc32c(data[header_end:payload_end]) != expected_crc:
        return None
    return header_end, payload_end


def _scan(path: Path, data: bytes) -> tuple[list[tuple[int, int]], int]:
    """Split journal bytes into frames.

    Returns the (start, end) payload spans of the valid frames and the byte length of the valid
    prefix.  A damaged region that runs to the end of the file and contains no valid frame is a torn
    tail (the valid prefix stops before it); any other damage raises JournalCorruptError.
    """
    if not data.startswith(MAGIC):
        raise JournalCorruptError(path, 0, f"missing journal header {MAGIC!r}; not a sparkafka journal")
    spans: list[tuple[int, int]] = []
    view = memoryview(data)
    position = len(MAGIC)
    while position < len(data):
        frame = _frame_at(view, position)
        if frame is None:
            _raise_unless_torn_tail(path, view, position)
            return spans, position
        spans.append(frame)
        position = frame[1]
    return spans, position


def _raise_unless_torn_tail(path: Path, data: memoryview, bad_position: int) -> None:
    # A crash can only damage the last frame written, so if any valid frame follows the damaged one,
    # the damage was not caused by a crash and the later entries must not be silently discarded.
    for candidate in range(bad_position + 1, len(data) - _FRAME_HEADER.size):
        if data[candidate + _FRAME_HEADER.size] == ord("{") and _frame_at(data, candidate) is not None:
            raise JournalCorruptError(
                path,
                bad_position,
                f"invalid frame followed by a valid frame at byte {candidate} "
                "(damage in the middle of the file, not a torn tail from a crash)",
            )


class Journal:
    """An append-only, crash-safe file of JSON object entries (see the module docstring).

    Opening the journal validates the whole file and truncates a torn tail, so appends always follow a
    valid frame.  Not thread-safe: the broker uses it from its single event-loop thread.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None
        self._broken_reason: str | None = None
        self._remove_stale_rewrite()
        self._fd, entry_count = self._open_and_recover()
        # Entries already in the file count as "appended": the owner cannot tell how much of the file
        # is a compacted snapshot, and counting them only makes the first compaction come sooner.
        self.appended_since_rewrite: int = entry_count

    # -- opening -------------------------------------------------------------------------------------

    def _remove_stale_rewrite(self) -> None:
        temp = self._temp_path()
        if temp.exists():
            # A rewrite crashed before its rename; the journal itself still holds the complete old state.
            _LOG.warning("journal %s: removing unfinished compaction file %s", self.path, temp)
            temp.unlink()

    def _open_and_recover(self) -> tuple[int, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            data = self._read_all(fd)
            if len(data) < len(MAGIC) and MAGIC.startswith(data):
                # Empty, or the crash happened while the header of a new journal was being written.
                if data:
                    _LOG.warning("journal %s: dropping %d bytes of a torn header", self.path, len(data))
                os.ftruncate(fd, 0)
                write_all(fd, MAGIC)
                self._sync(fd, force=True)
                return fd, 0
            spans, valid_end = _scan(self.path, data)
            if valid_end < len(data):
                _LOG.warning(
                    "journal %s: truncating torn tail of %d bytes at byte %d (an unacknowledged "
                    "entry from a crash during a write)",
                    self.path,
                    len(data) - valid_end,
                    valid_end,
                )
                os.ftruncate(fd, valid_end)
                self._sync(fd, force=True)
            return fd, len(spans)
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _read_all(fd: int) -> bytes:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0) if size else b""

    def _temp_path(self) -> Path:
        return self.path.with_name(self.path.name + _TEMP_SUFFIX)

    # -- public API ----------------------------------------------------------------------------------

    def replay(self) -> Iterator[dict[str, Any]]:
        """Return the entries in append order.

        The whole file is read and validated before the first entry is returned, so a corrupt file
        raises here rather than after the caller has applied half of it.
        """
        fd = self._require_open()
        data = self._read_all(fd)
        spans, valid_end = _scan(self.path, data)
        if valid_end != len(data):
            # Recovery at open removed any torn tail, so this means someone else wrote to the file.
            raise JournalCorruptError(self.path, valid_end, "invalid data at the end of an open journal")
        entries: list[dict[str, Any]] = []
        for start, end in spans:
            try:
                entry = json.loads(data[start:end].decode())
            except (UnicodeDecodeError, ValueError) as exc:
                # The checksum matched, so these are the bytes that were written: not a crash artefact.
                raise JournalCorruptError(self.path, start, f"frame is not valid JSON: {exc}") from exc
            if not isinstance(entry, dict):
                raise JournalCorruptError(
                    self.path, start, f"entry is a {type(entry).__name__}, not an object"
                )
            entries.append(entry)
        return iter(entries)

    def append(self, entry: dict[str, Any]) -> None:
        """Write one entry; once this returns it survives a process crash (and, with fsync, power loss).

        On a write error the partial frame is cut off again so that later appends still follow a valid
        frame; if even that fails the journal refuses further writes.
        """
        fd = self._require_open()
        frame = _encode_frame(entry, self.path)
        start = os.fstat(fd).st_size
        try:
            write_all(fd, frame)
            self._sync(fd)
        except OSError as exc:
            self._undo_partial_write(fd, start, exc)
            raise JournalError(f"journal {self.path}: append failed: {exc}") from exc
        self.appended_since_rewrite += 1

    def rewrite(self, entries: Iterable[dict[str, Any]]) -> None:
        """Atomically replace the journal's contents with `entries` (compaction).

        Steps: encode every entry (so a bad entry fails before touching disk), write them to a
        temporary file next to the journal, fsync it, rename it over the journal, fsync the directory,
        then switch appends to the new file.  If anything fails before the rename the old journal is
        untouched and stays open for appends.  A successful rewrite also clears the refusal state left
        by an append whose partial frame could not be removed.
        """
        old_fd = self._require_open(for_rewrite=True)
        frames = [_encode_frame(entry, self.path) for entry in entries]
        temp = self._temp_path()
        temp_fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(temp_fd, MAGIC + b"".join(frames))
            os.fsync(temp_fd)
        except BaseException:
            os.close(temp_fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(temp_fd)
        try:
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        # Switch to the new file before anything else can fail, so appends never go to the unlinked one.
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        os.close(old_fd)
        self._broken_reason = None
        self.appended_since_rewrite = 0
        fsync_directory(self.path.parent)

    def close(self) -> None:
        """Close the file; further use raises JournalError.  Closing twice is harmless."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    # -- internals -----------------------------------------------------------------------------------

    def _require_open(self, *, for_rewrite: bool = False) -> int:
        # A rewrite replaces the whole file from the owner's state, which also discards a partial frame
        # that a failed append could not remove, so only appends and replays refuse a broken journal.
        if self._broken_reason is not None and not for_rewrite:
            raise JournalError(f"journal {self.path} refuses writes: {self._broken_reason}")
        if self._fd is None:
            raise JournalError(f"journal {self.path} is closed")
        return self._fd

    def _sync(self, fd: int, *, force: bool = False) -> None:
        if self.fsync or force:
            os.fsync(fd)

    def _undo_partial_write(self, fd: int, start: int, cause: OSError) -> None:
        try:
            os.ftruncate(fd, start)
        except OSError as truncate_error:
            self._broken_reason = (
                f"append failed ({cause}) and the partial entry could not be removed ({truncate_error}); "
                "restart to let recovery truncate it"
            )

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
