"""The same queries through Spark's own Kafka connector (``format("kafka")``) and through sparkafka
(``format("sparkafka")``), against the same topics of the embedded broker: batch reads compared row
by row and schema type by type, micro-batch boundaries of a rate-limited stream, and writes compared
record by record as read back from Kafka. Queries both refuse are compared by what their messages
name. The differences sparkafka keeps on purpose are tested as such (and listed in the README).
One Spark process with the connector's jars runs every query (``parity_runner.py``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import (
    create_topic,
    producer,
    read_all,
    read_to_end,
    transactional_producer,
)
from tests.integration.spark_kafka_connector import spark_kafka_jars
from tests.integration.spark_session import run_reporting_script

# Topics read by the pattern case start with "parity-"; the others must not.
TOPIC, OTHER = "parity-a", "parity-b"
TRANSACTIONAL, DELETED, STREAMED = "pt-transactional", "pt-deleted", "pt-streamed"
DELETED_BELOW = 4
BASE_TIMESTAMP_MS = 1_700_000_000_000

# name -> the read options both formats get (besides the bootstrap servers); both must agree.
READS: dict[str, dict[str, str]] = {
    "subscribe, earliest to latest": {"subscribe": TOPIC},
    "subscribe to a list": {"subscribe": f"{TOPIC},{OTHER}"},
    "subscribePattern": {"subscribePattern": "parity-.*"},
    "assign": {"assign": json.dumps({TOPIC: [0, 2]})},
    "offsets per partition with -2 and -1": {
        "subscribe": TOPIC,
        "startingOffsets": json.dumps({TOPIC: {"0": 2, "1": -2, "2": 1}}),
        "endingOffsets": json.dumps({TOPIC: {"0": -1, "1": 3, "2": 4}}),
    },
    "includeHeaders": {"subscribe": TOPIC, "includeHeaders": "true"},
    "startingOffsetsByTimestamp": {
        "subscribe": TOPIC,
        "startingOffsetsByTimestamp": json.dumps(
            {TOPIC: {str(p): BASE_TIMESTAMP_MS + 5_000 for p in range(3)}}
        ),
    },
    "startingTimestamp": {"subscribe": TOPIC, "startingTimestamp": str(BASE_TIMESTAMP_MS + 9_000)},
    "minPartitions": {"subscribe": TOPIC, "minPartitions": "7"},
    "maxRecordsPerPartition with minPartitions": {
        "subscribe": STREAMED,
        "maxRecordsPerPartition": "4",
        "minPartitions": "7",
    },
    "read_committed over aborted transactions": {
        "subscribe": TRANSACTIONAL,
        "kafka.isolation.level": "read_committed",
    },
    "read_uncommitted over aborted transactions": {
        "subscribe": TRANSACTIONAL,
        "kafka.isolation.level": "read_uncommitted",
    },
    "failOnDataLoss=false after records were deleted": {
        "subscribe": DELETED,
        "startingOffsets": json.dumps({DELETED: {"0": 0}}),
        "failOnDataLoss": "false",
    },
}

# name -> (read options, what both formats' refusals name): both must fail.
REFUSED_READS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "startingOffsets=latest on a batch read": (
        {"subscribe": TOPIC, "startingOffsets": "latest"},
        ("latest",),
    ),
    "endingOffsets=earliest on a batch read": (
        {"subscribe": TOPIC, "endingOffsets": "earliest"},
        ("earliest",),
    ),
    "no subscription": ({}, ("subscribe", "assign")),
    "subscribe and assign together": (
        {"subscribe": TOPIC, "assign": json.dumps({TOPIC: [0]})},
        ("subscribe", "assign"),
    ),
    "failOnDataLoss=true after records were deleted": (
        {"subscribe": DELETED, "startingOffsets": json.dumps({DELETED: {"0": 0}})},
        ("lost",),
    ),
}

# Deliberate difference: sparkafka reads read_committed unless told otherwise, Spark's connector
# read_uncommitted (the Kafka client's default), which shows aborted output to a pipeline.
DEFAULT_ISOLATION = "the default isolation level over aborted transactions"

# name -> streaming read options run with trigger(availableNow=True): the micro-batches must agree.
STREAMS: dict[str, dict[str, str]] = {
    "maxOffsetsPerTrigger over uneven partitions": {
        "subscribe": STREAMED,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "5",
    },
}
STREAMED_RECORDS = (10, 4, 1)  # per partition: shares of the limit are rounded per partition

KEY_VALUE = ["CAST(id AS STRING) AS key", "CONCAT('v', id) AS value"]
TO_TOPIC = {"topic": "{topic}"}

# name -> a df.write of spark.range(rows) both formats run, each to "<topic>-<format>"; the records
# read back must agree partition by partition. "partitions": of the output topics.
WRITES: dict[str, dict[str, Any]] = {
    "topic option": {"columns": KEY_VALUE, "options": TO_TOPIC, "partitions": 3},
    "per-row topic column": {"columns": [*KEY_VALUE, "'{topic}' AS topic"], "partitions": 3},
    "topic option over the topic column": {
        "columns": [*KEY_VALUE, "'{topic}-elsewhere' AS topic"],
        "options": TO_TOPIC,
        "partitions": 3,
    },
    "partition column": {
        "columns": [*KEY_VALUE, "CAST(id % 3 AS INT) AS partition"],
        "options": TO_TOPIC,
        "partitions": 3,
    },
    "keys placed by murmur2": {"columns": KEY_VALUE, "options": TO_TOPIC, "partitions": 5, "rows": 60},
    "headers": {
        "columns": [
            "CONCAT('v', id) AS value",
            "array(named_struct('key', 'n', 'value', CAST(CAST(id AS STRING) AS BINARY)), "
            "named_struct('key', 'none', 'value', CAST(NULL AS BINARY))) AS headers",
        ],
        "options": TO_TOPIC,
        "partitions": 1,
    },
    "null keys and values": {
        "columns": [
            "IF(id % 2 = 0, NULL, CAST(id AS STRING)) AS key",
            "IF(id % 3 = 0, NULL, CONCAT('v', id)) AS value",
        ],
        "options": TO_TOPIC,
        "partitions": 1,
    },
    "binary key and value": {
        "columns": ["CAST(CAST(id AS STRING) AS BINARY) AS key", "CAST(CONCAT('v', id) AS BINARY) AS value"],
        "options": TO_TOPIC,
        "partitions": 2,
    },
}

# name -> (a df.write both formats refuse, what both refusals name).
REFUSED_WRITES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "no value column": ({"columns": ["CAST(id AS STRING) AS key"], "options": TO_TOPIC}, ("value",)),
    "value of type bigint": ({"columns": ["id AS value"], "options": TO_TOPIC}, ("value", "binary")),
    "key of type bigint": (
        {"columns": ["id AS key", "CONCAT('v', id) AS value"], "options": TO_TOPIC},
        ("key",),
    ),
    "partition of type string": (
        {"columns": ["CONCAT('v', id) AS value", "'0' AS partition"], "options": TO_TOPIC},
        ("partition",),
    ),
    "no topic": ({"columns": ["CONCAT('v', id) AS value"]}, ("topic",)),
    "save mode overwrite": ({"columns": KEY_VALUE, "options": TO_TOPIC, "mode": "overwrite"}, ("overwrite",)),
}

# Unavoidable difference: df.write's default save mode, ErrorIfExists, which Spark's sink takes as
# append. PySpark's Python data sources can be written in Append and Overwrite mode only (Spark
# refuses before sparkafka is asked), so sparkafka needs .mode("append").
ERROR_IF_EXISTS = "save mode errorifexists (df.write's default)"

# Deliberate difference: sparkafka refuses an option it does not know (naming the closest one),
# Spark's connector ignores it, so a misspelt option silently does nothing.
UNKNOWN_OPTION = "an unknown option"


def _plan() -> dict[str, Any]:
    reads = {**READS, **{name: options for name, (options, _) in REFUSED_READS.items()}}
    reads[DEFAULT_ISOLATION] = {"subscribe": TRANSACTIONAL}
    writes = {**WRITES, **{name: case for name, (case, _) in REFUSED_WRITES.items()}}
    writes[UNKNOWN_OPTION] = {"columns": KEY_VALUE, "options": {**TO_TOPIC, "maxOffsetPerTrigger": "5"}}
    writes[ERROR_IF_EXISTS] = {"columns": KEY_VALUE, "options": TO_TOPIC, "mode": "errorifexists"}
    for number, case in enumerate(writes.values()):
        case["topic"] = f"pw-{number}"
    return {"reads": reads, "streams": STREAMS, "writes": writes, "named_streams": NAMED_STREAMS}


# Streaming writes of a named query: Spark hands the name to every sink as option 'queryName'.
NAMED_STREAMS: dict[str, dict[str, Any]] = {
    "named query, exactly-once for sparkafka": {
        "source": TOPIC,
        "topic": "pn-0",
        "partitions": 2,
        "sink_options": {"sparkafka": {"deliveryGuarantee": "exactly-once"}},
    },
}


def _fill_topics(bootstrap: str, plan: dict[str, Any]) -> None:
    create_topic(bootstrap, TOPIC, partitions=3)
    create_topic(bootstrap, OTHER, partitions=1)
    sender = producer(bootstrap)
    for i in range(15):
        headers = [("n", str(i).encode()), ("empty", b"")] if i % 3 else None
        sender.produce(
            TOPIC,
            key=None if i % 5 == 0 else f"k{i}",
            value=None if i == 7 else f"v{i}",
            partition=i % 3,
            timestamp=BASE_TIMESTAMP_MS + i * 1_000,
            headers=headers,
        )
    sender.produce(OTHER, key="only", value="other", partition=0, timestamp=BASE_TIMESTAMP_MS)

    create_topic(bootstrap, DELETED, partitions=1)
    for i in range(10):
        sender.produce(DELETED, value=f"d{i}", partition=0)
    create_topic(bootstrap, STREAMED, partitions=len(STREAMED_RECORDS))
    for partition, records in enumerate(STREAMED_RECORDS):
        for i in range(records):
            sender.produce(STREAMED, value=f"s{partition}-{i}", partition=partition)
    assert sender.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deleted = admin.delete_records([TopicPartition(DELETED, 0, DELETED_BELOW)], operation_timeout=10)
    for future in deleted.values():
        assert future.result(timeout=30).low_watermark == DELETED_BELOW

    # Committed, aborted, committed: the aborted records sit between committed ones.
    create_topic(bootstrap, TRANSACTIONAL, partitions=1)
    writer = transactional_producer(bootstrap, "parity-transactions")
    writer.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        writer.begin_transaction()
        for i in range(3):
            writer.produce(TRANSACTIONAL, value=f"{outcome}-{i}", partition=0)
        writer.flush(30)
        (writer.commit_transaction if outcome == "commit" else writer.abort_transaction)(30)

    for case in [*plan["writes"].values(), *plan["named_streams"].values()]:
        for sink in ("kafka", "sparkafka"):
            create_topic(bootstrap, f"{case['topic']}-{sink}", partitions=case.get("partitions", 1))
    # The topic the rows' topic column names, where the topic option must keep every record from: it
    # exists, so that a sink writing there would leave records to find.
    elsewhere = plan["writes"]["topic option over the topic column"]["topic"]
    for sink in ("kafka", "sparkafka"):
        create_topic(bootstrap, f"{elsewhere}-{sink}-elsewhere", partitions=3)


@pytest.fixture(scope="module")
def report(broker: BrokerProcess) -> dict[str, Any]:
    """What both formats did for every case, from one Spark process."""
    bootstrap = broker.bootstrap_servers
    plan = _plan()
    _fill_topics(bootstrap, plan)
    jars = ",".join(str(path) for path in spark_kafka_jars())
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    runner = (Path(__file__).parent / "parity_runner.py").read_text()
    found, _ = run_reporting_script(runner, jars, bootstrap, json.dumps(plan), env=env)
    found["plan"] = plan
    found["bootstrap"] = bootstrap
    return found


def _written(report: dict[str, Any], case: str, sink: str, *, suffix: str = "") -> dict[int, list[Any]]:
    """The records a write case left in its topic for ``sink``: partition -> sorted records."""
    spec = report["plan"]["writes"][case]
    partitions = spec.get("partitions", 1)
    topic = f"{spec['topic']}-{sink}{suffix}"
    messages = read_all(report["bootstrap"], topic, partitions=partitions, timeout_s=15)
    by_partition: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    for message in messages:
        headers = [(key, value) for key, value in message.headers() or []] or None
        by_partition[message.partition()].append((message.key(), message.value(), headers))
    return {p: sorted(records, key=repr) for p, records in by_partition.items()}


def _names_all(message: str, phrases: tuple[str, ...]) -> bool:
    return all(phrase.lower() in message.lower() for phrase in phrases)


@pytest.mark.parametrize("case", list(READS))
def test_a_batch_read_gives_what_sparks_kafka_source_gives(report: dict[str, Any], case: str) -> None:
    spark_kafka, ours = report["reads"][case]["kafka"], report["reads"][case]["sparkafka"]
    assert "error" not in spark_kafka and "error" not in ours, (spark_kafka, ours)
    assert ours["schema"] == spark_kafka["schema"]
    assert ours["rows"] == spark_kafka["rows"]
    assert ours["rows"], "a case that reads nothing compares nothing"


def test_min_partitions_splits_the_ranges_as_sparks_source_does(report: dict[str, Any]) -> None:
    """Spark's KafkaOffsetRangeCalculator: more input partitions than Kafka partitions, each range
    split in proportion to its size, rounded (15 records in 3 partitions, minPartitions 7: 6)."""
    spark_kafka, ours = (
        report["reads"]["minPartitions"]["kafka"],
        report["reads"]["minPartitions"]["sparkafka"],
    )
    assert spark_kafka["input_partitions"] > 3
    assert ours["input_partitions"] == spark_kafka["input_partitions"]


def test_max_records_per_partition_and_min_partitions_split_as_sparks_source_does(
    report: dict[str, Any],
) -> None:
    """10, 4 and 1 offsets cut to at most 4 (3+3+4, 4, 1), then minPartitions 7: Spark keeps every
    range of a partition whole when one of them stays whole, so partition 0 is not split further."""
    case = report["reads"]["maxRecordsPerPartition with minPartitions"]
    assert case["kafka"]["input_partitions"] == 6
    assert case["sparkafka"]["input_partitions"] == case["kafka"]["input_partitions"]


@pytest.mark.parametrize("case", list(REFUSED_READS))
def test_a_batch_read_spark_refuses_is_refused_naming_the_same_thing(
    report: dict[str, Any], case: str
) -> None:
    phrases = REFUSED_READS[case][1]
    spark_kafka, ours = report["reads"][case]["kafka"], report["reads"][case]["sparkafka"]
    assert "error" in spark_kafka and "error" in ours, (spark_kafka, ours)
    assert _names_all(spark_kafka["message"], phrases), spark_kafka["message"]
    assert _names_all(ours["message"], phrases), ours["message"]


def test_by_default_sparkafka_reads_committed_records_only_where_spark_reads_aborted_ones(
    report: dict[str, Any],
) -> None:
    default = report["reads"][DEFAULT_ISOLATION]
    committed = report["reads"]["read_committed over aborted transactions"]["kafka"]["rows"]
    uncommitted = report["reads"]["read_uncommitted over aborted transactions"]["kafka"]["rows"]
    assert default["sparkafka"]["rows"] == committed
    assert default["kafka"]["rows"] == uncommitted
    assert len(committed) == 6 and len(uncommitted) == 9


@pytest.mark.parametrize("case", list(STREAMS))
def test_a_rate_limited_stream_has_sparks_micro_batches(report: dict[str, Any], case: str) -> None:
    spark_kafka, ours = report["streams"][case]["kafka"], report["streams"][case]["sparkafka"]
    assert "error" not in spark_kafka and "error" not in ours, (spark_kafka, ours)
    assert ours["batches"] == spark_kafka["batches"]
    assert len(ours["batches"]) >= 3, "the limit must split the backlog"
    assert sum(len(batch) for batch in ours["batches"]) == sum(STREAMED_RECORDS)


@pytest.mark.parametrize("case", list(WRITES))
def test_a_write_leaves_what_sparks_kafka_sink_leaves(report: dict[str, Any], case: str) -> None:
    spark_kafka, ours = report["writes"][case]["kafka"], report["writes"][case]["sparkafka"]
    assert spark_kafka == ours == {"result": "ok"}, (spark_kafka, ours)
    written = _written(report, case, "sparkafka")
    assert written == _written(report, case, "kafka")
    rows = WRITES[case].get("rows", 20)
    assert sum(len(records) for records in written.values()) == rows


def test_the_topic_option_wins_over_the_topic_column_for_both(report: dict[str, Any]) -> None:
    case = "topic option over the topic column"
    for sink in ("kafka", "sparkafka"):
        assert _written(report, case, sink, suffix="-elsewhere") == {0: [], 1: [], 2: []}


def test_keys_are_spread_over_partitions_as_javas_default_partitioner_does(report: dict[str, Any]) -> None:
    written = _written(report, "keys placed by murmur2", "sparkafka")
    assert sum(1 for records in written.values() if records) >= 4, "60 keys over 5 partitions"


@pytest.mark.parametrize("case", list(REFUSED_WRITES))
def test_a_write_spark_refuses_is_refused_naming_the_same_thing(report: dict[str, Any], case: str) -> None:
    phrases = REFUSED_WRITES[case][1]
    spark_kafka, ours = report["writes"][case]["kafka"], report["writes"][case]["sparkafka"]
    assert "error" in spark_kafka and "error" in ours, (spark_kafka, ours)
    assert _names_all(spark_kafka["message"], phrases), spark_kafka["message"]
    assert _names_all(ours["message"], phrases), ours["message"]
    assert _written(report, case, "sparkafka") == _written(report, case, "kafka")


def test_an_unknown_option_is_refused_by_sparkafka_where_spark_ignores_it(report: dict[str, Any]) -> None:
    spark_kafka, ours = (
        report["writes"][UNKNOWN_OPTION]["kafka"],
        report["writes"][UNKNOWN_OPTION]["sparkafka"],
    )
    assert spark_kafka == {"result": "ok"}
    assert "error" in ours and "maxOffsetPerTrigger" in ours["message"].replace(
        "maxoffsetpertrigger", "maxOffsetPerTrigger"
    )


def test_the_default_save_mode_is_taken_as_append_by_spark_and_refused_by_pyspark(
    report: dict[str, Any],
) -> None:
    case = report["writes"][ERROR_IF_EXISTS]
    assert case["kafka"] == {"result": "ok"}
    assert "UNSUPPORTED_DATA_SOURCE_SAVE_MODE" in case["sparkafka"]["message"]
    assert len(_written(report, ERROR_IF_EXISTS, "kafka")[0]) == 20


def test_the_data_is_what_the_cases_need(report: dict[str, Any]) -> None:
    """Nulls, headers and per-partition ranges are really in the data the cases compare."""
    rows = report["reads"]["includeHeaders"]["kafka"]["rows"]
    assert any(row["key"] is None for row in rows) and any(row["value"] is None for row in rows)
    assert any(row["headers"] for row in rows) and any(row["headers"] is None for row in rows)
    deleted = report["reads"]["failOnDataLoss=false after records were deleted"]["kafka"]["rows"]
    assert [row["offset"] for row in deleted] == list(range(DELETED_BELOW, 10))


@pytest.mark.parametrize("case", list(NAMED_STREAMS))
def test_a_named_streaming_query_writes_what_sparks_kafka_sink_writes(
    report: dict[str, Any], case: str
) -> None:
    spark_kafka, ours = report["named_streams"][case]["kafka"], report["named_streams"][case]["sparkafka"]
    assert spark_kafka == {"result": "ok", "name": "parity-named-kafka"}, spark_kafka
    assert ours == {"result": "ok", "name": "parity-named-sparkafka"}, ours
    partitions = NAMED_STREAMS[case]["partitions"]
    written = {
        sink: sorted(
            (
                (m.key(), m.value())
                for m in read_to_end(report["bootstrap"], f"pn-0-{sink}", partitions=partitions)
            ),
            key=repr,
        )
        for sink in ("kafka", "sparkafka")
    }
    assert written["sparkafka"] == written["kafka"]
    assert len(written["sparkafka"]) == 15
