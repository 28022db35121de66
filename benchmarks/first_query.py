"""What a session's first exactly-once sparkafka query costs, with and without the zygote that forks
Spark's Python processes ready-made (:mod:`sparkafka.runtime.runner_zygote`).

Each run is a fresh Python process that creates a sparkafka session (``local[2]``, the class archive
mapped when built), runs one exactly-once ``availableNow`` query of 1,000 records from a topic of
the embedded broker to another, stops the session and waits for its driver JVM to exit. With the
zygote on, the process also stops the zygote and waits for it, so that the CPU of every process the
zygote forked (the driver-side daemons, the source runner, the executors' workers) is in the tree's
count. Measured per run: the time to the session, to the query's end, and the CPU of every process
of the run, counted by a cgroup where this user may make one (:class:`benchmarks.common.CpuCgroup`),
else by ``wait4`` (which misses the daemons that outlive the JVM). The broker is a process of its
own, started once and not counted. Runs alternate between the two modes so that the machine's load
falls on both alike.

    python -m benchmarks.first_query
    python -m benchmarks.first_query --repeats 5 --update-docs docs/benchmarks.md
    python -m benchmarks.first_query --from-results docs/benchmarks/first-query.json \
        --update-docs docs/benchmarks.md
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

if not __package__:  # run as `python benchmarks/first_query.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    REPO,
    ResultsSection,
    load_average,
    machine_line,
    results_main,
    run_reporting_child,
)
from confluent_kafka import Producer

from sparkafka.broker.runner import BrokerProcess
from sparkafka.runtime.python_exec import ZYGOTE_ENV

SECTION = ResultsSection(
    "first-query",
    REPO / "docs" / "benchmarks" / "first-query.json",
    "<!-- benchmark:first-query:start -->",
    "<!-- benchmark:first-query:end -->",
)
MODES = ("zygote off", "zygote on")
RECORDS = 1_000

CHILD = """
import json, os, sys, time
started = time.monotonic()
import psutil
from pyspark import SparkContext
from sparkafka.runtime.session import spark_session
bootstrap, source, sink, checkpoint = sys.argv[1:5]
spark = spark_session("sparkafka-first-query-benchmark", master="local[2]")
session_s = time.monotonic() - started
query = (
    spark.readStream.format("sparkafka").option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", source).option("startingOffsets", "earliest").load()
    .selectExpr("value").writeStream.format("sparkafka").option("kafka.bootstrap.servers", bootstrap)
    .option("topic", sink).option("deliveryGuarantee", "exactly-once")
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)
query.awaitTermination()
query_s = time.monotonic() - started
spark.stop()
gateway = SparkContext._gateway
gateway.shutdown()
gateway.proc.stdin.close()
gateway.proc.wait(120)
# The zygote ends with this process; stopped and waited for here, its children's CPU counts too.
# Its children end when the JVM closes their standard input, and it reaps them: wait for that first.
for child in psutil.Process().children():
    if "sparkafka.runtime.runner_zygote" in " ".join(child.cmdline()):
        deadline = time.monotonic() + 30
        while child.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        child.terminate()
        os.waitpid(child.pid, 0)
