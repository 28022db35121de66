"""The raw results of a comparison run, kept as JSON so that its tables and charts can be made again
without running anything.

A results file holds the run's context (command, machine, load, versions, settings) and every run of
every system as measured: its configuration, repetition, problems and every metric, the latency
quantiles included. :func:`load` gives back the same :class:`RunResult` objects :func:`save` took,
so the report is rendered from a file exactly as from a fresh run:

    python -m benchmarks.compare.results docs/benchmarks/compare.json --update-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.compare import docs
from benchmarks.compare.measure import Config, RunResult
from benchmarks.compare.report import rows
from benchmarks.compare.systems import SYSTEMS, System

FORMAT_VERSION = 1
# Measured values of a run, saved and loaded as they are.
_METRICS = tuple(
    f.name for f in dataclasses.fields(RunResult) if f.name not in ("config", "repeat", "log", "problems")
)


def _run_record(result: RunResult) -> dict[str, Any]:
    return {
        "system": result.config.system.name,
        "label": result.config.system.label,
        "guarantee": result.config.guarantee,
        "workload": result.config.workload,
        "repeat": result.repeat,
        "problems": list(result.problems),
        **{name: getattr(result, name) for name in _METRICS},
    }


def save(path: Path, results: list[RunResult], context: docs.RunContext, workloads: list[str]) -> None:
    """Write ``results`` and ``context`` to ``path`` (its directory is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "version": FORMAT_VERSION,
        "context": dataclasses.asdict(context),
        "workloads": workloads,
        "runs": [_run_record(result) for result in results],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def _system(record: dict[str, Any]) -> System:
    for system in SYSTEMS:
        if system.name == record["system"]:
            return system
    # A system no longer offered still renders under its saved name and label.
    return System(record["system"], record["label"], "", None, ())


def load(path: Path) -> tuple[list[RunResult], docs.RunContext, list[str]]:
    """The results, context and workloads :func:`save` wrote to ``path``; ValueError naming the file
    when it is not such a file."""
    try:
        document = json.loads(path.read_text())
        if document.get("version") != FORMAT_VERSION:
            raise ValueError(f"version {document.get('version')!r}, this code reads {FORMAT_VERSION}")
        context = docs.RunContext(**document["context"])
        results = []
        for record in document["runs"]:
            config = Config(_system(record), record["guarantee"], record["workload"])
            result = RunResult(config, record["repeat"], Path("-"), list(record["problems"]))
            for name in _METRICS:
                # A metric added since the file was written reads as not measured.
                setattr(result, name, record.get(name))
            results.append(result)
        return results, context, list(document["workloads"])
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a comparison results file: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare.results",
        description="Render the comparison section of the docs from a saved results file, running nothing.",
    )
    parser.add_argument("results", type=Path, help="a file written by python -m benchmarks --update-docs")
    parser.add_argument("--update-docs", type=Path, required=True, help="the markdown file to rewrite")
    args = parser.parse_args(argv)
    try:
        results, context, workloads = load(args.results)
    except ValueError as error:
        parser.error(str(error))
    plot_dir = args.update_docs.parent / "benchmarks"
    section = docs.render_section(rows(results), context, args.update_docs, plot_dir, workloads, args.results)
    docs.write(args.update_docs, section, context)
    print(f"updated {args.update_docs} from {args.results} (charts in {plot_dir})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
