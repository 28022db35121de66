"""Fixtures for the tests that run against more than one Kafka: the embedded broker and Apache
Kafka's own (tests/integration/apache_kafka.py), with the same test code and the same assertions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
from pyspark.sql import SparkSession

from sparkafka.broker.runner import BrokerProcess

from ..conftest import FAST_BROKER_ARGS
from .apache_kafka import KAFKA_VERSIONS, NEWEST, ApacheKafka
from .kafka_clients import create_topic
from .kafka_cluster import PARTITIONS as CLUSTER_PARTITIONS
from .spark_session import local_spark_session

INTEGRATION_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration carries the ``integration`` marker, by its folder."""
    for item in items:
        if INTEGRATION_TESTS in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)


EMBEDDED = "embedded"
APACHE_KAFKA = f"apache-kafka-{NEWEST}"
# Every pinned Apache Kafka: the newest 4.x and the newest 3.9.x.
ALL_APACHE_KAFKAS = [f"apache-kafka-{version}" for version in KAFKA_VERSIONS]


class Kafka(Protocol):
    """What a test needs of a running Kafka, whichever it is."""

    @property
    def bootstrap_servers(self) -> str: ...


def started_kafka(kind: str, directory: Path) -> BrokerProcess | ApacheKafka:
    if kind == EMBEDDED:
        return BrokerProcess(directory / "data", extra_args=FAST_BROKER_ARGS)
    return ApacheKafka(directory / "apache-kafka", kind.removeprefix("apache-kafka-"))


@pytest.fixture(params=[EMBEDDED, APACHE_KAFKA])
def fresh_kafka(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kafka]:
    """A Kafka of the test's own: the embedded broker, then the newest Apache Kafka.

    Kafka 3.9 is a parameter only where it behaves otherwise for sparkafka (``indirect`` with
    :data:`ALL_APACHE_KAFKAS`): librdkafka speaks transaction version 1 to both 3.9 and 4.x, so the
    broker's side of a transaction differs only where tests/integration/connector/test_transactions_v2.py
    shows it; the crash test of every protocol point and the coordinator's start-up run on both."""
    with started_kafka(request.param, tmp_path) as kafka:
        yield kafka


@pytest.fixture(scope="module", params=[EMBEDDED, APACHE_KAFKA])
def kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    """One Kafka shared by a test module: the embedded broker, then the newest Apache Kafka."""
    with started_kafka(request.param, tmp_path_factory.mktemp(request.param)) as running:
        yield running


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole test session (:func:`.spark_session.local_spark_session`),
    started by the first test that asks for it."""
    session = local_spark_session()
    yield session
    session.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ApacheKafka]:
    """A 3-node Apache Kafka of the test's own, with ``in`` and ``out`` on every node."""
    with ApacheKafka(tmp_path / "kafka", nodes=3) as running:
        for topic in ("in", "out"):
            create_topic(running.bootstrap_servers, topic, partitions=CLUSTER_PARTITIONS, replicas=3)
        yield running
