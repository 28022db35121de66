"""Medians and spreads over the repetitions, the tables, and whether the targets are met."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.compare.measure import Config, RunResult


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @staticmethod
    def of(values: list[float]) -> Spread | None:
        return Spread(statistics.median(values), min(values), max(values)) if values else None

    def format(self, digits: int = 0) -> str:
        def number(value: float) -> str:
            return f"{value:,.{digits}f}"

        if number(self.low) == number(self.high):
            return number(self.median)
        return f"{number(self.median)} ({number(self.low)}-{number(self.high)})"


@dataclass
class Row:
    """Every repetition of one configuration; metrics come from the correct runs only."""

    config: Config
    runs: list[RunResult]

    @property
    def correct_runs(self) -> list[RunResult]:
        return [run for run in self.runs if run.ok]

    @property
    def status(self) -> str:
        failed = [run for run in self.runs if not run.ok]
        killed = sum(run.killed for run in self.runs)
        # Not a correctness problem, but the runner contract asks for an exit within ~10 s of SIGTERM.
        note = f"; {killed} did not stop on SIGTERM" if killed else ""
        if not failed:
            return f"ok {len(self.runs)}/{len(self.runs)}{note}"
        return f"FAILED {len(failed)}/{len(self.runs)}: {'; '.join(failed[0].problems)}{note}"

    def spread(self, metric: Callable[[RunResult], float | None]) -> Spread | None:
        return Spread.of([value for run in self.correct_runs if (value := metric(run)) is not None])

    def cell(self, metric: Callable[[RunResult], float | None], digits: int = 0) -> str:
        spread = self.spread(metric)
        return spread.format(digits) if spread is not None else "-"

    def latency_quantiles(self) -> list[float]:
        """Pooled latency quantiles of the correct runs (each run contributes equally)."""
        return sorted(q for run in self.correct_runs for q in run.latency_quantiles_ms)


def rows(results: list[RunResult]) -> list[Row]:
    grouped: dict[Config, list[RunResult]] = {}
    for result in results:
        grouped.setdefault(result.config, []).append(result)
    return [Row(config, runs) for config, runs in grouped.items()]


def table(workload_rows: list[Row], with_latency: bool) -> list[str]:
    header = [
        "system", "guarantee", "correct", "records/s", "start-up s", "start → done s",
        "CPU s", "CPU s per M after first output", "peak RSS MiB", "peak PSS MiB", "broker CPU s",
    ]  # fmt: skip
    if with_latency:
        header += ["latency p50 ms", "latency p99 ms", "steady rate achieved"]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | --- |" + " ---: |" * (len(header) - 3)]
    for row in workload_rows:
        cells = [
            row.config.system.label,
            row.config.guarantee,
            row.status.replace("|", "\\|"),
            row.cell(lambda r: r.throughput),
            row.cell(lambda r: r.startup_s, 1),
            row.cell(lambda r: r.total_s, 1),
            row.cell(lambda r: r.cpu_s, 1),
            row.cell(lambda r: r.cpu_s_per_million, 1),
            row.cell(lambda r: r.peak_rss_mib),
            row.cell(lambda r: r.peak_pss_mib),
            row.cell(lambda r: r.broker_cpu_s, 1),
        ]
        if with_latency:
            cells += [
                row.cell(lambda r: r.latency_p50_ms),
                row.cell(lambda r: r.latency_p99_ms),
                row.cell(lambda r: r.steady_rate),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _find(all_rows: list[Row], system: str, guarantee: str, workload: str) -> Row | None:
    return next(
        (
            row
            for row in all_rows
            if row.config.system.name == system
            and row.config.guarantee == guarantee
            and row.config.workload == workload
        ),
        None,
    )


@dataclass(frozen=True)
class _Bound:
    """sparkafka exactly-once's median of ``metric`` (in ``workload``) held against another system's:
    at most ``factor`` times it where lower is better, at least ``factor`` times it otherwise.
    ``with_total``: also show the ratio of the times from start to done."""

    what: str
    metric: Callable[[RunResult], float | None]
    unit: str
    other: tuple[str, str]
    factor: float
    lower_is_better: bool = True
    workload: str = "map"
    digits: int = 1
    with_total: bool = False

    def judge(self, all_rows: list[Row]) -> str:
        ours = _find(all_rows, "sparkafka", "exactly-once", self.workload)
        theirs = _find(all_rows, *self.other, self.workload)
        ours_spread = ours.spread(self.metric) if ours else None
        theirs_spread = theirs.spread(self.metric) if theirs else None
        if ours is None or theirs is None or ours_spread is None or theirs_spread is None:
            missing = "sparkafka" if ours_spread is None else self.other[0]
            return f"{self.what}: not measured (no correct run of {missing} measured it)"
        ratio = ours_spread.median / theirs_spread.median
        met = ratio <= self.factor if self.lower_is_better else ratio >= self.factor
        medians = (
            f"medians {ours_spread.median:,.{self.digits}f} vs {theirs_spread.median:,.{self.digits}f} "
            f"{self.unit}"
        )
        return (
            f"{self.what}: {'met' if met else 'NOT met'} ({ratio:.2f}x, {medians}{self._total(ours, theirs)})"
        )

    def _total(self, ours: Row, theirs: Row) -> str:
        # records/s starts at the first visible output, which flatters late, large commits; the time
        # from start to done does not, so its ratio is shown next to it.
        ours_total, theirs_total = ours.spread(lambda r: r.total_s), theirs.spread(lambda r: r.total_s)
        if not self.with_total or ours_total is None or theirs_total is None:
            return ""
        return f"; by start → done {theirs_total.median / ours_total.median:.2f}x"


def _throughput(what: str, workload: str, other: tuple[str, str], factor: float) -> _Bound:
    """At least ``factor`` times the other system's records/s."""
    return _Bound(
        what, lambda r: r.throughput, "records/s", other, factor,
        lower_is_better=False, workload=workload, digits=0, with_total=True,
    )  # fmt: skip


