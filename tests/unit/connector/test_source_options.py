"""The source's option parsing, offset arithmetic and schema, without Kafka or Spark running."""

from __future__ import annotations

import itertools
import pickle

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from sparkafka.connector.kafka_admin import validate_consumer_config
from sparkafka.connector.options import parse_duration_ms
from sparkafka.connector.source.offsets import decode_offsets, encode_offsets
from sparkafka.connector.source.options import (
    ARROW_BATCH_ROWS,
    Assign,
    SourceOptions,
    Subscribe,
    SubscribePattern,
)
from sparkafka.connector.source.ranges import (
    LEGACY_CALCULATOR,
    SPARK_CALCULATOR,
    OffsetRange,
    offset_ranges,
    rate_limit,
    split_offset_ranges,
)
from sparkafka.connector.source.schema import kafka_arrow_schema, kafka_schema
from sparkafka.connector.source.stream import KafkaStreamReader
from sparkafka.errors import SparkafkaOptionError

BASE = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "events"}


def parse(**overrides: str) -> SourceOptions:
    options = {**BASE, **overrides}
    # Spark hands options over with lower-cased keys.
    return SourceOptions.parse({key.lower(): value for key, value in options.items() if value is not None})


def parse_error(**overrides: str) -> str:
    with pytest.raises(SparkafkaOptionError) as error:
        parse(**overrides)
    return str(error.value)


# -- options ---------------------------------------------------------------------------------------


def test_defaults() -> None:
    options = parse()
    assert options.strategy == Subscribe(("events",))
    assert options.starting is None and options.ending is None
    assert options.fail_on_data_loss is True
    assert options.include_headers is False
    assert options.read_committed is True
    assert options.client_config["isolation.level"] == "read_committed"
    assert options.commit_offsets_on_batch is True
    assert options.group_offsets_fallback == "latest"
    assert options.max_trigger_delay_ms == 15 * 60 * 1000
    assert options.api_timeout_ms == 30_000
    assert options.partition_discovery_interval_ms is None  # every micro-batch, as Spark's source


def test_kafka_options_go_to_the_client_without_prefix() -> None:
    options = parse(
        **{
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.client.rack": "eu-1a",
            "kafka.default.api.timeout.ms": "5000",
        }
    )
    assert options.client_config["security.protocol"] == "SASL_SSL"
    assert options.client_config["sasl.mechanism"] == "PLAIN"
    assert options.client_config["client.rack"] == "eu-1a"
    # Read by the connector, not passed to librdkafka (which does not know it).
    assert "default.api.timeout.ms" not in options.client_config
    assert options.api_timeout_ms == 5000


def test_read_consumers_bound_their_prefetch_unless_the_user_sets_it() -> None:
    config = parse().executor_consumer_config()
    # Two Arrow batches ahead, re-checked often: not librdkafka's 100,000 records and 1 s pause.
    assert config["queued.min.messages"] == 2 * ARROW_BATCH_ROWS
    assert config["fetch.queue.backoff.ms"] == 10
    assert config["enable.sparse.connections"] is False
    # The fetch past a range's end answers within 50 ms, not librdkafka's 500 ms.
    assert config["fetch.wait.max.ms"] == 50
    tuned = parse(
        **{
            "kafka.queued.min.messages": "500",
            "kafka.fetch.queue.backoff.ms": "200",
            "kafka.fetch.wait.max.ms": "500",
        }
    ).executor_consumer_config()
    assert tuned["queued.min.messages"] == "500"
    assert tuned["fetch.queue.backoff.ms"] == "200"
    assert tuned["fetch.wait.max.ms"] == "500"


def test_typo_suggests_the_option() -> None:
    options = {"kafka.bootstrap.servers": "x:1", "subscirbe": "events"}
    with pytest.raises(SparkafkaOptionError, match="unknown option 'subscirbe'; did you mean 'subscribe'\\?"):
        SourceOptions.parse(options)
    assert "did you mean 'maxOffsetsPerTrigger'" in parse_error(maxOffsetPerTrigger="10")
    assert "known options are" in parse_error(zzzzzz="1")


