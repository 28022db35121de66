"""`sparkafka demo` and `sparkafka verify`: the exactly-once proofs."""

from __future__ import annotations

import typer


def demo(
    bootstrap_servers: str = typer.Option(
        None,
        "--bootstrap-server",
        "--bootstrap-servers",
        help="Run on an existing cluster (topic names get a unique prefix).",
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

    from sparkafka.errors import SparkafkaError
    from sparkafka.tools.demo import run_demo

    console = Console()
    try:
        verdict = run_demo(console, bootstrap_servers, keep)
    except SparkafkaError as error:
        typer.echo(f"sparkafka demo: {error}", err=True)
        raise typer.Exit(1) from None
    if not verdict.exactly_once:
        raise typer.Exit(1)


def verify(
    records: int = typer.Option(2000, "--records", min=1, help="Unique keyed input records to send."),
    kills: int = typer.Option(3, "--kills", min=0, help="SIGKILLs of the pipeline's process group."),
    partitions: int = typer.Option(
        2, "--partitions", min=1, help="Partitions of the input and output topics."
    ),
    keys: int = typer.Option(20, "--keys", min=1, help="Distinct keys (per-key order is checked)."),
    delivery_guarantee: str = typer.Option(
        "exactly-once",
        "--delivery-guarantee",
        help="exactly-once, at-least-once or none (watch duplicates appear).",
    ),
    kill_broker: bool = typer.Option(
        False, "--kill-broker", help="Also SIGKILL and restart the embedded broker."
    ),
    bootstrap_servers: str = typer.Option(
        None, "--bootstrap-server", "--bootstrap-servers", help="Run on an existing cluster."
    ),
    seed: int = typer.Option(None, "--seed", help="Random seed of the kill moments (printed by every run)."),
    send_seconds: float = typer.Option(
        20.0, "--send-seconds", min=1.0, help="Spread the input over this long."
    ),
) -> None:
    """The chaos proof: kill the pipeline at random moments while input streams in, then check that
    read_committed output has every input exactly once, in per-key order. Exit 0 only if it held.

    Example: sparkafka verify --records 5000 --kills 5 --kill-broker
    """
    from rich.console import Console

    from sparkafka.errors import SparkafkaError
    from sparkafka.tools.verify import VerifySettings, run_verify

    try:
        settings = VerifySettings(
            records=records,
            kills=kills,
            partitions=partitions,
            keys=keys,
            delivery_guarantee=delivery_guarantee,
            bootstrap_servers=bootstrap_servers,
            kill_broker=kill_broker,
            seed=seed,
            send_seconds=send_seconds,
        )
        verdict = run_verify(Console(), settings)
    except SparkafkaError as error:
        typer.echo(f"sparkafka verify: {error}", err=True)
        raise typer.Exit(1) from None
    if not verdict.exactly_once:
        raise typer.Exit(1)
