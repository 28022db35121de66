"""Exactly-once on a Spark standalone cluster (a master and two one-core workers on loopback
addresses of their own): an executor that dies with a batch half committed, a replay with fewer
executors, and speculative task copies."""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.connector.sink.transactional_ids import default_transactional_id_prefix
from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import APACHE_KAFKA, EMBEDDED, Kafka
from tests.integration.kafka_clients import (
    assert_exactly_once,
    committed_ids,
    committed_markers,
    create_topic,
    producer,
    read_all,
    wait_for_committed,
)
from tests.integration.spark_cluster import StandaloneCluster

PARTITIONS = 4
RECORDS = 2000
SHUFFLED = "SELECT /*+ REPARTITION(key) */ key, value FROM input"


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path / "cluster", workers=2) as running:
        yield running


@pytest.fixture
def topics(fresh_kafka: Kafka) -> set[str]:
    """Input topic ``in`` with RECORDS records over PARTITIONS partitions, empty ``out``, on a Kafka of
    the test's own (the embedded broker, then Apache Kafka); the ids."""
    bootstrap = fresh_kafka.bootstrap_servers
    create_topic(bootstrap, "in", partitions=PARTITIONS)
    create_topic(bootstrap, "out", partitions=PARTITIONS)
    sender = producer(bootstrap)
    for i in range(RECORDS):
        sender.produce("in", key=f"k{i % 53}", value=f"r{i:05d}|{'v' * 200}", partition=i % PARTITIONS)
    assert sender.flush(60) == 0
    return {f"r{i:05d}" for i in range(RECORDS)}


def _pipeline(
    broker: Kafka,
    standalone: StandaloneCluster,
    tmp_path: Path,
    executors: int,
    *conf: str,
    sink_options: tuple[str, ...] = (),
) -> PipelineProcess:
    settings = (
        "spark.executor.cores=1",
        f"spark.cores.max={executors}",
        "spark.executor.memory=1g",
        *StandaloneCluster.executor_settings(),
        *conf,
    )
    submit = " ".join(f"--conf {shlex.quote(setting)}" for setting in settings)
    args = run_arguments(
        broker.bootstrap_servers,
        "in",
        "out",
        tmp_path / "checkpoint",
        sql=SHUFFLED,
        trigger="500ms",
        master=standalone.master_url,
        sink_options=sink_options,
    )
    env = {
        **StandaloneCluster.environment(),
        "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell",
        "SPARKAFKA_SHUFFLE_PARTITIONS": str(PARTITIONS),
    }
    return PipelineProcess(tmp_path / "pipeline.log", args, env=env)


def _everything(broker: Kafka) -> list[bytes]:
    found = read_all(broker.bootstrap_servers, "out", isolation="read_uncommitted", partitions=PARTITIONS)
    return [m.value() or b"" for m in found]


def test_executor_and_driver_killed_mid_batch_then_one_executor_replays_exactly_once(
    fresh_kafka: Kafka, topics: set[str], standalone: StandaloneCluster, tmp_path: Path
) -> None:
    """Two executors of one core, one per worker; write partitions 1 and 3 of batch 0 hold their
    transactions open while 0 and 2 commit; one executor and the driver are SIGKILLed; the replay
    runs on a single executor, with the 4 write partitions the checkpoint pins, and writes exactly
    what is missing."""
    broker, ids = fresh_kafka, topics
    held = (
        "debug.pauseAt=beforeCommit",
        "debug.pausePartitions=1,3",
        "debug.pauseMs=600s",
        "kafka.transaction.timeout.ms=600000",
    )
    first = _pipeline(broker, standalone, tmp_path, 2, sink_options=held).start()
    try:
        standalone.wait_for_executors(2)
        # Held partitions flush their rows before pausing: every record is in the log, 0 and 2 committed.
        assert wait_until(lambda: len(_everything(broker)) == RECORDS, timeout_s=180), first.output()[-3000:]
        assert wait_until(lambda: len(committed_markers(broker.bootstrap_servers, 0)) == 2, timeout_s=60)
        os.kill(standalone.executor_pids()[0], signal.SIGKILL)
    finally:
        first.kill_group()
    prefix = default_transactional_id_prefix(_query_id(tmp_path))
    assert sorted(committed_markers(broker.bootstrap_servers, 0)) == [f"{prefix}-0", f"{prefix}-2"]

    replay = _pipeline(broker, standalone, tmp_path, 1).start()
    try:
        output = committed_ids(
            broker.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=replay.terminate
        )
    finally:
        replay.terminate()
    assert_exactly_once(output, ids)