def test_exactly_one_strategy() -> None:
    with pytest.raises(SparkafkaOptionError, match="One of the following options must be specified"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1"})
    message = parse_error(subscribePattern="ev.*")
    assert "Only one of the following options can be specified" in message
    assert "subscribe, subscribePattern" in message
    assert "No topics to subscribe" in parse_error(subscribe=" , ")


def test_strategies() -> None:
    assert parse(subscribe="b, a,b").strategy == Subscribe(("a", "b"))
    pattern = SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribepattern": "ev.*"})
    assert pattern.strategy == SubscribePattern("ev.*")
    assign = SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "assign": '{"a":[1,0],"b":[2]}'})
    assert assign.strategy == Assign((("a", 0), ("a", 1), ("b", 2)))
    with pytest.raises(SparkafkaOptionError, match="No topicpartitions to assign"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "assign": "a"})
    with pytest.raises(SparkafkaOptionError, match="not a valid regular expression"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribepattern": "ev[("})


def test_bootstrap_servers_required() -> None:
    with pytest.raises(SparkafkaOptionError, match=r"'kafka\.bootstrap\.servers' must be specified"):
        SourceOptions.parse({"subscribe": "events"})


@pytest.mark.parametrize(
    ("kafka_option", "alternative"),
    [
        ("auto.offset.reset", "startingOffsets"),
        ("enable.auto.commit", "commitOffsetsOnBatch"),
        ("key.deserializer", "deserialize the keys"),
        ("value.deserializer", "deserialize the values"),
        ("interceptor.classes", "not safe"),
    ],
)
def test_forbidden_kafka_options_name_the_alternative(kafka_option: str, alternative: str) -> None:
    message = parse_error(**{f"kafka.{kafka_option}": "x"})
    assert f"Kafka option '{kafka_option}' is not supported" in message
    assert alternative in message


def test_client_properties_are_checked_by_librdkafka() -> None:
    validate_consumer_config({"bootstrap.servers": "x:1", "client.rack": "a", "fetch.min.bytes": "10"})
    with pytest.raises(SparkafkaOptionError, match=r"'kafka\.ssl\.truststore\.location' is a Java"):
        validate_consumer_config({"bootstrap.servers": "x:1", "ssl.truststore.location": "/x"})
    with pytest.raises(SparkafkaOptionError, match=r"'kafka\.no\.such\.thing' was rejected by librdkafka"):
        validate_consumer_config({"bootstrap.servers": "x:1", "no.such.thing": "1"})


def test_a_combination_librdkafka_cannot_serve_is_refused_with_its_reason() -> None:
    """Kerberos, as Java clients configure it: this librdkafka build has no GSSAPI provider, and its
    reason names no single option."""
    kerberos = {"bootstrap.servers": "x:1", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}
    with pytest.raises(SparkafkaOptionError) as refused:
        validate_consumer_config(kerberos)
    message = str(refused.value)
    assert message.startswith("the kafka.* options were rejected by librdkafka: ")
    assert "No provider for SASL mechanism GSSAPI" in message
    assert "KafkaError{" not in message  # the reason itself, not the error object's repr


def test_group_id_is_allowed() -> None:
    assert parse(**{"kafka.group.id": "lag-monitor"}).group_id == "lag-monitor"


def test_isolation_level() -> None:
    options = parse(**{"kafka.isolation.level": "read_uncommitted"})
    assert options.read_committed is False
    assert "must be one of read_committed, read_uncommitted" in parse_error(
        **{"kafka.isolation.level": "dirty"}
    )


def test_values_are_checked() -> None:
    assert "'failOnDataLoss' must be true or false, got 'yes'" in parse_error(failOnDataLoss="yes")
    assert "'maxOffsetsPerTrigger' must be an integer" in parse_error(maxOffsetsPerTrigger="lots")
    assert "'minPartitions' must be at least 1" in parse_error(minPartitions="0")
    message = parse_error(minOffsetsPerTrigger="100", maxOffsetsPerTrigger="10")
    assert "minOffsetsPerTrigger(100) is higher than the maxOffsetsPerTrigger(10)" in message
    assert "groupOffsetsFallback" in parse_error(groupOffsetsFallback="oldest")
    assert parse_error(maxTriggerDelay="soon") == (
        "option 'maxTriggerDelay' must be a duration such as 100ms, 30s, 15m, 1h or a number of "
        "milliseconds, got 'soon'"
    )


def test_starting_offsets_forms() -> None:
    assert parse(startingOffsets="earliest").starting.kind == "earliest"  # type: ignore[union-attr]
    assert parse(startingOffsets="LATEST").starting.kind == "latest"  # type: ignore[union-attr]
    specific = parse(startingOffsets='{"events":{"0":23,"1":-2,"2":-1}}').starting
    assert specific is not None and specific.kind == "offsets"
    assert dict(specific.offsets) == {("events", 0): 23, ("events", 1): -2, ("events", 2): -1}
    by_time = parse(startingOffsetsByTimestamp='{"events":{"0":1000}}').starting
    assert by_time is not None and by_time.kind == "timestamps"
    # Spark's preference: startingTimestamp over startingOffsetsByTimestamp over startingOffsets.
    both = parse(startingTimestamp="5000", startingOffsets="earliest").starting
    assert both is not None and both.kind == "timestamp" and both.timestamp == 5000
    assert "must be earliest, latest, group or JSON" in parse_error(startingOffsets="newest")
    assert "not valid JSON" in parse_error(startingOffsets="{oops")
    assert "is not an offset" in parse_error(startingOffsets='{"events":{"0":-3}}')
    assert "single long value" in parse_error(startingTimestamp="yesterday")


def test_group_start_needs_a_group() -> None:
    assert "set the option 'kafka.group.id'" in parse_error(startingOffsets="group")
    options = parse(startingOffsets="group", **{"kafka.group.id": "g"})
    assert options.starting is not None and options.starting.kind == "group"


def test_streaming_rejects_ending_offsets() -> None:
    for option in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
        value = '{"events":{"0":5}}' if option == "endingOffsetsByTimestamp" else "5"
        if option == "endingOffsets":
            value = "latest"
        with pytest.raises(
            SparkafkaOptionError, match=f"option '{option}' is not valid in streaming queries"
        ):
            parse(**{option: value}).for_stream()


def test_batch_boundaries() -> None:
    options = parse().for_batch()
    assert options.starting is not None and options.starting.kind == "earliest"
    assert options.ending is not None and options.ending.kind == "latest"
    with pytest.raises(SparkafkaOptionError, match="starting offset can't be latest for batch queries"):
        parse(startingOffsets="latest").for_batch()
    with pytest.raises(SparkafkaOptionError, match="startingOffsets for events-0 can't be latest"):
        parse(startingOffsets='{"events":{"0":-1}}').for_batch()
    with pytest.raises(SparkafkaOptionError, match="ending offset for events-0 can't be earliest"):
        parse(endingOffsets='{"events":{"0":-2}}').for_batch()
    with pytest.raises(SparkafkaOptionError, match="ending offset can't be earliest"):
        parse(endingOffsets="earliest").for_batch()
    with pytest.raises(SparkafkaOptionError, match="must name the same topic partitions"):
        parse(startingOffsets='{"events":{"0":1}}', endingOffsets='{"events":{"1":5}}').for_batch()
    with pytest.raises(SparkafkaOptionError, match=r"for events-0 \(9\) is greater than endingOffsets \(5\)"):
        parse(startingOffsets='{"events":{"0":9}}', endingOffsets='{"events":{"0":5}}').for_batch()


@pytest.mark.parametrize(
    ("text", "milliseconds"),
    [("15m", 900_000), ("30s", 30_000), ("250", 250), ("100ms", 100), ("2h", 7_200_000), ("1d", 86_400_000)],
)
def test_durations(text: str, milliseconds: int) -> None:
    assert parse_duration_ms("maxTriggerDelay", text) == milliseconds


def test_options_and_readers_pickle_without_clients() -> None:
    options = parse(maxOffsetsPerTrigger="10")
    reader = KafkaStreamReader(options)
    _ = reader.resolver  # creates the admin wrapper (the AdminClient itself only on first request)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == options
    assert copy._admin is None


def test_default_read_limit_follows_options() -> None:
    assert KafkaStreamReader(parse()).getDefaultReadLimit() == ReadAllAvailable()
    assert KafkaStreamReader(parse(maxOffsetsPerTrigger="7")).getDefaultReadLimit() == ReadMaxRows(7)
    assert KafkaStreamReader(parse(minOffsetsPerTrigger="3")).getDefaultReadLimit() == ReadMinRows(3)


# -- offsets ---------------------------------------------------------------------------------------


def test_offsets_json_is_sparks_format_and_canonical() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 9): 1, ("a", 0): 3}
    encoded = encode_offsets(offsets)
    assert encoded == {"a": {"0": 3, "2": 7}, "b": {"9": 1, "10": 5}}
    # Partitions in numeric order, topics in name order: equal offsets give equal JSON text.
    assert list(encoded) == ["a", "b"] and list(encoded["b"]) == ["9", "10"]
    assert decode_offsets(encoded) == offsets


def test_offset_ranges_skip_new_gone_and_empty_partitions() -> None:
    start = {("t", 0): 5, ("t", 1): 8, ("gone", 0): 3, ("t", 2): 4}
    end = {("t", 0): 9, ("t", 1): 8, ("new", 0): 0, ("t", 2): 0}
    assert offset_ranges(start, end) == [OffsetRange("t", 0, 5, 9)]


def test_rate_limit_is_proportional_to_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50, ("new", 0): 0}
    limited = rate_limit(100, start, latest)
    assert limited == {("t", 0): 90, ("t", 1): 110, ("t", 2): 50, ("new", 0): 0}
    # A small backlog still gets at least one offset.
    assert rate_limit(10, {("a", 0): 0, ("b", 0): 0}, {("a", 0): 10_000, ("b", 0): 1})[("b", 0)] == 1
    # Under the limit: everything.
    assert rate_limit(1000, start, latest) == latest


