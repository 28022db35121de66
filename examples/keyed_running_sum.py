"""Seed 003's job, exactly-once: a running sum per key, kept in Spark's state. One command:

    .venv/bin/python examples/keyed_running_sum.py

It starts the embedded broker (`sparkafka broker`) in a temporary directory and produces `key,amount`
lines to `amounts`. A streaming query in update mode sums the amounts per key:

    readStream sparkafka  ->  transform: split 'key,amount', groupBy(key).sum(amount)
    ->  foreachBatch: batch.write sparkafka, deliveryGuarantee=exactly-once  ->  `sums`

Python streaming sinks take append mode only, so update-mode output goes through foreachBatch; its
write tasks still carry the query and batch ids, so a replayed batch is written exactly once. Each
micro-batch writes one record per key it changed: key -> the key's sum so far. The query runs twice
with trigger(availableNow=True) — more input arrives in between — and the second run resumes from
the checkpoint with the sums of the first. Finally it prints what a read_committed consumer sees.

The same pipeline from the command line (from the repository root, where
`--transform` finds the `examples` package):

    .venv/bin/sparkafka run --source-topic amounts --sink-topic sums \\
        --checkpoint ./ckpt --output-mode update --transform examples.keyed_running_sum:transform
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.session import spark_session

if not __package__:  # run as `python examples/keyed_running_sum.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.kafka_io import create_topics, read_committed

FIRST_INPUT = ["alice,10", "bob,5", "alice,7", "carol,1"]
SECOND_INPUT = ["bob,20", "carol,2", "dave,4", "alice,3"]
# Tiny input: one core (one Python worker, which keeps its transactional producer from batch to
# batch) and one shuffle partition, so one state store and one transactional id.
TINY_INPUT_CONF = {"spark.sql.shuffle.partitions": "1"}


def transform(events: DataFrame) -> DataFrame:
    """``key,amount`` lines -> (key, running sum of its amounts as text). Aggregates: update mode."""
    fields = F.split(F.col("value").cast("string"), ",")
    amounts = events.select(
        F.trim(fields.getItem(0)).alias("key"), F.trim(fields.getItem(1)).cast("long").alias("amount")
    )
    return (
        amounts.groupBy("key")
        .agg(F.sum("amount").alias("total"))
        .select("key", F.col("total").cast("string").alias("value"))
    )


def produce(bootstrap: str, lines: list[str]) -> None:
    sender = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for line in lines:
        sender.produce("amounts", value=line.encode())
    sender.flush(30)


def run_pipeline(spark: SparkSession, bootstrap: str, checkpoint: Path) -> None:
    """One AvailableNow run: everything in `amounts` the checkpoint has not seen yet."""
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "amounts")
        .option("startingOffsets", "earliest")
        .load()
    )

    def write_exactly_once(batch: DataFrame, batch_id: int) -> None:
        (
            batch.write.format("sparkafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "sums")
            .option("deliveryGuarantee", "exactly-once")
            # A df.write names its transactional ids: one prefix per exactly-once write of a batch.
            .option("transactionalIdPrefix", "running-sums")
            # The query's checkpoint, which Spark hands only a writeStream's own sink: the sink tells
            # a replayed batch from one planned anew after the checkpoint went back.
            .option("checkpointLocation", str(checkpoint))
            .mode("append")
            .save()
        )

    query = (
        transform(events)
        .writeStream.outputMode("update")
        .foreachBatch(write_exactly_once)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything runs on this machine
    workdir = Path(tempfile.mkdtemp(prefix="sparkafka-running-sum-"))
    broker = BrokerProcess(workdir / "kafka").start()
    try:
        bootstrap = broker.bootstrap_servers
        print(f"broker on {bootstrap} (data in {workdir})", flush=True)
        create_topics(bootstrap, "amounts", "sums")
        spark = spark_session("sparkafka-example-running-sum", master="local[1]", conf=TINY_INPUT_CONF)
        for number, lines in enumerate((FIRST_INPUT, SECOND_INPUT), start=1):
            produce(bootstrap, lines)
            print(
                f"run {number}: produced {', '.join(lines)}; running the pipeline (AvailableNow)...",
                flush=True,
            )
            run_pipeline(spark, bootstrap, workdir / "checkpoint")
        spark.stop()
        updates = [(m.key().decode(), m.value().decode()) for m in read_committed(bootstrap, "sums")]
        print(f"\nsums ({len(updates)} updates, read_committed, in order):")
        for key, value in updates:
            print(f"  {key} -> {value}")
        final = dict(updates)  # the last update of each key is its sum
        print("\nfinal sums: " + ", ".join(f"{key}={final[key]}" for key in sorted(final)))
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
