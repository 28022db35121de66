"""A Python worker SIGKILLed alone, while its write task holds a transaction open: the driver and the
JVM live on, Spark retries the task in a new worker, and the output is exactly-once. (A whole
executor killed alone is in test_sink_on_cluster.py; the whole process group in
test_sink_exactly_once.py.) Real broker process, `sparkafka run` with a local master that retries
failed tasks (local[2,4])."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import EMBEDDED, Kafka
from tests.integration.kafka_clients import (
    assert_exactly_once,
    committed_ids,
    create_topic,
    producer,
    wait_for_committed,
)

RECORDS = 400
PAUSE = "sparkafka debug pause: beforeCommit partition=0 batch=0"


def _parent(pid: int) -> int | None:
    """The parent of ``pid``, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> set[int]:
    parents = {int(e.name): _parent(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def python_workers(root: int) -> list[int]:
    """The Python workers below ``root``: the processes Spark's worker daemon forked (same command
    line as the daemon, which is their parent), not the daemon itself. The daemon puts itself in a
    process group of its own, so they are found by descent, not by group."""
    below = _descendants(root)
    daemons = {pid for pid in below if "worker_daemon" in _command(pid)}
    return sorted(pid for pid in daemons if _parent(pid) in daemons)


@pytest.mark.parametrize("fresh_kafka", [EMBEDDED], indirect=True)
def test_a_python_worker_killed_alone_mid_transaction_is_retried_exactly_once(
    fresh_kafka: Kafka, tmp_path: Path
) -> None:
    bootstrap = fresh_kafka.bootstrap_servers
    create_topic(bootstrap, "in", partitions=2)
    create_topic(bootstrap, "out", partitions=2)
    sender = producer(bootstrap)
    ids = {f"r{i:04d}" for i in range(RECORDS)}
    for i, record_id in enumerate(sorted(ids)):
        sender.produce("in", key=f"k{i % 7}", value=record_id, partition=i % 2)
    assert sender.flush(30) == 0
    held = (
        "debug.pauseAt=beforeCommit",
        "debug.pausePartitions=0",
        "debug.pauseMs=8s",
        "kafka.transaction.timeout.ms=600000",  # the broker must not abort it meanwhile
    )
    arguments = run_arguments(
        bootstrap,
        "in",
        "out",
        tmp_path / "checkpoint",
        sql="SELECT key, value FROM input",
        trigger="500ms",
        master="local[2,4]",
        sink_options=held,
    )
    run = PipelineProcess(tmp_path / "pipeline.log", arguments).start()
    try:
        run.wait_for(PAUSE, timeout_s=180)
        assert run.process is not None
        # Only the worker holding the transaction open: an idle worker killed too would be handed to
        # the retry by Spark's pool of reused workers, failing attempts that never ran.
        paused = re.search(re.escape(PAUSE) + r".*\(pid (\d+)\)", run.output())
        assert paused is not None, "the paused worker did not say its pid"
        worker = int(paused.group(1))
        assert worker in python_workers(run.process.pid), "the paused task is not a worker below the pipeline"
        os.kill(worker, signal.SIGKILL)
        wait_for_committed(bootstrap, "out", expect=RECORDS, partitions=2)
        assert run.process.poll() is None, "the pipeline itself must live on: only workers were killed"
        output = committed_ids(bootstrap, "out", expect=RECORDS, partitions=2, stop=run.terminate)
    finally:
        run.terminate()
    assert_exactly_once(output, ids)
    assert run.output().count(PAUSE) >= 2, "the killed write task did not run again"
