"""How the A/B command (benchmarks/ab.py) keeps and renders a comparison of the broker benchmark,
and that the pipeline comparisons kept before the broker's existed still load and render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import ab
from benchmarks.common import save_results

REPOSITORY = Path(__file__).resolve().parents[2]


def _broker_setup() -> ab.AbSetup:
    return ab.AbSetup(
        name="broker-example",
        title="An example",
        question="Does the broker take less CPU?",
        variants=[ab.Variant("before", "abc1234", "abc1234", []), ab.Variant("after", ".", "def5678", [])],
        benchmark_args=["--repeats", "2"],
        repeats=2,
        command="python -m benchmarks.ab ...",
        machine="a machine",
        benchmark=ab.BROKER,
    )


def _run(variant: str, repetition: int, size: int, cpu: float) -> ab.BrokerAbRun:
    return ab.BrokerAbRun(variant, repetition, size, 1_000_000, cpu, 5.0, cpu / 4, 0.5)


def test_a_broker_comparison_renders_every_measurement_per_size_and_variant(tmp_path: Path) -> None:
    runs = [
        _run("before", 0, 100, 0.30),
        _run("before", 0, 100, 0.34),
        _run("after", 0, 100, 0.20),
        _run("after", 0, 100, 0.22),
        _run("before", 1, 1024, 1.0),
        _run("before", 1, 1024, 1.2),
        _run("after", 1, 1024, 1.1),
        _run("after", 1, 1024, 0.9),
    ]
    results = tmp_path / "broker-example.json"
    save_results(results, runs, _broker_setup())

    loaded, setup = ab.load(results)
    assert loaded == runs and setup == _broker_setup()
    text = ab.render(loaded, setup, results)

    assert "| 100 B | before | abc1234 | 0.30 · 0.34 | 0.32 (0.30-0.34) | 0.0032 | 1.00x |" in text
    assert "| 100 B | after | def5678 | 0.20 · 0.22 | 0.21 (0.20-0.22) | 0.0021 | 0.66x |" in text
    assert "| 1024 B | after | def5678 | 1.10 · 0.90 | 1.00 (0.90-1.10) | 0.0010 | 0.91x |" in text
    # Every measurement of one variant below every one of the other, at 100 B only.
    assert "- 100 B, after against before: broker CPU 0.66x, outside the runs' spread" in text
    assert "- 1024 B, after against before: broker CPU 0.91x, within the runs' spread." in text
    assert "2 measurements per variant and size" in text
    assert "`python -m benchmarks.broker --no-tansu --no-apache-kafka --repeats 2`" in text
    assert "--benchmark broker --repeats 2 --variant before abc1234 ''" in text
    assert f"--from-results {results.as_posix()}" in text


def test_a_pipeline_comparison_kept_without_a_benchmark_name_is_read_as_one() -> None:
    kept = REPOSITORY / "docs" / "benchmarks" / "ab" / "progress-producer.json"
    assert "benchmark" not in json.loads(kept.read_text())["setup"]

    runs, setup = ab.load(kept)

    assert setup.benchmark == ab.PIPELINE
    assert runs and all(isinstance(run, ab.AbRun) for run in runs)
    assert "| records/s median (min-max) |" in ab.render(runs, setup, kept)


def test_a_file_of_another_kind_is_refused_naming_it(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"version": 1, "runs": []}))
    with pytest.raises(ValueError, match=r"other\.json is not an A/B comparison results file"):
        ab.load(other)
