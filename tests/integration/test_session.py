"""sparkafka's sessions start Python workers through sparkafka.worker_daemon: PySpark then runs in
the workers from its installed, compiled files instead of from pyspark.zip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

WORKER_REPORT = """
import json, sys
from pyspark.sql.functions import udf
from sparkafka.session import spark_session

spark = spark_session("sparkafka-worker-daemon-test", master="local[1]", conf=json.loads(sys.argv[1]))

@udf("string")
def worker_facts(_):
    import os, pyspark
    return json.dumps({"pyspark": pyspark.__file__, "pid": os.getpid()})

print("REPORT " + spark.range(1).select(worker_facts("id")).first()[0], flush=True)
spark.stop()
"""


def _worker_pyspark_file(conf: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WORKER_REPORT, json.dumps(conf)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(reports[0].removeprefix("REPORT "))["pyspark"]


def test_workers_import_the_installed_pyspark_not_the_bundled_zip() -> None:
    installed = Path(pyspark.__file__).resolve().parent
    if not (installed / "python" / "lib" / "pyspark.zip").exists():
        pytest.skip("this PySpark installation ships no pyspark.zip: nothing for the daemon to leave out")

    with_daemon = _worker_pyspark_file({})
    assert ".zip" not in with_daemon and Path(with_daemon).resolve().parent == installed

    # Spark's own daemon, for contrast: the same session imports PySpark from the bundled zip.
    plain = _worker_pyspark_file({"spark.python.daemon.module": "pyspark.daemon"})
    assert "pyspark.zip" in plain
