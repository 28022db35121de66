"""The marked section of docs/benchmarks.md for a comparison, and its PNG charts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import update_docs
from benchmarks.compare import plots
from benchmarks.compare.measure import max_offsets_per_trigger
from benchmarks.compare.report import Row, memory_lines, table, targets, variant_lines

# Spark's update mode writes each changed key once per micro-batch; the others write an update per
# input record, so their output holds as many records as the input.
PER_BATCH_COUNT_SYSTEMS = ("sparkafka", "spark-kafka")
COUNT_GROUPS_NOTE = (
    "The Spark-based systems and the others do not write the same output here, so they are not ranked "
    "together: a Spark streaming aggregation in update mode writes each key whose count changed once per "
    "micro-batch (1,000 keys: about 1,000 output records per batch, whatever the batch's size), while the "
    "hand-written loop, Quix Streams and PyFlink write an updated count for every input record. Both "
    "give every key's running total; records/s counts inputs in both cases, but the per-record systems "
    "produce and commit as many output records as inputs."
)
WORKLOAD_TITLES = {
    "map": "map: seed 001's EVENT(a,b), one output per input",
    "count": "count: seed 003's keyed running count",
}


@dataclass(frozen=True)
class RunContext:
    """What the section says about how the numbers were obtained."""

    command: str
    records: int
    repeats: int
    rate: float
    seconds: float
    latency: bool
    commit_interval_ms: int
    machine: str
    versions: list[str]
    skipped: list[str]
    # Busy processes beside the systems for the whole run (--background-load); 0: a quiet machine.
    background_load: int = 0
    # --name: a run of its own (say, a system against a variant of it), kept apart from the others.
    run_name: str | None = None

    @property
    def name(self) -> str:
        """The run's name in the docs' markers, chart files and raw results: quiet, loaded and named
        runs keep sections of their own."""
        if self.run_name is not None:
            return self.run_name
        return "compare" if self.background_load == 0 else "compare-loaded"

    @property
    def results_file(self) -> str:
        return f"{self.name}.json"


def _busy(count: int) -> str:
    return f"{count} busy process{'' if count == 1 else 'es'}"


def _method(context: RunContext) -> str:
    batch = max_offsets_per_trigger(context.records)
    latency = (
        f" Then, the runner caught up, {context.rate:,.0f} records/s are produced for "
        f"{context.seconds:.0f} s (map only) and latency is the time a record became visible to the "
        "read_committed reader minus the produce time carried in the input value."
        if context.latency
        else ""
    )
    loaded = (
        f"Beside every system, for the whole run: {_busy(context.background_load)}, each a pure-Python "
        "loop spinning one core at normal priority, counted in no system's CPU or memory. "
        if context.background_load
        else ""
    )
    return loaded + (
        f"Every system runs the same workloads on the embedded broker (its own process), {context.repeats} "
        "repetition(s), the systems alternating within each repetition (their order rotating from one "
        "repetition to the next); cells show the median and, in "
        "parentheses, the min-max over the repetitions. Each run pre-produces "
        f"{context.records:,} records of 100 B (1,000 keys) into a fresh 4-partition topic, starts the "
        "runner and watches a fresh output topic with a read_committed consumer (in the benchmark's own "
        "process, on the same cores, reading 1 M outputs in about 3.5 s when alone). **start-up**: "
        "runner start to the first output visible; **records/s**: the sustained rate, inputs per second "
        "from 10 % to 90 % of the inputs accounted for in the output (map: distinct outputs; count: the "
        "sum of the keys' latest counts); complete = every input's output visible (map) or every key's "
        "latest count equal to its total (count); **start → done**: runner start to complete; **CPU s** "
        "and **peak RSS**: the runner's whole process tree (JVM and Python workers included, broker "
        "excluded), from start to complete and over "
        "the run; **peak PSS**: the same tree's proportional set size, a page shared by several of its "
        "processes (forked Python workers, mapped jars) counted once in all: the tree's fair share of "
        'the memory, where RSS counts such a page once per process ("-": not measured then); '
        "**CPU s per M after first output**: the tree's CPU from the first output visible to "
        "complete, per million inputs accounted for in that time (start-up left out: what a long-running "
        "pipeline pays per record); **broker CPU s**: the broker from start to complete. Commits (Kafka "
        "transactions for "
        f"exactly-once, Spark's trigger) every {context.commit_interval_ms} ms. **correct**: every input's "
        "output exactly once (map), every key's total and no overcount (count), checked on every run; "
        "metrics come from correct runs only."
        + latency
        + " The Spark-based systems (sparkafka, Spark's kafka connector) read a backlog in micro-batches "
        f"of at most {batch:,} records (maxOffsetsPerTrigger, a fifth of the run and at least 200,000), "
        "so their output becomes visible batch by batch like the other systems' output at each commit; "
        "as Spark starts at most one micro-batch per trigger interval, this bounds their rate at "
        f"{batch * 1000 // context.commit_interval_ms:,} records/s. Spark's kafka connector writes "
        "without transactions: it has at-least-once rows only."
    )


def render_section(
    all_rows: list[Row],
    context: RunContext,
    docs_file: Path,
    plot_dir: Path,
    workloads: list[str],
    results_file: Path,
) -> str:
    """Write the charts into ``plot_dir`` and return the section's markdown, linking them and the raw
    ``results_file`` they come from relative to ``docs_file``."""
    plot_dir.mkdir(parents=True, exist_ok=True)

    def link(path: Path) -> str:
        return Path(os.path.relpath(path, docs_file.parent)).as_posix()

    # The systems the run measured, in the order they were given: a system left out is not named.
    labels = dict.fromkeys(row.config.system.label for row in all_rows)
    title = f"## Side by side: {', '.join(labels)}"
    if context.run_name is not None:
        title = f"## Side by side ({context.run_name}): {' against '.join(labels)}"
    if context.background_load:
        title += f", under load ({_busy(context.background_load)})"
    lines = [title, "", _method(context)]
    for workload in workloads:
        workload_rows = [row for row in all_rows if row.config.workload == workload]
        if not workload_rows:
            continue
        chart = plot_dir / f"{context.name}-throughput-{workload}.png"
        plots.throughput_chart(workload_rows, workload, chart)
        lines += ["", f"### {WORKLOAD_TITLES[workload]}", ""]
        with_latency = workload == "map" and context.latency
        per_batch = [row for row in workload_rows if row.config.system.name in PER_BATCH_COUNT_SYSTEMS]
        if workload == "count" and per_batch and len(per_batch) < len(workload_rows):
            per_record = [row for row in workload_rows if row not in per_batch]
            lines += [
                COUNT_GROUPS_NOTE,
                "",
                "**One output per key per micro-batch** (Spark's update mode):",
                "",
                *table(per_batch, with_latency=with_latency),
                "",
                "**One output per input record:**",
                "",
                *table(per_record, with_latency=with_latency),
            ]
        else:
            lines += table(workload_rows, with_latency=with_latency)
        lines += ["", f"![{workload} throughput]({link(chart)})"]
        if workload == "map" and (memory := memory_lines(workload_rows)):
            lines += [
                "",
                "### Where the memory goes (map)",
                "",
                "Each process of the tree at the sample of its highest RSS, per kind (a fork has its "
                "parent's command line; a child of sparkafka's zygote is named after the launcher Spark "
                "started it for). RSS counts a page shared by several processes once per process; PSS "
                "shares it out.",
                *memory,
            ]
    map_rows = [row for row in all_rows if row.config.workload == "map"]
    cdf = plot_dir / f"{context.name}-latency-cdf.png"
    limit_ms = context.commit_interval_ms + 2000
    if context.latency and plots.latency_cdf_chart(map_rows, limit_ms, context.rate, cdf):
        lines += ["", "### Steady-rate latency (map)", "", f"![latency CDF]({link(cdf)})"]
    judged = targets(all_rows, context.commit_interval_ms, context.rate)
    if context.run_name is not None:
        # A run of a few systems: their variants against their base, and the targets it measured.
        lines += ["", "### Variants against their base", ""]
        lines += [f"- {line}" for line in variant_lines(all_rows)]
        judged = [line for line in judged if ": not measured" not in line]
    lines += ["", "### Targets", ""]
    lines += [f"- {line}" for line in judged]
    lines += [
        "",
        "### Setup",
        "",
        f"- Machine: {context.machine}",
        *[f"- {line}" for line in context.versions],
        f"- Command: `{context.command}`",
        f"- Raw results, every run of every system: [{link(results_file)}]({link(results_file)}); this "
        "section and its charts are made from them, running nothing, by "
        f"`python -m benchmarks.compare.results {results_file.as_posix()} "
        f"--update-docs {docs_file.as_posix()}`",
    ]
    lines += [f"- Not measured: {line}" for line in context.skipped]
    return "\n".join(lines)


def write(path: Path, section: str, context: RunContext) -> None:
    """Replace the section of ``context``'s run (quiet, loaded or named) in ``path``."""
    marker = f"<!-- benchmark:{context.name}"
    update_docs(path, section, f"{marker}:start -->", f"{marker}:end -->")
