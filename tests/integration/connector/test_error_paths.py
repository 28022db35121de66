"""The connector's refusals that need a real Kafka and a real Spark session to reach: each test makes
the mistake a user would, and asserts the message that names the thing and the way out."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

from sparkafka.errors import SparkafkaError
from sparkafka.eventtime import drop_heartbeats
from tests.integration.conftest import EMBEDDED, Kafka
from tests.integration.kafka_clients import create_topic, producer, read_all, read_to_end

pytestmark = pytest.mark.parametrize("kafka", [EMBEDDED], indirect=True)


@pytest.fixture
def topic(kafka: Kafka) -> Iterator[str]:
    """A two-partition topic holding five records in partition 0."""
    name = f"errors-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    sender = producer(kafka.bootstrap_servers)
    for i in range(5):
        sender.produce(name, value=f"r{i}".encode(), partition=0)
    assert sender.flush(30) == 0
    yield name


def _batch_read(spark: SparkSession, kafka: Kafka, **options: str) -> None:
    reader = spark.read.format("sparkafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
    for key, value in options.items():
        reader = reader.option(key, value)
    reader.load().collect()


def _refusal(spark: SparkSession, kafka: Kafka, **options: str) -> str:
    with pytest.raises(Exception) as refused:  # Spark wraps the connector's error
        _batch_read(spark, kafka, **options)
    return str(refused.value)


def test_assign_naming_partitions_that_do_not_exist(spark: SparkSession, kafka: Kafka, topic: str) -> None:
    message = _refusal(spark, kafka, assign=f'{{"{topic}": [0, 5]}}')
    assert "option 'assign' names partitions that do not exist" in message
    assert f"topic '{topic}' has 2 partitions" in message


def test_specific_starting_offsets_must_name_every_partition(
    spark: SparkSession, kafka: Kafka, topic: str
) -> None:
    message = _refusal(spark, kafka, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 1}}}}')
    assert "If startingOffsets contains specific offsets, you must specify all TopicPartitions" in message


def test_ending_offsets_beyond_the_end(spark: SparkSession, kafka: Kafka, topic: str) -> None:
    message = _refusal(spark, kafka, subscribe=topic, endingOffsets=f'{{"{topic}": {{"0": 50, "1": -1}}}}')
    assert f"endingOffsets for topic '{topic}' partition 0 is 50, beyond the" in message


def test_a_start_after_the_end(spark: SparkSession, kafka: Kafka, topic: str) -> None:
    message = _refusal(
        spark,
        kafka,
        subscribe=topic,
        startingOffsets=f'{{"{topic}": {{"0": 4, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 2, "1": -1}}}}',
    )
    assert f"startingOffsets for {topic}-0 (4) is greater than endingOffsets (2)" in message


def test_a_group_start_after_the_end(spark: SparkSession, kafka: Kafka, topic: str) -> None:
    """Only the cluster knows where a group's offsets start: checked once they are resolved."""
    group = f"g-{topic}"
    committer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    committer.close()
    message = _refusal(
        spark,
        kafka,
        subscribe=topic,
        startingOffsets="group",
        endingOffsets=f'{{"{topic}": {{"0": 2, "1": -1}}}}',
        **{"kafka.group.id": group},
    )
    assert (
        f"the starting offset 4 of topic '{topic}' partition 0 is after its ending offset 2 "
        "(startingOffsets / endingOffsets)"
    ) in message


def test_a_read_that_makes_no_progress_names_the_settings(
    spark: SparkSession, kafka: Kafka, topic: str
) -> None:
    """Fetches told to wait longer than the poll timeout for more bytes than the topic holds: the
    task fails after the poll timeout instead of hanging, naming both settings."""
    message = _refusal(
        spark,
        kafka,
        subscribe=topic,
        **{
            "kafka.fetch.min.bytes": "50000000",
            "kafka.fetch.wait.max.ms": "5000",
            "kafkaConsumer.pollTimeoutMs": "500",
        },
    )
    assert f"reading topic '{topic}' partition 0 offsets [0, 5) made no progress for 500 ms" in message
    assert "kafka.fetch.wait.max.ms=5000 lets the broker hold each fetch that long" in message


