"""Seed 001's job, exactly-once: "aa,bb" -> "EVENT(aa,bb)". One command:

    .venv/bin/python examples/seed001_map.py

It starts the embedded broker (`sparkafka broker`) in a temporary directory, creates the topics `in`
and `out`, produces a few `a,b` lines to `in`, and runs a streaming query with
trigger(availableNow=True):

    readStream sparkafka  ->  transform: concat('EVENT(', value, ')')  ->  writeStream sparkafka,
    deliveryGuarantee=exactly-once

Finally it prints what a read_committed consumer sees in `out`. The same pipeline from the command
line, restarted from its checkpoint after failures (from the repository root; PYTHONPATH=. makes
`examples` importable):

    PYTHONPATH=. .venv/bin/sparkafka run --source-topic in --sink-topic out --checkpoint ./ckpt \\
        --transform examples.seed001_map:transform
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.session import spark_session

INPUT_LINES = ["aa,bb", "cc,dd", "ee,ff", "gg,hh", "ii,jj"]


def transform(events: DataFrame) -> DataFrame:
    """The source's rows -> the sink's: the key unchanged, the value wrapped in EVENT(...)."""
    return events.select(
        "key", F.concat(F.lit("EVENT("), F.col("value").cast("string"), F.lit(")")).alias("value")
    )


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in names]).values():
        future.result(30)


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    """The values a read_committed consumer sees in partition 0 of the topic, up to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "example-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                break
            raise RuntimeError(f"reading {topic}: {message.error()}")
        values.append(message.value())
    consumer.close()
    return values


def run_pipeline(bootstrap: str, checkpoint: Path) -> None:
    # One core: one Python worker, which keeps its transactional producer from batch to batch.
    spark = spark_session("sparkafka-example-seed001-map", master="local[1]")
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        transform(events)
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "out")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything runs on this machine
    workdir = Path(tempfile.mkdtemp(prefix="sparkafka-seed001-"))
    broker = BrokerProcess(workdir / "kafka").start()
    try:
        bootstrap = broker.bootstrap_servers
        print(f"broker on {bootstrap} (data in {workdir})", flush=True)
        create_topics(bootstrap, "in", "out")
        sender = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for line in INPUT_LINES:
            sender.produce("in", value=line.encode())
        sender.flush(30)
        print(
            f"produced {len(INPUT_LINES)} lines to 'in'; running the pipeline (AvailableNow)...", flush=True
        )
        run_pipeline(bootstrap, workdir / "checkpoint")
        output = read_committed(bootstrap, "out")
        print(f"\nout ({len(output)} records, read_committed):")
        for value in output:
            print(f"  {value.decode()}")
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
