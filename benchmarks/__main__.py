"""sparkafka next to the alternatives, in one run on the embedded broker:

* **sparkafka** (`sparkafka run`, Spark local[2], trigger = commit interval), exactly-once and at-least-once;
* **Spark's kafka connector** (``format("kafka")`` source and sink, the same Spark settings and SQL),
  at-least-once only: its sink has no transactions;
* **confluent-kafka loop**: the consume-transform-produce loop a user writes by hand (transactions with
  ``send_offsets_to_transaction`` for exactly-once; flush, then commit offsets for at-least-once);
* **Quix Streams** with ``processing_guarantee`` exactly-once and at-least-once (its own virtualenv);
* **PyFlink** EXACTLY_ONCE and AT_LEAST_ONCE, with a Python UDF and (map only) a Java one (its own
  virtualenv).

Run from the repository root with the project's venv, after ``pip install -e '.[bench]'``. The first
run builds the virtualenvs of Quix Streams and PyFlink in ``.bench-venvs/`` (``--setup-only`` does just
that and exits):

    python -m benchmarks                                   # 1,000,000 records, 3 repetitions
    python -m benchmarks --update-docs docs/benchmarks.md  # also rewrite its compare section + charts,
                                                           # raw results in docs/benchmarks/compare.json
    python -m benchmarks.compare.results docs/benchmarks/compare.json --update-docs docs/benchmarks.md
                                                           # the same section again, running nothing
    python -m benchmarks --systems sparkafka,quix --workloads map --records 200000 --repeats 1
    python -m benchmarks --background-load 2 --update-docs docs/benchmarks.md
                                                           # beside 2 busy processes: a section, charts
                                                           # and docs/benchmarks/compare-loaded.json apart
    python -m benchmarks --systems sparkafka,sparkafka-quick-jit --name compare-driver-jit \
        --guarantees exactly-once --workloads map --update-docs docs/benchmarks.md
                                                           # a system against a variant, in its own section

Every run of every system gets a fresh 4-partition input topic with ``--records`` records of 100 B
(keys ``k0`` .. ``k999``) and a fresh output topic, which a read_committed consumer in this process
watches. Workloads: **map** (seed 001: ``EVENT(<value>)`` per input) and **count** (seed 003: a running
count per key). Within a repetition the systems take turns, and the order rotates from one repetition to
the next (ABCD, BCDA, …; each system's guarantees alternate which goes first); the tables show the
median and the min-max over ``--repeats`` repetitions. The Spark-based systems read a backlog in
micro-batches of at most max(200,000, records / 5) records (``maxOffsetsPerTrigger``), so that a run
always spans at least five micro-batches and a larger backlog is not held to 200,000 records/s.

Metrics:

* **records/s**: the sustained rate, inputs per second from 10 % to 90 % of the inputs accounted for in
  the read_committed output (map: distinct outputs seen; count: the sum of every key's latest count),
  so that start-up and a first commit holding a whole batch do not count. Complete: every input's
  output is visible (map), every key's latest count equals its total (count).
* **start-up s**: runner started → first output visible. **start → done s**: runner started → complete.
* **CPU s**: user+system CPU of the runner's whole process tree (JVM and Python workers included; the
  broker is not), runner start → complete. **CPU s per M after first output**: the same, from the first
  output visible to complete, per million inputs accounted for in that time: what a long-running
  pipeline pays per record, start-up left out (use a large ``--records``, e.g. 5000000, so that batch
  granularity does not dominate; left out when the first output already accounts for half the run).
* **correct** also asks, of an exactly-once run, for transaction markers in the output: its offsets
  must outnumber its records. **peak RSS MiB**: maximum over 0.25 s samples of the tree's
  summed RSS. **broker CPU s**: the broker process over the same interval.
* **latency p50/p99 ms** (map, unless ``--skip-latency``): with the runner caught up, ``--rate`` records/s
  for ``--seconds``; latency = visible to the read_committed reader minus the produce time carried in
  the value.
  **steady rate achieved**: what the producer managed (it shares the machine).
* **correct**: checked on every run; map: each input exactly once, value ``EVENT(<input>)``, key kept;
  count: every key's total, never above it, never going down. Failed runs are reported with the reason
  and left out of the numbers.

Each system is a runner script in ``benchmarks/systems/`` with one command line (see ``runner_args.py``);
a system whose files or virtualenv are missing is skipped with the reason.
"""

