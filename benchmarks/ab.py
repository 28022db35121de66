"""Variants of sparkafka measured against each other (A/B), with raw results kept.

A variant is a version of sparkafka (a git revision whose ``src`` the measured process imports, or
this checkout) with, optionally, settings of its own. Each repetition runs one benchmark once per
variant (the arguments after ``--`` go to it), the variants' order rotating from one repetition to
the next, so that none always runs first on a machine that warms up or gets busier. Two benchmarks:

- ``--benchmark pipeline`` (the default): the exactly-once pipeline (`benchmarks/pipeline.py`, one
  run). Only the pipeline process (`sparkafka run`, its driver and the Python processes Spark
  starts) runs a variant's code: the harness, its output check and the embedded broker are this
  checkout's, so a difference is the pipeline's. Settings: ``spark.KEY=VALUE`` and ``env:NAME=VALUE``.
- ``--benchmark broker``: the embedded broker alone (`benchmarks/broker.py`, without Tansu and
  Apache Kafka), its CPU while producing. Only the broker process runs a variant's code; the
  clients that produce and fetch are this checkout's. No settings.

    python -m benchmarks.ab progress-producer --title "..." --question "..." \\
        --variant "a producer per progress record" 6c564b0 "" \\
        --variant "one producer" 1ef0cd1 "" \\
        --update-docs docs/benchmarks.md -- --guarantees exactly-once --triggers 1s --seconds 5
    python -m benchmarks.ab broker-split --benchmark broker --title "..." --question "..." \\
        --variant "before" 5daa368 "" --variant "after" . "" --update-docs docs/benchmarks.md -- --repeats 3
    python -m benchmarks.ab --from-results docs/benchmarks/ab/progress-producer.json \\
        --update-docs docs/benchmarks.md          # the section again from the raw results, running nothing

Every pipeline run's output is checked record by record by the pipeline benchmark (none missing,
none twice for exactly-once), every broker run's deliveries by the broker benchmark; a run that
fails stops the comparison. The section shows each variant's runs in the order they ran, the median
and min-max, and the ratio of the medians against the first variant; where the variants' ranges
overlap the difference is within the runs' spread, and the section says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

if not __package__:  # run as `python benchmarks/ab.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import broker
from benchmarks.common import (
    REPO,
    in_rotation,
    load_average,
    load_results,
    machine_line,
    save_results,
    update_docs,
)
from benchmarks.compare.report import Spread
from benchmarks.pipeline import Result, RunSetup, pipeline_environment

WORKING_TREE = "."
ENV_PREFIX = "env:"
RESULTS_DIRECTORY = Path("docs") / "benchmarks" / "ab"
PIPELINE = "pipeline"
BROKER = "broker"
# The broker benchmark measures the embedded broker alone: the other brokers it can run beside it
# would only lengthen every run.
BROKER_ALONE = ["--no-tansu", "--no-apache-kafka"]


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    revision: str  # as given: a git revision, or "." for this checkout
    commit: str  # the commit it resolved to (for ".", HEAD's, with "+changes" if the tree differs)
    # KEY=VALUE settings passed to `sparkafka run --spark-conf`, and env:NAME=VALUE for the pipeline
    # process's environment.
    settings: list[str]


@dataclasses.dataclass(frozen=True)
class AbRun:
    variant: str  # its label
    repetition: int
    throughput: float
    startup_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    load_average: float  # the machine's 1-minute load average when the run started


@dataclasses.dataclass(frozen=True)
class BrokerAbRun:
    """One measured size of one run of the broker benchmark (which may repeat it: ``--repeats``)."""

    variant: str  # its label
    repetition: int
    size: int  # bytes per record value
    records: int
    produce_cpu_s: float  # the broker process's CPU while the records were produced
    produce_s: float
    fetch_cpu_s: float
    load_average: float  # the machine's 1-minute load average when the run started

    @property
    def cpu_s_per_mb(self) -> float:
        return self.produce_cpu_s / (self.records * self.size / 1e6)


@dataclasses.dataclass(frozen=True)
class AbSetup:
    name: str
    title: str
    question: str
    variants: list[Variant]
    benchmark_args: list[str]
    repeats: int
    command: str
    machine: str
    benchmark: str = PIPELINE  # which benchmark each run is: PIPELINE or BROKER

    def __post_init__(self) -> None:
        # Loaded from JSON, the variants are dictionaries.
        variants = [v if isinstance(v, Variant) else Variant(**v) for v in self.variants]
        object.__setattr__(self, "variants", variants)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def resolve(revision: str) -> str:
    """The commit ``revision`` names; for this checkout HEAD's, marked when the tree has changes."""
    if revision == WORKING_TREE:
        head = _git("rev-parse", "--short=7", "HEAD").strip()
        changed = _git("status", "--porcelain", "--", "src").strip()
        return f"{head}+changes" if changed else head
    try:
        return _git("rev-parse", "--short=7", f"{revision}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"--variant: {revision!r} is not a commit of this repository") from None


def source_tree(variant: Variant, work: Path) -> Path | None:
    """The ``src`` directory a variant's pipeline imports sparkafka from (None: this checkout's)."""
    if variant.revision == WORKING_TREE:
        return None
    target = work / variant.commit
    if not target.exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", variant.commit, "src"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
    return target / "src"


def check_imported_from(src: Path, benchmark: str) -> None:
    """That a process given ``src`` the way a variant's measured process is given it imports
    sparkafka from there (and not, say, from an installed copy that comes first on its path)."""
    environment = pipeline_environment(src) if benchmark == PIPELINE else broker.broker_environment(src)
    found = subprocess.run(
        [sys.executable, "-c", "import sparkafka; print(sparkafka.__file__)"],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"a pipeline given {src} imports sparkafka from {found} instead")


def _run_benchmark(command: list[str], variant: Variant, number: int) -> None:
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(
            f"run {number} ({variant.label}) failed, exit code {completed.returncode}:\n"
            f"{(completed.stdout + completed.stderr)[-3000:]}"
        )


def run_pipeline_once(
    variant: Variant, src: Path | None, benchmark_args: list[str], work: Path, number: int
) -> Result:
    results_file = work / f"run-{number}.json"
    command = [sys.executable, "-m", "benchmarks.pipeline", "--repeats", "1", "--results", str(results_file)]
    if src is not None:
        command += ["--pipeline-src", str(src)]
    for setting in variant.settings:
        if setting.startswith(ENV_PREFIX):
            command += ["--pipeline-env", setting.removeprefix(ENV_PREFIX)]
        else:
            command += ["--spark-conf", setting]
    _run_benchmark([*command, *benchmark_args], variant, number)
    results, _ = load_results(results_file, Result, RunSetup, "pipeline")
    if len(results) != 1:
        raise SystemExit(f"run {number} ({variant.label}) measured {len(results)} configurations, not one")
    return results[0]


def run_broker_once(
    variant: Variant, src: Path | None, benchmark_args: list[str], work: Path, number: int
) -> list[broker.Result]:
    """One run of the broker benchmark, every size and repeat it measured."""
    results_file = work / f"run-{number}.json"
    command = [sys.executable, "-m", "benchmarks.broker", *BROKER_ALONE, "--results", str(results_file)]
    if src is not None:
        command += ["--broker-src", str(src)]
    _run_benchmark([*command, *benchmark_args], variant, number)
    results, _ = load_results(results_file, broker.Result, broker.RunSetup, "broker")
    unmeasured = [result for result in results if result.produce_cpu_s is None or result.fetch_cpu_s is None]
    if not results or unmeasured:
        raise SystemExit(
            f"run {number} ({variant.label}) measured no broker CPU (it is read from /proc: Linux only)"
        )
    return results


def measure(setup_args: argparse.Namespace, variants: list[Variant]) -> list[AbRun] | list[BrokerAbRun]:
    pipeline_runs: list[AbRun] = []
    broker_runs: list[BrokerAbRun] = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-ab-") as directory:
        work = Path(directory)
        sources = {variant.label: source_tree(variant, work) for variant in variants}
        for src in sources.values():
            if src is not None:
                check_imported_from(src, setup_args.benchmark)
        number = 0
        for repetition in range(setup_args.repeats):
            for variant in in_rotation(variants, repetition):
                number += 1
                load = load_average()
                src, args = sources[variant.label], setup_args.benchmark_args
                if setup_args.benchmark == BROKER:
                    for measured in run_broker_once(variant, src, args, work, number):
                        assert measured.produce_cpu_s is not None and measured.fetch_cpu_s is not None
                        broker_runs.append(
                            BrokerAbRun(
                                variant.label,
                                repetition,
                                measured.size,
                                measured.records,
                                measured.produce_cpu_s,
                                measured.produce_s,
                                measured.fetch_cpu_s,
                                load,
                            )
                        )
                        print(f"repetition {repetition + 1}, {variant.label}: {measured}", flush=True)
                    continue
                result = run_pipeline_once(variant, src, args, work, number)
                print(f"repetition {repetition + 1}, {variant.label}: {result}", flush=True)
                pipeline_runs.append(
                    AbRun(
                        variant.label,
                        repetition,
                        result.throughput,
                        result.startup_s,
                        result.latency_p50_ms,
                        result.latency_p99_ms,
                        load,
                    )
                )
    return broker_runs if setup_args.benchmark == BROKER else pipeline_runs


def _spread(values: list[float]) -> Spread:
    spread = Spread.of(values)
    assert spread is not None, "a variant without runs"
    return spread


def verdict(first: list[float], other: list[float]) -> str:
    """Whether two variants' runs of one metric overlap (the difference within the runs' spread)."""
    if max(first) < min(other) or max(other) < min(first):
        return "outside the runs' spread (every run of one above every run of the other)"
    return "within the runs' spread"


def render(runs: list[AbRun] | list[BrokerAbRun], setup: AbSetup, results_file: Path | None) -> str:
    """The comparison's section of docs/benchmarks.md."""
    if setup.benchmark == BROKER:
        body = render_broker([run for run in runs if isinstance(run, BrokerAbRun)], setup)
    else:
        body = render_pipeline([run for run in runs if isinstance(run, AbRun)], setup)
    lines = [
        f"### {setup.title} (A/B)",
        "",
        setup.question,
        "",
        *body,
        "",
        f"- Machine: {setup.machine}",
        f"- Command (with the title and question above): `{command_line(setup)}`",
    ]
    if results_file is not None:
        lines.append(
            f"- Raw results: `{results_file.as_posix()}`; this section is made from them, running "
            "nothing, by "
            f"`python -m benchmarks.ab --from-results {results_file.as_posix()} --update-docs FILE`"
        )
    return "\n".join(lines)


def render_pipeline(runs: list[AbRun], setup: AbSetup) -> list[str]:
    by_variant = {v.label: [run for run in runs if run.variant == v.label] for v in setup.variants}
    base = setup.variants[0].label
    base_rate = _spread([run.throughput for run in by_variant[base]]).median
    base_startup = _spread([run.startup_s for run in by_variant[base]]).median
    lines = [
        "| variant | code | records/s, each run | records/s median (min-max) | vs first "
        "| start-up s, each run | latency p99 ms median (min-max) |",
        "| --- | --- | --- | ---: | ---: | --- | ---: |",
    ]
    for variant in setup.variants:
        mine = by_variant[variant.label]
        rate = _spread([run.throughput for run in mine])
        code = variant.commit + "".join(f", `{setting}`" for setting in variant.settings)
        lines.append(
            f"| {variant.label} | {code} | {' · '.join(f'{run.throughput:,.0f}' for run in mine)} | "
            f"{rate.format()} | {rate.median / base_rate:.2f}x | "
            f"{' · '.join(f'{run.startup_s:.1f}' for run in mine)} | "
            f"{_spread([run.latency_p99_ms for run in mine]).format()} |"
        )
    lines.append("")
    for variant in setup.variants[1:]:
        mine = by_variant[variant.label]
        rate_ratio = _spread([run.throughput for run in mine]).median / base_rate
        startup = _spread([run.startup_s for run in mine]).median
        lines.append(
            f"- {variant.label} against {base}: records/s {rate_ratio:.2f}x, "
            f"{verdict([r.throughput for r in by_variant[base]], [r.throughput for r in mine])}; "
            f"start-up {startup - base_startup:+.1f} s (medians {base_startup:.1f} and {startup:.1f} s), "
            f"{verdict([r.startup_s for r in by_variant[base]], [r.startup_s for r in mine])}."
        )
    loads = [run.load_average for run in runs]
    lines += [
        "",
        "Each run: the pipeline benchmark once "
        f"(`python -m benchmarks.pipeline {shlex.join(setup.benchmark_args)}`), "
        f"{setup.repeats} repetition(s), each running every variant once in an order rotating from one "
        "repetition to the next. Only the pipeline process runs the variant's code (its `src` on "
        "`PYTHONPATH`); the harness, its record-by-record output check and the embedded broker are the "
        "checkout's that ran the comparison. Load average at the runs' starts: "
        f"{min(loads):.1f}-{max(loads):.1f}.",
    ]
    return lines


def render_broker(runs: list[BrokerAbRun], setup: AbSetup) -> list[str]:
    """Per record size, each variant's broker CPU while producing: every measurement in the order
    run, the median and min-max, per MB, and the ratio of the medians against the first variant
    (below 1: less CPU than the first)."""
    base = setup.variants[0].label
    sizes = sorted({run.size for run in runs})
    lines = [
        "| record size | variant | code | broker CPU s producing, each measurement | median (min-max) "
        "| CPU s per MB | vs first |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: |",
    ]
    verdicts = []
    for size in sizes:
        of_size = {
            v.label: [run for run in runs if run.size == size and run.variant == v.label]
            for v in setup.variants
        }
        base_cpu = _spread([run.produce_cpu_s for run in of_size[base]])
        for variant in setup.variants:
            mine = of_size[variant.label]
            cpu = _spread([run.produce_cpu_s for run in mine])
            per_mb = _spread([run.cpu_s_per_mb for run in mine]).median
            lines.append(
                f"| {size} B | {variant.label} | {variant.commit} | "
                f"{' · '.join(f'{run.produce_cpu_s:.2f}' for run in mine)} | {cpu.format(2)} | "
                f"{per_mb:.4f} | {cpu.median / base_cpu.median:.2f}x |"
            )
            if variant.label != base:
                verdicts.append(
                    f"- {size} B, {variant.label} against {base}: broker CPU "
                    f"{cpu.median / base_cpu.median:.2f}x, "
                    f"{verdict([r.produce_cpu_s for r in of_size[base]], [r.produce_cpu_s for r in mine])}."
                )
    loads = [run.load_average for run in runs]
    records = sorted({run.records for run in runs})
    measurements = len(runs) // max(len(sizes) * len(setup.variants), 1)
    lines += [
        "",
        *verdicts,
        "",
        "Each run: the broker benchmark once (`python -m benchmarks.broker "
        f"{shlex.join([*BROKER_ALONE, *setup.benchmark_args])}`: a fresh embedded broker per size "
        f"and repeat, {' and '.join(f'{count:,}' for count in records)} records produced and fetched "
        "after an untimed warm-up; the CPU is the broker process's own), "
        f"{setup.repeats} repetition(s), each running every variant once in an order rotating from one "
        f"repetition to the next: {measurements} measurements per variant and size. Only the broker "
        "process runs the variant's code (`--broker-src`, its `src` alone on `PYTHONPATH`); the "
        "producing and fetching clients are the checkout's that ran the comparison. Load average at "
        f"the runs' starts: {min(loads):.1f}-{max(loads):.1f}.",
    ]
    return lines


def command_line(setup: AbSetup) -> str:
    """The command that made the comparison, its title and question left out (the section shows
    them; the raw results keep the whole command)."""
    words = ["python", "-m", "benchmarks.ab", setup.name, "--title", "…", "--question", "…"]
    if setup.benchmark != PIPELINE:
        words += ["--benchmark", setup.benchmark]
    words += ["--repeats", str(setup.repeats)]
    for variant in setup.variants:
        words += ["--variant", variant.label, variant.revision, " ".join(variant.settings)]
    return shlex.join([*words, "--update-docs", "docs/benchmarks.md", "--", *setup.benchmark_args])


def load(path: Path) -> tuple[list[AbRun] | list[BrokerAbRun], AbSetup]:
    """A comparison's raw results, of whichever benchmark its setup names; ValueError otherwise."""
    try:
        benchmark = json.loads(path.read_text())["setup"].get("benchmark", PIPELINE)
    except (OSError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"{path} is not an A/B comparison results file: {error}") from None
    if benchmark == BROKER:
        return load_results(path, BrokerAbRun, AbSetup, "A/B comparison")
    return load_results(path, AbRun, AbSetup, "A/B comparison")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- benchmark:ab-{name}:start -->", f"<!-- benchmark:ab-{name}:end -->"


def main() -> None:
    argv = sys.argv[1:]
    benchmark_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", nargs="?", help="the comparison's name: its results file and section")
    parser.add_argument("--title", default="", help="the section's heading")
    parser.add_argument(
        "--question", default="", help="the section's first paragraph: what is compared, and why"
    )
    parser.add_argument(
        "--variant",
        nargs=3,
        action="append",
        default=[],
        metavar=("LABEL", "REVISION", "SETTINGS"),
        help="a variant: its label, a git revision ('.' for this checkout) and space-separated settings "
        "('' for none): spark.KEY=VALUE for Spark, env:NAME=VALUE for the pipeline process's "
        "environment; the first variant is the base the others are held against",
    )
    parser.add_argument(
        "--benchmark",
        choices=(PIPELINE, BROKER),
        default=PIPELINE,
        help="what each run measures: the exactly-once pipeline, or the embedded broker alone",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--update-docs", type=Path, default=None)
    parser.add_argument(
        "--from-results", type=Path, default=None, help="render from raw results, running nothing"
    )
    args = parser.parse_args(own)
    if args.from_results is not None:
        try:
            runs, setup = load(args.from_results)
        except ValueError as error:
            parser.error(str(error))
        results_file = args.from_results
    else:
        if not args.name or not args.title or not args.question:
            parser.error("a comparison needs a name, --title and --question (or --from-results)")
        if len(args.variant) < 2:
            parser.error("give at least two --variant")
        if len({label for label, _, _ in args.variant}) != len(args.variant):
            parser.error("each --variant needs a label of its own")
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        if args.benchmark == BROKER and any(settings.strip() for _, _, settings in args.variant):
            parser.error("--benchmark broker takes no settings: give '' as each --variant's SETTINGS")
        variants = [Variant(label, rev, resolve(rev), conf.split()) for label, rev, conf in args.variant]
        args.benchmark_args = benchmark_args
        start_load = load_average()
        runs = measure(args, variants)
        setup = AbSetup(
            args.name,
            args.title,
            args.question,
            variants,
            benchmark_args,
            args.repeats,
            shlex.join(["python", "-m", "benchmarks.ab", *argv]),
            f"{machine_line(start_load)}; Python {sys.version.split()[0]}",
            args.benchmark,
        )
        results_file = RESULTS_DIRECTORY / f"{args.name}.json"
        save_results(REPO / results_file, runs, setup)
    text = render(runs, setup, results_file)
    print(text)
    if args.update_docs is not None:
        update_docs(args.update_docs, text, *markers(setup.name))


if __name__ == "__main__":
    main()
