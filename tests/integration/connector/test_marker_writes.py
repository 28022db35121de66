"""The driver's own writes to the commit-marker topic when the topic refuses them: the write fails
naming the topic and what happens next; nothing is taken as written (real broker, the sink's own
code)."""

from __future__ import annotations

import time
import uuid

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.markers import ProgressRecord, read_marker_partition
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.producers import write_progress
from sparkafka.errors import CommitMarkerError
from tests.integration.kafka_clients import create_topic


def _options(bootstrap: str, marker_topic: str) -> SinkOptions:
    return SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "operationTimeoutMs": "20s",
        }
    )


def test_a_progress_record_the_marker_topic_refuses_fails_the_commit_naming_the_topic(
    broker: BrokerProcess,
) -> None:
    """A marker topic whose max.message.bytes is below the progress record's size: the driver's
    commit fails (Spark then retries the batch) instead of going on without the record."""
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(
        broker.bootstrap_servers,
        marker_topic,
        config={"cleanup.policy": "compact", "max.message.bytes": "100"},
    )
    options = _options(broker.bootstrap_servers, marker_topic)
    record = ProgressRecord("p", "q-1", 3, "plan", ('{"in":{"0":10}}',), int(time.time() * 1000))
    with pytest.raises(CommitMarkerError) as refused:
        write_progress(options, record)
    message = str(refused.value)
    assert f"writing the progress record to the commit-marker topic '{marker_topic}' failed" in message
    assert "the batch fails, and Spark retries it" in message
    assert read_marker_partition(options) == {}, "nothing of the record is in the topic"
