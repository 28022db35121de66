"""The sink's option parsing, input-schema checks and commit markers: every bad input named clearly."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from sparkafka.connector.sink.client_config import producer_config
from sparkafka.connector.sink.commit_log import CommitMarker
from sparkafka.connector.sink.options import SinkOptions, validate_input_schema
from sparkafka.errors import SparkafkaOptionError

BASE = {"kafka.bootstrap.servers": "localhost:9092", "topic": "out"}


def schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, data_type) for name, data_type in fields])  # type: ignore[arg-type]


def test_defaults_follow_spark_and_kafka() -> None:
    options = SinkOptions.parse(BASE)
    assert options.delivery_guarantee == "at-least-once"
    assert options.transaction_timeout_ms == 60_000
    assert options.marker_topic == "_sparkafka_commit_markers"
    assert options.transactional_id_prefix is None
    assert options.client_config == {"bootstrap.servers": "localhost:9092"}


def test_options_are_case_insensitive_and_pass_kafka_properties() -> None:
    options = SinkOptions.parse(
        {
            **BASE,
            "DELIVERYGUARANTEE": "exactly-once",
            "kafka.compression.type": "zstd",
            "kafka.transaction.timeout.ms": "120000",
        }
    )
    assert options.delivery_guarantee == "exactly-once"
    assert options.client_config["compression.type"] == "zstd"
    assert options.transaction_timeout_ms == 120_000
    assert "transaction.timeout.ms" not in options.client_config


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "out"}, "kafka.bootstrap.servers"),
        ({**BASE, "deliveryGuarantee": "exactly_once"}, "did you mean 'exactly-once'"),
        ({**BASE, "deliverGuarantee": "none"}, "did you mean 'deliveryGuarantee'"),
        ({**BASE, "kafka.transactional.id": "x"}, "transactionalIdPrefix"),
        ({**BASE, "kafka.value.serializer": "x"}, "value"),
        ({**BASE, "kafka.transaction.timeout.ms": "0"}, "must be positive"),
        ({**BASE, "transactionalIdPrefix": ""}, "must not be empty"),
        (
            {**BASE, "transactionalIdPrefix": "query/orders"},
            r"option 'transactionalIdPrefix' is 'query/orders', which starts with 'query/': the "
            r"commit-marker topic keys records of its own so",
        ),
        ({**BASE, "transactionalIdPrefix": "claim/x"}, "starts with 'claim/'"),
        ({**BASE, "debug.pausePartitions": "one"}, "partition numbers"),
        ({**BASE, "debug.pauseAt": "sometime"}, "debug.pauseAt"),
        (
            {**BASE, "leaseTimeoutMs": "500ms"},
            r"option 'leaseTimeoutMs' is 500 ms: the checkpoint's lease must outlive the time between two "
            r"renewals by far; give at least 1s \(default 2m\)",
        ),
        (
            {**BASE, "deliveryGuarantee": "exactly-once", "kafka.enable.idempotence": "false"},
            "Kafka transactions need enable.idempotence=true",
        ),
        (
            {**BASE, "deliveryGuarantee": "exactly-once", "kafka.acks": "1"},
            "Kafka transactions need acks=all",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(SparkafkaOptionError, match=message):
        SinkOptions.parse(options)


def test_input_schema_accepts_spark_kafka_sink_columns() -> None:
    headers = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    validate_input_schema(
        schema(
            ("key", StringType()),
            ("value", BinaryType()),
            ("topic", StringType()),
            ("partition", IntegerType()),
            ("headers", headers),
        ),
        SinkOptions.parse(BASE),
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((("key", StringType()),), "needs a 'value' column"),
        ((("value", LongType()),), "column 'value' must be string or binary"),
        ((("value", StringType()), ("key", IntegerType())), "column 'key' must be string or binary"),
        ((("value", StringType()), ("partition", LongType())), "CAST\\(partition AS INT\\)"),
        ((("value", StringType()), ("headers", StringType())), "column 'headers'"),
    ],
)
def test_bad_input_columns_are_named(fields: tuple[tuple[str, object], ...], message: str) -> None:
    with pytest.raises(SparkafkaOptionError, match=message):
        validate_input_schema(schema(*fields), SinkOptions.parse(BASE))


def test_a_topic_column_must_be_a_string_unless_the_topic_option_decides() -> None:
    numeric_topic = schema(("value", StringType()), ("topic", IntegerType()))
    with pytest.raises(SparkafkaOptionError, match="column 'topic' must be a string"):
        validate_input_schema(numeric_topic, SinkOptions.parse({"kafka.bootstrap.servers": "localhost:9092"}))
    validate_input_schema(numeric_topic, SinkOptions.parse(BASE))  # Spark's KafkaWriter ignores the column


def test_no_topic_anywhere_is_an_error() -> None:
    options = SinkOptions.parse({"kafka.bootstrap.servers": "localhost:9092"})
    with pytest.raises(SparkafkaOptionError, match="no topic to write to"):
        validate_input_schema(schema(("value", StringType())), options)
    validate_input_schema(schema(("value", StringType()), ("topic", StringType())), options)


def test_commit_marker_round_trips() -> None:
    for topic, width in (("out", 8), ("", None)):  # "": the rows named their topics
        marker = CommitMarker("sparkafka-q-3", "q", 17, 3, 250, 1_795_000_000_000, topic, width)
        assert CommitMarker.decode(marker.encode()) == marker


def test_a_commit_marker_of_an_accepted_batch_round_trips_and_older_ones_read_as_not_accepted() -> None:
    marker = CommitMarker("p-1", "q", 5, 1, 3, 1, "out", 2, "digest", "run-a", accepted_run="run-r")
    assert CommitMarker.decode(marker.encode()) == marker
    assert CommitMarker.decode(dataclasses.replace(marker, accepted_run=None).encode()).accepted_run is None


def test_a_refusal_record_round_trips_and_is_never_taken_for_a_commit_marker() -> None:
    from sparkafka.connector.sink.commit_log import RefusalRecord
    from sparkafka.connector.sink.options import is_marker_key
    from sparkafka.errors import CommitMarkerError

    record = RefusalRecord("p", "q-1", 4, "run-r", 1)
    assert RefusalRecord.decode(record.encode()) == record
    for other in (
        dataclasses.replace(record, run_id=None),
        dataclasses.replace(record, rejected_runs=("a", "b")),
    ):
        assert RefusalRecord.decode(other.encode()) == other
    # Readers of earlier releases find a query's markers by a needle, and skip what lacks it.
    assert b'"query_id":"q-1"' not in record.encode()
    assert not is_marker_key("refusal/p") and is_marker_key("p-0")
    with pytest.raises(CommitMarkerError, match="version 2"):
        RefusalRecord.decode(record.encode().replace(b'"version":1', b'"version":2'))


def test_a_commit_marker_written_before_markers_named_their_topic_reads_as_topic_unknown() -> None:
    older = b'{"transactional_id":"p-0","query_id":"q","batch_id":4,"partition":0,"records":2,"time_ms":1}'
    assert CommitMarker.decode(older) == CommitMarker("p-0", "q", 4, 0, 2, 1, None, None)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, {"acks": "all", "enable.idempotence": True}),
        ({"kafka.acks": "1"}, {"acks": "1", "enable.idempotence": False}),
        ({"kafka.enable.idempotence": "false"}, {"acks": "all", "enable.idempotence": "false"}),
        ({"kafka.acks": "-1"}, {"acks": "-1", "enable.idempotence": True}),
    ],
)
def test_at_least_once_writes_with_the_java_producers_defaults_and_the_users_settings(
    settings: dict[str, str], expected: dict[str, object]
) -> None:
    """Spark's sink passes kafka.* through to a Java producer (acks=all, idempotence on by default)."""
    config = producer_config(SinkOptions.parse({**BASE, **settings}), None)
    assert {key: config[key] for key in expected} == expected
    assert config["partitioner"] == "murmur2_random"