from __future__ import annotations

import argparse
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, in_rotation, load_average, machine_line
from benchmarks.compare import docs
from benchmarks.compare import results as saved_results
from benchmarks.compare.load import BackgroundLoad
from benchmarks.compare.measure import Config, RunResult, Settings, measure
from benchmarks.compare.report import rows, table, targets
from benchmarks.compare.systems import DEFAULT_SYSTEMS, SYSTEMS, System, prepare, select, versions

from sparkafka.tools.harness import Cluster

GUARANTEES = ("exactly-once", "at-least-once")
WORKLOADS = ("map", "count")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = ",".join(system.name for system in DEFAULT_SYSTEMS)
    variants = ",".join(system.name for system in SYSTEMS if system not in DEFAULT_SYSTEMS)
    add = parser.add_argument
    add(
        "--systems",
        default=names,
        help=f"comma-separated subset of {names} (flink = both), or of the variants {variants}",
    )
    add("--workloads", default=",".join(WORKLOADS), help="map, count or both (default both)")
    add("--guarantees", default=",".join(GUARANTEES), help="exactly-once, at-least-once (default both)")
    add("--records", type=int, default=1_000_000, help="records per run (default 1000000)")
    add("--repeats", type=int, default=3, help="repetitions (default 3)")
    add("--rate", type=float, default=20_000, help="records/s of the latency phase (default 20000)")
    add("--seconds", type=float, default=60, help="seconds of the latency phase (default 60)")
    add("--skip-latency", action="store_true", help="no steady-rate latency phase")
    add("--commit-interval-ms", type=int, default=1000, help="transaction / trigger interval (default 1000)")
    add(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="N busy processes beside the systems for the whole run; its docs section, charts and raw "
        "results are kept apart from the quiet run's (default 0)",
    )
    add(
        "--name",
        help="a run of its own, e.g. a system against a variant of it: its docs section, charts and raw "
        "results (docs/benchmarks/NAME.json) are kept apart from the full comparison's",
    )
    add("--timeout", type=float, default=900, help="seconds a phase of a run may take (default 900)")
    add("--update-docs", type=Path, help="rewrite this markdown file's compare section, charts beside it")
    add("--venvs-dir", type=Path, default=REPO / ".bench-venvs", help="default .bench-venvs")
    add("--setup-only", action="store_true", help="build the virtualenvs and exit")
    args = parser.parse_args(argv)
    for option, allowed in (("workloads", WORKLOADS), ("guarantees", GUARANTEES)):
        chosen = [item.strip() for item in getattr(args, option).split(",") if item.strip()]
        unknown = sorted(set(chosen) - set(allowed))
        if unknown or not chosen:
            given = ", ".join(unknown) or "nothing"
            parser.error(f"--{option}: {given} given; choose from {', '.join(allowed)}")
        setattr(args, option, [item for item in allowed if item in chosen])
    try:
        args.systems = select(args.systems)
    except ValueError as error:
        parser.error(str(error))
    if args.records < 1 or args.repeats < 1:
        parser.error("--records and --repeats must be at least 1")
    if args.background_load < 0:
        parser.error(f"--background-load: {args.background_load} given; give 0 or more busy processes")
    if args.name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.name):
        parser.error(f"--name: {args.name!r} given; give lower-case letters, digits and dashes (a file name)")
    if args.name in ("compare", "compare-loaded"):
        parser.error(f"--name: {args.name!r} is the full comparison's own; give another name")
    return args


