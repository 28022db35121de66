"""The benchmark workloads on Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10):
the system a Spark user compares sparkafka with first. Its sink has no transactions, so it runs
at-least-once only.

The same Spark settings as ``sparkafka run`` (sparkafka's session builder: local[2], its shuffle
partitions, collector, checkpoint writer and Python launchers; the connector's jars on
``spark.jars``), the same SQL, the same trigger (the commit interval) and the same
``maxOffsetsPerTrigger`` (``BENCH_MAX_OFFSETS_PER_TRIGGER``, set by the driver). map writes in
append mode, count in update mode (Spark's sink takes it directly).

The connector's jars are those ``scripts/install --test`` fetches with Maven; without them the run
fails saying so. Stdlib and the project venv (sparkafka, PySpark) only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from runner_args import runner_parser

REPO = Path(__file__).resolve().parents[2]
MAP_SQL = "SELECT key, concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
COUNT_SQL = "SELECT key, CAST(count(*) AS STRING) AS value FROM input GROUP BY key"
# What the connector needs beyond the jars PySpark ships.
NEEDED_JARS = (
    "spark-sql-kafka-0-10_2.13-",
    "spark-token-provider-kafka-0-10_2.13-",
    "kafka-clients-",
    "commons-pool2-",
)


def connector_jars() -> list[Path]:
    version = (REPO / "tests" / "spark_kafka" / "version").read_text().split()[0]
    directory = REPO / ".venv" / "share" / "sparkafka-test" / f"spark-sql-kafka-{version}" / "jars"
    jars = [path for path in sorted(directory.glob("*.jar")) if path.name.startswith(NEEDED_JARS)]
    if len(jars) < len(NEEDED_JARS):
        sys.exit(f"Spark's Kafka connector {version} is not in {directory}: scripts/install --test gets it")
    return jars


def main() -> None:
    args = runner_parser(__doc__.split("\n\n")[0]).parse_args()
    if args.guarantee != "at-least-once":
        sys.exit("Spark's Kafka sink writes at-least-once only")
    from sparkafka.runtime.session import spark_session

    jars = ",".join(str(path) for path in connector_jars())
    spark = spark_session("bench-spark-kafka", master="local[2]", conf={"spark.jars": jars})
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.input_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("BENCH_MAX_OFFSETS_PER_TRIGGER", "200000"))
        .load()
    )
    source.createOrReplaceTempView("input")
    frame = spark.sql(MAP_SQL if args.workload == "map" else COUNT_SQL)
    query = (
        frame.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("topic", args.output_topic)
        .option("checkpointLocation", str(Path(args.work_dir) / "checkpoint"))
        .outputMode("append" if args.workload == "map" else "update")
        .trigger(processingTime=f"{args.commit_interval_ms} milliseconds")
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5) and query.isActive:
        pass
    if query.exception() is not None:
        sys.exit(f"the query failed: {query.exception()}")
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
