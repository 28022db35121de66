"""Where a topic config's value comes from, as Kafka's DescribeConfigs reports it: its synonyms.

A topic config left unset takes the value of a broker config (``retention.ms`` that of
``log.retention.ms``, or of ``log.retention.minutes`` or ``log.retention.hours``), which in turn
is set in the broker's static configuration or left at its default. Kafka's ConfigHelper lists
these places, most specific first, as the config's synonyms, and the first one is the config's
source. The steps (ConfigHelper.createTopicConfigEntry and configSynonyms):

1. the topic's own override, if any (DYNAMIC_TOPIC_CONFIG);
2. for each broker synonym in order, its static value (STATIC_BROKER_CONFIG), then for each its
   default (DEFAULT_CONFIG); this broker has no dynamic broker configs;
3. drop every entry before the first one naming the main broker synonym: an alternate unit such as
   ``log.retention.hours`` shows only where the main one is also set somewhere.

A broker config counts as statically set here when this broker runs with a value other than
Kafka's default (what a server.properties line would do). This module is the one place that says
which broker setting stands behind a topic config: the value a topic inherits
(:func:`inherited_topic_config`) and what DescribeConfigs lists (:func:`broker_config_entries`)
both come from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.settings import BY_KAFKA_NAME, DESCRIBED, ConfigType
from sparkafka.broker.topic_configs import TOPIC_CONFIGS, described_value

SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# Kafka's ServerTopicConfigSynonyms, with DynamicBrokerConfig.brokerConfigSynonyms' alternates.
BROKER_SYNONYMS: dict[str, tuple[str, ...]] = {
    "segment.bytes": ("log.segment.bytes",),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
    "segment.jitter.ms": ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    "segment.index.bytes": ("log.index.size.max.bytes",),
    "flush.messages": ("log.flush.interval.messages",),
    "flush.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    "retention.bytes": ("log.retention.bytes",),
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "max.message.bytes": ("message.max.bytes",),
    "index.interval.bytes": ("log.index.interval.bytes",),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms",),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms",),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms",),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms",),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio",),
    "cleanup.policy": ("log.cleanup.policy",),
    "unclean.leader.election.enable": ("unclean.leader.election.enable",),
    "min.insync.replicas": ("min.insync.replicas",),
    "compression.type": ("compression.type",),
    "compression.gzip.level": ("compression.gzip.level",),
    "compression.lz4.level": ("compression.lz4.level",),
    "compression.zstd.level": ("compression.zstd.level",),
    "preallocate": ("log.preallocate",),
    "message.timestamp.type": ("log.message.timestamp.type",),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms",),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms",),
    "local.retention.ms": ("log.local.retention.ms",),
    "local.retention.bytes": ("log.local.retention.bytes",),
}

_LONG_MAX = str(2**63 - 1)
# Kafka 4's defaults, as ConfigDef prints them, of the broker configs behind topic configs whose
# default is not their topic config's: alternate units, and those without a default; None: no default.
_DEFAULTS_OF_THEIR_OWN: dict[str, str | None] = {
    "log.roll.ms": None,
    "log.roll.hours": "168",
    "log.roll.jitter.ms": None,
    "log.roll.jitter.hours": "0",
    "log.flush.interval.ms": None,
    "log.flush.scheduler.interval.ms": _LONG_MAX,
    "log.retention.minutes": None,
    "log.retention.hours": "168",
}
_WITH_A_SETTING = frozenset(setting.kafka_name for setting in DESCRIBED)
# The other broker configs behind topic configs that this broker describes without a setting of its
# own (sparkafka.broker.settings has the others): a topic config's default is its broker config's,
# as in Kafka (LogConfig takes its defaults from the server's), so it is written once, in
# topic_configs.
_DEFAULTS_WITHOUT_A_SETTING: dict[str, str | None] = {
    **{
        synonyms[0]: TOPIC_CONFIGS[topic].default
        for topic, synonyms in BROKER_SYNONYMS.items()
        if synonyms[0] not in _WITH_A_SETTING
    },
    **_DEFAULTS_OF_THEIR_OWN,
}
# Every broker config this broker describes, with Kafka's default.
BROKER_DEFAULTS: dict[str, str | None] = {
    **_DEFAULTS_WITHOUT_A_SETTING,
    **{setting.kafka_name: setting.kafka_default_text for setting in DESCRIBED},
}
# The value a broker config without a default of its own amounts to (log.retention.ms: the 168
# hours of log.retention.hours), when the broker runs with it.
_EFFECTIVE_DEFAULTS = {
    setting.kafka_name: setting.text(setting.default)
    for setting in DESCRIBED
    if setting.kafka_default_text is None and setting.default is not None
}
# Alternate units of a broker config (log.retention.hours for log.retention.ms), in milliseconds.
_UNIT_MS = {".hours": 3_600_000, ".minutes": 60_000}


class BrokerConfigEntry(NamedTuple):
    name: str
    value: str | None  # None: unset, as Kafka's log.retention.ms is by default
    type: ConfigType
    # Kafka's DynamicBrokerConfig.AllDynamicConfigs: of these, the broker configs behind topic
    # configs can change at run time on Kafka (this broker fixes them all at start).
    read_only: bool


class Synonym(NamedTuple):
    name: str
    value: str
    source: int


def kafka_settings(config: BrokerConfig) -> dict[str, str]:
    """What this broker runs with, by the names of Kafka's broker configs (a setting left to the
    broker, such as max.connections, is not among them: see :func:`broker_config_entries`)."""
    return {
        setting.kafka_name: text
        for setting in DESCRIBED
        if (text := setting.text(getattr(config, setting.field))) is not None
    }


def static_broker_configs(broker_configs: Mapping[str, str]) -> dict[str, str]:
    """The broker configs this broker runs with that differ from Kafka's defaults."""
    return {
        name: value
        for name, value in broker_configs.items()
        if name in BROKER_DEFAULTS
        and value
        != (BROKER_DEFAULTS[name] if BROKER_DEFAULTS[name] is not None else _EFFECTIVE_DEFAULTS.get(name))
    }


