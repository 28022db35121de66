"""The commit-marker topic's layout: a prefix's records in one partition chosen by a hash of the
prefix, a query's ``query/`` records in the partition of its id, the layout recorded in partition 0
when the topic is created, and topics written before layouts existed read as they always were. On
the embedded broker and on Apache Kafka."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.sql import SparkSession

from sparkafka.broker import protocol
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.runner import EmbeddedBroker
from sparkafka.connector.sink.commit_log import (
    LAYOUT_KEY,
    CommitMarker,
    MarkerLayout,
    ensure_marker_topic,
    marker_layout,
    marker_partition_end,
    query_claim_key,
)
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.errors import CommitMarkerError
from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import (
    create_topic,
    marker_topic_partitions,
    producer,
    read_to_end,
    transactional_producer,
)
from tests.integration.kafka_cluster import SAME_PARTITION

ROWS = 20


def _options(kafka: Kafka, marker_topic: str, **extra: str) -> SinkOptions:
    return _options_at(kafka.bootstrap_servers, marker_topic, **extra)


def _options_at(bootstrap: str, marker_topic: str, **extra: str) -> SinkOptions:
    return SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "operationTimeoutMs": "20000",
            **extra,
        }
    )


def _keys_by_partition(kafka: Kafka, topic: str, partitions: int) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for message in read_to_end(kafka.bootstrap_servers, topic, partitions=partitions):
        found.setdefault(message.partition(), []).append((message.key() or b"").decode())
    return found


def test_a_topic_the_sink_creates_has_its_partitions_and_records_them_first(
    kafka: Kafka, topic_name: str
) -> None:
    options = _options(kafka, f"{topic_name}-markers", commitMarkerTopicPartitions="6")
    ensure_marker_topic(options)
    assert marker_layout(options) == MarkerLayout(6)
    keys = _keys_by_partition(kafka, options.marker_topic, 6)
    assert keys == {0: [LAYOUT_KEY]}, "the layout record, once, and nothing else yet"
    # Partitions added later are never used: the records of a prefix stay where they are.
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_partitions([NewPartitions(options.marker_topic, 9)])[options.marker_topic].result(30)
    assert marker_layout(options) == MarkerLayout(6)


def test_a_topic_deleted_and_created_again_is_laid_out_anew_by_a_process_that_knew_it(
    kafka: Kafka, topic_name: str
) -> None:
    """A process keeps the layout it found for the topic's id (the driver asks for it twice a
    micro-batch): the topic created again under the same name has another id, and its own layout."""
    six = _options(kafka, f"{topic_name}-markers", commitMarkerTopicPartitions="6")
    ensure_marker_topic(six)
    assert marker_layout(six) == MarkerLayout(6)
    assert marker_layout(six) == MarkerLayout(6), "asked again: the same"
    _delete_topic(kafka.bootstrap_servers, six.marker_topic)
    three = dataclasses.replace(six, marker_partitions=3)
    assert wait_until(lambda: _created(three), 60), "the topic was not created again"
    assert marker_layout(three) == MarkerLayout(3)
    assert marker_layout(six) == MarkerLayout(3), "the options' partition count only matters at creation"


def _created(options: SinkOptions) -> bool:
    """Whether ``ensure_marker_topic`` created the topic (a broker may still be deleting the old one)."""
    try:
        ensure_marker_topic(options)
    except CommitMarkerError:
        return False
    return (
        len(marker_topic_partitions(options.bootstrap_servers, options.marker_topic))
        == options.marker_partitions
    )


def test_a_topic_a_node_learns_of_late_is_laid_out_and_read_not_taken_for_deleted(
    kafka: Kafka, topic_name: str
) -> None:
    """Kafka's controller acknowledges CreateTopics before every node learnt of the topic, and a node
    that has not answers as if it did not exist (a first batch on a busy three-node Apache Kafka was
    refused as "deleted while the query ran"). Here the topic appears a moment after the sink first
    asks: the layout is that of the topic, and its offsets are read, not refused."""
    options = _options(kafka, f"{topic_name}-markers", commitMarkerTopicPartitions="4")
    created = threading.Timer(
        1.5, lambda: create_topic(kafka.bootstrap_servers, options.marker_topic, partitions=4)
    )
    created.start()
    try:
        assert marker_layout(options) == MarkerLayout(4)
    finally:
        created.join()
    late = f"{topic_name}-late"
    later = threading.Timer(1.5, lambda: create_topic(kafka.bootstrap_servers, late, partitions=1))
    later.start()
    try:
        assert marker_partition_end(dataclasses.replace(options, marker_topic=late), 0) == 0
    finally:
        later.join()


def test_a_one_partition_topic_keeps_everything_in_partition_0(kafka: Kafka, topic_name: str) -> None:
    """Every marker topic written before layouts existed had one partition (and a topic created with
    commitMarkerTopicPartitions=1 has one): no layout record, and every key in partition 0."""
    options = _options(kafka, f"{topic_name}-markers", commitMarkerTopicPartitions="1")
    ensure_marker_topic(options)
    layout = marker_layout(options)
    assert layout == MarkerLayout(1)
    assert {layout.partition_of(f"prefix-{n}") for n in range(50)} == {0}
    assert read_to_end(kafka.bootstrap_servers, options.marker_topic) == []


def test_a_topic_of_several_partitions_an_older_sparkafka_wrote_is_read_as_it_was_written(
    kafka: Kafka, topic_name: str
) -> None:
    """Created by hand with four partitions, then written by a sparkafka that knew one partition
    only: its records are in partition 0 and no layout record precedes them, so everything stays in
    partition 0 and no layout record is added."""
    markers = f"{topic_name}-markers"
    create_topic(kafka.bootstrap_servers, markers, partitions=4, config={"cleanup.policy": "compact"})
    older = transactional_producer(kafka.bootstrap_servers, f"{topic_name}-old-0")
    older.init_transactions(30)
    older.begin_transaction()
    marker = CommitMarker(f"{topic_name}-old-0", "q-old", 0, 0, 3, 1)
    older.produce(markers, key=marker.transactional_id, value=marker.encode(), partition=0)
    older.commit_transaction(30)
    options = _options(kafka, markers)
    ensure_marker_topic(options)
    assert marker_layout(options) == MarkerLayout(1)
    assert _keys_by_partition(kafka, markers, 4) == {0: [marker.transactional_id]}


def test_processes_laying_out_a_topic_created_by_hand_all_take_the_same_layout(
    kafka: Kafka, topic_name: str
) -> None:
    """An empty topic of five partitions: the first sparkafka to use it records its layout; racing
    ones may record it too, and every one of them takes the same."""
    markers = f"{topic_name}-markers"
    create_topic(kafka.bootstrap_servers, markers, partitions=5, config={"cleanup.policy": "compact"})
    options = _options(kafka, markers)
    layouts: list[MarkerLayout] = []
    racers = [threading.Thread(target=lambda: layouts.append(marker_layout(options))) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
    assert layouts == [MarkerLayout(5)] * 4
    keys = _keys_by_partition(kafka, markers, 5)
    assert set(keys) == {0} and set(keys[0]) == {LAYOUT_KEY}


def exactly_once_query(
    spark: SparkSession, kafka: Kafka, source: str, sink: str, checkpoint: Path, **options: str
) -> None:
    writer = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", sink)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.trigger(availableNow=True).start().awaitTermination(300)


def _prefix_in_another_partition(layout: MarkerLayout, partitions: set[int]) -> str:
    return next(
        prefix
        for prefix in (f"other-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if layout.partition_of(prefix) not in partitions
    )


def test_a_query_keeps_its_records_in_its_partitions_and_is_not_held_back_by_another_querys_transaction(
    spark: SparkSession, kafka: Kafka, topic_name: str, tmp_path: Path
) -> None:
    """A query's markers, registrations, claim and progress are in its prefix's partition of the
    marker topic, its record of the claim in its query id's, nothing of it elsewhere. Another query's
    writer then dies with a transaction open on a third partition (a 15-minute timeout): the query's
    restart neither waits for it nor reads that partition, and writes each record once."""
    bootstrap = kafka.bootstrap_servers
    markers, source, sink = f"{topic_name}-markers", f"{topic_name}-in", f"{topic_name}-out"
    options = _options(kafka, markers, commitMarkerTopicPartitions="8")
    ensure_marker_topic(options)
    layout = marker_layout(options)
    assert layout == MarkerLayout(8)
    prefix = f"{topic_name}-query"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    sender = producer(bootstrap)

    def send(numbers: range) -> None:
        for number in numbers:
            sender.produce(source, value=f"r{number}".encode(), partition=number % 2)
        assert sender.flush(30) == 0

    checkpoint = tmp_path / "checkpoint"
    sink_options = {
        "commitMarkerTopic": markers,
        "transactionalIdPrefix": prefix,
        # The marker read waits at most this (plus operationTimeoutMs) for an open transaction.
        "kafka.transaction.timeout.ms": "10000",
        "operationTimeoutMs": "10000",
    }
    send(range(ROWS))
    exactly_once_query(spark, kafka, source, sink, checkpoint, **sink_options)

    keys = _keys_by_partition(kafka, markers, 8)
    own = set(keys[layout.partition_of(prefix)])
    expected = {f"{prefix}-0", f"{prefix}-1", f"registration/{prefix}-0", f"registration/{prefix}-1"}
    assert expected | {f"claim/{prefix}", f"progress/{prefix}"} <= own
    query_records = [key for found in keys.values() for key in found if key.startswith("query/")]
    assert len(query_records) == 1, query_records
    query_id = query_records[0].split("/")[1]
    assert query_records[0] == query_claim_key(query_id, prefix)
    assert query_records[0] in keys[layout.partition_of(query_id)]
    theirs = (layout.partition_of(prefix), layout.partition_of(query_id))
    elsewhere = [key for partition, found in keys.items() if partition not in theirs for key in found]
    assert not [key for key in elsewhere if prefix in key or query_id in key], elsewhere

    # The other query's crashed writer: its marker in a transaction left open, in its own partition.
    other = _prefix_in_another_partition(layout, {*theirs, 0})
    held = transactional_producer(bootstrap, f"{other}-0", transaction_timeout_ms=900_000)
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(markers, key=f"{other}-0", value=b"{}", partition=layout.partition_of(other))
    assert held.flush(30) == 0
    try:
        send(range(ROWS, 2 * ROWS))
        exactly_once_query(spark, kafka, source, sink, checkpoint, **sink_options)
        output = sorted((m.value() or b"").decode() for m in read_to_end(bootstrap, sink, partitions=2))
        assert output == sorted(f"r{number}" for number in range(2 * ROWS))
    finally:
        held.abort_transaction(30)


def test_a_query_on_a_one_partition_topic_of_an_older_sparkafka_replays_a_partial_commit_once(
    kafka: Kafka, topic_name: str, tmp_path: Path
) -> None:
    """The marker topic an older sparkafka created (one partition, compacted): the pipeline is killed
    when write partition 0 committed its half of the batch and partition 1's transaction is open;
    the restart skips partition 0's half by its marker in partition 0 and writes partition 1's."""
    bootstrap = kafka.bootstrap_servers
    markers, source, sink = f"{topic_name}-markers", f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, markers, partitions=1, config={"cleanup.policy": "compact"})
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    sender = producer(bootstrap)
    for number in range(ROWS):
        sender.produce(source, value=f"r{number}".encode(), partition=number % 2)
    assert sender.flush(30) == 0
    checkpoint = tmp_path / "checkpoint"
    common = (f"commitMarkerTopic={markers}",)
    paused = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=600s")
    first = PipelineProcess(
        tmp_path / "first.log",
        run_arguments(bootstrap, source, sink, checkpoint, sql=SAME_PARTITION, sink_options=common + paused),
    ).start()
    try:
        first.wait_for("sparkafka debug pause: beforeCommit partition=1")
        assert wait_until(lambda: len(read_to_end(bootstrap, sink, partitions=2)) == ROWS // 2, 60)
    finally:
        first.kill_group()
    replay = PipelineProcess(
        tmp_path / "replay.log",
        run_arguments(bootstrap, source, sink, checkpoint, sql=SAME_PARTITION, sink_options=common),
    ).start()
    try:
        assert wait_until(lambda: len(read_to_end(bootstrap, sink, partitions=2)) >= ROWS, 120), (
            replay.output()[-3000:]
        )
    finally:
        replay.terminate()
    output = sorted((m.value() or b"").decode() for m in read_to_end(bootstrap, sink, partitions=2))
    assert output == sorted(f"r{number}" for number in range(ROWS))
    # Partition 1's aborted half is in the log beside the output; partition 0's half is not twice.
    uncommitted = read_to_end(bootstrap, sink, partitions=2, isolation="read_uncommitted")
    assert len(uncommitted) == ROWS + ROWS // 2
    keys = _keys_by_partition(kafka, markers, 1)
    assert set(keys) == {0} and LAYOUT_KEY not in keys[0]
    kinds = {key.split("/")[0] for key in keys[0] if "/" in key}
    # As an older sparkafka wrote it: no record of the query's claims, the topic is read whole.
    assert kinds >= {"claim", "registration", "progress"} and "query" not in kinds


def test_a_transaction_open_in_partition_0_does_not_hold_the_layout_read_back(
    kafka: Kafka, topic_name: str
) -> None:
    """A topic of several partitions an older sparkafka wrote (everything in partition 0), with a
    writer's transaction open there: whether it has a layout is answered at once, not after the
    transaction's timeout."""
    markers = f"{topic_name}-markers"
    create_topic(kafka.bootstrap_servers, markers, partitions=3, config={"cleanup.policy": "compact"})
    held = transactional_producer(
        kafka.bootstrap_servers, f"{topic_name}-held-0", transaction_timeout_ms=900_000
    )
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(markers, key=f"{topic_name}-held-0", value=b"{}", partition=0)
    assert held.flush(30) == 0
    try:
        assert marker_layout(_options(kafka, markers, operationTimeoutMs="5000")) == MarkerLayout(1)
    finally:
        held.abort_transaction(30)


