"""The ``sparkafka`` format without ``sparkafka.register``: PySpark's lookup of ``pyspark_*`` modules
finds ``pyspark_sparkafka``, and a later ``register`` leaves that registration alone. In a process of
its own: the lookup runs once per JVM, and the test session's JVM has long done it."""

from __future__ import annotations

import os
import sys

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, producer
from tests.integration.spark_session import run_reporting_script

PLAIN_SESSION = """
import json, sys
from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1], sys.argv[2]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("WARN")

def values():
    frame = spark.read.format("sparkafka").option("kafka.bootstrap.servers", bootstrap)
    return sorted(row.value.decode() for row in frame.option("subscribe", topic).load().collect())

import sparkafka

report = {
    "known_before_use": sparkafka.format_known(spark, "sparkafka"),
    "found": values(),
    "known": sparkafka.format_known(spark, "sparkafka"),
    "unknown_name": sparkafka.format_known(spark, "no_such_format"),
}
print("REGISTER", flush=True, file=sys.stderr)
sparkafka.register(spark)
report["after_register"] = values()
print("REPORT " + json.dumps(report), flush=True)
spark.stop()
"""


def test_format_found_without_register_and_register_leaves_it(broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    client = producer(bootstrap)
    for value in ("a", "b", "c"):
        client.produce(topic_name, value=value.encode())
    assert client.flush(30) == 0

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    report, stderr = run_reporting_script(PLAIN_SESSION, bootstrap, topic_name, env=env)
    # Spark looks the format up by itself, at the first question about a Python data source.
    assert report["known_before_use"] is True
    assert report["found"] == ["a", "b", "c"]
    assert report["known"] is True
    assert report["unknown_name"] is False
    assert report["after_register"] == ["a", "b", "c"]
    # Registering the found format again would have Spark warn that it replaced it.
    after_register = stderr.split("REGISTER", 1)[1]
    assert "replaced a statically registered data source" not in after_register, after_register[-3000:]
