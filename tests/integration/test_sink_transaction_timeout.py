"""A write task whose transaction outlives kafka.transaction.timeout.ms: the broker aborts it and fences
the producer, and the failure says so and names the options to change, instead of blaming another
attempt of the task (real broker, real local SparkSession)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkafka.broker.runner import BrokerProcess

from .kafka_clients import create_topic, producer, read_all
from .spark_session import spark_fixture  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture
def quick_aborting_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """Looks for timed-out transactions every 200 ms (Kafka's default: every 10 s)."""
    args = ["--group-initial-rebalance-delay-ms", "0", "--transaction-abort-check-interval-ms", "200"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as process:
        yield process


def test_a_transaction_open_longer_than_its_timeout_fails_naming_the_timeout(
    spark: SparkSession, quick_aborting_broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = quick_aborting_broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    create_topic(bootstrap, f"{topic_name}-out")
    sender = producer(bootstrap)
    sender.produce(topic_name, value=b"v")
    assert sender.flush(30) == 0
    query = (
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
        .option("kafka.transaction.timeout.ms", "1000")
        # The transaction is open (its record produced) while the task pauses, as while Spark
        # computes a slow task's rows.
        .option("debug.pauseAt", "beforeCommit")
        .option("debug.pauseMs", "3000")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    expected = r"was open for \d+\.\d s, longer than kafka\.transaction\.timeout\.ms=1000"
    with pytest.raises(Exception, match=expected):
        query.awaitTermination()
    assert read_all(bootstrap, f"{topic_name}-out", timeout_s=3) == []
