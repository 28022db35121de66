"""Small helpers shared by the command modules."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sparkafka.errors import SparkafkaOptionError


def parse_key_values(flag: str, entries: list[str]) -> dict[str, str]:
    """[`a=1`, `b=x=y`] -> {a: 1, b: x=y}; a clear error for an entry without `=`."""
    parsed: dict[str, str] = {}
    for entry in entries:
        key, separator, value = entry.partition("=")
        if not separator or not key:
            raise SparkafkaOptionError(f"{flag} {entry!r} is not KEY=VALUE")
        parsed[key.strip()] = value
    return parsed


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart (as kafka-consumer-groups.sh prints them).

    The last column is not padded, so lines carry no trailing blanks."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