_THROUGHPUT_BOUNDS = (
    _throughput(
        "sparkafka exactly-once ≥ 0.8x Spark's kafka connector at-least-once (map)",
        "map", ("spark-kafka", "at-least-once"), 0.8,
    ),
    _throughput(
        "sparkafka exactly-once ≥ 1.0x Spark's kafka connector at-least-once (count)",
        "count", ("spark-kafka", "at-least-once"), 1.0,
    ),
    _throughput(
        "sparkafka exactly-once ≥ 1.0x PyFlink EXACTLY_ONCE with a Python UDF (map)",
        "map", ("flink-python", "exactly-once"), 1.0,
    ),
    _throughput(
        "sparkafka exactly-once ≥ 2x Quix Streams exactly-once (map)",
        "map", ("quix", "exactly-once"), 2.0,
    ),
)  # fmt: skip

# Start-up, memory, CPU and latency against the alternatives (issue: start faster and lighter).
_FOOTPRINT_BOUNDS = (
    _Bound(
        "sparkafka exactly-once start-up ≤ Spark's kafka connector's (map)",
        lambda r: r.startup_s, "s", ("spark-kafka", "at-least-once"), 1.0,
    ),
    _Bound(
        "sparkafka exactly-once peak RSS ≤ 1.3x Spark's kafka connector's (map)",
        lambda r: r.peak_rss_mib, "MiB", ("spark-kafka", "at-least-once"), 1.3,
    ),
    _Bound(
        "sparkafka exactly-once CPU per M after first output ≤ Spark's kafka connector's (map)",
        lambda r: r.cpu_s_per_million, "CPU s", ("spark-kafka", "at-least-once"), 1.0,
    ),
    _Bound(
        "sparkafka exactly-once CPU per M after first output ≤ 2x the confluent-kafka loop's (map)",
        lambda r: r.cpu_s_per_million, "CPU s", ("handwritten", "exactly-once"), 2.0,
    ),
    _Bound(
        "sparkafka exactly-once p99 latency ≤ PyFlink EXACTLY_ONCE's with a Python UDF (map)",
        lambda r: r.latency_p99_ms, "ms", ("flink-python", "exactly-once"), 1.0,
    ),
    _Bound(
        "stretch: sparkafka exactly-once ≥ 1.0x PyFlink EXACTLY_ONCE with a Java UDF (map)",
        lambda r: r.throughput, "records/s", ("flink-java", "exactly-once"), 1.0, lower_is_better=False,
    ),
)  # fmt: skip


# What a variant is held against its base by (lower is better for all but records/s).
_VARIANT_METRICS: tuple[tuple[str, Callable[[RunResult], float | None], str], ...] = (
    ("start-up", lambda r: r.startup_s, "s"),
    ("CPU", lambda r: r.cpu_s, "s"),
    ("CPU per M after first output", lambda r: r.cpu_s_per_million, "s"),
    ("records/s", lambda r: r.throughput, ""),
    ("latency p99", lambda r: r.latency_p99_ms, "ms"),
    ("peak RSS", lambda r: r.peak_rss_mib, "MiB"),
)


