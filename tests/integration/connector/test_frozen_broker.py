"""A broker that stops answering (SIGSTOP: its connections stay open, its requests wait unread): the
connector's offset queries, on the driver and on an executor, give up after their timeout with an
error naming what they asked, the cluster and the option that sets the wait.

The module's broker process is its own (the ``broker`` fixture is one per module), so freezing it
touches no other test; every test thaws it before it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.kafka_admin import KafkaAdmin
from sparkafka.connector.sink.commit_log import read_marker_partition
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.options import SourceOptions
from sparkafka.connector.source.reader import read_offset_range
from sparkafka.errors import KafkaUnavailableError, SparkafkaError
from tests.integration.kafka_clients import create_topic, producer

TIMEOUT_S = 2


@contextlib.contextmanager
def frozen(broker: BrokerProcess) -> Iterator[None]:
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def answered_while_awake(admin: KafkaAdmin, topic: str) -> dict[tuple[str, int], int]:
    """The first answer of a client still connecting: on a loaded machine, connecting, learning
    the metadata and listing the offsets may take longer than the short timeout under test, so
    the awake broker is asked again (for at most 60 s) rather than failing the test before the
    freeze it is about."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return admin.latest_offsets([(topic, 0)], read_committed=False)
        except KafkaUnavailableError:
            if time.monotonic() >= deadline:
                raise


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    """A topic of one partition holding offsets 0-2."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, name)
    writer = producer(broker.bootstrap_servers)
    for value in (b"a", b"b", b"c"):
        writer.produce(name, value=value)
    assert writer.flush(30) == 0
    return name


def test_the_latest_offsets_of_a_frozen_broker_fail_after_the_timeout(
    broker: BrokerProcess, topic: str
) -> None:
    admin = KafkaAdmin(
        {"bootstrap.servers": broker.bootstrap_servers}, timeout_s=TIMEOUT_S, retry_interval_s=0.2
    )
    try:
        # The client knows the partition's leader: the request goes to it, and waits.
        assert answered_while_awake(admin, topic) == {(topic, 0): 3}
        started = time.monotonic()
        with frozen(broker), pytest.raises(KafkaUnavailableError) as raised:
            admin.latest_offsets([(topic, 0)], read_committed=False)
        assert time.monotonic() - started < TIMEOUT_S + 3
    finally:
        admin.close()
    message = str(raised.value)
    assert (
        f"could not list the offsets of [('{topic}', 0)]: Kafka at bootstrap servers "
        f"'{broker.bootstrap_servers}' did not answer within {TIMEOUT_S} s"
    ) in message
    assert "Check kafka.bootstrap.servers, that the brokers are up and reachable" in message
    assert "kafka.default.api.timeout.ms" in message


def test_an_executor_reading_from_a_frozen_broker_fails_after_the_timeout(
    broker: BrokerProcess, topic: str
) -> None:
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "subscribe": topic,
            "kafka.default.api.timeout.ms": str(TIMEOUT_S * 1000),
        }
    ).for_batch()
    offsets = OffsetRange(topic, 0, 0, 3)
    # The executor's pooled consumer is connected and has read from the broker before.
    assert sum(batch.num_rows for batch in read_offset_range(offsets, options)) == 3
    started = time.monotonic()
    with frozen(broker), pytest.raises(KafkaUnavailableError) as raised:
        list(read_offset_range(offsets, options))
    assert time.monotonic() - started < TIMEOUT_S + 3
    message = str(raised.value)
    assert (
        f"could not read the offsets of topic '{topic}' partition 0 from Kafka at bootstrap servers "
        f"'{broker.bootstrap_servers}' within {TIMEOUT_S} s"
    ) in message
    assert (
        "Check kafka.bootstrap.servers, that the brokers are up and reachable from the Spark executors"
        in message
    )
    assert "kafka.default.api.timeout.ms" in message


def test_the_commit_markers_of_a_frozen_broker_fail_after_the_timeout(broker: BrokerProcess) -> None:
    """A write task reads the commit markers before it writes: a broker that stops answering then
    fails the task after operationTimeoutMs (Spark retries it), naming what it asked."""
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, marker_topic, config={"cleanup.policy": "compact"})
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "operationTimeoutMs": str(TIMEOUT_S * 1000),
        }
    )
    assert read_marker_partition(options) == {}  # the pooled clients know the broker
    started = time.monotonic()
    with frozen(broker), pytest.raises(SparkafkaError) as raised:
        read_marker_partition(options)
    assert time.monotonic() - started < TIMEOUT_S + 3
    message = str(raised.value)
    assert f"read the offsets of {marker_topic}" in message
    assert broker.bootstrap_servers in message
    assert "operationTimeoutMs" in message
