"""Shared fixtures: a real `sparkafka broker` child process per test module or test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from tests.ports import start_broker_on_a_low_port

# How scripts/check shares the suite between its workers (--schedule-by-cost).
pytest_plugins = ["tests.scheduling"]

# Spark's JVMs (the test session's and those of pipeline child processes, which inherit this) start
# about twice as fast with the C1 compiler only and the serial collector. Test jobs are small, so peak
# JIT throughput does not matter; production sessions keep the JVM defaults.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Every broker a test starts on "any port" gets one below the ephemeral range (tests/ports.py says why).
_start_on_any_port = BrokerProcess.start
BrokerProcess.start = lambda self: start_broker_on_a_low_port(self, _start_on_any_port)

# Tests do not need Kafka's 3 s wait for more members before the first rebalance.
FAST_BROKER_ARGS = ["--group-initial-rebalance-delay-ms", "0", "--log-level", "DEBUG"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker process shared by a test module."""
    data_dir = tmp_path_factory.mktemp("broker") / "data"
    with BrokerProcess(data_dir, extra_args=FAST_BROKER_ARGS) as process:
        yield process


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker process of the test's own, for tests that kill or restart it."""
    with BrokerProcess(tmp_path / "data", extra_args=FAST_BROKER_ARGS) as process:
        yield process


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
