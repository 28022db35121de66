"""The per-machine record of a transactional id's first batch in a query run: what a worker taking
the id over later in the run finds, and what it must not take from another run or a damaged file."""

from __future__ import annotations

import subprocess
import sys
import uuid

from sparkafka.connector.sink.id_state import run_first_batch
from sparkafka.connector.sink.ownership import _run_file, first_batch_of_run, record_first_batch_of_run
from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY
from sparkafka.connector.sink.task import TaskIdentity

APP = "local-1765000000000"


def _identity(
    query_id: str, run_id: str | None, batch_id: int | None, application_id: str | None = APP
) -> TaskIdentity:
    return TaskIdentity(0, 1, query_id, batch_id, run_id, {APP_ID_PROPERTY: application_id})


def test_another_worker_of_the_machine_finds_the_runs_first_batch() -> None:
    transactional_id, query_id, run_id = f"t-{uuid.uuid4()}-0", str(uuid.uuid4()), str(uuid.uuid4())
    record_first_batch_of_run(transactional_id, query_id, run_id, APP, 7)
    # Another Python worker is another process: it reads the record from the machine's file.
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from sparkafka.connector.sink.ownership import first_batch_of_run; "
            "print(first_batch_of_run(*sys.argv[1:]))",
            transactional_id,
            query_id,
            run_id,
            APP,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == "7"
    assert run_first_batch(_identity(query_id, run_id, 12), transactional_id) == 7


def test_a_record_of_another_run_or_query_or_id_is_no_record() -> None:
    transactional_id, query_id, run_id = f"t-{uuid.uuid4()}-0", str(uuid.uuid4()), str(uuid.uuid4())
    record_first_batch_of_run(transactional_id, query_id, run_id, APP, 3)
    assert first_batch_of_run(transactional_id, query_id, str(uuid.uuid4()), APP) is None
    assert first_batch_of_run(transactional_id, str(uuid.uuid4()), run_id, APP) is None
    assert first_batch_of_run(f"{transactional_id}-other", query_id, run_id, APP) is None
    # A restart (a new run) takes its own batch, whatever the old run recorded.
    assert run_first_batch(_identity(query_id, str(uuid.uuid4()), 9), transactional_id) == 9
    # So does a new application whose run id reads the same (a description of the user's naming a run):
    # a record an earlier application left on the machine is never taken.
    assert run_first_batch(_identity(query_id, run_id, 9, "local-1765000000001"), transactional_id) == 9
    assert run_first_batch(_identity(query_id, run_id, 9, None), transactional_id) == 9


def test_the_tasks_own_batch_where_the_run_is_unknown_or_the_record_is_later() -> None:
    transactional_id, query_id, run_id = f"t-{uuid.uuid4()}-0", str(uuid.uuid4()), str(uuid.uuid4())
    record_first_batch_of_run(transactional_id, query_id, run_id, APP, 5)
    # A foreachBatch that set its own job description: no run, every write a first.
    assert run_first_batch(_identity(query_id, None, 8), transactional_id) == 8
    # A batch write has no batch.
    assert run_first_batch(_identity(query_id, run_id, None), transactional_id) is None
    # A record past the task's batch cannot be its run's first write (batches only grow in a run).
    assert run_first_batch(_identity(query_id, run_id, 4), transactional_id) == 4


def test_a_damaged_record_is_no_record_and_is_replaced() -> None:
    transactional_id, query_id, run_id = f"t-{uuid.uuid4()}-0", str(uuid.uuid4()), str(uuid.uuid4())
    keys = f'"query_id": "{query_id}", "run_id": "{run_id}", "application_id": "{APP}"'
    as_text, as_true = f'{{{keys}, "first_batch": "2"}}', f'{{{keys}, "first_batch": true}}'
    for damaged in ("", "not json", "[]", '{"query_id": 1}', as_text, as_true):
        _run_file(transactional_id).write_text(damaged)
        assert first_batch_of_run(transactional_id, query_id, run_id, APP) is None
        assert run_first_batch(_identity(query_id, run_id, 6), transactional_id) == 6
    record_first_batch_of_run(transactional_id, query_id, run_id, APP, 6)
    assert first_batch_of_run(transactional_id, query_id, run_id, APP) == 6
