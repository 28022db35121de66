"""Runs streaming queries one after the other on one checkpoint, each on Spark's own ``kafka`` format
or on ``sparkafka``, in one Spark process with the connector's jars; prints what each step did
(``REPORT {json}``). Used by ``test_migration_spark_kafka.py``:
``python migration_runner.py JARS BOOTSTRAP CHECKPOINT STEPS``.

Each step, in order: produce records ``r{i:04d}`` (``"produce": [first, count]``, keys ``k{i % 5}``);
rewrite the checkpoint for Spark's format with ``sparkafka checkpoint to-spark-kafka``
(``"rewrite": true``); run a query to the end of its input (``trigger(availableNow=True)``):
``"source"`` and ``"sink"`` formats, ``"mode"`` ``map`` (the record id as value) or ``count`` (a
running count per key in update mode, ``key:count``; sparkafka writes it exactly-once through
``foreachBatch``), ``"sink_options"`` added to the sink. Reported per step: the query's input rows,
or the error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.integration.spark_session import local_spark_session

INPUT, OUTPUT, PREFIX = "migration-in", "migration-out", "migration"


def produce(bootstrap: str, first: int, count: int) -> None:
    sender = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(first, first + count):
        sender.produce(INPUT, key=f"k{i % 5}", value=f"r{i:04d}", partition=i % 2)
    assert sender.flush(30) == 0


def run_query(spark: SparkSession, bootstrap: str, checkpoint: str, step: dict[str, Any]) -> dict[str, Any]:
    source = (
        spark.readStream.format(step["source"])
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", INPUT)
        .option("startingOffsets", "earliest")
        .load()
    )
    sink_options = {"kafka.bootstrap.servers": bootstrap, "topic": OUTPUT, **step.get("sink_options", {})}
    if step["sink"] == "sparkafka":
        sink_options.update(deliveryGuarantee="exactly-once", transactionalIdPrefix=PREFIX)
        if step["mode"] != "map":  # a df.write in foreachBatch names the query's checkpoint
            sink_options["checkpointLocation"] = checkpoint
    if step["mode"] == "map":
        rows = source.select("key", F.col("value").cast("string").alias("value"))
        writer = rows.writeStream.outputMode("append").format(step["sink"]).options(**sink_options)
    else:
        counts = source.groupBy(F.col("key").cast("string").alias("key")).count()
        rows = counts.select("key", F.concat_ws(":", "key", F.col("count").cast("string")).alias("value"))
        writer = rows.writeStream.outputMode("update")
        if step["sink"] == "kafka":
            writer = writer.format("kafka").options(**sink_options)
        else:

            def write(batch: DataFrame, _batch_id: int) -> None:
                batch.write.format("sparkafka").options(**sink_options).mode("append").save()

            writer = writer.foreachBatch(write)
    try:
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
        return {"result": "ok", "input_rows": sum(p.numInputRows for p in query.recentProgress)}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)[:4000]}


def rewrite(checkpoint: str) -> dict[str, Any]:
    command = Path(sys.executable).with_name("sparkafka")
    done = subprocess.run(
        [str(command), "checkpoint", "to-spark-kafka", checkpoint], capture_output=True, text=True, timeout=60
    )
    return {"exit": done.returncode, "output": done.stdout + done.stderr}


def main() -> None:
    jars, bootstrap, checkpoint, steps = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spark = local_spark_session("sparkafka-migration", conf={"spark.jars": jars})
    report = []
    for step in steps:
        done: dict[str, Any] = {}
        if "produce" in step:
            produce(bootstrap, *step["produce"])
        if step.get("rewrite"):
            done["rewrite"] = rewrite(checkpoint)
        if "source" in step:
            done.update(run_query(spark, bootstrap, checkpoint, step))
        report.append(done)
        print(f"STEP {len(report)} {json.dumps(done)}", flush=True)
    print("REPORT " + json.dumps({"steps": report}))
    spark.stop()


if __name__ == "__main__":
    main()