def test_split_keeps_ranges_whole_without_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 5, 5)]
    assert split_offset_ranges(ranges, min_partitions=None, max_records_per_partition=None) == ranges[:1]


@pytest.mark.parametrize("calculator", [LEGACY_CALCULATOR, SPARK_CALCULATOR])
def test_a_batch_without_records_splits_into_no_ranges_whatever_min_partitions(calculator: int) -> None:
    """A new query's first batch from latest or a group's offsets reads nothing; with minPartitions
    its planning once failed ("max() arg is an empty sequence")."""
    empty = [OffsetRange("t", 0, 5, 5), OffsetRange("t", 1, 7, 7)]
    assert (
        split_offset_ranges(empty, min_partitions=2, max_records_per_partition=None, calculator=calculator)
        == []
    )


def test_split_proportionally_to_at_least_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10)]
    split = split_offset_ranges(ranges, min_partitions=4, max_records_per_partition=None)
    assert len(split) >= 4
    assert OffsetRange("t", 1, 0, 10) in split  # small ranges stay whole
    big = sorted((r for r in split if r.partition == 0), key=lambda r: r.start)
    assert big[0].start == 0 and big[-1].end == 1000
    assert all(a.end == b.start for a, b in itertools.pairwise(big))
    # Deterministic: the same input always gives the same split.
    assert split == split_offset_ranges(ranges, min_partitions=4, max_records_per_partition=None)


