"""PNG charts of a comparison: throughput bars per workload (median, whiskers min-max) and the latency
CDF of the steady-rate phase. matplotlib with the Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from benchmarks.compare.report import Row
from matplotlib.ticker import StrMethodFormatter

GUARANTEE_COLOURS = {"exactly-once": "#1f77b4", "at-least-once": "#ff7f0e"}


def throughput_chart(workload_rows: list[Row], workload: str, path: Path) -> None:
    systems = list(dict.fromkeys(row.config.system.label for row in workload_rows))
    guarantees = [g for g in GUARANTEE_COLOURS if any(r.config.guarantee == g for r in workload_rows)]
    width = 0.8 / max(len(guarantees), 1)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(systems) + 2), 4.5))
    labelled: set[str] = set()
    for index, guarantee in enumerate(guarantees):
        for position, system in enumerate(systems):
            row = next(
                (
                    r
                    for r in workload_rows
                    if r.config.system.label == system and r.config.guarantee == guarantee
                ),
                None,
            )
            if row is None:
                continue
            x = position + (index - (len(guarantees) - 1) / 2) * width
            spread = row.spread(lambda r: r.throughput)
            if spread is None:
                axes.text(x, 0, "failed", rotation=90, ha="center", va="bottom", color="red", fontsize=8)
                continue
            axes.bar(
                x,
                spread.median,
                width,
                yerr=[[spread.median - spread.low], [spread.high - spread.median]],
                capsize=4,
                color=GUARANTEE_COLOURS[guarantee],
                label=None if guarantee in labelled else guarantee,
            )
            labelled.add(guarantee)
            axes.text(x, spread.high, f"{spread.median:,.0f}", ha="center", va="bottom", fontsize=7)
    axes.set_xticks(range(len(systems)), systems, rotation=15, ha="right")
    axes.set_ylabel("records/s (median, whiskers min-max)")
    axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.set_title(f"{workload}: throughput")
    axes.legend()
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def latency_cdf_chart(map_rows: list[Row], limit_ms: float, rate: float, path: Path) -> bool:
    """The chart, if any row has latencies; False when there was nothing to draw."""
    drawn = False
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    # One colour per system, the line style tells the guarantee.
    systems = list(dict.fromkeys(row.config.system.label for row in map_rows))
    palette = plt.get_cmap("tab10")
    for row in map_rows:
        quantiles = row.latency_quantiles()
        if not quantiles:
            continue
        fractions = [(i + 1) / len(quantiles) for i in range(len(quantiles))]
        axes.plot(
            [max(q, 1.0) for q in quantiles],  # the log axis cannot show <= 0 (clock skew)
            fractions,
            "-" if row.config.guarantee == "exactly-once" else "--",
            color=palette(systems.index(row.config.system.label) % 10),
            label=row.config.label,
        )
        drawn = True
    if drawn:
        axes.axvline(limit_ms, color="grey", linestyle=":", label=f"target p99 ≤ {limit_ms:,.0f} ms")
        axes.axhline(0.99, color="grey", linewidth=0.5)
        axes.set_xscale("log")
        axes.set_xlabel("end-to-end latency, ms (log scale)")
        axes.set_ylabel("fraction of records")
        axes.set_title(f"map at {rate:,.0f} records/s: latency CDF (read_committed)")
        axes.legend(fontsize=7)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn
