"""The `sparkafka` command line."""

from __future__ import annotations

import typer

from sparkafka import __version__
from sparkafka.cli import broker as broker_commands
from sparkafka.cli import checkpoint as checkpoint_commands
from sparkafka.cli import class_archive as class_archive_commands
from sparkafka.cli import console as console_commands
from sparkafka.cli import demo as demo_commands
from sparkafka.cli import pipeline as pipeline_commands

EPILOG = """\
Examples:

  sparkafka broker --listen 127.0.0.1:9092 --data-dir ./kafka-data

  sparkafka dump-log --data-dir ./kafka-data --topic out
"""

app = typer.Typer(
    name="sparkafka",
    help="Exactly-once Kafka -> Spark -> Kafka pipelines for PySpark, and the tools to watch and prove them.",
    epilog=EPILOG,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"sparkafka {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Exactly-once Kafka -> Spark -> Kafka pipelines for PySpark."""


app.command("broker")(broker_commands.broker)
app.command("dump-log")(broker_commands.dump_log)
app.command("run")(pipeline_commands.run)
app.command("demo")(demo_commands.demo)
app.command("verify")(demo_commands.verify)
app.command("produce", cls=console_commands.ProduceCommand)(console_commands.produce)
app.command("consume", cls=console_commands.ConsumeCommand)(console_commands.consume)
app.add_typer(console_commands.topics_app, name="topics")
app.add_typer(console_commands.groups_app, name="groups")
app.add_typer(console_commands.transactions_app, name="transactions")
app.add_typer(checkpoint_commands.checkpoint_app, name="checkpoint")
app.add_typer(class_archive_commands.class_archive_app, name="class-archive")


def main() -> None:
    app()
