"""Who a write task is: its write partition and stage, and the streaming query, run and micro-batch
Spark runs it for, read from the task's context."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from sparkafka.connector.sink.replay import ADAPTIVE_ENABLED, ADAPTIVE_STATELESS_STREAMING
from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY, STATUS_URL_SETTING
from sparkafka.errors import SparkafkaError


@dataclass(frozen=True)
class TaskIdentity:
    """Who a write task is, from Spark's TaskContext: its write partition and stage, the streaming
    query, run and micro-batch it belongs to (None outside a streaming query), and the Spark SQL
    settings its session set explicitly, which Spark hands to every task of the job."""

    partition: int
    stage_id: int
    query_id: str | None
    batch_id: int | None
    run_id: str | None
    properties: Mapping[str, str | None]


# Settings of the job a write task reads from its TaskContext.
_TASK_SETTINGS = (ADAPTIVE_ENABLED, ADAPTIVE_STATELESS_STREAMING, STATUS_URL_SETTING, APP_ID_PROPERTY)


def task_identity() -> TaskIdentity:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SparkafkaError("the sparkafka sink's write() must run inside a Spark task")
    batch = context.getLocalProperty("streaming.sql.batchId")
    return TaskIdentity(
        partition=context.partitionId(),
        stage_id=context.stageId(),
        query_id=context.getLocalProperty("sql.streaming.queryId"),
        batch_id=int(batch) if batch is not None else None,
        run_id=query_run_id(
            context.getLocalProperty("spark.job.description"), context.getLocalProperty("spark.jobGroup.id")
        ),
        properties={key: context.getLocalProperty(key) for key in _TASK_SETTINGS},
    )


_RUN_ID_IN_DESCRIPTION = re.compile(r"^runId = (\S+)$", re.MULTILINE)


def query_run_id(description: str | None, job_group: str | None) -> str | None:
    """The streaming query run a task belongs to. Spark describes every micro-batch's jobs with
    ``id = …``, ``runId = …``, ``batch = …`` lines, anew at each batch; it also names the run's job
    group after the run id, but once per run, so a ``foreachBatch`` function that sets a job group of
    its own replaces it for the rest of the run (and for later runs in the same application). A job
    group is taken for the run only when it is a UUID, as Spark's run ids are: a name of the user's
    would stand for every run at once, and the sink would take another run's commits for this one's."""
    found = _RUN_ID_IN_DESCRIPTION.search(description or "")
    if found:
        return found.group(1)
    return job_group if job_group is not None and _is_uuid(job_group) else None


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
