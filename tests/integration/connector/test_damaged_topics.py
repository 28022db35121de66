"""Topics the connector cannot use as they are: a damaged batch in the input or in the commit
markers, and a marker topic refusing the sink's records. Each stops the query with a message naming
the topic, the offset and the way out; nothing is skipped or written twice silently.

Each damage test runs a broker process of its own (`fresh_broker`): it is stopped, a byte of a
stored batch is flipped, and it is started again on the same data."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.commit_log import read_marker_partition
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.errors import CommitMarkerError
from tests.integration.kafka_clients import create_topic, end_offsets, producer, read_to_end
from tests.log_damage import flip_byte_in_batch


def _send(bootstrap: str, topic: str, batches: int, per_batch: int) -> None:
    """``batches`` batches of ``per_batch`` records each, one flush apiece."""
    sender = producer(bootstrap, acks="all")
    for batch in range(batches):
        for i in range(per_batch):
            sender.produce(topic, value=f"r{batch * per_batch + i:04d}".encode(), partition=0)
        assert sender.flush(30) == 0


def _damage(broker: BrokerProcess, topic: str, offset: int, partition: int = 0) -> None:
    """Stop the broker cleanly and flip a byte of the stored batch holding ``offset``: a clean
    shutdown leaves nothing to rescan, so only the fetch-time CRC check can tell."""
    broker.terminate()
    [segment] = sorted((broker.data_dir / f"{topic}-{partition}").glob("*.log"))
    flip_byte_in_batch(segment, offset)
    broker.start()


def _exactly_once_query(spark: SparkSession, bootstrap: str, source: str, marker_topic: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", f"{source}-out")
        .option("deliveryGuarantee", "exactly-once")
        .option("commitMarkerTopic", marker_topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
    )


def test_a_damaged_input_batch_fails_the_read_naming_its_offset(
    spark: SparkSession, fresh_broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name)
    _send(fresh_broker.bootstrap_servers, topic_name, batches=3, per_batch=10)
    _damage(fresh_broker, topic_name, offset=10)

    with pytest.raises(Exception) as failed:  # Spark wraps the connector's error
        (
            spark.read.format("sparkafka")
            .option("kafka.bootstrap.servers", fresh_broker.bootstrap_servers)
            .option("subscribe", topic_name)
            .load()
            .collect()
        )
    message = str(failed.value)
    assert f"reading topic '{topic_name}' partition 0 offsets [0, 30) failed at offset 10" in message
    assert "stored copy of that batch is damaged" in message
    assert "startingOffsets" in message


def test_a_damaged_commit_marker_stops_the_exactly_once_write(
    spark: SparkSession, fresh_broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """Without its markers the sink cannot tell which batches an id already committed: it refuses
    to write rather than guess, and writes nothing more. The damaged record is the registration of
    write partition 0's id, which the next run reads (it was written after the run's snapshot of
    the commit log)."""
    bootstrap = fresh_broker.bootstrap_servers
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic_name)
    create_topic(bootstrap, f"{topic_name}-out")
    _send(bootstrap, topic_name, batches=1, per_batch=10)
    _exactly_once_query(spark, bootstrap, topic_name, marker_topic, tmp_path).start().awaitTermination(120)
    assert len(read_to_end(bootstrap, f"{topic_name}-out")) == 10
    [registration] = [
        m
        for m in read_to_end(bootstrap, marker_topic, partitions=16)
        if (m.key() or b"").startswith(b"registration/") and (m.key() or b"").endswith(b"-0")
    ]

    _damage(fresh_broker, marker_topic, offset=registration.offset(), partition=registration.partition())
    _send(bootstrap, topic_name, batches=1, per_batch=10)
    query = _exactly_once_query(spark, bootstrap, topic_name, marker_topic, tmp_path).start()
    with pytest.raises(Exception) as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    where = f"{marker_topic}-{registration.partition()} failed at offset {registration.offset()}"
    assert f"reading commit markers from {where}" in message
    assert "The broker found its stored copy damaged" in message
    assert len(read_to_end(bootstrap, f"{topic_name}-out")) == 10


def test_a_marker_topic_refusing_the_registration_record_stops_the_write(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """A compacted marker topic created with a max.message.bytes too small for the sink's records:
    the first record, the id's registration, is refused, and the message names the setting."""
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic_name)
    create_topic(broker.bootstrap_servers, f"{topic_name}-out")
    create_topic(
        broker.bootstrap_servers,
        marker_topic,
        config={"cleanup.policy": "compact", "max.message.bytes": "100"},
    )
    _send(broker.bootstrap_servers, topic_name, batches=1, per_batch=3)
    query = _exactly_once_query(spark, broker.bootstrap_servers, topic_name, marker_topic, tmp_path).start()
    with pytest.raises(Exception) as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    assert f"in the commit-marker topic '{marker_topic}' failed" in message
    assert "max.message.bytes" in message
    assert "KafkaError{" not in message  # the broker's reason itself, not the error object's repr
    assert end_offsets(broker.bootstrap_servers, f"{topic_name}-out", partitions=1) == [0]  # nothing sent


def test_a_marker_topic_deleted_while_the_query_runs_stops_the_write(broker: BrokerProcess) -> None:
    """The driver checks the marker topic when the query starts; a task that finds it gone since
    (its partition unknown to the cluster) writes nothing and names the way out."""
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"  # never created: as if deleted
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "operationTimeoutMs": "5000",
        }
    )
    with pytest.raises(CommitMarkerError) as raised:
        read_marker_partition(options)
    message = str(raised.value)
    assert f"the commit-marker topic '{marker_topic}' has no partition 0 any more" in message
    assert "restore the topic from a backup, or start the query again with a new checkpoint" in message
