"""Exactly-once df.write inside foreachBatch when one call writes more than once: each write names its
own transactionalIdPrefix, and writes that share one fail loudly instead of one of them skipping its
rows as a replay (real broker, real local SparkSession)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import udf

from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import create_topic, producer, read_to_end, values


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's cluster: the embedded broker, then Apache Kafka (``kafka`` in conftest)."""
    return kafka


ROWS = 10


def _input(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    create_topic(bootstrap, topic, partitions=2)
    sender = producer(bootstrap)
    for i in range(ROWS):
        sender.produce(topic, value=f"r{i}".encode(), partition=i % 2)
    assert sender.flush(30) == 0
    return (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
    )


def _write(batch: DataFrame, bootstrap: str, topic: str, prefix: str | None, checkpoint: Path) -> None:
    writer = (
        batch.write.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .mode("append")
    )
    if prefix is not None:
        writer = writer.option("transactionalIdPrefix", prefix)
    writer.save()


def _run(frame: DataFrame, each_batch: Callable[[DataFrame, int], None], checkpoint: Path) -> None:
    query = (
        frame.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _fan_out(
    spark: SparkSession, bootstrap: str, topic_name: str, checkpoint: Path, prefix_of: Callable[[str], str]
) -> list[str]:
    """Every micro-batch written exactly-once to two topics, with ``prefix_of(topic)`` as prefix."""
    frame = _input(spark, bootstrap, topic_name)
    outputs = [f"{topic_name}-a", f"{topic_name}-b"]
    for output in outputs:
        create_topic(bootstrap, output, partitions=2)

    def fan_out(batch: DataFrame, _batch_id: int) -> None:
        for output in outputs:
            _write(batch, bootstrap, output, prefix=prefix_of(output), checkpoint=checkpoint)

    _run(frame, fan_out, checkpoint)
    return outputs


def test_two_exactly_once_writes_of_one_batch_with_a_prefix_each_both_write_every_row(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    outputs = _fan_out(spark, bootstrap, topic_name, tmp_path / "cp", lambda topic: f"fan-out-{topic}")
    expected = sorted(f"r{i}".encode() for i in range(ROWS))
    for output in outputs:
        assert sorted(values(read_to_end(bootstrap, output, partitions=2))) == expected, output


def test_two_exactly_once_writes_of_one_batch_sharing_a_prefix_fail_naming_the_fix(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    shared = f"shared-{topic_name}"
    with pytest.raises(Exception, match="need a transactionalIdPrefix each") as failure:
        _fan_out(spark, broker.bootstrap_servers, topic_name, tmp_path / "cp", lambda _: shared)
    assert f"topic '{topic_name}-a'" in str(failure.value)
    assert f"topic '{topic_name}-b'" in str(failure.value)


def test_an_exactly_once_write_without_a_prefix_is_refused_before_any_task(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    frame = _input(spark, bootstrap, topic_name)
    create_topic(bootstrap, f"{topic_name}-out", partitions=2)

    def write(batch: DataFrame, _batch_id: int) -> None:
        _write(batch, bootstrap, f"{topic_name}-out", prefix=None, checkpoint=checkpoint)

    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(Exception, match="needs option 'transactionalIdPrefix'"):
        _run(frame, write, checkpoint)
    output = f"{topic_name}-out"
    assert read_to_end(bootstrap, output, partitions=2, isolation="read_uncommitted") == []


def test_a_batch_replayed_by_a_restart_with_another_topic_fails_naming_the_way_forward(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    """The first run writes micro-batch 0 and fails before Spark records it as done; the query is then
    restarted writing to another topic. A task cannot tell this from a second write sharing the
    prefix (which would lose its rows if skipped): it fails, saying where the output already is.
    Back on the first topic the replay is skipped, and the query goes on."""
    bootstrap = broker.bootstrap_servers
    frame = _input(spark, bootstrap, topic_name)
    first, second = f"{topic_name}-first", f"{topic_name}-second"
    for output in (first, second):
        create_topic(bootstrap, output, partitions=2)
    checkpoint = tmp_path / "checkpoint"
    prefix = f"moved-{topic_name}"

    def write_then_fail(batch: DataFrame, _batch_id: int) -> None:
        _write(batch, bootstrap, first, prefix=prefix, checkpoint=checkpoint)
        raise RuntimeError("crash after the write, before the batch is committed")

    with pytest.raises(Exception, match="crash after the write"):
        _run(frame, write_then_fail, checkpoint)
    moved_away = f"already in topic '{first}', and skipping would leave it out of the new one"
    with pytest.raises(Exception, match=moved_away):
        _run(
            frame,
            lambda batch, _id: _write(batch, bootstrap, second, prefix=prefix, checkpoint=checkpoint),
            checkpoint,
        )
    _run(
        frame,
        lambda batch, _id: _write(batch, bootstrap, first, prefix=prefix, checkpoint=checkpoint),
        checkpoint,
    )
    assert len(read_to_end(bootstrap, first, partitions=2)) == ROWS
    assert read_to_end(bootstrap, second, partitions=2) == []


def test_a_write_retried_inside_foreach_batch_after_a_partial_commit_writes_every_row_once(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    """The foreachBatch function retries its one write when the job fails: partition 0 committed,
    partition 1 failed. The retry (another Spark job of the same batch) skips partition 0, which its
    marker shows done with the same rows, and writes partition 1."""
    bootstrap = broker.bootstrap_servers
    frame = _input(spark, bootstrap, topic_name)
    output = f"{topic_name}-out"
    create_topic(bootstrap, output, partitions=2)
    failed_once = tmp_path / "failed-once"

    @udf("string")
    def fails_partition_1_once(value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1 and not failed_once.exists():
            # Fail only once partition 0's transaction and commit marker are committed: a partial
            # commit, as the broker shows it to read_committed readers.
            failed_once.write_text(committed_marker_of_partition_0())
            raise RuntimeError("transient failure of partition 1")
        return value

    def committed_marker_of_partition_0() -> str:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"witness-{time.monotonic_ns()}",
             "isolation.level": "read_committed", "auto.offset.reset": "earliest"}
        )  # fmt: skip
        metadata = consumer.list_topics(timeout=30)  # naming the topic could auto-create it
        partitions = metadata.topics["_sparkafka_commit_markers"].partitions
        consumer.assign([TopicPartition("_sparkafka_commit_markers", p, 0) for p in partitions])
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and not message.error() and message.key() == marker_key:
                    return (message.value() or b"").decode()
        finally:
            consumer.close()
        raise AssertionError("partition 0 did not commit its marker within 60 s")

    def write_with_retries(batch: DataFrame, _batch_id: int) -> None:
        flaky = batch.select(fails_partition_1_once("value").alias("value"))
        for attempt in range(3):
            try:
                _write(flaky, bootstrap, output, prefix=f"retried-{topic_name}", checkpoint=checkpoint)
                return
            except Exception:
                if attempt == 2:
                    raise

    marker_key = f"retried-{topic_name}-0".encode()
    checkpoint = tmp_path / "checkpoint"
    _run(frame, write_with_retries, checkpoint)
    partial = json.loads(failed_once.read_text())
    assert partial["batch_id"] == 0 and partial["records"] > 0, partial
    committed = values(read_to_end(bootstrap, output, partitions=2))
    assert sorted(committed) == sorted(f"r{i}".encode() for i in range(ROWS))
