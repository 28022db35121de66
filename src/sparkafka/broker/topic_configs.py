"""Kafka's topic configs: every name Kafka 4 accepts, its type, default and valid range (Kafka's
LogConfig), and which of them this broker acts on.

A client may set any of them, as on Kafka: tools and frameworks create topics with configs such as
``compression.type``, ``segment.ms`` or ``unclean.leader.election.enable``, and a broker that refused
them would break those tools. The ones this broker does not act on are stored, described and
returned like the others, and logged when a topic is created with them (:func:`inert_configs`).

Validation follows Kafka's ConfigDef: a value is trimmed and parsed by type (a long or int is
digits with an optional sign, no underscores; a boolean is true or false in any case), then
checked against the config's range or choices. A value is stored as it was given, and described as
Kafka's DescribeConfigs describes it: parsed, then written back (:func:`described_value`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import cast

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.records import HEADER_SIZE
from sparkafka.broker.settings import ConfigType, default_of

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Kafka 4's lower bound for segment.bytes (KIP-1030); internal.segment.bytes goes below it.
MIN_SEGMENT_BYTES = 1024 * 1024

_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")


# A check of a parsed value: Kafka's message when the value is not valid (its ConfigException's
# text), else None. It gets the config's name, as Kafka's validators do.
Check = Callable[[str, object], str | None]


@dataclass(frozen=True)
class TopicConfigDefinition:
    name: str
    type: ConfigType
    default: str | None
    acted_on: bool = False
    check: Check | None = None
    internal: bool = False  # accepted, but not described unless set (Kafka's defineInternal)


def invalid_value(name: str, value: object, reason: str) -> str:
    """Kafka's ConfigException(name, value, message) text."""
    return f"Invalid value {value} for configuration {name}: {reason}"


def _at_least(minimum: int) -> Check:
    # Kafka's ConfigDef.Range.atLeast
    def check(name: str, value: object) -> str | None:
        assert isinstance(value, int | float)
        return None if value >= minimum else invalid_value(name, value, f"Value must be at least {minimum}")

    return check


def _between(low: int, high: int) -> Check:
    # Kafka's ConfigDef.Range.between
    def check(name: str, value: object) -> str | None:
        assert isinstance(value, int | float)
        if value < low:
            return invalid_value(name, value, f"Value must be at least {low}")
        if value > high:
            return invalid_value(name, value, f"Value must be no more than {high}")
        return None

    return check


def _one_of(*choices: str) -> Check:
    # Kafka's ConfigDef.ValidString.in
    def check(name: str, value: object) -> str | None:
        return (
            None
            if value in choices
            else invalid_value(name, value, f"String must be one of: {', '.join(choices)}")
        )

    return check


def _list_of(*choices: str) -> Check:
    # Kafka 4.0's ConfigDef.ValidList.in: each item as ValidString checks it; the empty list is valid.
    one = _one_of(*choices)

    def check(name: str, value: object) -> str | None:
        assert isinstance(value, list)
        return next((message for item in value if (message := one(name, item)) is not None), None)

    return check


def _gzip_level(name: str, value: object) -> str | None:
    # Kafka's CompressionType.GZIP.levelValidator: Deflater's levels 1-9, or its default -1.
    if value == -1 or (isinstance(value, int) and 1 <= value <= 9):
        return None
    return invalid_value(name, value, "Value must be between 1 and 9 or equal to -1")


def _throttled_replicas(name: str, value: object) -> str | None:
    # Kafka's ThrottledReplicaListValidator; the value shows as a Java list does.
    assert isinstance(value, list)
    if value in ([], ["*"]) or all(_THROTTLED_REPLICA.fullmatch(item) for item in value):
        return None
    return invalid_value(
        name,
        f"[{', '.join(value)}]",
        f"{name} must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
    )


def _no_tiered_storage(name: str, value: object) -> str | None:
    # Kafka's LogConfig.validateRemoteStorageOnlyIfSystemEnabled, on a broker without tiered storage.
    if value is True:
        return (
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with "
            "remote log storage."
        )
    return None


