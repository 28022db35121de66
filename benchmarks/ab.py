"""Variants of the exactly-once pipeline measured against each other (A/B), with raw results kept.

A variant is a version of sparkafka (a git revision whose ``src`` the pipeline process imports, or
this checkout) with, optionally, Spark settings of its own. Each repetition runs the pipeline
benchmark (`benchmarks/pipeline.py`, one run, the arguments after ``--``) once per variant, the
variants' order rotating from one repetition to the next, so that none always runs first on a
machine that warms up or gets busier. Only the pipeline process (`sparkafka run`, its driver and
the Python processes Spark starts) runs a variant's code: the harness, its output check and the
embedded broker are this checkout's, so a difference is the pipeline's.

    python -m benchmarks.ab progress-producer --title "..." --question "..." \\
        --variant "a producer per progress record" 6c564b0 "" \\
        --variant "one producer" 1ef0cd1 "" \\
        --update-docs docs/benchmarks.md -- --guarantees exactly-once --triggers 1s --seconds 5
    python -m benchmarks.ab --from-results docs/benchmarks/ab/progress-producer.json \\
        --update-docs docs/benchmarks.md          # the section again from the raw results, running nothing

Every run's output is checked record by record by the pipeline benchmark (none missing, none twice
for exactly-once); a run that fails stops the comparison. The section shows each variant's runs in
the order they ran, the median and min-max, and the ratio of the medians against the first variant;
where the variants' ranges overlap the difference is within the runs' spread, and the section says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

if not __package__:  # run as `python benchmarks/ab.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
from benchmarks.pipeline import Result, RunSetup

WORKING_TREE = "."
ENV_PREFIX = "env:"
RESULTS_DIRECTORY = Path("docs") / "benchmarks" / "ab"


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
class AbSetup:
    name: str
    title: str
    question: str
    variants: list[Variant]
    benchmark_args: list[str]
    repeats: int
    command: str
    machine: str

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


def check_imported_from(src: Path) -> None:
    """That a process given ``src`` the way a variant's pipeline is given it imports sparkafka from
    there (and not, say, from an installed copy that comes first on its path)."""
    from benchmarks.pipeline import pipeline_environment

    found = subprocess.run(
        [sys.executable, "-c", "import sparkafka; print(sparkafka.__file__)"],
        env={**os.environ, **pipeline_environment(src)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"a pipeline given {src} imports sparkafka from {found} instead")


def run_once(
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
    completed = subprocess.run([*command, *benchmark_args], cwd=REPO, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(
            f"run {number} ({variant.label}) failed, exit code {completed.returncode}:\n"
            f"{(completed.stdout + completed.stderr)[-3000:]}"
        )
    results, _ = load_results(results_file, Result, RunSetup, "pipeline")
    if len(results) != 1:
        raise SystemExit(f"run {number} ({variant.label}) measured {len(results)} configurations, not one")
    return results[0]


def measure(setup_args: argparse.Namespace, variants: list[Variant]) -> list[AbRun]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-ab-") as directory:
        work = Path(directory)
        sources = {variant.label: source_tree(variant, work) for variant in variants}
        for src in sources.values():
            if src is not None:
                check_imported_from(src)
        number = 0
        for repetition in range(setup_args.repeats):
            for variant in in_rotation(variants, repetition):
                number += 1
                load = load_average()
                result = run_once(variant, sources[variant.label], setup_args.benchmark_args, work, number)
                print(f"repetition {repetition + 1}, {variant.label}: {result}", flush=True)
                runs.append(
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
    return runs


def _spread(values: list[float]) -> Spread:
    spread = Spread.of(values)
    assert spread is not None, "a variant without runs"
    return spread


def verdict(first: list[float], other: list[float]) -> str:
    """Whether two variants' runs of one metric overlap (the difference within the runs' spread)."""
    if max(first) < min(other) or max(other) < min(first):
        return "outside the runs' spread (every run of one above every run of the other)"
    return "within the runs' spread"


def render(runs: list[AbRun], setup: AbSetup, results_file: Path | None) -> str:
    by_variant = {v.label: [run for run in runs if run.variant == v.label] for v in setup.variants}
    base = setup.variants[0].label
    base_rate = _spread([run.throughput for run in by_variant[base]]).median
    base_startup = _spread([run.startup_s for run in by_variant[base]]).median
    lines = [
        f"### {setup.title} (A/B)",
        "",
        setup.question,
        "",
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


def command_line(setup: AbSetup) -> str:
    """The command that made the comparison, its title and question left out (the section shows
    them; the raw results keep the whole command)."""
    words = ["python", "-m", "benchmarks.ab", setup.name, "--title", "…", "--question", "…"]
    words += ["--repeats", str(setup.repeats)]
    for variant in setup.variants:
        words += ["--variant", variant.label, variant.revision, " ".join(variant.settings)]
    return shlex.join([*words, "--update-docs", "docs/benchmarks.md", "--", *setup.benchmark_args])


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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--update-docs", type=Path, default=None)
    parser.add_argument(
        "--from-results", type=Path, default=None, help="render from raw results, running nothing"
    )
    args = parser.parse_args(own)
    if args.from_results is not None:
        try:
            runs, setup = load_results(args.from_results, AbRun, AbSetup, "A/B comparison")
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
        )
        results_file = RESULTS_DIRECTORY / f"{args.name}.json"
        save_results(REPO / results_file, runs, setup)
    text = render(runs, setup, results_file)
    print(text)
    if args.update_docs is not None:
        update_docs(args.update_docs, text, *markers(setup.name))


if __name__ == "__main__":
    main()