print("RESULT " + json.dumps({"session_s": session_s, "query_s": query_s}))
"""


@dataclasses.dataclass(frozen=True)
class FirstQueryRun:
    mode: str
    session_s: float
    query_s: float
    total_s: float
    cpu_s: float
    # "cgroup v1"/"cgroup v2": every process of the run; "wait4": the processes the run waited for,
    # which misses daemons that outlive the JVM (where no cgroup could be made).
    cpu_counted_by: str = "wait4"


@dataclasses.dataclass(frozen=True)
class FirstQuerySetup:
    machine: str
    records: int
    java_options: str


def run_once(mode: str, bootstrap: str, work_dir: Path) -> FirstQueryRun:
    environ = dict(os.environ)
    if mode == "zygote off":
        environ[ZYGOTE_ENV] = ""  # set (so no session starts one) and empty (so no launcher asks one)
    else:
        environ.pop(ZYGOTE_ENV, None)
    source, sink = f"first-query-in-{uuid.uuid4().hex[:8]}", f"first-query-out-{uuid.uuid4().hex[:8]}"
    _produce(bootstrap, source)
    checkpoint = work_dir / uuid.uuid4().hex
    command = [sys.executable, "-c", CHILD, bootstrap, source, sink, str(checkpoint)]
    child = run_reporting_child(command, environ, mode)
    return FirstQueryRun(
        mode=mode,
        session_s=child.reported["session_s"],
        query_s=child.reported["query_s"],
        total_s=child.total_s,
        cpu_s=child.cpu_s,
        cpu_counted_by=child.cpu_counted_by,
    )


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for number in range(RECORDS):
        producer.produce(topic, value=str(number).encode())
    if producer.flush(30):
        raise RuntimeError(f"producing {RECORDS} records to {topic} did not finish")


def measure(repeats: int) -> tuple[list[FirstQueryRun], FirstQuerySetup]:
    start_load = load_average()
    runs = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-first-query-") as directory:
        work_dir = Path(directory)
        with BrokerProcess(work_dir / "broker", extra_args=["--log-level", "WARNING"]) as broker:
            run_once(MODES[0], broker.bootstrap_servers, work_dir)  # warms the page cache for both
            for repetition in range(repeats):
                for mode in MODES if repetition % 2 == 0 else reversed(MODES):
                    run = run_once(mode, broker.bootstrap_servers, work_dir)
                    print(
                        f"{mode:>10}: session {run.session_s:5.1f} s, query done {run.query_s:5.1f} s, "
                        f"CPU {run.cpu_s:5.1f} s",
                        file=sys.stderr,
                    )
                    runs.append(run)
    setup = FirstQuerySetup(
        machine=machine_line(start_load),
        records=RECORDS,
        java_options=os.environ.get("JDK_JAVA_OPTIONS", ""),
    )
    return runs, setup


def render(runs: list[FirstQueryRun], setup: FirstQuerySetup) -> str:
    def median(mode: str, field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs if run.mode == mode)

    def cells(mode: str) -> str:
        return " | ".join(
            ", ".join(f"{getattr(run, field):.1f}" for run in runs if run.mode == mode)
            for field in ("session_s", "query_s", "cpu_s")
        )

    rows = [f"| {mode} | {cells(mode)} |" for mode in MODES]
    saved_cpu = median(MODES[0], "cpu_s") - median(MODES[1], "cpu_s")
    saved_time = median(MODES[0], "query_s") - median(MODES[1], "query_s")
    repeats = sum(run.mode == MODES[0] for run in runs)
    options = f" (`JDK_JAVA_OPTIONS={setup.java_options}`)" if setup.java_options else ""
    return "\n".join(
        [
            "## A session's first exactly-once query, and the zygote",
            "",
            "Measured with `python -m benchmarks.first_query` (see `benchmarks/first_query.py`): a fresh "
            "process creates a sparkafka session (`local[2]`), runs one exactly-once `availableNow` query "
            f"of {setup.records:,} records between two topics of the embedded broker, and stops; CPU is "
            f"that of every process of the run, counted by {_counted_by(runs)}, the zygote's children "
            "included, the broker's not. With the zygote "
            "off, every Python process Spark starts (the driver-side daemons, the source runner, the "
            "executors' worker daemon) imports PySpark, pyarrow and the connector itself. "
            f"{repeats} run(s) per mode, alternating{options}.",
            "",
            "| mode | session s, each run | query done s, each run | CPU s, each run |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"The zygote saves {saved_cpu:.1f} s of CPU and {saved_time:.1f} s to the query's end "
            f"(medians). {setup.machine}.",
        ]
    )


def _counted_by(runs: list[FirstQueryRun]) -> str:
    ways = sorted({run.cpu_counted_by for run in runs})
    if ways == ["wait4"]:
        return "`wait4` (no cgroup could be made: daemons that outlive the JVM are missed)"
    return " and ".join(f"a {way}" if way.startswith("cgroup") else f"`{way}`" for way in ways)


def main() -> None:
    results_main(__doc__, SECTION, FirstQueryRun, FirstQuerySetup, lambda args: measure(args.repeats), render)


if __name__ == "__main__":
    main()
