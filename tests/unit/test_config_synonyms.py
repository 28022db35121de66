"""Where a topic or broker config's value comes from, as Kafka's DescribeConfigs lists it."""

from __future__ import annotations

from sparkafka.broker.config_synonyms import (
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    Synonym,
    broker_config_synonyms,
    static_broker_configs,
    topic_config_synonyms,
)

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