def prepare_systems(systems: list[System], venvs_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """The python of every system that can run, and a line for each one that cannot."""
    pythons: dict[str, Path] = {}
    skipped: list[str] = []
    for system in systems:
        print(f"preparing {system.name} ...", file=sys.stderr, flush=True)
        python, reason = prepare(system, venvs_dir)
        if python is None:
            skipped.append(f"{system.name}: {reason}")
            print(f"skipping {system.name}: {reason}", file=sys.stderr, flush=True)
        else:
            pythons[system.name] = python
    return pythons, skipped


def java_version() -> str:
    try:
        completed = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    except OSError:
        return "no java on PATH"
    lines = (completed.stderr or completed.stdout).splitlines()
    return lines[0] if lines else "unknown"


def version_lines(systems: list[System], pythons: dict[str, Path]) -> list[str]:
    lines = [f"Python {platform.python_version()}; Java: {java_version()}"]
    for system in systems:
        if system.name not in pythons:
            continue
        found = versions(pythons[system.name], system.distributions)
        librdkafka = found.pop("librdkafka", None)
        parts = [f"{name} {version}" for name, version in found.items()]
        if librdkafka and "confluent-kafka" in found:
            parts = [part + f" (librdkafka {librdkafka})" if part.startswith("confluent-kafka ") else part
                     for part in parts]  # fmt: skip
        if system.name == "spark-kafka":  # the connector is a jar: its version is the test install's
            connector = (REPO / "tests" / "spark_kafka" / "version").read_text().split()[0]
            parts.append(f"spark-sql-kafka-0-10 {connector} (Maven Central)")
        # Rows of one system that differ only in a variant (PyFlink's UDFs) share one line.
        line = f"{system.label.split(' (')[0]}: {', '.join(parts)}"
        if line not in lines:
            lines.append(line)
    return lines


def progress_line(result: RunResult, repeat: int, repeats: int) -> str:
    head = f"[{repeat}/{repeats}] {result.config.workload:5} {result.config.label:40}"
    if not result.ok:
        return f"{head} FAILED: {'; '.join(result.problems)}"
    line = (
        f"{head} ok  {result.throughput or 0:>9,.0f} rec/s  start-up {result.startup_s or 0:5.1f} s  "
        f"CPU {result.cpu_s or 0:6.1f} s  RSS {result.peak_rss_mib or 0:6,.0f} MiB"
    )
    if result.cpu_s_per_million is not None:
        line += f"  {result.cpu_s_per_million:4.1f} CPU s/M after first output"
    if result.latency_p99_ms is not None:
        line += f"  p50/p99 {result.latency_p50_ms or 0:,.0f}/{result.latency_p99_ms:,.0f} ms"
    if result.killed:
        line += f"  (did not stop within {result.stop_s:.0f} s of SIGTERM: killed)"
    return line


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    args = parse_arguments(arguments)
    pythons, skipped = prepare_systems(args.systems, args.venvs_dir)
    if args.setup_only:
        for name, python in pythons.items():
            print(f"{name}: {python}")
        return 0 if not skipped else 1
    configs = [
        Config(system, guarantee, workload)
        for workload in args.workloads
        for system in args.systems
        if system.name in pythons and workload in system.workloads
        for guarantee in args.guarantees
        if guarantee in system.guarantees
    ]
    if not configs:
        print("nothing to run: no selected system is available for the selected workloads", file=sys.stderr)
        return 1
    settings = Settings(
        records=args.records,
        rate=args.rate,
        seconds=args.seconds,
        latency=not args.skip_latency,
        commit_interval_ms=args.commit_interval_ms,
        timeout_s=args.timeout,
    )
    start_load = load_average()
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-compare-") as temporary:
        work = Path(temporary)
        cluster = Cluster(work).start()
        try:
            with BackgroundLoad(args.background_load) as load:
                _run_all(cluster, pythons, configs, settings, work, args.repeats, load, results)
        finally:
            cluster.stop()
        # Runner logs vanish with the temporary directory: keep those of failed runs.
        kept = _keep_failed_logs(results, work)
    all_rows = rows(results)
    for workload in args.workloads:
        workload_rows = [row for row in all_rows if row.config.workload == workload]
        if workload_rows:
            print(f"\n{workload} ({args.records:,} records, {args.repeats} repetition(s))")
            print("\n".join(table(workload_rows, with_latency=workload == "map" and settings.latency)))
    print("\ntargets:")
    print("\n".join(f"- {line}" for line in targets(all_rows, args.commit_interval_ms, args.rate)))
    for line in skipped:
        print(f"not measured: {line}")
    for path in kept:
        print(f"log of a failed run: {path}")
    if args.update_docs is not None:
        context = docs.RunContext(
            command=shlex.join(["python", "-m", "benchmarks", *arguments]),
            records=args.records,
            repeats=args.repeats,
            rate=args.rate,
            seconds=args.seconds,
            latency=settings.latency,
            commit_interval_ms=args.commit_interval_ms,
            machine=machine_line(start_load),
            versions=version_lines(args.systems, pythons),
            skipped=skipped,
            background_load=args.background_load,
            run_name=args.name,
        )
        plot_dir = args.update_docs.parent / "benchmarks"
        results_file = plot_dir / context.results_file
        saved_results.save(results_file, results, context, args.workloads)
        section = docs.render_section(
            all_rows, context, args.update_docs, plot_dir, args.workloads, results_file
        )
        docs.write(args.update_docs, section, context)
        print(f"updated {args.update_docs} (charts and raw results in {plot_dir})", file=sys.stderr)
    return 0 if all(result.ok for result in results) else 1


def _run_all(
    cluster: Cluster,
    pythons: dict[str, Path],
    configs: list[Config],
    settings: Settings,
    work: Path,
    repeats: int,
    load: BackgroundLoad,
    results: list[RunResult],
) -> None:
    """Every run of every repetition, appended to ``results`` as it ends."""
    for repeat in range(1, repeats + 1):
        for number, config in enumerate(rotated(configs, repeat), 1):
            if load.running != load.count:
                raise RuntimeError(f"{load.count - load.running} of the background load's processes died")
            run_id = f"r{repeat}-{number}-{config.workload}-{config.system.name}-{config.guarantee}"
            python = pythons[config.system.name]
            result = measure(cluster, python, config, settings, work / run_id, run_id, repeat)
            results.append(result)
            print(progress_line(result, repeat, repeats), file=sys.stderr, flush=True)


def rotated(configs: list[Config], repeat: int) -> list[Config]:
    """The runs of repetition ``repeat`` (from 1): per workload the systems in an order rotated by one
    place per repetition, each system's guarantees reversed every other repetition, so that no
    system or guarantee always runs first (on a warmer or a quieter machine)."""
    ordered = []
    for workload in dict.fromkeys(config.workload for config in configs):
        of_workload = [config for config in configs if config.workload == workload]
        systems = list(dict.fromkeys(config.system for config in of_workload))
        for system in in_rotation(systems, repeat - 1):
            runs = [config for config in of_workload if config.system == system]
            ordered += runs if repeat % 2 else runs[::-1]
    return ordered


def _keep_failed_logs(results: list[RunResult], work: Path) -> list[Path]:
    kept = []
    keep_dir = Path(tempfile.gettempdir()) / f"sparkafka-compare-logs-{time.strftime('%Y%m%d-%H%M%S')}"
    for result in results:
        if not result.ok and result.log.exists():
            keep_dir.mkdir(exist_ok=True)
            target = keep_dir / f"{result.log.parent.name}.log"
            target.write_bytes(result.log.read_bytes())
            result.log = target
            kept.append(target)
    return kept


if __name__ == "__main__":
    sys.exit(main())