def inherited_topic_config(key: str, static: Mapping[str, str]) -> str | None:
    """The value topic config ``key`` takes from the broker when the topic does not set it: the
    first of its broker synonyms set statically, else the first with a default (Kafka's
    KafkaConfig: log.retention.ms, else .minutes, else .hours), in milliseconds where that synonym
    counts hours or minutes. None where no broker config stands behind ``key``."""
    names = BROKER_SYNONYMS.get(key, ())
    for source in (static, BROKER_DEFAULTS):
        for name in names:
            value = source.get(name)
            if value is not None:
                unit = next((ms for suffix, ms in _UNIT_MS.items() if name.endswith(suffix)), None)
                return str(int(value) * unit) if unit else value
    return None


def broker_config_entries(static: Mapping[str, str]) -> list[BrokerConfigEntry]:
    """Every broker config this broker describes, by name: its static setting, else Kafka's default."""
    return [
        BrokerConfigEntry(name, static.get(name, default), _broker_config_type(name), _read_only(name))
        for name, default in sorted(BROKER_DEFAULTS.items())
    ]


def _read_only(name: str) -> bool:
    """Kafka's DynamicBrokerConfig: the broker configs behind topic configs, and some others, can
    change on a running Kafka broker (this broker fixes them all at start)."""
    if name in BY_KAFKA_NAME:
        return BY_KAFKA_NAME[name].read_only
    return name not in {names[0] for names in BROKER_SYNONYMS.values()}


def _broker_config_type(name: str) -> ConfigType:
    if name in BY_KAFKA_NAME:
        return BY_KAFKA_NAME[name].type
    if any(name.endswith(suffix) for suffix in _UNIT_MS):
        return ConfigType.INT
    topic_config = next(key for key, names in BROKER_SYNONYMS.items() if name in names)
    return TOPIC_CONFIGS[topic_config].type


def topic_config_synonyms(
    key: str, topic_overrides: Mapping[str, str], static: Mapping[str, str]
) -> list[Synonym]:
    """The synonyms of topic config ``key``, most specific first (see the module's steps)."""
    found = (
        [Synonym(key, described_value(key, topic_overrides[key]), SOURCE_TOPIC)]
        if key in topic_overrides
        else []
    )
    return found + _broker_synonyms(BROKER_SYNONYMS.get(key, ()), static)


def broker_config_synonyms(name: str, static: Mapping[str, str]) -> list[Synonym]:
    """The synonyms of broker config ``name``: its alternate units too (Kafka's brokerConfigSynonyms)."""
    alternates = next((names for names in BROKER_SYNONYMS.values() if names[0] == name), (name,))
    return _broker_synonyms(alternates, static)


def _broker_synonyms(names: tuple[str, ...], static: Mapping[str, str]) -> list[Synonym]:
    found = [Synonym(name, static[name], SOURCE_STATIC_BROKER) for name in names if name in static]
    found += [
        Synonym(name, default, SOURCE_DEFAULT)
        for name in names
        if (default := BROKER_DEFAULTS.get(name)) is not None
    ]
    while found and found[0].name != names[0]:
        found.pop(0)
    return found