def test_a_custom_schema_is_refused(spark: SparkSession, kafka: Kafka, topic: str) -> None:
    reader = (
        spark.read.format("sparkafka")
        .schema("value STRING")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
    )
    with pytest.raises(
        Exception, match="Kafka source has a fixed schema and cannot be set with a custom one"
    ):
        reader.load().collect()


def test_exactly_once_in_a_plain_batch_write_is_refused(
    spark: SparkSession, kafka: Kafka, topic: str, tmp_path: Path
) -> None:
    """Refused on the driver for want of a checkpoint, and, given a path anyway, in the tasks, which
    find no streaming query; nothing is written either way."""
    frame = spark.createDataFrame([("a",)], "value STRING")
    writer = (
        frame.write.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("deliveryGuarantee", "exactly-once")
        .option("transactionalIdPrefix", f"plain-{topic}")
        .mode("append")
    )
    with pytest.raises(Exception, match=r"inside foreachBatch, the only place it works\) needs"):
        writer.save()
    with pytest.raises(Exception, match="deliveryGuarantee=exactly-once needs a streaming query"):
        writer.option("checkpointLocation", str(tmp_path / "not-a-query")).save()
    written = read_all(
        kafka.bootstrap_servers, topic, isolation="read_uncommitted", partitions=2, timeout_s=2
    )
    assert len(written) == 5  # the fixture's own records only


def test_a_marker_topic_the_broker_refuses_to_create(
    spark: SparkSession, kafka: Kafka, topic: str, tmp_path: Path
) -> None:
    """Kafka refuses a topic whose name collides with an existing one once '.' and '_' are alike."""
    create_topic(kafka.bootstrap_servers, f"markers_{topic}")
    marker_topic = f"markers.{topic}"
    query = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .load()
        .select("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("deliveryGuarantee", "exactly-once")
        .option("commitMarkerTopic", marker_topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(Exception, match=f"cannot create the commit-marker topic '{marker_topic}'") as failed:
        query.start().awaitTermination(120)
    assert "KafkaError{" not in str(failed.value)  # the broker's reason itself, not the error's repr


def test_drop_heartbeats_needs_the_partition_column_and_a_watermark(
    spark: SparkSession, kafka: Kafka, topic: str
) -> None:
    stream = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    with pytest.raises(SparkafkaError, match="the frame has no column 'partition'"):
        drop_heartbeats(stream.select("value", "timestamp"))
    with pytest.raises(SparkafkaError, match="drop_heartbeats must come after withWatermark"):
        drop_heartbeats(stream)


def test_option_batch_id_that_is_not_the_batch_spark_runs_is_refused(
    spark: SparkSession, kafka: Kafka, topic: str, tmp_path: Path
) -> None:
    """In a classic session Spark names the micro-batch a foreachBatch write belongs to; option
    batchId must agree with it. Here the option agrees with the checkpoint the write names (another
    query's, one batch further on) and not with the batch Spark runs: the tasks refuse before
    writing, and nothing reaches the output."""
    output = f"{topic}-out"
    create_topic(kafka.bootstrap_servers, output, partitions=2)
    source = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select("value")
    )
    other_checkpoint = tmp_path / "other-query"
    for more in ("r5", "r6"):  # two micro-batches: the other query's checkpoint ends at batch 1
        source.writeStream.foreachBatch(lambda _frame, _batch: None).option(
            "checkpointLocation", str(other_checkpoint)
        ).trigger(availableNow=True).start().awaitTermination(120)
        sender = producer(kafka.bootstrap_servers)
        sender.produce(topic, value=more.encode(), partition=1)
        assert sender.flush(30) == 0

    def write_filed_under_the_other_query(frame: DataFrame, batch_id: int) -> None:
        assert batch_id == 0
        options = {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "topic": output,
            "deliveryGuarantee": "exactly-once",
            "transactionalIdPrefix": f"batch-id-{topic}",
            "checkpointLocation": str(other_checkpoint),
            "batchId": "1",
        }
        frame.write.format("sparkafka").options(**options).mode("append").save()

    query = (
        source.writeStream.foreachBatch(write_filed_under_the_other_query)
        .option("checkpointLocation", str(tmp_path / "own"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"option batchId=1, and Spark runs this write for micro-batch 0"):
        query.awaitTermination(120)
    assert read_to_end(kafka.bootstrap_servers, output, isolation="read_uncommitted", partitions=2) == []
