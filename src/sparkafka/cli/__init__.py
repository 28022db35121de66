"""The ``sparkafka`` command line: one module per group of commands, assembled in :mod:`.app`."""

from sparkafka.cli.app import main

__all__ = ["main"]
