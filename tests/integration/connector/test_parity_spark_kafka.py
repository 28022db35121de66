"""The same batch reads through Spark's own Kafka connector (``format("kafka")``) and through
sparkafka (``format("sparkafka")``), against the same topics: the rows must agree field by field,
and the schemas type by type. One Spark process (with the connector's jars) runs every read."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, producer
from tests.integration.spark_kafka_connector import spark_kafka_jars
from tests.integration.spark_session import run_reporting_script

TOPIC, OTHER = "parity-a", "parity-b"
BASE_TIMESTAMP_MS = 1_700_000_000_000

# name -> the read options both formats get (besides the bootstrap servers).
CASES: dict[str, dict[str, str]] = {
    "subscribe, earliest to latest": {"subscribe": TOPIC},
    "subscribe to a list": {"subscribe": f"{TOPIC},{OTHER}"},
    "subscribePattern": {"subscribePattern": "parity-.*"},
    "assign": {"assign": json.dumps({TOPIC: [0, 2]})},
    "offsets per partition with -2 and -1": {
        "subscribe": TOPIC,
        "startingOffsets": json.dumps({TOPIC: {"0": 2, "1": -2, "2": 1}}),
        "endingOffsets": json.dumps({TOPIC: {"0": -1, "1": 3, "2": 4}}),
    },
    "includeHeaders": {"subscribe": TOPIC, "includeHeaders": "true"},
    "startingOffsetsByTimestamp": {
        "subscribe": TOPIC,
        "startingOffsetsByTimestamp": json.dumps(
            {TOPIC: {str(p): BASE_TIMESTAMP_MS + 5_000 for p in range(3)}}
        ),
    },
    "startingTimestamp": {"subscribe": TOPIC, "startingTimestamp": str(BASE_TIMESTAMP_MS + 9_000)},
    "minPartitions": {"subscribe": TOPIC, "minPartitions": "7"},
}

READER = """
import json, sys
from pyspark.sql import SparkSession
import sparkafka

jars, bootstrap, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = (
    SparkSession.builder.master("local[2]").config("spark.jars", jars)
    .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
sparkafka.register(spark)

def plain(value):
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return {k: plain(v) for k, v in value.asDict().items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value

report = {}
for name, options in cases.items():
    report[name] = {}
    for source in ("kafka", "sparkafka"):
        reader = spark.read.format(source).option("kafka.bootstrap.servers", bootstrap)
        for key, value in options.items():
            reader = reader.option(key, value)
        frame = reader.load()
        rows = sorted((plain(row.asDict()) for row in frame.collect()),
                      key=lambda r: (r["topic"], r["partition"], r["offset"]))
        report[name][source] = {
            "schema": [(f.name, f.dataType.simpleString(), f.nullable) for f in frame.schema.fields],
            "rows": rows,
            "input_partitions": frame.rdd.getNumPartitions(),
        }
print("REPORT " + json.dumps(report))
spark.stop()
"""


@pytest.fixture(scope="module")
def report(broker: BrokerProcess) -> dict[str, Any]:
    """Both formats' answers to every case, from one Spark process."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, TOPIC, partitions=3)
    create_topic(bootstrap, OTHER, partitions=1)
    sender = producer(bootstrap)
    for i in range(15):
        headers = [("n", str(i).encode()), ("empty", b"")] if i % 3 else None
        sender.produce(
            TOPIC,
            key=None if i % 5 == 0 else f"k{i}",
            value=None if i == 7 else f"v{i}",
            partition=i % 3,
            timestamp=BASE_TIMESTAMP_MS + i * 1_000,
            headers=headers,
        )
    sender.produce(OTHER, key="only", value="other", partition=0, timestamp=BASE_TIMESTAMP_MS)
    assert sender.flush(30) == 0
    jars = ",".join(str(path) for path in spark_kafka_jars())
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    found, _ = run_reporting_script(READER, jars, bootstrap, json.dumps(CASES), env=env)
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_a_batch_read_gives_what_sparks_kafka_source_gives(report: dict[str, Any], case: str) -> None:
    spark_kafka, ours = report[case]["kafka"], report[case]["sparkafka"]
    assert ours["schema"] == spark_kafka["schema"]
    assert ours["rows"] == spark_kafka["rows"]
    assert ours["rows"], "a case that reads nothing compares nothing"


def test_min_partitions_splits_the_ranges_as_sparks_source_does(report: dict[str, Any]) -> None:
    """Spark's KafkaOffsetRangeCalculator: more input partitions than Kafka partitions, each range
    split in proportion to its size, rounded (15 records in 3 partitions, minPartitions 7: 6)."""
    spark_kafka, ours = report["minPartitions"]["kafka"], report["minPartitions"]["sparkafka"]
    assert spark_kafka["input_partitions"] > 3
    assert ours["input_partitions"] == spark_kafka["input_partitions"]


def test_the_data_is_what_the_cases_need(report: dict[str, Any]) -> None:
    """Nulls, headers and per-partition ranges are really in the data the cases compare."""
    rows = report["includeHeaders"]["kafka"]["rows"]
    assert any(row["key"] is None for row in rows) and any(row["value"] is None for row in rows)
    assert any(row["headers"] for row in rows) and any(row["headers"] is None for row in rows)
