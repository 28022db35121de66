"""`sparkafka class-archive`: the driver JVM's class archive, a third off a session's start-up."""

from __future__ import annotations

import typer

class_archive_app = typer.Typer(
    help=(
        "The class-data-sharing archive of the Spark driver JVM: built once per JDK and Spark, it "
        "saves about a third of the CPU and time a sparkafka session takes to start."
    ),
    no_args_is_help=True,
)


@class_archive_app.command("build")
def build(
    if_missing: bool = typer.Option(
        False, "--if-missing", help="Do nothing when an archive of this JDK and Spark is already there."
    ),
) -> None:
    """Start a session once, with the driver JVM writing the classes it loads to an archive in the
    cache (SPARKAFKA_CACHE_DIR, else ~/.cache/sparkafka). Takes about a minute; later sparkafka
    sessions map it. SPARKAFKA_CLASS_ARCHIVE=off turns its use off.

    Example: sparkafka class-archive build --if-missing
    """
    from sparkafka.runtime import class_archive

    if if_missing and (existing := class_archive.whole_archive()) is not None:
        typer.echo(f"class archive already built: {existing}")
        return
    typer.echo("building the driver JVM's class archive (about a minute)...")
    try:
        archive = class_archive.build()
    except class_archive.ClassArchiveError as error:
        typer.echo(f"sparkafka class-archive build: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"class archive built: {archive}")


@class_archive_app.command("status")
def status() -> None:
    """Say which archive sparkafka sessions map, or why none."""
    from sparkafka.runtime import class_archive

    path = class_archive.archive_path()
    if path is None:
        typer.echo("no java or no Spark jars found: no class archive can be used")
        raise typer.Exit(1)
    usable = class_archive.usable_archive()
    if usable is not None:
        typer.echo(f"in use: {usable}")
    elif class_archive.switched_off():
        typer.echo(f"not used: {class_archive.SWITCH_ENV} turns it off")
    else:
        typer.echo(f"none for this JDK and Spark (expected at {path}): run 'sparkafka class-archive build'")


@class_archive_app.command("remove")
def remove() -> None:
    """Delete every class archive in the cache. Running sessions keep theirs until they stop."""
    from sparkafka.runtime import class_archive

    removed = class_archive.remove()
    typer.echo(f"removed {len(removed)} file(s)" if removed else "no class archive in the cache")
