"""What a sparkafka session costs to start, with and without the driver JVM's class archive
(:mod:`sparkafka.runtime.class_archive`).

Each run is a fresh Python process that creates a sparkafka session (``local[2]``), runs one small
aggregation, stops the session and waits for its driver JVM to exit. Measured per run: the time to
the session (``getOrCreate`` returned), to the first query's answer, and the CPU of every process
of the run (Python, launcher, zygote and driver JVM), counted by a cgroup where one can be made,
else by ``wait4`` (:func:`benchmarks.common.run_reporting_child`). Runs alternate between the two
modes so that the machine's load falls on both alike; the archive is built first when it is missing.

    python -m benchmarks.startup
    python -m benchmarks.startup --repeats 5 --update-docs docs/benchmarks.md
    python -m benchmarks.startup --from-results docs/benchmarks/startup.json --update-docs docs/benchmarks.md
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/startup.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    REPO,
    ResultsSection,
    load_average,
    machine_line,
    results_main,
    run_reporting_child,
)

from sparkafka.runtime import class_archive

SECTION = ResultsSection(
    "start-up",
    REPO / "docs" / "benchmarks" / "startup.json",
    "<!-- benchmark:startup:start -->",
    "<!-- benchmark:startup:end -->",
)
MODES = ("without archive", "with archive")

CHILD = """
import json, sys, time
started = time.monotonic()
from pyspark import SparkContext
from sparkafka.runtime.session import spark_session
spark = spark_session("sparkafka-startup-benchmark", master="local[2]")
session_s = time.monotonic() - started
spark.range(100_000).selectExpr("id % 10 AS k").groupBy("k").count().collect()
query_s = time.monotonic() - started
spark.stop()
gateway = SparkContext._gateway
gateway.shutdown()
gateway.proc.stdin.close()
gateway.proc.wait(120)
print("RESULT " + json.dumps({"session_s": session_s, "first_query_s": query_s}))
"""


@dataclasses.dataclass(frozen=True)
class StartupRun:
    mode: str
    session_s: float
    first_query_s: float
    total_s: float
    cpu_s: float


@dataclasses.dataclass(frozen=True)
class StartupSetup:
    machine: str
    archive_bytes: int
    java_options: str


def run_once(mode: str) -> StartupRun:
    environ = {**os.environ, class_archive.SWITCH_ENV: "on" if mode == "with archive" else "off"}
    child = run_reporting_child([sys.executable, "-c", CHILD], environ, mode)
    return StartupRun(
        mode=mode,
        session_s=child.reported["session_s"],
        first_query_s=child.reported["first_query_s"],
        total_s=child.total_s,
        cpu_s=child.cpu_s,
    )


def measure(repeats: int) -> tuple[list[StartupRun], StartupSetup]:
    start_load = load_average()
    archive = class_archive.whole_archive()
    if archive is None:
        print("building the class archive first", file=sys.stderr)
        archive = class_archive.build()
    run_once(MODES[0])  # warms the page cache for both modes alike
    runs = []
    for repetition in range(repeats):
        for mode in MODES if repetition % 2 == 0 else reversed(MODES):
            run = run_once(mode)
            print(
                f"{mode:>16}: session {run.session_s:5.1f} s, first answer {run.first_query_s:5.1f} s, "
                f"CPU {run.cpu_s:5.1f} s",
                file=sys.stderr,
            )
            runs.append(run)
    setup = StartupSetup(
        machine=machine_line(start_load),
        archive_bytes=archive.stat().st_size,
        java_options=os.environ.get("JDK_JAVA_OPTIONS", ""),
    )
    return runs, setup


def render(runs: list[StartupRun], setup: StartupSetup) -> str:
    def median(mode: str, field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs if run.mode == mode)

    def cells(mode: str) -> str:
        values = [
            ", ".join(f"{getattr(run, field):.1f}" for run in runs if run.mode == mode)
            for field in ("session_s", "first_query_s", "cpu_s")
        ]
        return " | ".join(values)

    rows = [f"| {mode} | {cells(mode)} |" for mode in MODES]
    cpu_ratio = median(MODES[1], "cpu_s") / median(MODES[0], "cpu_s")
    answer_ratio = median(MODES[1], "first_query_s") / median(MODES[0], "first_query_s")
    repeats = sum(run.mode == MODES[0] for run in runs)
    options = f" (`JDK_JAVA_OPTIONS={setup.java_options}`)" if setup.java_options else ""
    return "\n".join(
        [
            "## Session start-up and the class archive",
            "",
            "Measured with `python -m benchmarks.startup` (see `benchmarks/startup.py`): a fresh process "
            "creates a sparkafka session (`local[2]`), runs one aggregation and stops; CPU is the whole "
            f"process tree's. {repeats} run(s) per mode, alternating{options}. The archive is "
            f"{setup.archive_bytes / 1024 / 1024:.0f} MiB (`sparkafka class-archive build`).",
            "",
            "| driver JVM | session s, each run | first answer s, each run | CPU s, each run |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"With the archive, the medians are {cpu_ratio:.2f}x the CPU and {answer_ratio:.2f}x the time to "
            f"the first answer. {setup.machine}.",
        ]
    )


def main() -> None:
    results_main(__doc__, SECTION, StartupRun, StartupSetup, lambda args: measure(args.repeats), render)


if __name__ == "__main__":
    main()
