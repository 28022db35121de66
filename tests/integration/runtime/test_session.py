"""sparkafka's own sessions (sparkafka.runtime.session): every Python process Spark starts (executor workers,
the driver-side data source daemons, a query's streaming source runner) runs PySpark from its
installed, compiled files instead of from pyspark.zip; on a machine of at most two cores a local
driver JVM uses the serial collector unless one is chosen already; SPARKAFKA_DRIVER_JIT=quick reaches
the driver JVM's command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyspark
import pytest

from sparkafka.runtime.session import JAVA_OPTIONS_VARIABLES, JIT_ENV, SERIAL_GC_MAX_CORES, machine_cores
from tests.integration.spark_session import run_reporting_script

SESSION_REPORT = """
import json, sys, tempfile
from pathlib import Path
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.functions import udf
from sparkafka.runtime.session import spark_session

def pyspark_file():
    import pyspark
    return pyspark.__file__

class Probe(DataSource):
    # schema() runs in the driver-side daemon that creates data sources; the stream reader's methods
    # in the streaming source runner Spark starts for the query.
    @classmethod
    def name(cls):
        return "probe"

    def schema(self):
        Path(self.options["dir"], "planner").write_text(pyspark_file())
        return "x int"

    def streamReader(self, schema):
        return ProbeStream(self.options["dir"])

class ProbeStream(DataSourceStreamReader):
    def __init__(self, directory):
        self.directory = directory

    def initialOffset(self):
        Path(self.directory, "stream_runner").write_text(pyspark_file())
        return {"n": 0}

    def latestOffset(self, start, limit):
        return {"n": 1}

    def partitions(self, start, end):
        return [InputPartition(0)]

    def read(self, partition):
        return iter([(1,)])

spark = spark_session("sparkafka-session-test", master="local[1]", conf=json.loads(sys.argv[1]))
spark.dataSource.register(Probe)
def frozen_objects():
    import gc
    return gc.get_freeze_count()

report = {"worker": spark.range(1).select(udf(pyspark_file, "string")()).first()[0]}
report["worker_frozen_objects"] = spark.range(1).select(udf(frozen_objects, "int")()).first()[0]
with tempfile.TemporaryDirectory() as directory:
    query = spark.readStream.format("probe").option("dir", directory).load().writeStream.format("noop")
    query.option("checkpointLocation", directory + "/checkpoint").trigger(availableNow=True).start()
    spark.streams.awaitAnyTermination()
    for process in ("planner", "stream_runner"):
        report[process] = Path(directory, process).read_text()
management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
report["collectors"] = [bean.getName() for bean in management.getGarbageCollectorMXBeans()]
arguments = management.getRuntimeMXBean().getInputArguments()
report["compiler_flags"] = [str(flag) for flag in arguments if "Tiered" in str(flag)]
print("REPORT " + json.dumps(report), flush=True)
spark.stop()
"""


def _session_report(
    conf: dict[str, str], java_options: str | None, python: str | None = None, jit: str | None = None
) -> tuple[dict[str, str], set[str], int, list[str]]:
    """({Python process: the file PySpark was imported from there}, the driver JVM's collectors,
    the objects an executor worker holds in the garbage collector's permanent generation, the
    compiler flags on the driver JVM's command line); ``jit``: SPARKAFKA_DRIVER_JIT, unset if None"""
    chosen = (*JAVA_OPTIONS_VARIABLES, "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", JIT_ENV)
    env = {name: value for name, value in os.environ.items() if name not in chosen}
    if jit is not None:
        env[JIT_ENV] = jit
    if java_options is not None:
        env["JDK_JAVA_OPTIONS"] = java_options
    if python is not None:
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = python
    report, _ = run_reporting_script(SESSION_REPORT, json.dumps(conf), env=env)
    collectors = set(report.pop("collectors"))
    frozen = int(report.pop("worker_frozen_objects"))
    return report, collectors, frozen, report.pop("compiler_flags")


def test_sparkafka_sessions_workers_and_collector() -> None:
    installed = Path(pyspark.__file__).resolve().parent
    bundled = (installed / "python" / "lib" / "pyspark.zip").exists()

    files, collectors, frozen, compiler = _session_report({}, java_options=None, jit="quick")
    assert compiler == ["-XX:TieredStopAtLevel=1"]
    assert set(files) == {"worker", "planner", "stream_runner"}
    # The daemon froze PySpark's modules before forking: a reused worker's gc.collect() after each
    # task skips them (sparkafka.runtime.worker_daemon).
    assert frozen > 10_000
    if bundled:
        for process, file in files.items():
            assert Path(file).resolve().parent == installed, f"{process} imported PySpark from {file}"
    serial = {"Copy", "MarkSweepCompact"}
    if machine_cores() <= SERIAL_GC_MAX_CORES:
        assert collectors == serial
    else:
        assert not serial & collectors

    # Spark's own daemon, the user's Python and collector: all are left as they are.
    files, collectors, frozen, compiler = _session_report(
        {"spark.python.daemon.module": "pyspark.daemon"},
        java_options="-XX:+UseParallelGC",
        python=sys.executable,
    )
    assert compiler == [], "no SPARKAFKA_DRIVER_JIT: the JVM's own tiered compilation"
    if bundled:
        for process, file in files.items():
            assert "pyspark.zip" in file, f"{process} imported PySpark from {file}"
    assert collectors == {"PS Scavenge", "PS MarkSweep"}
    assert frozen == 0
    if not bundled:
        pytest.skip("this PySpark ships no pyspark.zip: the worker daemon had nothing to leave out")