def variant_lines(all_rows: list[Row]) -> list[str]:
    """Each row of a variant (a system run with settings of its own) against its base system's row
    (the same runner without them), of the same workload and guarantee: the ratio of the medians."""
    lines = []
    for row in all_rows:
        system = row.config.system
        if not system.variables:
            continue
        base = next(
            (
                other
                for other in all_rows
                if other.config.system.runner == system.runner
                and not other.config.system.variables
                and (other.config.workload, other.config.guarantee)
                == (row.config.workload, row.config.guarantee)
            ),
            None,
        )
        if base is None:
            continue
        ratios = []
        for name, metric, unit in _VARIANT_METRICS:
            ours, theirs = row.spread(metric), base.spread(metric)
            if ours is not None and theirs is not None and theirs.median:
                ratios.append(
                    f"{name} {ours.median / theirs.median:.2f}x ({ours.median:,.1f} vs {theirs.median:,.1f}"
                    f"{' ' + unit if unit else ''})"
                )
        lines.append(
            f"{system.label} against {base.config.system.label}, {row.config.guarantee} "
            f"{row.config.workload}, medians: {', '.join(ratios)}"
        )
    return lines


def targets(all_rows: list[Row], commit_interval_ms: int, rate: float) -> list[str]:
    lines = [bound.judge(all_rows) for bound in _THROUGHPUT_BOUNDS]
    for workload in ("map", "count"):
        if _find(all_rows, "sparkafka", "exactly-once", workload) is not None:
            lines.append(
                _throughput(
                    f"sparkafka exactly-once ≥ 0.85x its at-least-once ({workload})",
                    workload, ("sparkafka", "at-least-once"), 0.85,
                ).judge(all_rows)
            )  # fmt: skip
    lines += [bound.judge(all_rows) for bound in _FOOTPRINT_BOUNDS]
    limit_ms = commit_interval_ms + 2000
    what = f"sparkafka exactly-once p99 latency ≤ trigger + 2 s = {limit_ms:,} ms at {rate:,.0f} records/s"
    ours = _find(all_rows, "sparkafka", "exactly-once", "map")
    p99 = ours.spread(lambda r: r.latency_p99_ms) if ours else None
    achieved = ours.spread(lambda r: r.steady_rate) if ours else None
    if p99 is None:
        lines.append(f"{what}: not measured")
    else:
        verdict = "met" if p99.median <= limit_ms else "NOT met"
        rate_note = ""
        if achieved is not None and achieved.median < 0.95 * rate:
            rate_note = f"; the producer achieved only {achieved.median:,.0f} records/s"
        lines.append(f"{what}: {verdict} (median p99 {p99.median:,.0f} ms{rate_note})")
    return lines


# The systems of the peak-RSS target, whose memory is shown process by process.
MEMORY_SYSTEMS = ("sparkafka", "spark-kafka")


def memory_lines(workload_rows: list[Row]) -> list[str]:
    """Where the memory goes: for each configuration of :data:`MEMORY_SYSTEMS`, its process tree at
    the peak of the run whose peak RSS is the median of its correct runs, per kind of process."""
    lines: list[str] = []
    for row in workload_rows:
        if row.config.system.name not in MEMORY_SYSTEMS:
            continue
        measured = sorted(
            (run for run in row.correct_runs if run.peak_memory_by_process and run.peak_rss_mib is not None),
            key=lambda run: run.peak_rss_mib or 0.0,
        )
        if not measured:
            continue
        run = measured[(len(measured) - 1) // 2]
        lines += [
            "",
            f"**{row.config.label}** (repetition {run.repeat}, peak RSS {run.peak_rss_mib:,.0f} MiB):",
            "",
            "| process | count | RSS MiB | PSS MiB |",
            "| --- | ---: | ---: | ---: |",
        ]
        # A process that exited while the peak sample was labelled left nothing to show.
        for group in (g for g in run.peak_memory_by_process or [] if g["rss_mib"] > 0):
            pss = "-" if group["pss_mib"] is None else f"{group['pss_mib']:,.0f}"
            lines.append(f"| {group['process']} | {group['count']} | {group['rss_mib']:,.0f} | {pss} |")
    return lines
