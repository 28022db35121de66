"""`sparkafka run` with a mistake no restart can fix: a bad connector option fails before Spark
starts, a bad query fails with one line, neither is restarted (real broker, real Spark)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.pipeline_process import run_arguments

VALID_SQL = "SELECT value FROM input"


def _run(
    broker: BrokerProcess, tmp_path: Path, *extra: str, sql: str = VALID_SQL
) -> tuple[subprocess.CompletedProcess[str], float]:
    args = run_arguments(
        broker.bootstrap_servers,
        "in",
        "out",
        tmp_path / "checkpoint",
        sql=sql,
        extra=("--restart-attempts", "5", "--restart-delay", "10s", *extra),
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sparkafka", "run", *args], capture_output=True, text=True, timeout=300
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--source-option", "maxOffsetsPerTrigger=abc"), "option 'maxOffsetsPerTrigger' must be an integer"),
        (("--sink-option", "deliveryGuarantee=exactly_once"), "did you mean 'exactly-once'"),
        (("--sink-option", "kafka.transactional.id=x"), "transactionalIdPrefix"),
        (("--restart-failure-interval", "soon"), "option '--restart-failure-interval' must be a duration"),
        (("--spark-conf", "ui.enabled=false"), "--spark-conf ui.enabled: Spark ignores settings"),
        (("--spark-conf", "spark.ui.enabled"), "--spark-conf 'spark.ui.enabled' is not KEY=VALUE"),
    ],
)
def test_an_option_mistake_fails_before_spark_starts(
    broker: BrokerProcess, tmp_path: Path, option: tuple[str, str], message: str
) -> None:
    done, seconds = _run(broker, tmp_path, *option)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert seconds < 20  # no Spark session, no restarts


def test_a_query_spark_refuses_fails_with_one_line_and_no_restart(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    done, seconds = _run(broker, tmp_path, sql="SELECT no_such_column AS value FROM input")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sparkafka run: the pipeline's query could not start" in done.stderr
    assert "no_such_column" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "restarting from checkpoint" not in done.stderr
    assert seconds < 120  # a restart would wait 10 s each, five times
