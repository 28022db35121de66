"""The sink's input columns as Spark's Kafka sink takes them: value (string or binary, null is a
tombstone), key, per-row topic, partition and headers, written by a real Spark job to the real broker
and read back with a plain Kafka consumer; and records too large for the client or the broker, which
fail the write with a message naming the fix instead of disappearing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, read_all

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
ROWS_PER_TOPIC = 300  # per topic, spread over both write tasks and every output partition


def _write(frame: DataFrame, bootstrap: str, **options: str) -> None:
    # Two partitions, so two write tasks each write part of every topic.
    frame.repartition(2).write.format("sparkafka").option("kafka.bootstrap.servers", bootstrap).options(
        **options
    ).mode("append").save()


@pytest.mark.parametrize("guarantee", ["at-least-once", "none"])
def test_per_row_topic_partition_key_headers_and_tombstones(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, guarantee: str
) -> None:
    topics = [f"{topic_name}-{guarantee}-a", f"{topic_name}-{guarantee}-b"]
    for topic in topics:
        create_topic(broker.bootstrap_servers, topic, partitions=3)
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("headers", HEADERS),
        ]
    )
    rows: list[tuple[object, ...]] = []
    for n in range(ROWS_PER_TOPIC):
        for t, topic in enumerate(topics):
            value = None if n % 50 == 0 else f"v{t}-{n}".encode()  # every 50th is a tombstone
            headers = [("seq", str(n).encode()), ("empty", None)] if n % 3 == 0 else None
            rows.append((topic, n % 3, f"k{n}", value, headers))
    _write(spark.createDataFrame(rows, schema), broker.bootstrap_servers, deliveryGuarantee=guarantee)
    for t, topic in enumerate(topics):
        messages = read_all(broker.bootstrap_servers, topic, expect=ROWS_PER_TOPIC, partitions=3)
        assert len(messages) == ROWS_PER_TOPIC
        seen = set()
        for message in messages:
            n = int((message.key() or b"").decode()[1:])
            seen.add(n)
            assert message.partition() == n % 3
            assert message.value() == (None if n % 50 == 0 else f"v{t}-{n}".encode())
            expected_headers = [("seq", str(n).encode()), ("empty", None)] if n % 3 == 0 else None
            assert message.headers() == expected_headers
        assert seen == set(range(ROWS_PER_TOPIC))


def test_topic_option_wins_over_the_column_and_strings_are_utf8(
    spark: SparkSession, broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name, partitions=1)
    schema = StructType([StructField("topic", StringType()), StructField("value", StringType())])
    rows = [("some-other-topic", f"zürich {n}") for n in range(ROWS_PER_TOPIC)] + [(None, "no topic column")]
    _write(spark.createDataFrame(rows, schema), broker.bootstrap_servers, topic=topic_name)
    messages = read_all(broker.bootstrap_servers, topic_name, expect=len(rows))
    assert sorted(m.value() or b"" for m in messages) == sorted(str(v).encode() for _, v in rows)
    assert all(m.key() is None for m in messages)


def test_a_row_without_a_topic_fails_the_write_naming_the_fix(
    spark: SparkSession, broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name, partitions=1)
    schema = StructType([StructField("topic", StringType()), StructField("value", StringType())])
    rows = [(topic_name, "fine"), (None, "lost?")]
    with pytest.raises(Exception, match="every row needs a topic"):
        (
            spark.createDataFrame(rows, schema)
            .coalesce(1)
            .write.format("sparkafka")
            .option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .mode("append")
            .save()
        )


TOO_LARGE = "the broker accepts"  # from the sink's message naming max.message.bytes as the fix


@pytest.mark.parametrize("guarantee", ["at-least-once", "none"])
def test_a_record_larger_than_the_client_sends_fails_the_write_naming_the_fix(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, guarantee: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    values = ["small", "x" * 1_500_000]  # above librdkafka's message.max.bytes of 1,000,000
    _write_expecting_too_large(spark, broker, topic_name, values, deliveryGuarantee=guarantee)


def test_a_record_the_broker_refuses_fails_the_write_naming_the_fix(
    spark: SparkSession, broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name, config={"max.message.bytes": "50000"})
    values = [f"small {n}" for n in range(20)] + ["x" * 200_000]
    _write_expecting_too_large(spark, broker, topic_name, values, **{"kafka.message.max.bytes": "4000000"})


def _write_expecting_too_large(
    spark: SparkSession, broker: BrokerProcess, topic: str, values: list[str], **options: str
) -> None:
    schema = StructType([StructField("value", StringType())])
    with pytest.raises(Exception, match=TOO_LARGE):
        _write(
            spark.createDataFrame([(value,) for value in values], schema),
            broker.bootstrap_servers,
            topic=topic,
            **options,
        )


def test_exactly_once_query_fails_on_a_record_the_broker_refuses_and_commits_nothing(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap_servers, topic_name, config={"max.message.bytes": "50000"})
    rows = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    query = (
        rows.selectExpr("IF(value = 5, repeat('x', 200000), CAST(value AS STRING)) AS value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("kafka.message.max.bytes", "4000000")
        .option("topic", topic_name)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        with pytest.raises(Exception, match=TOO_LARGE):
            query.awaitTermination(120)
            raise AssertionError("the query did not fail within 120 s")
    finally:
        query.stop()
    # The transaction holding the refused record was aborted: nothing of that batch is visible.
    visible = [m.value() for m in read_all(broker.bootstrap_servers, topic_name, timeout_s=5)]
    assert b"5" not in visible


def test_keyed_rows_land_where_javas_default_partitioner_puts_them(
    spark: SparkSession, broker: BrokerProcess, topic_name: str
) -> None:
    """Spark's sink leaves a keyed row's partition to the Java client's default partitioner:
    toPositive(murmur2(key)) % partitions. The hashes are those of Kafka's UtilsTest.testMurmur2."""
    murmur2 = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }
    partitions = 7
    create_topic(broker.bootstrap_servers, topic_name, partitions=partitions)
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    _write(
        spark.createDataFrame([(key, key) for key in murmur2], schema),
        broker.bootstrap_servers,
        topic=topic_name,
    )
    messages = read_all(broker.bootstrap_servers, topic_name, expect=len(murmur2), partitions=partitions)
    assert {m.key().decode(): m.partition() for m in messages} == {
        key: (hash_code & 0x7FFFFFFF) % partitions for key, hash_code in murmur2.items()
    }


