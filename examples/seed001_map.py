"""Seed 001's job, exactly-once: "aa,bb" -> "EVENT(aa,bb)". One command:

    .venv/bin/python examples/seed001_map.py

It starts the embedded broker (`sparkafka broker`) in a temporary directory, creates the topics `in`
and `out`, produces a few `a,b` lines to `in`, and runs a streaming query with
trigger(availableNow=True):

    readStream sparkafka  ->  transform: concat('EVENT(', value, ')')  ->  writeStream sparkafka,
    deliveryGuarantee=exactly-once

Finally it prints what a read_committed consumer sees in `out`. The same pipeline from the command
line, restarted from its checkpoint after failures (from the repository root, where
`--transform` finds the `examples` package):

    .venv/bin/sparkafka run --source-topic in --sink-topic out --checkpoint ./ckpt \\
        --transform examples.seed001_map:transform
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.session import spark_session

if not __package__:  # run as `python examples/seed001_map.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.kafka_io import create_topics, read_committed

INPUT_LINES = ["aa,bb", "cc,dd", "ee,ff", "gg,hh", "ii,jj"]


def transform(events: DataFrame) -> DataFrame:
    """The source's rows -> the sink's: the key unchanged, the value wrapped in EVENT(...)."""
    return events.select(
        "key", F.concat(F.lit("EVENT("), F.col("value").cast("string"), F.lit(")")).alias("value")
    )


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
        for record in output:
            print(f"  {record.value().decode()}")
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
