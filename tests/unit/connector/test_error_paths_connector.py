"""Error paths of the connector's reading side that need no running Kafka or Spark: the source's
options as Spark hands them to the data source when a DataFrame is loaded (Java-only client
properties, malformed per-partition offsets), and a record timestamp Spark's TimestampType cannot hold."""

from __future__ import annotations

import re

import pytest

from sparkafka.connector.sink.failures import transaction_timeout_error
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.source.data_source import KafkaSource
from sparkafka.connector.source.reader import _Columns
from sparkafka.errors import KafkaReadError, SparkafkaOptionError, TransactionTimeoutError

# Spark hands a data source its options with lower-cased keys. Nothing listens on port 1: the checks
# below must fail without any answer from a cluster.
BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "events"}


def load(**options: str) -> None:
    """What Spark calls when ``spark.read(Stream).format("sparkafka")...load()`` runs."""
    KafkaSource({**BASE, **{key.lower(): value for key, value in options.items()}}).schema()


@pytest.mark.parametrize(
    ("option", "alternative"),
    [
        (
            "kafka.sasl.jaas.config",
            "kafka.sasl.username and kafka.sasl.password (or kafka.sasl.oauthbearer.*)",
        ),
        ("kafka.ssl.truststore.location", "kafka.ssl.ca.location (a PEM file of CA certificates)"),
        ("kafka.max.poll.records", "maxOffsetsPerTrigger to bound a micro-batch"),
    ],
)
def test_a_java_client_property_is_refused_with_the_librdkafka_way_to_say_it(
    option: str, alternative: str
) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"'{option}' is a Java Kafka client property; sparkafka uses librdkafka (confluent-kafka), "
            f"use {alternative}"
        ),
    ):
        load(**{option: "x"})


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [
        ("startingOffsets", '{"events":[0,1]}', "[0, 1]"),
        ("endingOffsets", '{"events":-1}', "-1"),
        ("startingOffsetsByTimestamp", '{"events":1700000000000}', "1700000000000"),
    ],
)
def test_per_partition_offsets_must_map_each_topic_to_partitions(option: str, value: str, shown: str) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"option '{option}': topic 'events' must map to " + '{"partition": number}, got ' + shown
        ),
    ):
        load(**{option: value})


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("startingOffsets", "newest", "earliest, latest, group"),
        ("endingOffsets", "group", "latest"),  # a group's offsets are a place to start, not to stop
    ],
)
def test_an_offsets_word_the_option_does_not_know_is_refused_with_what_it_takes(
    option: str, value: str, allowed: str
) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"option '{option}' must be {allowed} or JSON such as "
            + '{"topicA":{"0":23,"1":-1}} (-2 = earliest, -1 = latest), got '
            + f"'{value}'"
        ),
    ):
        load(**{option: value})


@pytest.mark.parametrize(("option", "offset"), [("startingOffsets", -3), ("endingOffsets", -100)])
def test_an_offset_below_the_earliest_sentinel_is_refused(option: str, offset: int) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"option '{option}': offset {offset} for events-1 is not an offset "
            "(use -2 for earliest, -1 for latest)"
        ),
    ):
        load(**{option: '{"events":{"0":-2,"1":' + str(offset) + "}}"})


def test_a_record_timestamp_beyond_sparks_timestamp_type_fails_the_read_naming_the_records() -> None:
    # The reader's consume loop fills these lists from each Message; a timestamp of 2**62 ms does
    # not fit in a long once converted to microseconds.
    columns = _Columns("events", 3, include_headers=False)
    for offset, timestamp_ms in ((40, 1_700_000_000_000), (41, 2**62)):
        columns.keys.append(None)
        columns.values.append(b"v")
        columns.offsets.append(offset)
        columns.timestamp_types.append(0)
        columns.timestamp_ms.append(timestamp_ms)
    with pytest.raises(
        KafkaReadError,
        match=re.escape(
            "topic 'events' partition 3: a record among offsets 40..41 has a timestamp outside Spark's "
            f"TimestampType (milliseconds 1700000000000..{2**62})"
        ),
    ):
        columns.to_batch()


def test_a_refused_transaction_timeout_says_why_the_brokers_limit_is_not_shown() -> None:
    """The refusal of kafka.transaction.timeout.ms names the brokers' transaction.max.timeout.ms as
    they answer it (integration: test_sink_exactly_once.py); a cluster gone since it refused leaves
    the message saying so, with a fix that does not need the value."""
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "kafka.transaction.timeout.ms": "60000",
            "operationTimeoutMs": "500",
        }
    )
    error = transaction_timeout_error(options)
    assert isinstance(error, TransactionTimeoutError)
    message = str(error)
    assert (
        "kafka.transaction.timeout.ms=60000 is larger than the brokers' transaction.max.timeout.ms" in message
    )
    assert "which could not be read (no answer within 0.5 s)" in message
    assert "kafka-configs --describe --entity-type brokers --all" in message
    assert "Kafka's default" not in message
