"""Parsing and validation of connector options, shared by the source and the sink.

Spark hands a Python data source its options in a case-insensitive map whose keys are lower-cased,
so every lookup here goes through the lower-cased key while every message uses the documented
spelling (``subscribePattern``, not ``subscribepattern``). Options starting with ``kafka.`` are
Kafka client properties: they are passed to confluent-kafka (librdkafka) with the prefix removed.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkafka.errors import SparkafkaOptionError

KAFKA_PREFIX = "kafka."

# Kafka client properties of the Java client that librdkafka does not know, with what to use instead.
# Users port option sets from Spark's built-in source; a pointer beats librdkafka's bare
# "No such configuration property".
JAVA_ONLY_CLIENT_PROPERTIES: Mapping[str, str] = {
    "ssl.truststore.location": "kafka.ssl.ca.location (a PEM file of CA certificates)",
    "ssl.truststore.password": "kafka.ssl.ca.location (a PEM file needs no password)",
    "ssl.truststore.type": "kafka.ssl.ca.location (a PEM file)",
    "ssl.keystore.type": "kafka.ssl.keystore.location (PKCS#12) or kafka.ssl.certificate.location",
    "sasl.jaas.config": "kafka.sasl.username and kafka.sasl.password (or kafka.sasl.oauthbearer.*)",
    "max.poll.records": "maxOffsetsPerTrigger to bound a micro-batch",
    "max.poll.interval.ms": "nothing: the connector never joins a consumer group",
}


@dataclass(frozen=True)
class OptionSpec:
    """A connector option: its documented spelling and a one-line description for messages."""

    name: str
    description: str = ""
    # Accepted, but left out of the options a message lists or suggests: internal test hooks.
    hidden: bool = False

    @property
    def key(self) -> str:
        return self.name.lower()


class OptionReader:
    """Typed, validated access to a case-insensitive option map.

    Construction rejects unknown options (suggesting the closest known name); the typed getters
    raise :class:`SparkafkaOptionError` naming the option and the offending value."""

    def __init__(self, options: Mapping[str, str], specs: Iterable[OptionSpec], *, component: str) -> None:
        self.component = component
        self.specs = {spec.key: spec for spec in specs}
        self.values: dict[str, str] = {str(key).lower(): str(value) for key, value in options.items()}
        self._reject_unknown()

    def _reject_unknown(self) -> None:
        for key in sorted(self.values):
            if key in self.specs or key.startswith(KAFKA_PREFIX):
                continue
            raise SparkafkaOptionError(
                unknown_option_message(key, [spec.name for spec in self.specs.values() if not spec.hidden])
            )

    def name(self, key: str) -> str:
        """The documented spelling of an option, for messages."""
        spec = self.specs.get(key.lower())
        return spec.name if spec is not None else key

    def has(self, name: str) -> bool:
        return name.lower() in self.values

    def raw(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        return default if value is None else value.strip()

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        return parse_bool(self.name(name), value)

    def optional_integer(self, name: str, *, minimum: int | None = None) -> int | None:
        value = self.raw(name)
        return None if value is None else parse_int(self.name(name), value, minimum=minimum)

    def integer(self, name: str, default: int, *, minimum: int | None = None) -> int:
        value = self.optional_integer(name, minimum=minimum)
        return default if value is None else value

    def duration_ms(self, name: str, default: str) -> int:
        value = self.raw(name)
        return parse_duration_ms(self.name(name), default if value is None else value)

    def choice(self, name: str, choices: Iterable[str], default: str) -> str:
        value = self.raw(name)
        if value is None:
            return default
        return parse_choice(self.name(name), value, choices)

    def kafka_params(self) -> dict[str, str]:
        """The ``kafka.*`` options with the prefix removed, ready for a confluent-kafka client."""
        return {
            key[len(KAFKA_PREFIX) :]: value
            for key, value in self.values.items()
            if key.startswith(KAFKA_PREFIX)
        }


def unknown_option_message(key: str, known_names: Iterable[str]) -> str:
    """``unknown option 'subscirbe'; did you mean 'subscribe'?`` (or the list when nothing is close)."""
    names = sorted(set(known_names))
    by_key = {name.lower(): name for name in names}
    close = difflib.get_close_matches(key.lower(), list(by_key), n=1, cutoff=0.6)
    if close:
        return f"unknown option '{key}'; did you mean '{by_key[close[0]]}'?"
    return f"unknown option '{key}'; known options are {', '.join(names)} and kafka.* client properties"


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise SparkafkaOptionError(f"option '{name}' must be true or false, got '{value}'")


def parse_int(name: str, value: str, *, minimum: int | None = None) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise SparkafkaOptionError(f"option '{name}' must be an integer, got '{value}'") from None
    if minimum is not None and number < minimum:
        raise SparkafkaOptionError(f"option '{name}' must be at least {minimum}, got {number}")
    return number


def parse_choice(name: str, value: str, choices: Iterable[str]) -> str:
    allowed = list(choices)
    lowered = value.strip().lower()
    if lowered in allowed:
        return lowered
    close = difflib.get_close_matches(lowered, allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise SparkafkaOptionError(f"option '{name}' must be one of {', '.join(allowed)}, got '{value}'{hint}")


_DURATION_UNITS_MS: Mapping[str, float] = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def parse_duration_ms(name: str, value: str) -> int:
    """Spark's time strings (``15m``, ``30s``, ``100ms``, ``2h``); a bare number means milliseconds."""
    match = _DURATION.match(value.lower())
    unit = match.group(2) if match else None
    if match is None or (unit and unit not in _DURATION_UNITS_MS):
        raise SparkafkaOptionError(
            f"option '{name}' must be a duration such as 100ms, 30s, 15m, 1h or a number of milliseconds, "
            f"got '{value}'"
        )
    return int(int(match.group(1)) * _DURATION_UNITS_MS[unit or "ms"])


