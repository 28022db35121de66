"""The format examples run as a user runs them: `python examples/<name>.py`, one command each, against
the embedded broker (and its Schema Registry) they start themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TIMEOUT_S = 300


def run_example(name: str, log: Path) -> str:
    """Run the example; its output goes to a file (Spark may write more than a pipe holds)."""
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLES / name)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    try:
        process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGINT, not SIGKILL: the example's finally block stops the broker it started.
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        pytest.fail(f"{name} did not finish within {TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
    text = log.read_text()
    assert process.returncode == 0, f"{name} failed:\n{text[-6000:]}"
    return text


def test_json_dead_letter_example(tmp_path: Path) -> None:
    output = run_example("json_dead_letter.py", tmp_path / "example.log")
    assert "orders-priced (4 records, read_committed):" in output
    assert '{"id":"o-4","item":"scone","total":7.5}' in output
    assert "orders-dlq (3 records, read_committed):" in output
    assert "from orders/0@2: field 'qty' does not hold a valid int" in output
    assert "from orders/0@4: the value is not valid JSON" in output
    assert "from orders/0@5: required field 'id' (NOT NULL in the schema) is missing or null" in output


def test_avro_registry_example(tmp_path: Path) -> None:
    output = run_example("avro_registry.py", tmp_path / "example.log")
    assert "subject payments-value, versions [1, 2]" in output
    assert "payments-eur (4 records, read_committed, Confluent's AvroDeserializer):" in output
    # A v1 record decoded with the v2 reader schema gets the default currency.
    assert "{'id': 'p-1', 'euros': 12.5, 'original_currency': 'EUR'}" in output
    assert "{'id': 'p-3', 'euros': 58.5, 'original_currency': 'GBP'}" in output
    assert "payments-dlq (2 records, read_committed):" in output
    assert "from payments@2: schema id 999 is not in the schema registry" in output
    assert "from payments@4: unknown magic byte 123" in output
