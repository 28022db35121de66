"""`sparkafka verify`: the chaos proof, run small."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.integration.apache_kafka import ApacheKafka


def test_verify_with_pipeline_and_broker_kills_holds_exactly_once() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkafka",
            "verify",
            "--records",
            "300",
            "--kills",
            "2",
            "--send-seconds",
            "10",
            "--kill-broker",
            "--seed",
            "7",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "random seed: 7 (replay with --seed 7)" in result.stdout
    assert lines[-1].startswith("exactly-once verified: in=300 out(read_committed)=300 duplicates=0 lost=0")
    assert "reordered keys=0" in result.stdout
    # The seed has one kill wait for a write task holding its transaction open: the proof covers it.
    # Observed after the kill: an output partition's last stable offset below its high watermark.
    caught = re.search(r"kills that caught a transaction open: (\d) of 2", result.stdout)
    assert caught is not None and int(caught.group(1)) >= 1, result.stdout[-3000:]
    # Each caught transaction is aborted when the pipeline restarts (an ABORT marker on each of its
    # partitions) and its records are written again: read_uncommitted readers see them twice,
    # read_committed ones once.
    aborts = re.search(r"ABORT markers in the output: (\d+)", result.stdout)
    assert aborts is not None and int(aborts.group(1)) >= int(caught.group(1)), result.stdout[-3000:]
    uncommitted = re.search(r"read_uncommitted duplicates=(\d+)", result.stdout)
    assert uncommitted is not None and int(uncommitted.group(1)) >= 1, result.stdout[-3000:]
    # The broker restarts on purpose: its own clients' reconnection attempts are not printed.
    assert "|FAIL|" not in result.stdout + result.stderr, result.stderr[-3000:]


def test_verify_rejects_contradictory_options() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkafka",
            "verify",
            "--kill-broker",
            "--bootstrap-servers",
            "127.0.0.1:9092",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "--kill-broker" in result.stderr


def test_verify_usage_error_shows_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkafka", "verify", "--records", "zero"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Usage:" in result.stderr


def test_verify_on_apache_kafka_holds_exactly_once(tmp_path: Path) -> None:
    """The chaos proof against Apache Kafka's own broker (`--bootstrap-servers`): pipeline kills only,
    the broker is not ours to restart."""
    with ApacheKafka(tmp_path / "apache-kafka") as kafka:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparkafka",
                "verify",
                "--bootstrap-servers",
                kafka.bootstrap_servers,
                "--records",
                "300",
                "--kills",
                "2",
                "--send-seconds",
                "10",
                "--seed",
                "7",
            ],
            capture_output=True,
            text=True,
            timeout=400,
        )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("exactly-once verified: in=300 out(read_committed)=300 duplicates=0 lost=0"), last
    assert "ABORT markers in the output: not counted" in result.stdout
