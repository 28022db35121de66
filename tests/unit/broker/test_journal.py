"""Tests of the append-only state journal: round trips, crash recovery, corruption, compaction."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from sparkafka.broker import journal as journal_module
from sparkafka.broker.journal import MAGIC, Journal, JournalCorruptError, JournalError


def _entries(count: int) -> list[dict[str, object]]:
    return [{"type": "test", "index": index, "text": f"entry-{index}"} for index in range(count)]


def _write(path: Path, entries: list[dict[str, object]], *, fsync: bool = False) -> None:
    with Journal(path, fsync=fsync) as journal:
        for entry in entries:
            journal.append(entry)


def _replay(path: Path) -> list[dict[str, object]]:
    with Journal(path) as journal:
        return list(journal.replay())


def test_entries_round_trip_across_reopen_in_append_order(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(3), fsync=True)
    with Journal(path) as journal:
        assert list(journal.replay()) == _entries(3)
        assert journal.appended_since_rewrite == 3
        journal.append({"type": "test", "index": 3, "text": "entry-3"})
    assert _replay(path) == _entries(4)


def test_new_journal_is_created_with_header_and_no_entries(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "state.journal"
    assert _replay(path) == []
    assert path.read_bytes() == MAGIC


def test_torn_tail_is_truncated_with_a_warning_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(3))
    intact_size = path.stat().st_size
    _write(path, [{"type": "test", "index": 99, "text": "x" * 100}])
    # Simulate a crash in the middle of writing the last entry.
    with path.open("r+b") as handle:
        handle.truncate(intact_size + 30)

    with caplog.at_level(logging.WARNING, logger="sparkafka.broker.journal"):
        journal = Journal(path)
    try:
        assert list(journal.replay()) == _entries(3)
        assert path.stat().st_size == intact_size
        assert any(
            str(path) in record.getMessage() and "30 bytes" in record.getMessage()
            for record in caplog.records
        )
        # New entries follow the last intact one.
        journal.append({"type": "test", "index": 3, "text": "entry-3"})
    finally:
        journal.close()
    assert _replay(path) == _entries(4)


def test_torn_frame_header_and_zero_filled_tail_are_treated_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(2))
    intact_size = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(b"\x00" * 64)  # e.g. a file extended by the filesystem but never written
    assert _replay(path) == _entries(2)
    assert path.stat().st_size == intact_size

    with path.open("ab") as handle:
        handle.write(b"\x00\x00\x01")  # only part of a frame header
    assert _replay(path) == _entries(2)
    assert path.stat().st_size == intact_size


def test_torn_journal_header_is_recovered_as_an_empty_journal(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    path.write_bytes(MAGIC[:3])
    assert _replay(path) == []
    assert path.read_bytes() == MAGIC


def test_corruption_in_the_middle_raises_naming_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(3))
    data = bytearray(path.read_bytes())
    first_payload = len(MAGIC) + 8
    data[first_payload + 5] ^= 0xFF
    path.write_bytes(bytes(data))

    with pytest.raises(JournalCorruptError) as caught:
        Journal(path)
    assert caught.value.path == path
    assert caught.value.position == len(MAGIC)
    assert str(path) in str(caught.value)
    assert "middle" in str(caught.value)
    # Nothing was truncated: the later entries are still on disk for inspection.
    assert path.read_bytes() == bytes(data)


def test_corrupted_length_field_in_the_middle_is_not_mistaken_for_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(3))
    data = bytearray(path.read_bytes())
    data[len(MAGIC)] = 0x7F  # first frame now claims to run far past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError):
        Journal(path)
    assert path.read_bytes() == bytes(data)


def test_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    path.write_bytes(b"this is somebody else's file")
    with pytest.raises(JournalCorruptError, match="not a sparkafka journal"):
        Journal(path)
    assert path.read_bytes() == b"this is somebody else's file"


def test_rewrite_replaces_contents_and_resets_counter(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(5))
    with Journal(path) as journal:
        journal.rewrite([{"type": "snapshot", "latest": 4}])
        assert journal.appended_since_rewrite == 0
        assert list(journal.replay()) == [{"type": "snapshot", "latest": 4}]
        journal.append({"type": "test", "index": 5})
        assert journal.appended_since_rewrite == 1
    assert _replay(path) == [{"type": "snapshot", "latest": 4}, {"type": "test", "index": 5}]
    assert not (tmp_path / "state.journal.rewrite-tmp").exists()


def test_failed_rewrite_leaves_the_old_journal_intact_and_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(3))
    before = path.read_bytes()

    def failing_replace(source: object, target: object) -> None:
        raise OSError(errno.EIO, "simulated crash before rename")

    with Journal(path) as journal:
        monkeypatch.setattr(journal_module.os, "replace", failing_replace)
        with pytest.raises(OSError, match="simulated crash"):
            journal.rewrite([{"type": "snapshot"}])
        monkeypatch.undo()
        assert path.read_bytes() == before
        assert not (tmp_path / "state.journal.rewrite-tmp").exists()
        journal.append({"type": "test", "index": 3, "text": "entry-3"})
    assert _replay(path) == _entries(4)


def test_leftover_temp_file_from_a_crashed_rewrite_is_discarded(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(2))
    temp = tmp_path / "state.journal.rewrite-tmp"
    temp.write_bytes(MAGIC + b"half a snapshot")
    assert _replay(path) == _entries(2)
    assert not temp.exists()


def test_bad_entries_are_rejected_without_writing_anything(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    with Journal(path) as journal:
        with pytest.raises(JournalError, match="not JSON-serialisable"):
            journal.append({"type": "bad", "value": object()})
        with pytest.raises(JournalError, match="not JSON-serialisable"):
            journal.append({"type": "bad", "value": float("nan")})
        with pytest.raises(JournalError, match="must be dicts"):
            journal.append(["not", "a", "dict"])  # type: ignore[arg-type]
        with pytest.raises(JournalError, match="not JSON-serialisable"):
            journal.rewrite([{"fine": 1}, {"bad": {1, 2}}])
        assert journal.appended_since_rewrite == 0
    assert path.read_bytes() == MAGIC


def test_failed_append_removes_its_partial_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.journal"
    _write(path, _entries(2))
    real_write = os.write

    def half_write_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with Journal(path) as journal:
        monkeypatch.setattr(journal_module.os, "write", half_write_then_fail)
        with pytest.raises(JournalError, match="No space left"):
            journal.append({"type": "test", "index": 2, "text": "entry-2"})
        monkeypatch.undo()
        assert list(journal.replay()) == _entries(2)
        journal.append({"type": "test", "index": 2, "text": "entry-2"})
    assert _replay(path) == _entries(3)


def test_closed_journal_refuses_use(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state.journal")
    journal.close()
    journal.close()  # idempotent
    assert journal.closed
    with pytest.raises(JournalError, match="closed"):
        journal.append({"type": "late"})
    with pytest.raises(JournalError, match="closed"):
        journal.replay()


def test_a_closed_journal_refuses_appends_naming_itself(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    journal = Journal(path)
    journal.append({"type": "test", "index": 0})
    journal.close()
    with pytest.raises(JournalError, match=f"^journal {path} is closed$"):
        journal.append({"type": "test", "index": 1})
    assert _replay(path) == [{"type": "test", "index": 0}]