def test_split_rounds_as_sparks_calculator_and_the_first_calculator_fills_up() -> None:
    """Spark's KafkaOffsetRangeCalculator keeps what rounding gives (here fewer than asked for);
    batches recorded by the first calculator, which halved the largest range until there were
    minPartitions, are replayed with it."""
    even = [OffsetRange("t", p, 0, 5) for p in range(3)]
    assert len(split_offset_ranges(even, min_partitions=7, max_records_per_partition=None)) == 6
    assert len(split_offset_ranges(even, min_partitions=4, max_records_per_partition=None)) == 3
    first = split_offset_ranges(
        even, min_partitions=7, max_records_per_partition=None, calculator=LEGACY_CALCULATOR
    )
    assert len(first) == 7
    assert sum(r.size for r in first) == 15


def test_split_keeps_a_partition_whole_when_one_of_its_ranges_stays_whole_as_spark_does() -> None:
    """maxRecordsPerPartition cuts partition 2 (47 offsets) into 23 + 24, and 23 rounds to one part:
    Spark's calculator then leaves both pieces of partition 2 whole (5 ranges, not 7)."""
    ranges = [OffsetRange("t", 0, 0, 22), OffsetRange("t", 1, 0, 39), OffsetRange("t", 2, 0, 47)]
    split = split_offset_ranges(ranges, min_partitions=7, max_records_per_partition=24)
    assert [(r.partition, r.start, r.end) for r in split] == [
        (0, 0, 22),
        (1, 0, 19),
        (1, 19, 39),
        (2, 0, 23),
        (2, 23, 47),
    ]
    first = split_offset_ranges(
        ranges, min_partitions=7, max_records_per_partition=24, calculator=LEGACY_CALCULATOR
    )
    assert len(first) == 7, "batches recorded by the first calculator keep their split"


