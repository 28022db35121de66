"""The connector's offset queries across a broker outage (sparkafka.kafka_admin.partition_watermarks).

librdkafka answers "unknown partition" both for a partition that does not exist and, during an
outage and for seconds after it, for one it has no metadata for. Taking the second for the first
failed a pipeline whose broker restarted, or, with failOnDataLoss=false, would skip its records."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException

from sparkafka.broker.runner import BrokerProcess
from sparkafka.kafka_admin import KafkaAdmin, partition_watermarks

from .kafka_clients import create_topic, producer

pytestmark = pytest.mark.integration


@pytest.fixture
def consumer(fresh_broker: BrokerProcess) -> Iterator[Consumer]:
    client = Consumer(
        {
            "bootstrap.servers": fresh_broker.bootstrap_servers,
            "group.id": "outage-probe",  # never joined: offsets only
            "logger": logging.getLogger("outage-probe"),
        }
    )
    yield client
    client.close()


@contextlib.contextmanager
def _killed_and_restarted_after(broker: BrokerProcess, seconds: float) -> Iterator[None]:
    """SIGKILL the broker now and start it again ``seconds`` later, while the block runs."""
    broker.kill()

    def restart() -> None:
        time.sleep(seconds)
        broker.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        yield
    finally:
        restarter.join()


def _filled_topic(broker: BrokerProcess, name: str, records: int) -> None:
    create_topic(broker.bootstrap_servers, name, partitions=2)
    writer = producer(broker.bootstrap_servers)
    for index in range(records):
        writer.produce(name, value=b"%d" % index, partition=1)
    assert writer.flush(30) == 0


def test_the_watermarks_of_a_partition_and_of_none(fresh_broker: BrokerProcess, consumer: Consumer) -> None:
    _filled_topic(fresh_broker, "present", 7)
    assert partition_watermarks(consumer, "present", 1, 10) == (0, 7)
    started = time.monotonic()
    assert partition_watermarks(consumer, "present", 2, 10) is None
    assert partition_watermarks(consumer, "absent", 0, 10) is None
    # The cluster answered: no waiting out the timeout.
    assert time.monotonic() - started < 5


def test_a_broker_restart_within_the_timeout_is_waited_out(
    fresh_broker: BrokerProcess, consumer: Consumer
) -> None:
    _filled_topic(fresh_broker, "restarted", 5)
    assert partition_watermarks(consumer, "restarted", 1, 10) == (0, 5)
    with _killed_and_restarted_after(fresh_broker, 3):
        assert partition_watermarks(consumer, "restarted", 1, 30) == (0, 5)
    # Right after the restart the client still lacks metadata for a while; asked again at once:
    assert partition_watermarks(consumer, "restarted", 0, 30) == (0, 0)


def test_an_outage_longer_than_the_timeout_raises_after_the_timeout(
    fresh_broker: BrokerProcess, consumer: Consumer
) -> None:
    _filled_topic(fresh_broker, "down", 1)
    assert partition_watermarks(consumer, "down", 1, 10) == (0, 1)
    fresh_broker.kill()
    started = time.monotonic()
    with pytest.raises(KafkaException):
        partition_watermarks(consumer, "down", 1, 3)
    assert 2.5 < time.monotonic() - started < 10
    fresh_broker.start()


def test_latest_offsets_asked_during_a_broker_outage_leave_no_existing_partition_out(
    fresh_broker: BrokerProcess,
) -> None:
    """The source's end offsets: a partition left out is one the source reports as deleted."""
    _filled_topic(fresh_broker, "listed", 4)
    admin = KafkaAdmin({"bootstrap.servers": fresh_broker.bootstrap_servers}, timeout_s=30)
    wanted = [("listed", 0), ("listed", 1), ("listed", 2)]
    try:
        assert admin.latest_offsets(wanted, read_committed=True) == {("listed", 0): 0, ("listed", 1): 4}
        with _killed_and_restarted_after(fresh_broker, 2):
            # Asked while the broker is down: the answer waits for it.
            existing = wanted[:2]
            assert admin.latest_offsets(existing, read_committed=True) == {("listed", 0): 0, ("listed", 1): 4}
    finally:
        admin.close()
