"""What the exactly-once sink refuses so that a replay can never lose or double records: adaptive
execution that could re-split a replayed batch, two queries on one transactionalIdPrefix, a prefix
changed in the middle of a replay, a marker topic that deletes markers. Real Kafka processes (the
embedded broker and Apache Kafka), real local SparkSession."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

import sparkafka
from sparkafka.connector.datasource import KafkaDataSource
from sparkafka.connector.sink.task import ADAPTIVE_ENABLED, ADAPTIVE_STATELESS_STREAMING
from sparkafka.tools.harness import wait_until
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import (
    committed_markers,
    create_topic,
    producer,
    read_all,
    read_to_end,
    values,
)
from tests.integration.spark_session import run_reporting_script

ROWS = 20


@pytest.fixture
def topics(kafka: Kafka, topic_name: str) -> tuple[str, str]:
    """An input topic holding ROWS records over two partitions, and an empty output topic, on the
    module's Kafka (the embedded broker, then Apache Kafka)."""
    bootstrap = kafka.bootstrap_servers
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    sender = producer(bootstrap)
    for i in range(ROWS):
        sender.produce(source, value=f"r{i}".encode(), partition=i % 2)
    assert sender.flush(30) == 0
    return source, sink


@pytest.fixture
def unpinned_session(spark: SparkSession) -> Iterator[SparkSession]:
    """A session of the same application as a user's with Spark's defaults: adaptive execution on
    (the test application turns it off), the format registered directly, not by sparkafka.register,
    which would turn it off for stateless streaming plans."""
    session = spark.newSession()
    session.conf.set(ADAPTIVE_ENABLED, "true")
    session.dataSource.register(KafkaDataSource)
    yield session


def _input(session: SparkSession, bootstrap: str, source: str) -> DataFrame:
    return (
        session.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
    )