def parse_json_object(name: str, value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise SparkafkaOptionError(f"option '{name}' is not valid JSON ({error.msg}): {value}") from None
    if not isinstance(parsed, dict):
        raise SparkafkaOptionError(f"option '{name}' must be a JSON object, got: {value}")
    return parsed


def parse_topic_partitions(name: str, value: str) -> list[tuple[str, int]]:
    """Spark's ``assign`` format: ``{"topicA":[0,1],"topicB":[2,4]}``."""
    if not value.strip().startswith("{"):
        raise SparkafkaOptionError(
            f"No topicpartitions to assign as specified value for option '{name}' is '{value}'; "
            'expected JSON such as {"topicA":[0,1],"topicB":[2,4]}'
        )
    parsed = parse_json_object(name, value)
    partitions: list[tuple[str, int]] = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not all(isinstance(n, int) and n >= 0 for n in numbers):
            raise SparkafkaOptionError(
                f"option '{name}': topic '{topic}' must map to a list of partition numbers, got {numbers!r}"
            )
        partitions.extend((topic, number) for number in numbers)
    if not partitions:
        raise SparkafkaOptionError(f"option '{name}' assigns no partitions: {value}")
    return sorted(set(partitions))


def parse_partition_numbers(name: str, value: str) -> dict[tuple[str, int], int]:
    """Spark's per-partition offset/timestamp format: ``{"topicA":{"0":23,"1":-1}}``."""
    parsed = parse_json_object(name, value)
    result: dict[tuple[str, int], int] = {}
    for topic, by_partition in parsed.items():
        if not isinstance(by_partition, dict):
            raise SparkafkaOptionError(
                f"option '{name}': topic '{topic}' must map to "
                f'{{"partition": number}}, got {by_partition!r}'
            )
        for partition, number in by_partition.items():
            if not str(partition).isdigit() or isinstance(number, bool) or not isinstance(number, int):
                raise SparkafkaOptionError(
                    f"option '{name}': expected \"partition\": number for topic '{topic}', "
                    f"got {partition!r}: {number!r}"
                )
            result[(topic, int(partition))] = number
    if not result:
        raise SparkafkaOptionError(f"option '{name}' names no partitions: {value}")
    return result


def reject_forbidden_kafka_params(params: Mapping[str, str], forbidden: Mapping[str, str]) -> None:
    """Raise for a ``kafka.*`` property the connector must control itself; ``forbidden`` maps the
    property (without prefix) to the sentence explaining what to do instead."""
    for key in sorted(params):
        if key in forbidden:
            raise SparkafkaOptionError(f"Kafka option '{key}' is not supported. {forbidden[key]}")


def java_only_property_hint(property_name: str) -> str | None:
    alternative = JAVA_ONLY_CLIENT_PROPERTIES.get(property_name)
    if alternative is None:
        return None
    return (
        f"'kafka.{property_name}' is a Java Kafka client property; sparkafka uses librdkafka "
        f"(confluent-kafka), use {alternative}"
    )
