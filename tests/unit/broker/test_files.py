"""Durable file writes shared by the broker's stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkafka.broker import files


def test_write_file_atomically_replaces_the_file_and_syncs_file_then_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    files.write_file_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["state.json"]  # no .tmp left
    assert synced == [str(tmp_path / "state.json.tmp"), str(tmp_path)]


def test_write_all_writes_every_byte_even_when_os_write_is_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        files.write_all(fd, b"0123456789")
    finally:
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"0123456789"
