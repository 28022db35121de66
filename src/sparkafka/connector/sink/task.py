"""Who a write task is: its write partition and stage, and the streaming query, run and micro-batch
Spark runs it for, read from the task's context."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY, STATUS_URL_SETTING
from sparkafka.errors import SparkafkaError

# The Spark settings that let adaptive execution split a replayed batch otherwise than its first run
# (step 0 of the protocol, sink package docstring); a task reads them from its job.
ADAPTIVE_ENABLED = "spark.sql.adaptive.enabled"
ADAPTIVE_STATELESS_STREAMING = "spark.sql.adaptive.streaming.stateless.enabled"


@dataclass(frozen=True)
class TaskIdentity:
    """Who a write task is, from Spark's TaskContext: its write partition and stage, the streaming
    query, run and micro-batch it belongs to (None outside a streaming query), and the Spark SQL
    settings its session set explicitly, which Spark hands to every task of the job."""

    partition: int
    stage_id: int
    query_id: str | None
    batch_id: int | None
    # Spark's StreamingQuery.runId where the batch's job description names it, else None: a worker
    # reuses its producer only within one known run. The sink's protocol names runs otherwise (the
    # writer's own id, KafkaStreamWriter.run_id).
    spark_run_id: str | None
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
        spark_run_id=query_run_id(context.getLocalProperty("spark.job.description")),
        properties={key: context.getLocalProperty(key) for key in _TASK_SETTINGS},
    )


_RUN_ID_IN_DESCRIPTION = re.compile(r"^runId = (\S+)$", re.MULTILINE)


def query_run_id(description: str | None) -> str | None:
    """The streaming query run (StreamingQuery.runId) a task belongs to, where Spark's description
    of the batch's jobs (``id = …``, ``runId = …``, ``batch = …`` lines, set anew at each batch) is
    the task's. A foreachBatch function that sets a job group or description of its own replaces it
    for its writes: then no run is known. The job group is never taken for the run, though Spark
    names it after the run id: a group of the user's, even a UUID, would stand for every run."""
    found = _RUN_ID_IN_DESCRIPTION.search(description or "")
    return found.group(1) if found else None
