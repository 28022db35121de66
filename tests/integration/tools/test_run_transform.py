"""`sparkafka run --transform module:function` from the installed console script: the module is
found in the working directory, as `python -m` finds its module, by the driver and by the Python
workers that run its UDF; a name that cannot be imported fails before Spark starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from confluent_kafka import Message

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, producer, read_all, read_to_end, values

CONSOLE_SCRIPT = Path(sys.executable).with_name("sparkafka")

# The UDF is a module-level function: Spark's workers get it by reference, so they import the
# module themselves.
USER_MODULE = textwrap.dedent(
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType


    @F.udf(StringType())
    def shout(value):
        return value.upper() + "!"


    def transform(frame):
        return frame.select(shout(F.col("value").cast("string")).alias("value"))
    """
)


# UDFs made of plain functions of other modules: Spark's workers get those functions by reference
# (a decorated function is pickled whole), so each executor must import ``shouting``, a module
# beside the package, and ``user_pkg.jobs.text``, in a namespace subpackage (no __init__.py).
PACKAGE_MAIN = textwrap.dedent(
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    import shouting
    from user_pkg.jobs import text

    shout = F.udf(shouting.shout, StringType())
    bang = F.udf(text.bang, StringType())


    def transform(frame):
        return frame.select(bang(shout(F.col("value").cast("string"))).alias("value"))
    """
)


def _environment() -> dict[str, str]:
    # Nothing on PYTHONPATH: the working directory alone must make the module importable.
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _run_args(broker: BrokerProcess, workdir: Path, transform: str, master: str) -> list[str]:
    return [
        str(CONSOLE_SCRIPT),
        "run",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--source-topic",
        "words",
        "--sink-topic",
        "shouted",
        "--checkpoint",
        str(workdir / "checkpoint"),
        "--trigger",
        "500ms",
        "--master",
        master,
        "--source-option",
        "startingOffsets=earliest",
        "--transform",
        transform,
    ]


def _shout_words(broker: BrokerProcess, workdir: Path, log_path: Path, transform: str, master: str) -> None:
    """Run the pipeline over 20 words with ``transform`` from ``workdir`` until all are written
    shouted, then stop it with SIGTERM; it must exit 0."""
    assert CONSOLE_SCRIPT.exists(), "the sparkafka console script is installed beside this Python"
    create_topic(broker.bootstrap_servers, "words", partitions=2)
    create_topic(broker.bootstrap_servers, "shouted", partitions=2)
    sender = producer(broker.bootstrap_servers)
    words = [f"word{i}" for i in range(20)]
    for i, word in enumerate(words):
        sender.produce("words", value=word.encode(), partition=i % 2)
    assert sender.flush(30) == 0

    with open(log_path, "wb") as log:
        run = subprocess.Popen(
            _run_args(broker, workdir, transform, master),
            cwd=workdir,
            env=_environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    got: list[Message] = []
    deadline = time.monotonic() + 180
    try:
        # Stops early when the run exits: a run that cannot import the module ends at once.
        while len(got) < len(words) and run.poll() is None and time.monotonic() < deadline:
            got = read_all(broker.bootstrap_servers, "shouted", expect=len(words), timeout_s=5, partitions=2)
    finally:
        run.send_signal(signal.SIGTERM)  # to the driver alone: it stops the query and Spark itself
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    output = log_path.read_text(errors="replace")
    assert len(got) >= len(words), output
    # Everything the topic holds, not just the first len(words) records: a second copy would show.
    got = read_to_end(broker.bootstrap_servers, "shouted", partitions=2)
    assert sorted(values(got)) == sorted(f"{word.upper()}!".encode() for word in words), output
    assert run.returncode == 0, output


def test_a_transform_beside_the_user_runs_on_driver_and_workers(
    fresh_broker: BrokerProcess, tmp_path: Path
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "user_jobs.py").write_text(USER_MODULE)
    _shout_words(fresh_broker, workdir, tmp_path / "run.log", "user_jobs:transform", "local[2]")


def test_a_transform_package_reaches_executors_in_directories_of_their_own(
    fresh_broker: BrokerProcess, tmp_path: Path
) -> None:
    """With ``local-cluster`` Spark starts executors as separate processes in work directories of
    their own, as on a cluster: they find the user's package, and the module beside it that the
    transform imports, only because both are shipped to them."""
    workdir = tmp_path / "project"
    (workdir / "user_pkg" / "jobs").mkdir(parents=True)
    (workdir / "user_pkg" / "__init__.py").write_text("")
    (workdir / "user_pkg" / "jobs" / "text.py").write_text('def bang(value):\n    return value + "!"\n')
    (workdir / "user_pkg" / "jobs" / "main.py").write_text(PACKAGE_MAIN)
    (workdir / "shouting.py").write_text("def shout(value):\n    return value.upper()\n")
    log_path = tmp_path / "run.log"
    _shout_words(fresh_broker, workdir, log_path, "user_pkg.jobs.main:transform", "local-cluster[1,1,1024]")
    assert "shipped" in log_path.read_text(errors="replace")


def test_a_transform_that_cannot_be_imported_fails_before_spark_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            str(CONSOLE_SCRIPT),
            "run",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--source-topic",
            "words",
            "--sink-topic",
            "shouted",
            "--checkpoint",
            str(tmp_path / "checkpoint"),
            "--transform",
            "no_such_jobs_module:transform",
        ],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "cannot import module 'no_such_jobs_module'" in result.stderr
    assert "working directory" in result.stderr
    assert "SparkContext" not in result.stderr + result.stdout  # nothing of Spark ran
