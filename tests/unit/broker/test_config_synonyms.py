"""Where a topic or broker config's value comes from, as Kafka's DescribeConfigs lists it."""

from __future__ import annotations

from pathlib import Path

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.config_synonyms import (
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    BrokerConfigEntry,
    Synonym,
    broker_config_entries,
    broker_config_synonyms,
    inherited_topic_config,
    kafka_settings,
    static_broker_configs,
    topic_config_synonyms,
)
from sparkafka.broker.topic_configs import TOPIC_CONFIGS, ConfigType, described_value, java_double

LONG_MAX = str(2**63 - 1)


def test_an_unset_topic_config_falls_back_to_its_broker_configs_default() -> None:
    assert topic_config_synonyms("segment.bytes", {}, {}) == [
        Synonym("log.segment.bytes", "1073741824", SOURCE_DEFAULT)
    ]
    assert topic_config_synonyms("cleanup.policy", {}, {}) == [
        Synonym("log.cleanup.policy", "delete", SOURCE_DEFAULT)
    ]
    # Kafka drops the entries before the main synonym: log.retention.ms has no default, so
    # log.retention.hours=168 is not listed, and neither is anything for a config without synonyms.
    assert topic_config_synonyms("retention.ms", {}, {}) == []
    assert topic_config_synonyms("follower.replication.throttled.replicas", {}, {}) == []


def test_the_topics_override_comes_first_then_the_static_broker_config_then_the_default() -> None:
    static = {"log.segment.bytes": "2097152", "log.retention.ms": "1000"}
    assert topic_config_synonyms("segment.bytes", {"segment.bytes": "5242880"}, static) == [
        Synonym("segment.bytes", "5242880", SOURCE_TOPIC),
        Synonym("log.segment.bytes", "2097152", SOURCE_STATIC_BROKER),
        Synonym("log.segment.bytes", "1073741824", SOURCE_DEFAULT),
    ]
    assert topic_config_synonyms("retention.ms", {}, static) == [
        Synonym("log.retention.ms", "1000", SOURCE_STATIC_BROKER),
        Synonym("log.retention.hours", "168", SOURCE_DEFAULT),
    ]
    assert broker_config_synonyms("log.retention.ms", static)[0].source == SOURCE_STATIC_BROKER
    assert broker_config_synonyms("num.partitions", {}) == [Synonym("num.partitions", "1", SOURCE_DEFAULT)]


def test_only_values_other_than_kafkas_defaults_count_as_statically_set() -> None:
    running = {
        "log.segment.bytes": "1073741824",
        "log.retention.ms": "604800000",  # Kafka's 168 hours, only spelled in milliseconds
        "message.max.bytes": "2000000",
        "not.a.kafka.config": "x",
    }
    assert static_broker_configs(running) == {"message.max.bytes": "2000000"}


def test_a_topic_inherits_the_first_broker_synonym_set_in_milliseconds() -> None:
    assert inherited_topic_config("retention.ms", {}) == "604800000"  # log.retention.hours' default
    assert inherited_topic_config("retention.ms", {"log.retention.hours": "2"}) == "7200000"
    assert inherited_topic_config(
        "retention.ms", {"log.retention.minutes": "3", "log.retention.hours": "2"}
    ) == ("180000")
    assert inherited_topic_config("retention.ms", {"log.retention.ms": "1000"}) == "1000"
    assert inherited_topic_config("flush.messages", {"log.flush.interval.messages": "5"}) == "5"
    assert inherited_topic_config("follower.replication.throttled.replicas", {}) is None


def test_kafkas_broker_defaults_amount_to_kafkas_topic_defaults() -> None:
    for key, definition in TOPIC_CONFIGS.items():
        inherited = inherited_topic_config(key, {})
        assert inherited is None or inherited == definition.default, key


def test_the_broker_describes_each_config_with_its_type_and_whether_kafka_can_change_it_live() -> None:
    entries = {entry.name: entry for entry in broker_config_entries({"log.retention.ms": "1000"})}
    assert entries["log.retention.ms"] == BrokerConfigEntry(
        "log.retention.ms", "1000", ConfigType.LONG, False
    )
    assert entries["log.retention.minutes"] == BrokerConfigEntry(
        "log.retention.minutes", None, ConfigType.INT, True
    )
    assert entries["log.cleanup.policy"].type == ConfigType.LIST
    assert entries["auto.create.topics.enable"] == BrokerConfigEntry(
        "auto.create.topics.enable", "true", ConfigType.BOOLEAN, True
    )
    assert kafka_settings(BrokerConfig(data_dir=Path("unused")))["log.retention.ms"] == "604800000"


def test_a_topic_override_is_described_as_kafka_writes_its_parsed_value() -> None:
    assert topic_config_synonyms("preallocate", {"preallocate": " TRUE"}, {})[0] == Synonym(
        "preallocate", "true", SOURCE_TOPIC
    )
    assert described_value("segment.ms", "+0060000") == "60000"
    assert described_value("cleanup.policy", " compact ,delete") == "compact,delete"
    assert described_value("compression.type", " gzip ") == "gzip"
    # Java's Double.toString: plain from 10^-3 up to 10^7, else scientific.
    assert [described_value("min.cleanable.dirty.ratio", v) for v in ("0.250", "1", ".0005", "0")] == [
        "0.25",
        "1.0",
        "5.0E-4",
        "0.0",
    ]
    assert [java_double(v) for v in (1e7, 9999999.5, 0.001, 1.5e-12, -2.5)] == [
        "1.0E7",
        "9999999.5",
        "0.001",
        "1.5E-12",
        "-2.5",
    ]
