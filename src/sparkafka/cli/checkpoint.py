"""`sparkafka checkpoint`: move a streaming checkpoint between sparkafka and Spark's kafka format."""

from __future__ import annotations

from pathlib import Path

import typer

checkpoint_app = typer.Typer(
    help="Streaming checkpoints: the way back from sparkafka to Spark's kafka format.",
    no_args_is_help=True,
)


@checkpoint_app.command("to-spark-kafka")
def to_spark_kafka(
    checkpoint: Path = typer.Argument(..., help="The query's checkpointLocation (a local directory)."),
    backup: Path = typer.Option(
        None,
        "--backup",
        help="Where to copy offsets/ and commits/ first (default: <checkpoint>.backup-<time>).",
    ),
) -> None:
    """Drop sparkafka's own entries from the offsets log, so that the query can restart on
    format("kafka") from where it stopped. Stop the query first. Without this, Spark's source stops
    with "Expected e.g. {"topicA":{"0":23,"1":-1},...}, got {... "sparkafka:split" ...}".

    Example: sparkafka checkpoint to-spark-kafka /checkpoints/events
    """
    from sparkafka.tools.checkpoint import CheckpointError
    from sparkafka.tools.checkpoint import to_spark_kafka as rewrite

    try:
        done = rewrite(checkpoint, backup)
    except CheckpointError as error:
        typer.echo(f"sparkafka checkpoint to-spark-kafka: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"backup of offsets/ and commits/: {done.backup}")
    if not done.rewritten_batches:
        typer.echo("no offsets file holds sparkafka entries: nothing to rewrite")
        return
    batches = ", ".join(str(batch) for batch in done.rewritten_batches)
    typer.echo(f"rewrote the offsets of micro-batch(es) {batches}")
    typer.echo(f"removed entries: {', '.join(sorted(done.removed_entries))}")
    typer.echo('the query can now restart with format("kafka") on the same checkpointLocation')
