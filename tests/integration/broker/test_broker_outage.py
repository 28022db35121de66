"""The offset queries of the connector and the console across a broker outage.

librdkafka answers "unknown partition" both for a partition that does not exist and, during an
outage and for seconds after it, for one it has no metadata for. Taking the second for the first
failed a pipeline whose broker restarted, or, with failOnDataLoss=false, would skip its records.
And its ListOffsets reports offset -1001 with no error for partitions whose request the broker's
connection dropped: no offset, only a reason to ask again."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from sparkafka.broker.runner import BrokerProcess
from sparkafka.cli.console import Cluster, ConsoleError, _log_offsets
from sparkafka.connector.kafka_admin import KafkaAdmin, partition_watermarks
from tests.integration.kafka_clients import create_topic, producer

T = TypeVar("T")


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
    assert partition_watermarks(consumer, "present", 2, 60) is None
    assert partition_watermarks(consumer, "absent", 0, 60) is None
    # The cluster answered: no waiting out the timeout (either one alone would take 60 s).
    assert time.monotonic() - started < 30


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
    assert 2.5 < time.monotonic() - started < 30  # waited out the 3 s, and no more than that much longer
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


def test_latest_offsets_whose_request_the_broker_dropped_are_asked_again(fresh_broker: BrokerProcess) -> None:
    """librdkafka reports offset -1001 without an error for partitions whose leader request failed
    in flight; taken as an end offset, the source would plan a batch that reads backwards."""
    _filled_topic(fresh_broker, "dropped", 3)
    admin = KafkaAdmin({"bootstrap.servers": fresh_broker.bootstrap_servers}, timeout_s=30)
    wanted = [("dropped", 0), ("dropped", 1)]
    try:
        assert admin.latest_offsets(wanted, read_committed=False) == {("dropped", 0): 0, ("dropped", 1): 3}
        answer = _asked_while_the_request_is_dropped(
            fresh_broker, lambda: admin.latest_offsets(wanted, read_committed=False)
        )
        assert answer == {("dropped", 0): 0, ("dropped", 1): 3}
    finally:
        admin.close()


def test_topics_describe_refuses_to_show_offsets_whose_request_the_broker_dropped(
    fresh_broker: BrokerProcess,
) -> None:
    _filled_topic(fresh_broker, "shown", 2)
    cluster = Cluster(fresh_broker.bootstrap_servers, 30, [])
    admin = cluster.admin()
    partitions = [TopicPartition("shown", 0), TopicPartition("shown", 1)]
    assert _log_offsets(cluster, admin, partitions) == {("shown", 0): (0, 0, 0), ("shown", 1): (0, 2, 2)}
    answer = _asked_while_the_request_is_dropped(
        fresh_broker, lambda: _log_offsets(cluster, admin, partitions)
    )
    assert isinstance(answer, ConsoleError)
    assert "shown-0: its leader did not answer ListOffsets" in str(answer) or "shown-1: its leader" in str(
        answer
    )


def _asked_while_the_request_is_dropped(broker: BrokerProcess, ask: Callable[[], T]) -> T | Exception:
    """``ask()``'s answer, or what it raised, when the broker's connection breaks with its request in
    flight: frozen, the broker takes the request into its socket buffer and never answers; killed, the
    connection is reset. The broker is started again a second later."""
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    answers: list[T | Exception] = []

    def asking() -> None:
        try:
            answers.append(ask())
        except Exception as error:  # the caller checks what was raised
            answers.append(error)

    thread = threading.Thread(target=asking)
    thread.start()
    time.sleep(1)
    with _killed_and_restarted_after(broker, 1):
        thread.join(60)
    assert not thread.is_alive()
    return answers[0]
