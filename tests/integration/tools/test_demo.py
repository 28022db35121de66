"""`sparkafka demo` end to end: the README's main job must prove exactly-once on its own."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import Kafka


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """An existing cluster for the demo: the embedded broker, then Apache Kafka (``kafka`` in conftest)."""
    return kafka


def test_demo_kills_the_pipeline_and_verifies_exactly_once() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkafka", "demo"], capture_output=True, text=True, timeout=300
    )
    output = result.stdout
    assert result.returncode == 0, output[-4000:] + result.stderr[-4000:]
    last_line = output.strip().splitlines()[-1]
    assert re.fullmatch(
        r"exactly-once verified: in=6 out\(read_committed\)=6 duplicates=0 lost=0 "
        r"\(read_uncommitted saw [1-9]\d* duplicates\)",
        last_line,
    ), last_line
    assert "endTxnMarker: ABORT" in output and "endTxnMarker: COMMIT" in output
    assert "Reading uncommitted messages" in output and "Reading committed messages" in output
    assert "value = EVENT(mm,nn)" in output


def test_demo_reports_an_unreachable_cluster_clearly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkafka", "demo", "--bootstrap-servers", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "did not answer" in result.stderr and "127.0.0.1:1" in result.stderr


def test_demo_on_an_existing_cluster_uses_prefixed_topics(broker: Kafka) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkafka", "demo", "--bootstrap-servers", broker.bootstrap_servers],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert (
        result.stdout.strip().splitlines()[-1].startswith("exactly-once verified: in=6 out(read_committed)=6")
    )
    topics = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10).topics
    demo_topics = sorted(t for t in topics if t.startswith("sparkafka-demo-"))
    assert len(demo_topics) == 2 and demo_topics[0].endswith("-in") and demo_topics[1].endswith("-out")