# -- a cluster without topic ids ---------------------------------------------------------------------


@pytest.fixture
def kafka_without_topic_ids(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """The embedded broker, in this process, answering Metadata up to version 9 only, as Apache
    Kafka 2.7 and older do (topic ids came with version 10, KIP-516): librdkafka then reports every
    topic's id as the zero UUID. Yields its bootstrap servers."""
    monkeypatch.setitem(protocol.SUPPORTED_VERSIONS, protocol.ApiKey.METADATA, (0, 9))
    with EmbeddedBroker(BrokerConfig(port=0, data_dir=tmp_path / "broker")) as broker:
        yield broker.bootstrap_servers


def _layout_in_another_process(options: SinkOptions) -> MarkerLayout:
    """What every other process (an executor's Python worker, a restarted driver) finds."""
    code = (
        "import sys\n"
        "from sparkafka.connector.sink.commit_log import marker_layout\n"
        "from sparkafka.connector.sink.options import SinkOptions\n"
        "print(marker_layout(SinkOptions.parse(dict(zip(sys.argv[1::2], sys.argv[2::2])))).partitions)\n"
    )
    raw = {
        "kafka.bootstrap.servers": options.bootstrap_servers,
        "deliveryGuarantee": "exactly-once",
        "commitMarkerTopic": options.marker_topic,
    }
    arguments = [item for pair in raw.items() for item in pair]
    done = subprocess.run(
        [sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return MarkerLayout(int(done.stdout.split()[-1]))


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    assert wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 30)


def test_a_topic_created_again_on_a_cluster_without_topic_ids_is_laid_out_as_every_process_reads_it(
    kafka_without_topic_ids: str,
) -> None:
    """Without topic ids a process cannot tell a topic from one of the same name created again, so it
    keeps no layout: the driver that laid out the old topic writes the new one's layout record and
    reads what every other process reads (a layout kept from the old topic would place a prefix's
    markers where no other process looks, and a replay would write its batch again)."""
    bootstrap = kafka_without_topic_ids
    three = dataclasses.replace(_options_at(bootstrap, "markers"), marker_partitions=3)
    ensure_marker_topic(three)
    assert marker_layout(three) == MarkerLayout(3)
    _delete_topic(bootstrap, "markers")
    six = dataclasses.replace(three, marker_partitions=6)
    ensure_marker_topic(six)
    assert marker_layout(six) == MarkerLayout(6)
    assert _keys_in_partition_0(bootstrap, "markers") == [LAYOUT_KEY], "the new topic's layout record"
    assert _layout_in_another_process(six) == MarkerLayout(6)


def test_a_topic_written_before_layouts_then_created_again_without_topic_ids_is_laid_out_anew(
    kafka_without_topic_ids: str,
) -> None:
    bootstrap = kafka_without_topic_ids
    create_topic(bootstrap, "legacy", partitions=4, config={"cleanup.policy": "compact"})
    sender = producer(bootstrap)
    sender.produce("legacy", key=b"sparkafka-old-0", value=b'{"batch_id": 1}', partition=0)
    assert sender.flush(30) == 0
    four = dataclasses.replace(_options_at(bootstrap, "legacy"), marker_partitions=4)
    assert marker_layout(four) == MarkerLayout(1), "written before layouts: everything in partition 0"
    _delete_topic(bootstrap, "legacy")
    ensure_marker_topic(four)
    assert marker_layout(four) == MarkerLayout(4) == _layout_in_another_process(four)


def _keys_in_partition_0(bootstrap: str, topic: str) -> list[str]:
    return [
        (m.key() or b"").decode()
        for m in read_to_end(bootstrap, topic, partitions=1, isolation="read_uncommitted")
        if m.partition() == 0
    ]