def _write_stream(
    session: SparkSession, bootstrap: str, source: str, sink: str, checkpoint: Path, **options: str
) -> StreamingQuery:
    writer = (
        _input(session, bootstrap, source)
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.start()


def _run(
    session: SparkSession, bootstrap: str, source: str, sink: str, checkpoint: Path, **options: str
) -> str:
    """Run the query to the end of its input; returns its id."""
    query = _write_stream(session, bootstrap, source, sink, checkpoint, **options)
    query.awaitTermination()
    return str(query.id)


def _everything_written(bootstrap: str, sink: str) -> list[bytes]:
    """Every record in ``sink``, committed or not."""
    return values(read_to_end(bootstrap, sink, partitions=2, isolation="read_uncommitted"))


def test_write_stream_refuses_while_adaptive_execution_could_resplit_a_replay(
    unpinned_session: SparkSession, kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(Exception, match=f"{ADAPTIVE_STATELESS_STREAMING}=unset") as refused:
        _run(unpinned_session, bootstrap, source, sink, checkpoint)
    assert "sparkafka.register(spark)" in str(refused.value)
    assert _everything_written(bootstrap, sink) == [], "the refused write produced records"

    # The way out the message names: the same query from the same checkpoint then writes everything.
    unpinned_session.conf.set(ADAPTIVE_STATELESS_STREAMING, "false")
    _run(unpinned_session, bootstrap, source, sink, checkpoint)
    committed = values(read_all(bootstrap, sink, partitions=2, expect=ROWS))
    assert sorted(committed) == sorted(f"r{i}".encode() for i in range(ROWS))


def test_register_turns_adaptive_execution_off_for_stateless_streaming_plans(spark: SparkSession) -> None:
    session = spark.newSession()
    session.conf.unset(ADAPTIVE_STATELESS_STREAMING)
    sparkafka.register(session)
    assert session.conf.get(ADAPTIVE_STATELESS_STREAMING) == "false"


FOUND_BY_LOOKUP = """
import json, os, sys
from pyspark.sql import SparkSession

bootstrap, source, sink, checkpoint = sys.argv[1:5]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

def run():
    query = (
        spark.readStream.format("sparkafka").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source).option("startingOffsets", "earliest").load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("sparkafka").option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink).option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()

report = {"sparkafka imported here": "sparkafka" in sys.modules}
try:
    run()
    report["refusal"] = None
except Exception as error:
    report["refusal"] = str(error)
import sparkafka
sparkafka.register(spark)
report["after register"] = spark.conf.get("spark.sql.adaptive.streaming.stateless.enabled")
run()
print("REPORT " + json.dumps(report))
"""


def test_the_format_found_by_sparks_lookup_refuses_until_register_is_called(
    kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    """A new user's session: no sparkafka.register, Spark finds the format through the installed
    pyspark_sparkafka module. The exactly-once write refuses, naming the fix; after
    sparkafka.register(spark) the same query from the same checkpoint writes everything once."""
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    report, _ = run_reporting_script(
        FOUND_BY_LOOKUP, bootstrap, source, sink, str(tmp_path / "checkpoint"), env=env
    )
    assert report["sparkafka imported here"] is False, "the format must come from Spark's lookup"
    assert f"{ADAPTIVE_STATELESS_STREAMING}=unset" in report["refusal"]
    assert "sparkafka.register(spark)" in report["refusal"]
    assert report["after register"] == "false"
    committed = values(read_all(bootstrap, sink, partitions=2, expect=ROWS + 1, timeout_s=15))
    assert sorted(committed) == sorted(f"r{i}".encode() for i in range(ROWS))


def test_foreach_batch_write_refuses_while_adaptive_execution_is_on(
    unpinned_session: SparkSession, kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    # register()'s setting alone is not enough here: the micro-batch is written by a batch plan.
    unpinned_session.conf.set(ADAPTIVE_STATELESS_STREAMING, "false")

    def write(batch: DataFrame, _batch_id: int) -> None:
        (
            batch.write.format("sparkafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", sink)
            .option("deliveryGuarantee", "exactly-once")
            .option("transactionalIdPrefix", f"aqe-{sink}")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .mode("append")
            .save()
        )

    query = (
        _input(unpinned_session, bootstrap, source)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=f"{ADAPTIVE_ENABLED}=true"):
        query.awaitTermination()
    assert _everything_written(bootstrap, sink) == []


def test_a_second_query_on_the_same_prefix_refuses_until_it_adopts_the_ids(
    spark: SparkSession, kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    prefix = f"shared-{sink}"
    first_id = _run(spark, bootstrap, source, sink, tmp_path / "first", transactionalIdPrefix=prefix)
    assert len(_everything_written(bootstrap, sink)) == ROWS

    with pytest.raises(
        Exception, match=f"is used by another query: query {first_id} claimed it first"
    ) as refused:
        _run(spark, bootstrap, source, sink, tmp_path / "second", transactionalIdPrefix=prefix)
    assert f".option('adoptTransactionalIdsFrom', '{first_id}')" in str(refused.value)
    assert len(_everything_written(bootstrap, sink)) == ROWS, "the refused query wrote records"

    # Adopted deliberately (the first query's checkpoint is gone), the second query writes; it reads
    # its input from the start, as any new query with startingOffsets=earliest does.
    # It starts from the beginning, where the first query's output ends at ROWS records: refused,
    # counting them, until that cost is accepted for its first batch.
    adopting = {"transactionalIdPrefix": prefix, "adoptTransactionalIdsFrom": first_id}
    with pytest.raises(Exception, match=f"this query starts {ROWS} input record\\(s\\) before where"):
        _run(spark, bootstrap, source, sink, tmp_path / "second", **adopting)
    assert len(_everything_written(bootstrap, sink)) == ROWS, "the refused query wrote records"
    second_id = _run(spark, bootstrap, source, sink, tmp_path / "second", **adopting, acceptReshapedBatch="0")
    assert len(_everything_written(bootstrap, sink)) == 2 * ROWS
    # From then on the ids are the second query's: the first one, restarted, refuses.
    sender = producer(bootstrap)
    sender.produce(source, value=b"late", partition=0)
    assert sender.flush(30) == 0
    with pytest.raises(Exception, match=f"is used by another query: query {second_id} claimed it first"):
        _run(spark, bootstrap, source, sink, tmp_path / "first", transactionalIdPrefix=prefix)


def test_a_prefix_changed_in_the_middle_of_a_replay_refuses(
    spark: SparkSession, kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Batch 0 is cut short with write partition 0 committed under one prefix and 1 still open; the
    replay under another prefix would write partition 0's rows again, so every task refuses."""
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    checkpoint = tmp_path / "checkpoint"
    held = _write_stream(
        spark,
        bootstrap,
        source,
        sink,
        checkpoint,
        transactionalIdPrefix=f"old-{sink}",
        **{
            "debug.pauseAt": "beforeCommit",
            "debug.pausePartitions": "1",
            "debug.pauseMs": "600s",
            "kafka.transaction.timeout.ms": "600000",
        },
    )
    try:
        assert wait_until(lambda: f"old-{sink}-0" in committed_markers(bootstrap, 0), timeout_s=120)
        assert wait_until(lambda: len(_everything_written(bootstrap, sink)) == ROWS, timeout_s=60)
    finally:
        held.stop()
    written = _everything_written(bootstrap, sink)

    with pytest.raises(Exception, match=f"partly committed under transactional id\\(s\\) 'old-{sink}-0'"):
        _run(spark, bootstrap, source, sink, checkpoint, transactionalIdPrefix=f"new-{sink}")
    assert _everything_written(bootstrap, sink) == written, "the refused replay wrote records"


def test_a_marker_topic_that_deletes_markers_is_refused(
    spark: SparkSession, kafka: Kafka, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Markers are what a replay skips by: a pre-created marker topic with delete retention would lose
    them, and a replay after that would write its batch twice."""
    bootstrap, (source, sink) = kafka.bootstrap_servers, topics
    markers = f"markers-{sink}"
    create_topic(bootstrap, markers, config={"cleanup.policy": "compact,delete"})
    with pytest.raises(Exception, match=f"'{markers}' has cleanup.policy=compact,delete") as refused:
        _run(spark, bootstrap, source, sink, tmp_path / "checkpoint", commitMarkerTopic=markers)
    assert "cleanup.policy=compact" in str(refused.value)
    assert _everything_written(bootstrap, sink) == []
