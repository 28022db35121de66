"""One local SparkSession for the whole test session, shared by the tests that need Spark: tests
ask for the ``spark`` fixture (tests/integration/conftest.py). The session has the ``sparkafka``
format registered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import sparkafka
from sparkafka.runtime import class_archive
from sparkafka.runtime.python_exec import launcher_path

REPOSITORY = Path(__file__).resolve().parents[2]


def local_spark_session(
    app_name: str = "sparkafka-tests", *, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A small local[2] session: two cores, two shuffle partitions, quiet logs; ``conf``
    adds settings a session can only take at its start (``spark.jars``, say)."""
    # Workers must run this interpreter: it is the one with sparkafka and its dependencies installed;
    # through sparkafka-python where it is installed, as README's "Using the connector" advises (each
    # Python process Spark starts then imports the installed PySpark instead of compiling its zip).
    python = launcher_path() or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = python
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    # As sparkafka's own sessions: the driver JVM maps the class archive where one was built.
    if archive_options := class_archive.driver_options():
        builder = builder.config("spark.driver.extraJavaOptions", archive_options)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = (
        builder.master("local[2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        # On, as in sparkafka's own sessions: the exactly-once sink asks its monitoring API. Any
        # free port, since test processes run side by side.
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", "0")
        .config("spark.ui.showConsoleProgress", "false")
        # As README's "On your cluster" advises: workers import the installed PySpark.
        .config("spark.python.daemon.module", "sparkafka.runtime.worker_daemon")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        # As sparkafka's own sessions: the exactly-once df.write inside foreachBatch needs it.
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sparkafka.register(spark)
    return spark


def run_reporting_script(script: str, *args: str, env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """Run ``script`` in a fresh Python process (a SparkSession of its own); returns the JSON object it
    printed on its stdout line starting ``REPORT ``, and its stderr. Fails the test, showing the
    output, when the script fails or reports nothing."""
    # The script may import the tests' helpers (tests.integration.*) from the repository.
    path = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": path},
    )
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(reports[0].removeprefix("REPORT ")), done.stderr