def test_split_caps_records_per_partition() -> None:
    split = split_offset_ranges(
        [OffsetRange("t", 0, 10, 35)], min_partitions=None, max_records_per_partition=10
    )
    assert split == [OffsetRange("t", 0, 10, 18), OffsetRange("t", 0, 18, 26), OffsetRange("t", 0, 26, 35)]


# -- schema ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_what_pyspark_expects(include_headers: bool) -> None:
    expected = to_arrow_schema(kafka_schema(include_headers), timezone="UTC")
    assert kafka_arrow_schema(include_headers).equals(expected)


def test_schema_matches_sparks_kafka_source() -> None:
    assert kafka_schema(False).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert kafka_schema(True).simpleString().endswith(",headers:array<struct<key:string,value:binary>>>")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": None, "subscribePattern": "  "}, "Pattern to subscribe is empty"),
        ({"subscribe": None, "assign": '["a", 0]'}, "No topicpartitions to assign"),
        ({"subscribe": None, "assign": "{}"}, "option 'assign' assigns no partitions"),
        (
            {"subscribe": None, "assign": '{"a": [0, -1]}'},
            "topic 'a' must map to a list of partition numbers",
        ),
        ({"subscribe": None, "assign": '{"a": "0"}'}, "topic 'a' must map to a list of partition numbers"),
        ({"startingOffsets": "{}"}, "option 'startingOffsets' names no partitions"),
        ({"startingOffsets": '{"events": [0]}'}, "topic 'events' must map to {\"partition\": number}"),
        ({"startingOffsets": '{"events": {"x": 1}}'}, "expected \"partition\": number for topic 'events'"),
        ({"startingOffsets": '{"events": {"0": true}}'}, "expected \"partition\": number for topic 'events'"),
        ({"startingOffsets": '{"events": {"0": -3}}'}, "offset -3 for events-0 is not an offset"),
        (
            {"startingOffsetsByTimestamp": '["events"]'},
            "option 'startingOffsetsByTimestamp' must be a JSON object",
        ),
        ({"endingOffsetsByTimestamp": "{oops"}, "option 'endingOffsetsByTimestamp' is not valid JSON"),
        ({"startingTimestamp": "yesterday"}, "expected a single long value"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_malformed_offsets_and_strategies_name_the_option_and_the_shape(
    options: dict[str, str | None], message: str
) -> None:
    with pytest.raises(SparkafkaOptionError) as refused:
        parse(**options)
    assert message in str(refused.value)
