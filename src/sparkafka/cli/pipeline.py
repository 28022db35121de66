"""`sparkafka run`: a Kafka -> Spark -> Kafka pipeline from the command line."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import typer

from sparkafka.cli.common import parse_key_values


def run(
    bootstrap_servers: str = typer.Option(
        "localhost:9092", "--bootstrap-server", "--bootstrap-servers", help="Kafka cluster to read and write."
    ),
    source_topic: list[str] = typer.Option([], "--source-topic", help="Topic to read (repeatable)."),
    source_pattern: str = typer.Option(
        None, "--source-pattern", help="Regex of topics to read (instead of --source-topic)."
    ),
    sink_topic: str = typer.Option(..., "--sink-topic", help="Topic to write."),
    sql: str = typer.Option(
        None,
        "--sql",
        help="SELECT ... FROM input (the source's columns: key, value, topic, ...). Without --sql or "
        "--transform: seed 001's map, concat('EVENT(', value, ')').",
    ),
    transform: str = typer.Option(
        None,
        "--transform",
        help="module:function taking and returning a DataFrame; the module is looked up in the "
        "working directory first, as python -m does, and from there shipped to the executors.",
    ),
    checkpoint: str = typer.Option(
        ..., "--checkpoint", help="Checkpoint directory: offsets and state survive restarts here."
    ),
    trigger: str = typer.Option("1s", "--trigger", help="Micro-batch interval, e.g. 1s, 500ms, 1m."),
    delivery_guarantee: str = typer.Option(
        "exactly-once", "--delivery-guarantee", help="exactly-once, at-least-once or none."
    ),
    restart_attempts: int = typer.Option(
        0,
        "--restart-attempts",
        min=0,
        help="Restarts from the checkpoint after failures: this many in the pipeline's life (Flink's "
        "fixed-delay), or within --restart-failure-interval (Flink's failure-rate).",
    ),
    restart_delay: str = typer.Option("2s", "--restart-delay", help="Wait before each restart."),
    restart_failure_interval: str = typer.Option(
        None,
        "--restart-failure-interval",
        help="Count only the failures of the last interval, e.g. 10m, against --restart-attempts.",
    ),
    source_option: list[str] = typer.Option(
        [], "--source-option", help="KEY=VALUE for the source (repeatable), e.g. maxOffsetsPerTrigger=1000."
    ),
    sink_option: list[str] = typer.Option(
        [],
        "--sink-option",
        help="KEY=VALUE for the sink (repeatable), e.g. kafka.transaction.timeout.ms=60000.",
    ),
    output_mode: str = typer.Option(
        "append",
        "--output-mode",
        help="append (maps, watermarked windows), update (running aggregates) or complete.",
    ),
    master: str = typer.Option("local[*]", "--master", help="Spark master."),
    spark_conf: list[str] = typer.Option(
        [],
        "--spark-conf",
        help="KEY=VALUE Spark setting for the session (repeatable), e.g. spark.executor.memory=2g.",
    ),
) -> None:
    """Run a pipeline until SIGINT/SIGTERM; prints one line per micro-batch.

    Example: sparkafka run --source-topic in --sink-topic out --checkpoint ./ckpt
      --sql "SELECT concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
    """
    from sparkafka.connector.api import parse_duration_ms
    from sparkafka.errors import SparkafkaError
    from sparkafka.runtime.session import spark_session
    from sparkafka.tools.pipeline import (
        SEED_MAP_SQL,
        BatchProgress,
        Pipeline,
        PipelineConfig,
        load_transform,
        ship_transform_module,
    )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # py4j logs every foreachBatch callback at INFO: a line per micro-batch that says nothing.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        config = PipelineConfig(
            bootstrap_servers=bootstrap_servers,
            sink_topic=sink_topic,
            checkpoint=checkpoint,
            source_topics=source_topic,
            source_pattern=source_pattern,
            sql=sql if sql or transform else SEED_MAP_SQL,
            transform=transform,
            trigger=_spark_interval(trigger),
            delivery_guarantee=delivery_guarantee,
            source_options=parse_key_values("--source-option", source_option),
            sink_options=parse_key_values("--sink-option", sink_option),
            output_mode=output_mode,
        )
        config.validate_options()
        session_conf = parse_key_values("--spark-conf", spark_conf)
        for key in session_conf:
            if not key.startswith("spark."):
                raise SparkafkaError(
                    f"--spark-conf {key}: Spark ignores settings whose name does not start with 'spark.'"
                )
        delay_s = parse_duration_ms("--restart-delay", restart_delay) / 1000
        failure_interval_s = (
            None
            if restart_failure_interval is None
            else parse_duration_ms("--restart-failure-interval", restart_failure_interval) / 1000
        )
        if transform:
            load_transform(transform)  # a wrong name fails now, not after Spark has started
    except SparkafkaError as error:
        raise typer.BadParameter(str(error)) from None

    def report(progress: BatchProgress) -> None:
        lag = "?" if progress.lag is None else str(progress.lag)
        out = "?" if progress.output_rows < 0 else str(progress.output_rows)
        typer.echo(
            f"batch {progress.batch_id}: in={progress.input_rows} out={out} lag={lag} "
            f"time={progress.duration_ms} ms"
        )

    spark = spark_session("sparkafka-run", master=master, conf=session_conf)
    pipeline = Pipeline(
        spark,
        config,
        restart_attempts=restart_attempts,
        restart_delay_s=delay_s,
        restart_failure_interval_s=failure_interval_s,
        on_progress=report,
    )
    pipeline.install_signal_handlers()
    with tempfile.TemporaryDirectory(prefix="sparkafka-run-") as scratch:
        try:
            if transform:
                ship_transform_module(spark, transform, Path(scratch))
            pipeline.run()
        except SparkafkaError as error:
            typer.echo(f"sparkafka run: {error}", err=True)
            raise typer.Exit(1) from None
        finally:
            spark.stop()
    sys.stdout.flush()


def _spark_interval(value: str) -> str:
    """`1s` -> `1000 milliseconds` (Spark's processingTime accepts interval strings)."""
    from sparkafka.connector.api import parse_duration_ms

    return f"{parse_duration_ms('--trigger', value)} milliseconds"