@pytest.mark.parametrize("name", ["markers with spaces", "..", "m" * 250, "märker"])
def test_a_marker_topic_name_kafka_would_refuse_is_refused_by_name(name: str) -> None:
    with pytest.raises(
        SparkafkaOptionError, match=r"option 'commitMarkerTopic' .* not a legal Kafka topic name"
    ):
        SinkOptions.parse({**BASE, "commitmarkertopic": name})


@pytest.mark.parametrize(
    "handed",
    [
        {"queryName": "orders"},  # DataStreamWriter.queryName
        {"queryname": "orders", "checkpointlocation": "/tmp/c"},  # as Spark lower-cases them
        {"path": "out"},  # start(path) / save(path)
    ],
)
def test_the_options_spark_hands_every_sink_are_accepted(handed: dict[str, str]) -> None:
    options = SinkOptions.parse({**BASE, "deliveryGuarantee": "exactly-once", **handed})
    assert options.delivery_guarantee == "exactly-once"


def test_the_internal_fault_hooks_are_accepted_but_never_offered() -> None:
    assert SinkOptions.parse({**BASE, "debug.pauseAt": "beforeCommit"}).faults.pause_at == "beforecommit"
    with pytest.raises(SparkafkaOptionError) as refused:
        SinkOptions.parse({**BASE, "no.such.option": "1"})
    assert "known options are" in str(refused.value)
    assert "debug." not in str(refused.value)
    with pytest.raises(SparkafkaOptionError) as close_to_a_hook:
        SinkOptions.parse({**BASE, "debug.pauseAtt": "beforeCommit"})
    assert "debug." not in str(close_to_a_hook.value).replace("'debug.pauseatt'", "")
