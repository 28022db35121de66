"""`sparkafka demo` and `sparkafka verify`: the exactly-once proofs."""

from __future__ import annotations

import typer


def demo(
    bootstrap_servers: str = typer.Option(
        None, "--bootstrap-servers", help="Run on an existing cluster (topic names get a unique prefix)."
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Keep the work directory (broker data, checkpoint, logs)."
    ),
) -> None:
    """Seed 001's experiment in one command: kill -9 an exactly-once pipeline mid-transaction, restart it,
    and show that read_committed readers see every record exactly once.

    Example: sparkafka demo
    """
    from rich.console import Console

    from sparkafka.demo import run_demo
    from sparkafka.errors import SparkafkaError

    console = Console()
    try:
        verdict = run_demo(console, bootstrap_servers, keep)
    except SparkafkaError as error:
        typer.echo(f"sparkafka demo: {error}", err=True)
        raise typer.Exit(1) from None
    if not verdict.exactly_once:
        raise typer.Exit(1)
