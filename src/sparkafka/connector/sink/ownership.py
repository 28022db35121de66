"""Which Python worker of this machine initialised a transactional id last, and at which micro-batch
the id was first written in a query run on this machine.

Spark runs a task in any idle Python worker of its executor, so one transactional id moves between
workers: whoever initialises it fences the others' cached producers. Each initialisation is
recorded in a small file per id, shared by the workers of one machine; a worker reuses its cached
producer only while the file still names it, and otherwise initialises the id again (which also
makes the locally tracked commit marker stale, so it is read again). An id moving to another
machine (a rescheduled task) is caught by the broker: the stale producer is fenced, its task
fails, and Spark's retry initialises the id afresh.

A second small file per id records the query run an id was last read in (step 3) on this machine and
the micro-batch of that run's first read here, so that a worker taking the id over later in the same
run knows the run's first batch is behind it: only a run's first batch can be a replay, and the
checks that belong to it (a task's 4b and 4c, the driver's check after the tasks) run at that batch,
not again at every batch whose task landed in another worker. Invariant: a recorded batch belongs to
the run it names and is at most any later batch of that run, so it never names a later batch than
the run's first write of the id on this machine."""

from __future__ import annotations

import contextlib
import hashlib
import json
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


def _run_file(transactional_id: str) -> Path:
    return _ownership_file(transactional_id).with_suffix(".run")


def record_first_batch_of_run(
    transactional_id: str, query_id: str, run_id: str, application_id: str, batch_id: int
) -> None:
    """Record that ``transactional_id``'s first write of query ``query_id``'s run ``run_id`` in Spark
    application ``application_id`` on this machine, as far as this worker knows, was at ``batch_id``
    (after its step-3 read there)."""
    if first_batch_of_run(transactional_id, query_id, run_id, application_id) == batch_id:
        return
    target = _run_file(transactional_id)
    temporary = target.with_suffix(f".run.{os.getpid()}.tmp")
    recorded = {
        "query_id": query_id,
        "run_id": run_id,
        "application_id": application_id,
        "first_batch": batch_id,
    }
    temporary.write_text(json.dumps(recorded))
    os.replace(temporary, target)


def first_batch_of_run(transactional_id: str, query_id: str, run_id: str, application_id: str) -> int | None:
    """The batch :func:`record_first_batch_of_run` recorded for this id, query, run and application
    on this machine; None where nothing is recorded for them (another run's or application's record,
    or none, or a file that is not one: the caller then takes its own batch for the run's first, as
    without a record). The application is part of the key so that a run id read wrongly (a query
    name or a job description of the user's that carries a ``runId = ...`` line of its own) can at
    worst match within one application, never a record a previous application left on the machine."""
    with contextlib.suppress(OSError, ValueError, TypeError, LookupError):
        recorded = json.loads(_run_file(transactional_id).read_text())
        first = recorded["first_batch"]
        same_run = (recorded["query_id"], recorded["run_id"], recorded["application_id"]) == (
            query_id,
            run_id,
            application_id,
        )
        # JSON's true is a Python int too: a damaged record must not read as batch 1.
        if same_run and isinstance(first, int) and not isinstance(first, bool):
            return first
    return None