def test_columns_are_found_by_their_exact_names_and_overwrite_is_refused(
    spark: SparkSession, broker: BrokerProcess, topic_name: str
) -> None:
    """Spark's KafkaWriter finds 'value', 'key', 'topic' … by exact name, ignores a 'topic' column when
    the 'topic' option is set, and KafkaSourceProvider refuses SaveMode.Overwrite."""
    create_topic(broker.bootstrap_servers, topic_name, partitions=1)
    capitalised = spark.createDataFrame([("v",)], StructType([StructField("Value", StringType())]))
    with pytest.raises(Exception, match="the sink needs a 'value' column"):
        _write(capitalised, broker.bootstrap_servers, topic=topic_name)
    numeric_topic = StructType([StructField("topic", IntegerType()), StructField("value", StringType())])
    _write(spark.createDataFrame([(7, "kept")], numeric_topic), broker.bootstrap_servers, topic=topic_name)
    assert [m.value() for m in read_all(broker.bootstrap_servers, topic_name, expect=1)] == [b"kept"]
    with pytest.raises(Exception, match="save mode 'overwrite' is not allowed for Kafka"):
        (
            spark.createDataFrame([("v",)], StructType([StructField("value", StringType())]))
            .write.format("sparkafka")
            .option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("topic", topic_name)
            .mode("overwrite")
            .save()
        )