_L, _I, _B = ConfigType.LONG, ConfigType.INT, ConfigType.BOOLEAN
_DEFINITIONS = (
    TopicConfigDefinition("cleanup.policy", ConfigType.LIST, "delete", True, _list_of("compact", "delete")),
    TopicConfigDefinition(
        "compression.type",
        ConfigType.STRING,
        "producer",
        check=_one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    ),
    TopicConfigDefinition("compression.gzip.level", _I, "-1", check=_gzip_level),
    TopicConfigDefinition("compression.lz4.level", _I, "9", check=_between(1, 17)),
    TopicConfigDefinition("compression.zstd.level", _I, "3", check=_between(-131072, 22)),
    TopicConfigDefinition("delete.retention.ms", _L, "86400000", True, _at_least(0)),
    TopicConfigDefinition("file.delete.delay.ms", _L, "60000", check=_at_least(0)),
    TopicConfigDefinition("flush.messages", _L, str(INT64_MAX), True, _at_least(1)),
    TopicConfigDefinition("flush.ms", _L, str(INT64_MAX), check=_at_least(0)),
    TopicConfigDefinition(
        "follower.replication.throttled.replicas", ConfigType.LIST, "", check=_throttled_replicas
    ),
    TopicConfigDefinition("index.interval.bytes", _I, "4096", True, _at_least(0)),
    TopicConfigDefinition(
        "leader.replication.throttled.replicas", ConfigType.LIST, "", check=_throttled_replicas
    ),
    TopicConfigDefinition("local.retention.bytes", _L, "-2", check=_at_least(-2)),
    TopicConfigDefinition("local.retention.ms", _L, "-2", check=_at_least(-2)),
    TopicConfigDefinition("max.compaction.lag.ms", _L, str(INT64_MAX), True, _at_least(1)),
    TopicConfigDefinition("max.message.bytes", _I, str(default_of("message_max_bytes")), True, _at_least(0)),
    TopicConfigDefinition("message.timestamp.after.max.ms", _L, "3600000", True, _at_least(0)),
    TopicConfigDefinition("message.timestamp.before.max.ms", _L, str(INT64_MAX), True, _at_least(0)),
    TopicConfigDefinition(
        "message.timestamp.type",
        ConfigType.STRING,
        "CreateTime",
        True,
        _one_of("CreateTime", "LogAppendTime"),
    ),
    TopicConfigDefinition("min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5", True, _between(0, 1)),
    TopicConfigDefinition("min.compaction.lag.ms", _L, "0", True, _at_least(0)),
    # Every partition here has one replica, and Kafka requires min(min.insync.replicas, replication
    # factor) in-sync replicas for acks=all (Partition.effectiveMinIsr): one, always met.
    TopicConfigDefinition("min.insync.replicas", _I, "1", True, _at_least(1)),
    TopicConfigDefinition("preallocate", _B, "false"),
    TopicConfigDefinition("remote.log.copy.disable", _B, "false"),
    TopicConfigDefinition("remote.log.delete.on.disable", _B, "false"),
    TopicConfigDefinition("remote.storage.enable", _B, "false", check=_no_tiered_storage),
    # retention.bytes: any negative value is no limit
    TopicConfigDefinition("retention.bytes", _L, str(default_of("retention_bytes")), True),
    TopicConfigDefinition("retention.ms", _L, str(default_of("retention_ms")), True, _at_least(-1)),
    TopicConfigDefinition(
        "segment.bytes", _I, str(default_of("segment_bytes")), True, _at_least(MIN_SEGMENT_BYTES)
    ),
    # Below segment.bytes' bound, for tests of segment rolling and retention (as Kafka's own tests).
    TopicConfigDefinition("internal.segment.bytes", _I, None, True, _at_least(HEADER_SIZE), internal=True),
    TopicConfigDefinition("segment.index.bytes", _I, "10485760", True, _at_least(4)),
    TopicConfigDefinition("segment.jitter.ms", _L, "0", True, _at_least(0)),
    TopicConfigDefinition("segment.ms", _L, "604800000", True, _at_least(1)),
    TopicConfigDefinition("unclean.leader.election.enable", _B, "false"),
)
TOPIC_CONFIGS: Mapping[str, TopicConfigDefinition] = {d.name: d for d in _DEFINITIONS}


def default_int(name: str) -> int:
    """The default of topic config ``name`` (an INT or LONG one), as the log keeps it."""
    definition = TOPIC_CONFIGS[name]
    assert definition.type in (_I, _L) and definition.default is not None, name
    return int(definition.default)


def default_float(name: str) -> float:
    """The default of topic config ``name`` (a DOUBLE one)."""
    definition = TOPIC_CONFIGS[name]
    assert definition.type is ConfigType.DOUBLE and definition.default is not None, name
    return float(definition.default)


def default_text(name: str) -> str:
    """The default of topic config ``name`` (a STRING or LIST one), as Kafka spells it."""
    definition = TOPIC_CONFIGS[name]
    assert definition.type in (ConfigType.STRING, ConfigType.LIST) and definition.default is not None, name
    return definition.default


