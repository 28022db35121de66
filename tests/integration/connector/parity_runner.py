"""Runs a parity plan through Spark's own Kafka connector and through sparkafka, in one Spark process
with the connector's jars, and prints what each format did (``REPORT {json}``).

Run as a script by ``test_parity_spark_kafka.py``: ``python parity_runner.py JARS BOOTSTRAP PLAN``.
The plan has four parts, each a mapping of case name to case:

- ``reads``: batch read options; reported: schema, rows, number of input partitions, or the error;
- ``streams``: streaming read options run with ``trigger(availableNow=True)``; reported: each
  micro-batch's records as ``[partition, offset]`` pairs;
- ``writes``: ``{"columns": [SQL over spark.range(rows)], "rows": n, "options": {...}, "mode": m}``
  written by ``df.write`` to ``"{topic}"`` replaced with the case's topic for that format; reported:
  ``"ok"`` or the error. The test reads the written records back itself.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from tests.integration.spark_session import local_spark_session

FORMATS = ("kafka", "sparkafka")


def plain(value: Any) -> Any:
    """A row's value as JSON: bytes as hex, rows as dicts, timestamps as ISO strings."""
    if isinstance(value, bytes | bytearray):
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


def failure(error: Exception) -> dict[str, str]:
    return {"error": type(error).__name__, "message": str(error)[:4000]}


def batch_read(spark: SparkSession, source: str, bootstrap: str, options: dict[str, str]) -> dict[str, Any]:
    try:
        frame = (
            spark.read.format(source).option("kafka.bootstrap.servers", bootstrap).options(**options).load()
        )
        rows = sorted(
            (plain(row.asDict()) for row in frame.collect()),
            key=lambda r: (r["topic"], r["partition"], r["offset"]),
        )
        return {
            "schema": [(f.name, f.dataType.simpleString(), f.nullable) for f in frame.schema.fields],
            "rows": rows,
            "input_partitions": frame.rdd.getNumPartitions(),
        }
    except Exception as error:
        return failure(error)


def stream_batches(
    spark: SparkSession, source: str, bootstrap: str, options: dict[str, str]
) -> dict[str, Any]:
    batches: dict[int, list[list[int]]] = {}

    def keep(batch: DataFrame, batch_id: int) -> None:
        batches[batch_id] = sorted([row.partition, row.offset] for row in batch.collect())

    try:
        frame = (
            spark.readStream.format(source)
            .option("kafka.bootstrap.servers", bootstrap)
            .options(**options)
            .load()
        )
        query = (
            frame.select("partition", "offset")
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", tempfile.mkdtemp(prefix=f"parity-{source}-"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        if query.exception() is not None:
            return failure(query.exception())  # type: ignore[arg-type]
        return {"batches": [batches[batch_id] for batch_id in sorted(batches) if batches[batch_id]]}
    except Exception as error:
        return failure(error)


def batch_write(
    spark: SparkSession, sink: str, bootstrap: str, case: dict[str, Any], topic: str
) -> dict[str, Any]:
    columns = [column.replace("{topic}", topic) for column in case["columns"]]
    options = {key: value.replace("{topic}", topic) for key, value in case.get("options", {}).items()}
    try:
        frame = spark.range(case.get("rows", 20), numPartitions=2).selectExpr(*columns)
        (
            frame.write.format(sink)
            .option("kafka.bootstrap.servers", bootstrap)
            .options(**options)
            .mode(case.get("mode", "append"))
            .save()
        )
        return {"result": "ok"}
    except Exception as error:
        return failure(error)


def named_stream_write(
    spark: SparkSession, sink: str, bootstrap: str, case: dict[str, Any]
) -> dict[str, Any]:
    """A streaming write of a named query (Spark hands the name to the sink as option queryName)."""
    options = {key: value for key, value in case.get("sink_options", {}).get(sink, {}).items()}
    try:
        query = (
            spark.readStream.format(sink)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", case["source"])
            .option("startingOffsets", "earliest")
            .load()
            .select("key", "value")
            .writeStream.format(sink)
            .queryName(f"parity-named-{sink}")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", f"{case['topic']}-{sink}")
            .options(**options)
            .option("checkpointLocation", tempfile.mkdtemp(prefix=f"parity-named-{sink}-"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        if query.exception() is not None:
            return failure(query.exception())  # type: ignore[arg-type]
        return {"result": "ok", "name": query.name}
    except Exception as error:
        return failure(error)


def main() -> None:
    jars, bootstrap, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spark = local_spark_session("sparkafka-parity", conf={"spark.jars": jars})
    report: dict[str, dict[str, Any]] = {"reads": {}, "streams": {}, "writes": {}}
    for name, options in plan.get("reads", {}).items():
        report["reads"][name] = {source: batch_read(spark, source, bootstrap, options) for source in FORMATS}
    for name, options in plan.get("streams", {}).items():
        report["streams"][name] = {
            source: stream_batches(spark, source, bootstrap, options) for source in FORMATS
        }
    for name, case in plan.get("writes", {}).items():
        report["writes"][name] = {
            sink: batch_write(spark, sink, bootstrap, case, f"{case['topic']}-{sink}") for sink in FORMATS
        }
    for name, case in plan.get("named_streams", {}).items():
        report.setdefault("named_streams", {})[name] = {
            sink: named_stream_write(spark, sink, bootstrap, case) for sink in FORMATS
        }
    print("REPORT " + json.dumps(report))
    spark.stop()


if __name__ == "__main__":
    main()
