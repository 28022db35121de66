"""sparkafka's own sessions (sparkafka.session): Python workers start through sparkafka.worker_daemon,
so PySpark runs in them from its installed, compiled files instead of from pyspark.zip; on a machine
of at most two cores a local driver JVM uses the serial collector unless one is chosen already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from sparkafka.session import JAVA_OPTIONS_VARIABLES, SERIAL_GC_MAX_CORES, machine_cores

SESSION_REPORT = """
import json, sys
from pyspark.sql.functions import udf
from sparkafka.session import spark_session

spark = spark_session("sparkafka-session-test", master="local[1]", conf=json.loads(sys.argv[1]))

@udf("string")
def worker_pyspark(_):
    import pyspark
    return pyspark.__file__

management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
collectors = [bean.getName() for bean in management.getGarbageCollectorMXBeans()]
report = {"worker_pyspark": spark.range(1).select(worker_pyspark("id")).first()[0], "collectors": collectors}
print("REPORT " + json.dumps(report), flush=True)
spark.stop()
"""


def _session_report(conf: dict[str, str], java_options: str | None) -> tuple[str, set[str]]:
    """(the file PySpark was imported from in a Python worker, the driver JVM's collectors)"""
    env = {name: value for name, value in os.environ.items() if name not in JAVA_OPTIONS_VARIABLES}
    if java_options is not None:
        env["JDK_JAVA_OPTIONS"] = java_options
    done = subprocess.run(
        [sys.executable, "-c", SESSION_REPORT, json.dumps(conf)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    report = json.loads(reports[0].removeprefix("REPORT "))
    return str(report["worker_pyspark"]), set(report["collectors"])


def test_sparkafka_sessions_workers_and_collector() -> None:
    installed = Path(pyspark.__file__).resolve().parent
    bundled = (installed / "python" / "lib" / "pyspark.zip").exists()

    worker_file, collectors = _session_report({}, java_options=None)
    if bundled:
        assert ".zip" not in worker_file and Path(worker_file).resolve().parent == installed
    serial = {"Copy", "MarkSweepCompact"}
    if machine_cores() <= SERIAL_GC_MAX_CORES:
        assert collectors == serial
    else:
        assert not serial & collectors

    # Spark's own daemon and a collector the user chose: both are left as they are.
    worker_file, collectors = _session_report(
        {"spark.python.daemon.module": "pyspark.daemon"}, java_options="-XX:+UseParallelGC"
    )
    if bundled:
        assert "pyspark.zip" in worker_file
    assert collectors == {"PS Scavenge", "PS MarkSweep"}
    if not bundled:
        pytest.skip("this PySpark ships no pyspark.zip: the worker daemon had nothing to leave out")