DESCRIBED_TOPIC_CONFIGS = tuple(sorted(d.name for d in _DEFINITIONS if not d.internal))


def parse_config_value(definition: TopicConfigDefinition, value: str) -> object:
    """The value as Kafka's ConfigDef.parseType parses it; ValueError with Kafka's reason."""
    trimmed = value.strip()
    if definition.type in (ConfigType.INT, ConfigType.LONG):
        low, high = (INT32_MIN, INT32_MAX) if definition.type is ConfigType.INT else (INT64_MIN, INT64_MAX)
        if not _WHOLE_NUMBER.fullmatch(trimmed) or not low <= int(trimmed) <= high:
            raise ValueError(f"Not a number of type {definition.type.name}")
        return int(trimmed)
    if definition.type is ConfigType.BOOLEAN:
        if trimmed.lower() not in ("true", "false"):
            raise ValueError("Expected value to be either true or false")
        return trimmed.lower() == "true"
    if definition.type is ConfigType.DOUBLE:
        try:
            return float(trimmed)
        except ValueError:
            raise ValueError("Not a number of type DOUBLE") from None
    if definition.type is ConfigType.LIST:
        return [item.strip() for item in trimmed.split(",")] if trimmed else []
    return trimmed


def described_value(key: str, value: str) -> str:
    """A valid value of topic config ``key`` as Kafka describes it (ConfigDef.convertToString of the
    parsed value): trimmed, a number without sign or leading zeros, a boolean in lower case, a
    double as Java writes it, a list joined by bare commas."""
    parsed = parse_config_value(TOPIC_CONFIGS[key], value)
    if isinstance(parsed, bool):
        return "true" if parsed else "false"
    if isinstance(parsed, float):
        return java_double(parsed)
    if isinstance(parsed, list):
        return ",".join(parsed)
    return str(parsed)


def java_double(value: float) -> str:
    """Java's Double.toString: the shortest digits that read back as ``value``, written plainly from
    10^-3 up to 10^7 and as ``d.dddE±n`` otherwise."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return f"{sign}0.0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)
    power = len(digit_tuple) + exponent - 1  # of the first digit
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    if not 1e-3 <= abs(value) < 1e7:
        return f"{sign}{digits[0]}.{digits[1:] or '0'}E{power}"
    if power < 0:
        return f"{sign}0.{'0' * (-power - 1)}{digits}"
    whole = digits[: power + 1].ljust(power + 1, "0")
    return f"{sign}{whole}.{digits[power + 1 :] or '0'}"


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The configs as given, or BrokerError(INVALID_CONFIG) with Kafka's message, checked in the order
    of its controller (ReplicationControlManager.computeConfigChanges, then LogConfig.validate):
    every null value named at once, then the first unknown name, then each value parsed and checked,
    then the two compaction lags against each other."""
    nulls = [key for key, value in configs.items() if value is None]
    if nulls:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG, f"Null value not supported for topic configs: {','.join(nulls)}"
        )
    valid = cast(dict[str, str], dict(configs))
    unknown = next((key for key in valid if key not in TOPIC_CONFIGS), None)
    if unknown is not None:
        raise BrokerError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {unknown}")
    for key, value in valid.items():
        definition = TOPIC_CONFIGS[key]
        try:
            parsed = parse_config_value(definition, value)
        except ValueError as error:
            raise BrokerError(ErrorCode.INVALID_CONFIG, invalid_value(key, value, str(error))) from None
        message = definition.check(key, parsed) if definition.check else None
        if message is not None:
            raise BrokerError(ErrorCode.INVALID_CONFIG, message)
    # Kafka's LogConfig.validateValues: the two compaction lags, each given or its default.
    lags = [
        cast(int, parse_config_value(TOPIC_CONFIGS[key], valid.get(key, TOPIC_CONFIGS[key].default or "0")))
        for key in ("min.compaction.lag.ms", "max.compaction.lag.ms")
    ]
    if lags[0] > lags[1]:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG,
            f"conflict topic config setting min.compaction.lag.ms ({lags[0]}) > "
            f"max.compaction.lag.ms ({lags[1]})",
        )
    return valid


def inert_configs(configs: Mapping[str, str]) -> list[str]:
    """The names among ``configs`` that this broker stores and reports but does not act on."""
    return sorted(key for key in configs if not TOPIC_CONFIGS[key].acted_on)
