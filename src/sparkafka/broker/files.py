"""Durable file writes, shared by the broker's stores: partition logs and their indexes, the
coordinators' journals, ``topics.json`` and producer-state snapshots."""

from __future__ import annotations

import os
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (files created, renamed or removed) survive power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, so that a crash at any point leaves either the
    old file or the new one.

    Steps: write ``data`` to ``{path}.tmp`` next to it and fsync it; rename it over ``path``; fsync
    the directory, so the rename itself survives power loss. A ``.tmp`` file found later is what an
    interrupted write left and may be deleted."""
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)