@pytest.mark.parametrize("fresh_kafka", [EMBEDDED, APACHE_KAFKA], indirect=True)
def test_an_executor_killed_mid_batch_is_relaunched_and_the_query_carries_on_exactly_once(
    fresh_kafka: Kafka, topics: set[str], standalone: StandaloneCluster, tmp_path: Path
) -> None:
    """Write partition 1 of batch 0 holds its transaction open for 15 s; the executor running it is
    SIGKILLed. The driver lives on: the worker launches a new executor, Spark runs the lost tasks
    again, and the query writes every record once without a restart."""
    broker, ids = fresh_kafka, topics
    held = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=15s")
    run = _pipeline(broker, standalone, tmp_path, 2, sink_options=held).start()
    pause = "sparkafka debug pause: beforeCommit partition=1 batch=0"
    try:
        first_executors = set(standalone.wait_for_executors(2))
        assert wait_until(lambda: standalone.executor_pid_that_printed(pause) is not None, timeout_s=180), (
            run.output()[-3000:]
        )
        victim = standalone.executor_pid_that_printed(pause)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: bool(set(standalone.executor_pids()) - first_executors), timeout_s=120), (
            "the worker launched no new executor"
        )
        wait_for_committed(broker.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
        assert run.process is not None and run.process.poll() is None, run.output()[-3000:]
        output = committed_ids(
            broker.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=run.terminate
        )
    finally:
        run.terminate()
    assert_exactly_once(output, ids)
    assert standalone.executor_stderr().count(pause) >= 2, "the lost write task did not run again"
    assert "restarting from checkpoint" not in run.output()


def test_speculative_copies_of_a_slow_write_task_write_it_once(
    fresh_kafka: Kafka, topics: set[str], standalone: StandaloneCluster, tmp_path: Path
) -> None:
    """spark.speculation on: write partition 1 is slow (held 30 s before its commit), so Spark starts a
    copy of it on the other executor. Both attempts use transactional id ...-1; the later one's
    initialisation fences the earlier, which can no longer commit; the output is written once.

    The copy can only start once the other one-core executor has run write partitions 0, 2 and 3,
    and must then write its rows before it reaches the pause: on a loaded machine that takes more
    than 12 s, the original committed first and the copy was killed before it could be counted.

    Spark's efficiency rule (on by default) waits until a task has run twice the speculation
    threshold before copying it when its progress rate is unknown, and the threshold follows the
    median duration of the finished tasks, which is seconds on a cold first batch: with the rule on,
    the copy could start so late that the original commits first and the copy is killed before it
    prints its pause. The rule is off so the copy starts one threshold after the slow task did."""
    broker, ids = fresh_kafka, topics
    speculation = (
        "spark.speculation=true",
        "spark.speculation.interval=100ms",
        "spark.speculation.quantile=0.5",
        "spark.speculation.multiplier=1.1",
        "spark.speculation.minTaskRuntime=1s",
        "spark.speculation.efficiency.enabled=false",
    )
    slow = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=30s")
    run = _pipeline(broker, standalone, tmp_path, 2, *speculation, sink_options=slow).start()
    try:
        output = committed_ids(
            broker.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=run.terminate
        )
    finally:
        run.terminate()
    assert_exactly_once(output, ids)
    attempts = standalone.executor_stderr().count("sparkafka debug pause: beforeCommit partition=1 batch=0")
    assert attempts >= 2, "no speculative copy of the slow task ran"


def _query_id(tmp_path: Path) -> str:
    return str(json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"])
