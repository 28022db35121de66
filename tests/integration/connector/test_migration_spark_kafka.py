"""A query checkpointed by Spark's own ``kafka`` format continues on ``sparkafka`` from the same
checkpoint, and back: no input record read twice or skipped, aggregation state kept, the first
exactly-once batch after the switch replayed correctly after a SIGKILL. Real broker process, real
Spark with Spark's Kafka connector (``migration_runner.py`` runs the queries)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import assert_exactly_once, create_topic, read_to_end
from tests.integration.spark_kafka_connector import spark_kafka_jars
from tests.integration.spark_session import REPOSITORY, run_reporting_script

RUNNER = Path(__file__).with_name("migration_runner.py")
# Spark's sink wrote micro-batch 0: sparkafka's exactly-once output starts at 1.
STARTS_AT_1 = {"exactlyOnceFromBatch": "1"}
INPUT, OUTPUT = "migration-in", "migration-out"


def _map(source: str, sink: str, **extra: Any) -> dict[str, Any]:
    return {"source": source, "sink": sink, "mode": "map", **extra}


def _ids(first: int, count: int) -> set[str]:
    return {f"r{i:04d}" for i in range(first, first + count)}


@pytest.fixture
def bootstrap(fresh_broker: BrokerProcess) -> str:
    """A broker of the test's own with the runner's input and output topics."""
    create_topic(fresh_broker.bootstrap_servers, INPUT, partitions=2)
    create_topic(fresh_broker.bootstrap_servers, OUTPUT, partitions=2)
    return fresh_broker.bootstrap_servers


def _environment() -> dict[str, str]:
    """The runner's: this Python for Spark's workers, and the repository on the path for the tests'
    helpers it imports."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPOSITORY),
    }


def _run(bootstrap: str, checkpoint: Path, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    jars = ",".join(str(path) for path in spark_kafka_jars())
    arguments = (jars, bootstrap, str(checkpoint), json.dumps(list(steps)))
    report, _ = run_reporting_script(RUNNER.read_text(), *arguments, env=_environment())
    return report["steps"]


def _output(bootstrap: str) -> Counter[str]:
    """The output's values, as read_committed consumers see them once every query of the runner has
    ended (its steps run to the end of their input), read to the partitions' ends."""
    return Counter((m.value() or b"").decode() for m in read_to_end(bootstrap, OUTPUT, partitions=2))


def test_a_map_query_moves_from_kafka_to_sparkafka_and_reads_on_from_its_offsets(
    bootstrap: str, tmp_path: Path
) -> None:
    """The first exactly-once run refuses until told where its exactly-once output starts: its
    marker topic holds nothing of the query, which it cannot tell from markers lost."""
    steps = _run(
        bootstrap,
        tmp_path / "checkpoint",
        _map("kafka", "kafka", produce=[0, 100]),
        _map("sparkafka", "sparkafka", produce=[100, 100]),
        _map("sparkafka", "sparkafka", sink_options=STARTS_AT_1),
    )
    refused = steps[1]["message"]
    assert "holds nothing of it" in refused and ".option('exactlyOnceFromBatch', '1')" in refused
    assert [step.get("input_rows") for step in steps] == [100, None, 100], steps
    assert_exactly_once(_output(bootstrap), _ids(0, 200))


def test_a_running_count_keeps_its_state_across_the_switch(bootstrap: str, tmp_path: Path) -> None:
    """Update mode, counts per key: Spark's sink writes the first counts, sparkafka (exactly-once
    through foreachBatch) the next ones from the same state store."""
    count = {"mode": "count"}
    steps = _run(
        bootstrap,
        tmp_path / "checkpoint",
        {"source": "kafka", "sink": "kafka", "produce": [0, 100], **count},
        {
            "source": "sparkafka",
            "sink": "sparkafka",
            "produce": [100, 100],
            "sink_options": STARTS_AT_1,
            **count,
        },
    )
    assert [step.get("input_rows") for step in steps] == [100, 100], steps
    expected = {f"k{k}:{n}" for k in range(5) for n in (20, 40)}
    assert _output(bootstrap) == Counter(expected), "each key counted on, not from zero"


def test_the_way_back_to_sparks_format_needs_the_checkpoint_rewritten(bootstrap: str, tmp_path: Path) -> None:
    """sparkafka -> kafka: Spark's source refuses sparkafka's own offset entries, naming them; after
    `sparkafka checkpoint to-spark-kafka` it reads on from the offsets, and sparkafka can take the
    checkpoint over again after that."""
    steps = _run(
        bootstrap,
        tmp_path / "checkpoint",
        _map("sparkafka", "sparkafka", produce=[0, 100]),
        _map("kafka", "kafka", produce=[100, 100]),
        _map("kafka", "kafka", rewrite=True),
        # Spark's sink wrote micro-batch 1: the markers stop short of the checkpoint, so sparkafka's
        # exactly-once output is declared to start again at 2 (at no cost: batch 2 is new).
        _map("sparkafka", "sparkafka", produce=[200, 100], sink_options={"exactlyOnceFromBatch": "2"}),
    )
    assert steps[0]["input_rows"] == 100
    refused = steps[1]["message"]
    assert "Expected e.g." in refused and "sparkafka:split" in refused
    assert steps[2]["rewrite"]["exit"] == 0, steps[2]["rewrite"]
    assert "removed entries: " in steps[2]["rewrite"]["output"]
    assert steps[2]["input_rows"] == 100, "Spark's source read on from the rewritten offsets"
    assert steps[3]["input_rows"] == 100
    assert_exactly_once(_output(bootstrap), _ids(0, 300))


def test_the_first_exactly_once_batch_after_the_switch_replays_after_a_sigkill(
    bootstrap: str, tmp_path: Path
) -> None:
    """Spark's connector wrote batch 0; sparkafka's batch 1 is held before its commit and the process
    SIGKILLed: no commit marker of the query exists yet. The restart writes batch 1 exactly once."""
    checkpoint = tmp_path / "checkpoint"
    _run(bootstrap, checkpoint, _map("kafka", "kafka", produce=[0, 100]))
    held = {
        **STARTS_AT_1,
        "debug.pauseAt": "beforeCommit",
        "debug.pauseMs": "600s",
        "debug.pauseFromBatch": "1",
        "kafka.transaction.timeout.ms": "600000",
    }
    log = tmp_path / "killed.log"
    jars = ",".join(str(path) for path in spark_kafka_jars())
    steps = json.dumps([_map("sparkafka", "sparkafka", produce=[100, 100], sink_options=held)])
    with log.open("w") as output:
        killed = subprocess.Popen(
            [sys.executable, "-c", RUNNER.read_text(), jars, bootstrap, str(checkpoint), steps],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=_environment(),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "sparkafka debug pause: beforeCommit" not in log.read_text():
            assert killed.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()

    steps_after = _run(bootstrap, checkpoint, _map("sparkafka", "sparkafka"))
    assert steps_after[0]["input_rows"] == 100
    assert_exactly_once(_output(bootstrap), _ids(0, 200))
