"""Transactions that outlive a timeout, and what the sink says: a write task whose transaction outlives
kafka.transaction.timeout.ms (the broker aborts it and fences the producer) fails naming the option,
not another attempt of the task, and the restarted query writes the batch once; and another
writer's transaction left open on the shared commit-marker partition is named as the cause of the
wait (real broker, real local SparkSession)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.commit_log import _markers_held_back, ensure_marker_topic, read_marker_partition
from sparkafka.connector.sink.options import MARKER_PARTITION, SinkOptions
from sparkafka.connector.sink.producers import init_transactions, new_cached_producer
from sparkafka.errors import SparkafkaError
from tests.integration.kafka_clients import (
    create_topic,
    producer,
    read_to_end,
    transactional_producer,
)


@pytest.fixture
def quick_aborting_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """Looks for timed-out transactions every 200 ms (Kafka's default: every 10 s)."""
    args = ["--group-initial-rebalance-delay-ms", "0", "--transaction-abort-check-interval-ms", "200"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as process:
        yield process


def _query(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path, *, timeout_ms: str, **sink: str
) -> DataStreamWriter:
    """``topic_name`` copied to ``{topic_name}-out`` exactly once, to the end of its input."""
    return (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic_name)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", f"{topic_name}-out")
        .option("deliveryGuarantee", "exactly-once")
        .option("kafka.transaction.timeout.ms", timeout_ms)
        .options(**sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
    )


def test_a_transaction_open_longer_than_its_timeout_fails_naming_the_timeout_and_loses_nothing(
    spark: SparkSession, quick_aborting_broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = quick_aborting_broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    create_topic(bootstrap, f"{topic_name}-out")
    sender = producer(bootstrap)
    sender.produce(topic_name, value=b"v")
    assert sender.flush(30) == 0
    # The transaction is open (its record produced) while the task pauses, as while Spark computes
    # a slow task's rows.
    slow = {"debug.pauseAt": "beforeCommit", "debug.pauseMs": "3000"}
    query = _query(spark, bootstrap, topic_name, tmp_path, timeout_ms="1000", **slow).start()
    expected = r"was open for \d+\.\d s, longer than kafka\.transaction\.timeout\.ms=1000"
    with pytest.raises(Exception, match=expected):
        query.awaitTermination()
    assert read_to_end(bootstrap, f"{topic_name}-out") == []

    # Guarantees precondition 5: the abort never loses data. The batch is not in Spark's commit log,
    # so a restart from the checkpoint, with the task now quick enough, writes it exactly once.
    restarted = _query(spark, bootstrap, topic_name, tmp_path, timeout_ms="1000").start()
    restarted.awaitTermination()
    assert [m.value() for m in read_to_end(bootstrap, f"{topic_name}-out")] == [b"v"]
    uncommitted = read_to_end(bootstrap, f"{topic_name}-out", isolation="read_uncommitted")
    assert [m.value() for m in uncommitted] == [b"v", b"v"], "the aborted first write, then the replay"


def test_a_transaction_another_writer_left_open_on_the_marker_partition_is_named(
    broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    markers = f"{topic_name}-markers"
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": markers,
            "commitMarkerTopicPartitions": "1",  # the offsets below are the one partition's
            "kafka.transaction.timeout.ms": "2000",
            "operationTimeoutMs": "1000",
        }
    )
    ensure_marker_topic(options)
    # Another query's writer, with a 15 min timeout, died after producing its marker.
    other = transactional_producer(bootstrap, f"{topic_name}-other-0", transaction_timeout_ms=900_000)
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(markers, key=b"other", value=b"{}", partition=MARKER_PARTITION)
    assert other.flush(30) == 0
    try:
        with pytest.raises(SparkafkaError, match="did not reach offset") as failure:
            read_marker_partition(options, want={"mine-0"})
        message = str(failure.value)
        assert "holds read_committed readers of that partition back at offset 0" in message
        assert "longer kafka.transaction.timeout.ms" in message
        assert "sparkafka transactions list" in message
        assert "kafka-transactions.sh find-hanging" in message  # a lost marker is listed nowhere
    finally:
        other.abort_transaction(30)


def _three_markers(bootstrap: str, topic_name: str) -> tuple[SinkOptions, TopicPartition]:
    markers = f"{topic_name}-markers"
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": markers,
            "commitMarkerTopicPartitions": "1",  # the offsets below are the one partition's
        }
    )
    ensure_marker_topic(options)
    producer = Producer({"bootstrap.servers": bootstrap})
    for number in range(3):
        producer.produce(markers, key=f"k{number}".encode(), value=b"{}", partition=MARKER_PARTITION)
    assert producer.flush(30) == 0
    return options, TopicPartition(markers, MARKER_PARTITION)


def test_a_marker_read_cut_short_by_a_log_that_went_back_says_so(
    broker: BrokerProcess, topic_name: str
) -> None:
    """A read that began when the partition ended at offset 10 and finds it ending at 3: the topic was
    deleted and created again (or truncated) under it, not held back by a transaction."""
    options, partition = _three_markers(broker.bootstrap_servers, topic_name)
    message = str(_markers_held_back(options, partition, high=10, position=3))
    assert "did not reach offset 10, the partition's end when the read began: its end is 3 now" in message
    assert "deleted and created again" in message and "Spark retries the task" in message
    assert "open transaction" not in message


def test_a_marker_read_stalled_with_no_transaction_open_blames_the_leader(
    broker: BrokerProcess, topic_name: str
) -> None:
    options, partition = _three_markers(broker.bootstrap_servers, topic_name)
    message = str(_markers_held_back(options, partition, high=3, position=1))
    assert "stopped at offset 1" in message and "short of offset 3" in message
    assert "no transaction holds readers back there (the last stable offset is 3)" in message
    assert "the broker's log says why" in message


def test_an_initialisation_that_fails_for_a_cause_without_advice_names_the_id_and_the_clients_words(
    broker: BrokerProcess, topic_name: str
) -> None:
    """A failure of init_transactions that is neither the timeout, nor an unreachable cluster, nor a
    refused ACL has no advice to give: it still names the id and what librdkafka said. Here the
    producer had initialised the id already, which librdkafka refuses as an invalid state."""
    options = SinkOptions.parse(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "deliveryGuarantee": "exactly-once"}
    )
    transactional_id = f"{topic_name}-0"
    cached = new_cached_producer(options, transactional_id)
    try:
        cached.producer.init_transactions(30)
        with pytest.raises(SparkafkaError) as refused:
            init_transactions(options, cached, transactional_id, 0)
        assert str(refused.value) == (
            f"init_transactions for transactional id '{transactional_id}' failed: "
            "Operation not valid in state Ready"
        )
    finally:
        cached.producer.flush(0)
