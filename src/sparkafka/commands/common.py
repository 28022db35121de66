"""Small helpers shared by the command modules."""

from __future__ import annotations

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
