"""Which Python worker of this machine initialised a transactional id last.

Spark runs a task in any idle Python worker of its executor, so one transactional id moves between
workers: whoever initialises it fences the others' cached producers. Each initialisation is
recorded in a small file per id, shared by the workers of one machine; a worker reuses its cached
producer only while the file still names it, and otherwise initialises the id again (which also
makes the locally tracked commit marker stale, so it is read again). An id moving to another
machine (a rescheduled task) is caught by the broker: the stale producer is fenced, its task
fails, and Spark's retry initialises the id afresh."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

_WORKER_STARTED_NS = time.time_ns()


def _ownership_file(transactional_id: str) -> Path:
    directory = Path(tempfile.gettempdir()) / f"sparkafka-producers-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / hashlib.sha256(transactional_id.encode()).hexdigest()


def _worker_identity() -> str:
    # The pid alone could be reused by a later worker; the start time makes the identity unique.
    return f"{os.getpid()}:{_WORKER_STARTED_NS}"


def record_initialised_here(transactional_id: str) -> None:
    """Record that this worker initialised ``transactional_id`` (after its init_transactions)."""
    target = _ownership_file(transactional_id)
    temporary = target.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(_worker_identity())
    os.replace(temporary, target)


def initialised_here_last(transactional_id: str) -> bool:
    """Whether no other worker of this machine initialised ``transactional_id`` since this one did."""
    try:
        return _ownership_file(transactional_id).read_text() == _worker_identity()
    except FileNotFoundError:
        return False
