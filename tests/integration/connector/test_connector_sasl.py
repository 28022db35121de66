"""The connector against a cluster that requires authentication: every Kafka client the source and the
sink create (driver-side offset lookups, executor reads, group commits, the marker topic, transactional
producers) takes the user's ``kafka.*`` security settings, and a wrong password fails clearly."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from sparkafka.broker.runner import BrokerProcess
from tests.conftest import FAST_BROKER_ARGS

USER, PASSWORD = "pipeline", "s3cret"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("sasl-connector") / "data"
    args = [*FAST_BROKER_ARGS, "--sasl-plain-user", f"{USER}:{PASSWORD}"]
    with BrokerProcess(data_dir, extra_args=args) as process:
        yield process


def _client_config(bootstrap: str, password: str = PASSWORD) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": password,
    }


def _connector_options(bootstrap: str, password: str = PASSWORD) -> dict[str, str]:
    return {f"kafka.{key}": value for key, value in _client_config(bootstrap, password).items()}


def _read_committed(config: dict[str, Any], topic: str, expect: int) -> list[bytes]:
    consumer = Consumer({**config, "group.id": f"check-{topic}", "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        for _ in range(100):
            for message in consumer.consume(100, timeout=0.2):
                if message.error() is None:
                    values.append(message.value())
            if len(values) >= expect:
                break
        # Anything more would be a duplicate: give it a moment to show.
        values += [m.value() for m in consumer.consume(100, timeout=1.0) if m.error() is None]
    finally:
        consumer.close()
    return values


def test_exactly_once_pipeline_over_sasl(
    spark: SparkSession, sasl_broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = sasl_broker.bootstrap_servers
    config = _client_config(bootstrap)
    source, sink, group = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("in", "out", "group"))
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(source, 1, 1), NewTopic(sink, 1, 1)]).values():
        future.result(timeout=30)
    producer = Producer(config)
    inputs = [f"a{i},b{i}".encode() for i in range(30)]
    for value in inputs:
        producer.produce(source, value=value)
    assert producer.flush(30) == 0

    options = _connector_options(bootstrap)
    query = (
        spark.readStream.format("sparkafka")
        .options(**options)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("kafka.group.id", group)
        .load()
        .selectExpr("concat('EVENT(', CAST(value AS STRING), ')') AS value")
        .writeStream.format("sparkafka")
        .options(**options)
        .option("topic", sink)
        .option("deliveryGuarantee", "exactly-once")
        .option("commitMarkerTopic", f"markers-{sink}")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None

    assert sorted(_read_committed(config, sink, len(inputs))) == sorted(b"EVENT(" + v + b")" for v in inputs)
    # commitOffsetsOnBatch reached the group through the authenticated connection too.
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert [(p.topic, p.partition, p.offset) for p in listed.topic_partitions] == [(source, 0, len(inputs))]


def test_wrong_password_fails_naming_the_authentication(
    spark: SparkSession, sasl_broker: BrokerProcess
) -> None:
    options = _connector_options(sasl_broker.bootstrap_servers, password="wrong")
    frame = (
        spark.read.format("sparkafka")
        .options(**options)
        .option("kafka.default.api.timeout.ms", "60000")
        .option("subscribe", "anything")
    )
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        frame.load().collect()
    # No retry can fix refused credentials: the failure does not wait out the 60 s bound.
    assert time.monotonic() - started < 30
    message = str(failure.value)
    assert "refused the client's credentials" in message, message[-2000:]
    assert "Authentication failed" in message, message[-2000:]  # librdkafka's own words
    assert "kafka.sasl.password" in message, message[-2000:]


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once", "none"])
def test_sink_with_a_wrong_password_fails_naming_the_authentication(
    spark: SparkSession, sasl_broker: BrokerProcess, guarantee: str, tmp_path: Path
) -> None:
    rows = spark.createDataFrame([("v",)], "value string")
    writer = (
        rows.write.format("sparkafka")
        .mode("append")
        .options(**_connector_options(sasl_broker.bootstrap_servers, password="wrong"))
        .option("topic", "anything")
        .option("deliveryGuarantee", guarantee)
        .option("operationTimeoutMs", "60000")
        .option("transactionalIdPrefix", "wrong-password")  # needed by an exactly-once df.write
        .option("checkpointLocation", str(tmp_path / "checkpoint"))  # and so is this
    )
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        writer.save()
    assert time.monotonic() - started < 30  # refused credentials do not wait out operationTimeoutMs
    message = str(failure.value)
    assert "refused the client's credentials" in message, message[-2000:]
    assert "Authentication failed" in message, message[-2000:]
