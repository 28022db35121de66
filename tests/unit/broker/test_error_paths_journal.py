"""Error paths of sparkafka.broker.journal: entries it cannot store, files damaged in the middle or
written behind its back, checksummed frames that are not JSON, failed appends, and a closed journal."""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import crc32c
import pytest

from sparkafka.broker import journal as journal_module
from sparkafka.broker.journal import MAGIC, Journal, JournalCorruptError, JournalError


def frame(payload: bytes) -> bytes:
    """A frame as the journal writes one: length, CRC32C of the payload, payload."""
    return struct.pack(">II", len(payload), crc32c.crc32c(payload)) + payload


def test_an_entry_that_is_not_a_dict_is_refused_naming_its_type(tmp_path: Path) -> None:
    with Journal(tmp_path / "state.journal") as journal:
        with pytest.raises(JournalError, match=r"state\.journal: entries must be dicts, got list$"):
            journal.append([1, 2])  # type: ignore[arg-type]
        assert list(journal.replay()) == []


def test_a_damaged_frame_followed_by_a_valid_one_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    good = frame(b'{"n":1}')
    damaged = bytearray(frame(b'{"n":2}'))
    damaged[-2] ^= 0xFF
    path.write_bytes(MAGIC + good + bytes(damaged) + good)
    bad_at = len(MAGIC) + len(good)
    with pytest.raises(JournalCorruptError) as raised:
        Journal(path)
    assert raised.value.position == bad_at
    assert raised.value.reason == (
        f"invalid frame followed by a valid frame at byte {bad_at + len(damaged)} "
        "(damage in the middle of the file, not a torn tail from a crash)"
    )
    assert str(raised.value).startswith(f"journal {path} is corrupt at byte {bad_at}: invalid frame followed")
    assert path.read_bytes() == MAGIC + good + bytes(damaged) + good  # nothing cut


def test_a_checksummed_frame_that_is_not_json_fails_the_replay(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    path.write_bytes(MAGIC + frame(b'{"n":1}') + frame(b"{not json"))
    with (
        Journal(path) as journal,
        pytest.raises(
            JournalCorruptError, match="frame is not valid JSON: Expecting property name"
        ) as raised,
    ):
        journal.replay()
    assert raised.value.position == len(MAGIC) + len(frame(b'{"n":1}')) + 8


def test_bytes_another_writer_appended_to_an_open_journal_fail_the_replay(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    with Journal(path) as journal:
        journal.append({"n": 1})
        end = path.stat().st_size
        with path.open("ab") as other:
            other.write(b"\x00\x00\x00\x05junk")
        with pytest.raises(JournalCorruptError, match="invalid data at the end of an open journal") as raised:
            journal.replay()
    assert raised.value.position == end


def test_a_failed_append_names_the_journal_and_the_os_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.journal"

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with Journal(path) as journal:
        # The disk fills up: the OS refuses the write.
        monkeypatch.setattr(journal_module.os, "write", disk_full)
        with pytest.raises(
            JournalError,
            match=f"^journal {re.escape(str(path))}: append failed: \\[Errno 28\\] No space left on device$",
        ):
            journal.append({"n": 1})


def test_a_journal_whose_partial_frame_cannot_be_removed_refuses_writes_until_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.journal"
    real_write = os.write

    def half_write_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.EIO, "Input/output error")

    def truncate_fails(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with Journal(path) as journal:
        journal.append({"n": 1})
        with monkeypatch.context() as failing_disk:
            failing_disk.setattr(journal_module.os, "write", half_write_then_fail)
            failing_disk.setattr(journal_module.os, "ftruncate", truncate_fails)
            with pytest.raises(JournalError, match="append failed"):
                journal.append({"n": 2})
        refused = "refuses writes: append failed .* and the partial entry could not be removed"
        with pytest.raises(JournalError, match=refused):
            journal.append({"n": 3})
        with pytest.raises(JournalError, match=refused):
            journal.replay()
        journal.rewrite([{"n": 1}])
        journal.append({"n": 3})
        assert list(journal.replay()) == [{"n": 1}, {"n": 3}]


def test_a_closed_journal_says_it_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    journal = Journal(path)
    journal.close()
    with pytest.raises(JournalError, match=f"^journal {re.escape(str(path))} is closed$"):
        journal.append({"n": 1})
