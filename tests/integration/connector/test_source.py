"""The Kafka source against real Kafka processes — every test on the embedded broker and on Apache
Kafka's own — and a real local SparkSession (no mocks)."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.datasource import ReadAllAvailable

from sparkafka.connector.source.batch import KafkaBatchReader
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.offsets import decode_offsets
from sparkafka.connector.source.options import SourceOptions
from sparkafka.connector.source.resolver import OffsetResolver
from sparkafka.connector.source.schema import kafka_schema
from sparkafka.connector.source.stream import KafkaStreamReader
from sparkafka.errors import DataLossError
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import create_topic, open_transaction, producer, transactional_producer

FORMAT = "sparkafka"


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's Kafka, the embedded broker and then Apache Kafka (``kafka`` in conftest)."""
    return kafka


# -- helpers ---------------------------------------------------------------------------------------


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[str],
    *,
    partition: int | None = None,
    timestamps: Sequence[int] | None = None,
) -> None:
    sender = producer(bootstrap)
    for index, value in enumerate(values):
        extra: dict[str, Any] = {}
        if partition is not None:
            extra["partition"] = partition
        if timestamps is not None:
            extra["timestamp"] = timestamps[index]
        sender.produce(topic, value=value.encode(), **extra)
    assert sender.flush(30) == 0


def batch_read(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.read.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def values_of(rows: Sequence[Row]) -> list[str]:
    return [row.value.decode() for row in sorted(rows, key=lambda r: (r.topic, r.partition, r.offset))]


class Batches:
    """A foreachBatch sink that keeps each micro-batch's rows by batch id (runs on the driver)."""

    def __init__(self, on_batch: Callable[[int], None] | None = None) -> None:
        self.by_id: dict[int, list[Row]] = {}
        self.on_batch = on_batch

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.by_id[batch_id] = sorted(frame.collect(), key=lambda r: (r.topic, r.partition, r.offset))
        if self.on_batch is not None:
            self.on_batch(batch_id)

    @property
    def rows(self) -> list[Row]:
        return [row for batch_id in sorted(self.by_id) for row in self.by_id[batch_id]]

    def sizes(self) -> list[int]:
        return [len(self.by_id[batch_id]) for batch_id in sorted(self.by_id)]


def start(frame: DataFrame, sink: Batches, checkpoint: Path, *, available_now: bool) -> StreamingQuery:
    writer = frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    writer = (
        writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    )
    return writer.start()


def run_available_now(frame: DataFrame, checkpoint: Path, sink: Batches | None = None) -> Batches:
    sink = sink or Batches()
    query = start(frame, sink, checkpoint, available_now=True)
    try:
        assert query.awaitTermination(180), "AvailableNow query did not finish"
    finally:
        query.stop()
    return sink


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])]
    answer = admin.list_consumer_group_offsets(request)[group].result(30)
    return {tp.partition: tp.offset for tp in answer.topic_partitions}


# -- schema and batch reads ------------------------------------------------------------------------


def test_batch_read_has_sparks_schema_and_every_record_field(
    spark: SparkSession, broker: Kafka, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    sender = producer(bootstrap)
    sender.produce(
        topic_name,
        key=b"k0",
        value=b"v0",
        partition=0,
        timestamp=1_700_000_000_123,
        headers=[("trace", b"abc"), ("empty", None)],
    )
    sender.produce(topic_name, value=b"v1", partition=1, timestamp=1_700_000_001_000)
    sender.produce(topic_name, key=b"k2", value=None, partition=0, timestamp=1_700_000_002_000)
    assert sender.flush(30) == 0

    with_headers = batch_read(spark, bootstrap, subscribe=topic_name, includeHeaders="true")
    assert with_headers.schema == kafka_schema(True)
    rows = sorted(with_headers.collect(), key=lambda r: (r.partition, r.offset))
    first = rows[0].asDict(recursive=True)
    assert first == {
        "key": bytearray(b"k0"),
        "value": bytearray(b"v0"),
        "topic": topic_name,
        "partition": 0,
        "offset": 0,
        "timestamp": first["timestamp"],
        "timestampType": 0,
        "headers": [{"key": "trace", "value": bytearray(b"abc")}, {"key": "empty", "value": None}],
    }
    # Kafka's millisecond timestamps become the same instants (TimestampType, microseconds).
    millis = with_headers.selectExpr("unix_millis(timestamp) AS ms").collect()
    assert sorted(r.ms for r in millis) == [1_700_000_000_123, 1_700_000_001_000, 1_700_000_002_000]
    assert (rows[1].partition, rows[1].offset, rows[1].value, rows[1].key) == (0, 1, None, bytearray(b"k2"))
    assert rows[2].headers is None and rows[2].key is None  # no headers: null, as in Spark

    plain = batch_read(spark, bootstrap, subscribe=topic_name)
    assert plain.schema == kafka_schema(False)
    assert plain.count() == 3


def test_log_append_time_topics_show_the_brokers_time_and_timestamp_type_1(
    spark: SparkSession, broker: Kafka, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, config={"message.timestamp.type": "LogAppendTime"})
    sender = producer(bootstrap)
    before_ms = int(time.time() * 1000)
    sender.produce(topic_name, value=b"v", timestamp=1_000)  # replaced by the broker's append time
    assert sender.flush(30) == 0
    after_ms = int(time.time() * 1000)

    row = (
        batch_read(spark, bootstrap, subscribe=topic_name)
        .selectExpr("timestampType", "unix_millis(timestamp) AS ms")
        .collect()[0]
    )
    assert row.timestampType == 1
    assert before_ms <= row.ms <= after_ms


def test_batch_offsets_json_and_timestamps(spark: SparkSession, broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    base = 1_600_000_000_000
    produce(
        bootstrap, topic_name, [f"v{i}" for i in range(10)], timestamps=[base + i * 1000 for i in range(10)]
    )

    def offsets(**options: str) -> list[int]:
        return sorted(
            r.offset for r in batch_read(spark, bootstrap, subscribe=topic_name, **options).collect()
        )

    assert offsets(
        startingOffsets=f'{{"{topic_name}":{{"0":2}}}}', endingOffsets=f'{{"{topic_name}":{{"0":5}}}}'
    ) == [
        2,
        3,
        4,
    ]
    assert offsets(startingOffsets=f'{{"{topic_name}":{{"0":-2}}}}', endingOffsets="latest") == list(
        range(10)
    )
    assert offsets(startingOffsetsByTimestamp=f'{{"{topic_name}":{{"0":{base + 6500}}}}}') == [7, 8, 9]
    assert offsets(startingTimestamp=str(base + 3000), endingTimestamp=str(base + 5000)) == [3, 4]
    assert offsets(startingTimestamp=str(base + 99_000), startingOffsetsByTimestampStrategy="latest") == []
    with pytest.raises(Exception, match="No offset matched from request of topic-partition"):
        offsets(startingTimestamp=str(base + 99_000))
    past_the_end = f'{{"{topic_name}":{{"0":50}}}}'
    with pytest.raises(Exception, match=r"beyond the last stable offset 10.*failOnDataLoss"):
        offsets(startingOffsets=past_the_end)  # data loss, as with Spark's source
    assert offsets(startingOffsets=past_the_end, failOnDataLoss="false") == []  # starts at the end


def test_assign_and_min_partitions_splitting_large_ranges(
    spark: SparkSession, broker: Kafka, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    produce(bootstrap, topic_name, [f"a{i}" for i in range(90)], partition=0)
    produce(bootstrap, topic_name, [f"b{i}" for i in range(10)], partition=1)

    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name, "minpartitions": "5"}
    ).for_batch()
    planned = KafkaBatchReader(options).partitions()
    assert len(planned) >= 5
    assert OffsetRange(topic_name, 1, 0, 10) in planned  # the small range stays whole
    assert sum(r.size for r in planned if isinstance(r, OffsetRange)) == 100

    only_second = batch_read(spark, bootstrap, assign=f'{{"{topic_name}":[1]}}')
    assert values_of(only_second.collect()) == [f"b{i}" for i in range(10)]

    frame = batch_read(spark, bootstrap, subscribe=topic_name, minPartitions="5")
    assert frame.rdd.getNumPartitions() == len(planned)
    assert sorted(values_of(frame.collect())) == sorted(
        [f"a{i}" for i in range(90)] + [f"b{i}" for i in range(10)]
    )


# -- transactions and exact ranges (the reader on its own, as an executor runs it) -----------------


def read_range(options: SourceOptions, topic: str, start: int, end: int) -> list[pa.RecordBatch]:
    return list(KafkaBatchReader(options).read(OffsetRange(topic, 0, start, end)))


def test_read_committed_ranges_skip_aborted_data_and_stop_at_the_end(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, ["plain0", "plain1"])  # offsets 0-1
    other = transactional_producer(bootstrap, f"tx-{topic_name}")
    other.init_transactions()
    other.begin_transaction()
    for i in range(3):
        other.produce(topic_name, value=f"aborted{i}".encode())  # 2-4, abort marker 5
    other.flush(30)
    other.abort_transaction()
    other.begin_transaction()
    for i in range(2):
        other.produce(topic_name, value=f"committed{i}".encode())  # 6-7, commit marker 8
    other.flush(30)
    other.commit_transaction()
    other.begin_transaction()
    other.produce(topic_name, value=b"open0")  # 9, transaction still open
    other.flush(30)

    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic_name,
            "kafkaconsumer.polltimeoutms": "20000",
        }
    ).for_batch()
    admin = options.admin()
    last_stable = admin.latest_offsets([(topic_name, 0)], read_committed=True)[(topic_name, 0)]
    assert last_stable == 9  # the end offset never passes the open transaction

    def values(batches: list[pa.RecordBatch]) -> list[str]:
        return [v.decode() for batch in batches for v in batch.column("value").to_pylist()]

    started = time.monotonic()
    whole = read_range(options, topic_name, 0, last_stable)
    assert values(whole) == ["plain0", "plain1", "committed0", "committed1"]
    assert [o for b in whole for o in b.column("offset").to_pylist()] == [0, 1, 6, 7]
    # Replay: the same range reads the same records, batch for batch.
    assert [b.to_pydict() for b in read_range(options, topic_name, 0, last_stable)] == [
        b.to_pydict() for b in whole
    ]
    # Ranges ending inside aborted data or on a control marker end without waiting for a record at end - 1.
    assert values(read_range(options, topic_name, 2, 5)) == []
    assert values(read_range(options, topic_name, 1, 6)) == ["plain1"]
    assert values(read_range(options, topic_name, 6, 9)) == ["committed0", "committed1"]
    assert values(read_range(options, topic_name, 8, 9)) == []
    assert time.monotonic() - started < 15, "reads of ranges ending in skipped offsets must not hang"

    uncommitted = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic_name,
            "kafka.isolation.level": "read_uncommitted",
        }
    ).for_batch()
    assert values(read_range(uncommitted, topic_name, 0, 5)) == [
        "plain0",
        "plain1",
        "aborted0",
        "aborted1",
        "aborted2",
    ]

    other.commit_transaction()
    # Apache Kafka answers EndTxn once the commit is prepared and writes the markers afterwards, so
    # the last stable offset moves a little later, as any read_committed client sees it.
    wait_for(
        lambda: admin.latest_offsets([(topic_name, 0)], read_committed=True)[(topic_name, 0)] == 11,
        timeout_s=30,
    )
    now_stable = 11
    assert values(read_range(options, topic_name, last_stable, now_stable)) == ["open0"]


# -- streaming -------------------------------------------------------------------------------------


def test_restarted_query_rereads_the_uncommitted_batch_exactly(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    produce(bootstrap, topic_name, [f"p0-{i}" for i in range(20)], partition=0)
    aborting = transactional_producer(bootstrap, f"tx-{topic_name}")
    aborting.init_transactions()
    aborting.begin_transaction()
    for i in range(5):
        aborting.produce(topic_name, value=f"aborted{i}".encode(), partition=1)
    aborting.flush(30)
    aborting.abort_transaction()
    produce(bootstrap, topic_name, [f"p1-{i}" for i in range(20)], partition=1)

    checkpoint = tmp_path / "checkpoint"
    frame = stream(
        spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="15"
    )
    first = run_available_now(frame, checkpoint)
    assert sorted(values_of(first.rows)) == sorted(
        [f"p0-{i}" for i in range(20)] + [f"p1-{i}" for i in range(20)]
    )
    last_batch = max(first.by_id)
    assert last_batch >= 2

    # As if the driver died after the batch ran but before it was committed.
    (checkpoint / "commits" / str(last_batch)).unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    second = run_available_now(frame, checkpoint)
    assert list(second.by_id) == [last_batch]
    assert second.by_id[last_batch] == first.by_id[last_batch]


def test_the_first_micro_batch_replays_the_same_ranges_with_starting_offsets_latest(
    broker: Kafka, topic_name: str
) -> None:
    """The engine asks a new query's initial offset when it plans the first micro-batch and again
    when a new driver replays it. Records written in between must not change what that batch reads:
    the first batch only fixes the resolved starting offsets (and reads nothing), so its replay plans
    the same (no) ranges and the records are read, from checkpointed offsets, by the next one."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, [f"old{i}" for i in range(5)])
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name, "startingoffsets": "latest"}
    ).for_stream()
    first_driver = KafkaStreamReader(options)
    start = first_driver.initialOffset()
    produce(bootstrap, topic_name, [f"new{i}" for i in range(5)])  # between the engine's two calls
    end = first_driver.latestOffset(start, ReadAllAvailable())
    planned = first_driver.partitions(start, end)

    produce(bootstrap, topic_name, [f"later{i}" for i in range(3)])
    replaying_driver = KafkaStreamReader(options)  # after a crash: the end offsets come from the checkpoint
    replayed = replaying_driver.partitions(replaying_driver.initialOffset(), end)
    assert replayed == planned == []
    following = replaying_driver.latestOffset(end, ReadAllAvailable())
    assert replaying_driver.partitions(end, following) == [OffsetRange(topic_name, 0, 10, 13)]

    # earliest: the first batch reads records, as with Spark's source. Its end offset carries its
    # start, so a replay plans the same range even once retention has moved the earliest offset, and
    # finds the records gone (data loss) instead of silently starting later.
    earliest = SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name, "startingoffsets": "earliest"}
    ).for_stream()
    reader = KafkaStreamReader(earliest)
    initial = reader.initialOffset()
    assert decode_offsets(initial) == {(topic_name, 0): 0}
    first_end = reader.latestOffset(initial, ReadAllAvailable())
    assert decode_offsets(first_end) == {(topic_name, 0): 13}
    assert reader.partitions(initial, first_end) == [OffsetRange(topic_name, 0, 0, 13)]
    assert reader.latestOffset(first_end, ReadAllAvailable()) == first_end  # nothing new, no batch
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic_name, 0, 4)])[TopicPartition(topic_name, 0, 4)].result(30)
    replaying = KafkaStreamReader(earliest)
    moved = replaying.initialOffset()
    assert decode_offsets(moved) == {(topic_name, 0): 4}
    assert replaying.partitions(moved, first_end) == [OffsetRange(topic_name, 0, 0, 13)]
    with pytest.raises(DataLossError, match="requested offset 0, available offset 4"):
        list(replaying.read(OffsetRange(topic_name, 0, 0, 13)))


def test_available_now_reads_only_what_existed_at_start_rate_limited(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    produce(bootstrap, topic_name, [f"a{i}" for i in range(20)], partition=0)
    produce(bootstrap, topic_name, [f"b{i}" for i in range(10)], partition=1)

    def produce_more(batch_id: int) -> None:
        if batch_id == 0:
            produce(bootstrap, topic_name, [f"late{i}" for i in range(50)], partition=0)

    frame = stream(
        spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="10"
    )
    sink = run_available_now(frame, tmp_path / "checkpoint", Batches(produce_more))
    assert len(sink.rows) == 30
    assert not any(v.startswith("late") for v in values_of(sink.rows))
    assert all(size <= 10 for size in sink.sizes())
    # The limit is shared in proportion to the backlog: 20 vs 10 -> 6 and 3 (Spark's rounding).
    first = next(rows for _, rows in sorted(sink.by_id.items()) if rows)
    assert [sum(1 for r in first if r.partition == p) for p in (0, 1)] == [6, 3]


def _triggers_started_after(query: StreamingQuery, moment: float) -> int:
    """How many of ``query``'s recent triggers started after ``moment`` (seconds since the epoch)."""
    return sum(
        1
        for progress in query.recentProgress
        if datetime.datetime.fromisoformat(progress["timestamp"]).timestamp() > moment
    )


def test_min_offsets_per_trigger_waits_for_records_or_the_delay(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    sink = Batches()
    frame = stream(spark, bootstrap, subscribe=topic_name, minOffsetsPerTrigger="20", maxTriggerDelay="10s")
    # Every trigger reports its progress, those that run no batch too (Spark's default: one a 10 s).
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    try:
        query = start(frame, sink, tmp_path / "checkpoint", available_now=False)
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    try:
        # The first trigger runs at once, as Spark's maxTriggerDelay counts from the last batch.
        wait_for(lambda: query.lastProgress is not None)
        produce(bootstrap, topic_name, [f"few{i}" for i in range(5)])
        produced_at = time.time()
        wait_for(lambda: _triggers_started_after(query, produced_at) >= 3, timeout_s=30)
        assert sink.rows == [], "5 new records are below minOffsetsPerTrigger: the batch must wait"
        produce(bootstrap, topic_name, [f"more{i}" for i in range(20)])
        wait_for(lambda: len(sink.rows) == 25, timeout_s=30)
        # The 5 waited for the 20 that made the minimum, however long they had been seen alone.
        assert [size for size in sink.sizes() if size] == [25], sink.sizes()

        produce(bootstrap, topic_name, ["straggler"])
        produced_at = time.monotonic()
        wait_for(lambda: len(sink.rows) == 26, timeout_s=40)
        assert time.monotonic() - produced_at > 4, "a lone record must wait for maxTriggerDelay"
    finally:
        query.stop()


def test_subscribe_pattern_selects_topics_it_matches_anywhere_as_spark_does(
    broker: Kafka, topic_name: str
) -> None:
    """Spark's SubscribePatternStrategy keeps a topic when ``topicRegex.findFirstIn(name)`` finds the
    pattern anywhere in its name, not only when it matches the whole name."""
    bootstrap = broker.bootstrap_servers
    selected = [f"{topic_name}-orders", f"{topic_name}-orders-eu", f"old-{topic_name}-orders"]
    for topic in [*selected, f"{topic_name}-other"]:
        create_topic(bootstrap, topic)
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribepattern": f"{topic_name}-orders"}
    ).for_stream()
    admin = options.admin()
    try:
        found = OffsetResolver(options, admin).partitions(require_topics=False)
    finally:
        admin.close()
    assert found == sorted((topic, 0) for topic in selected)


def test_new_partitions_and_pattern_topics_are_discovered(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    first_topic, second_topic = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(bootstrap, first_topic)
    produce(bootstrap, first_topic, ["a0-0", "a0-1"])
    sink = Batches()
    frame = stream(
        spark,
        bootstrap,
        subscribePattern=f"{topic_name}-.*",
        startingOffsets="earliest",
    )  # no partitionDiscoveryIntervalMs: every micro-batch looks, as with Spark's source
    query = start(frame, sink, tmp_path / "checkpoint", available_now=False)
    try:
        query.processAllAvailable()
        assert values_of(sink.rows) == ["a0-0", "a0-1"]

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(first_topic, 2)])[first_topic].result(30)
        produce(bootstrap, first_topic, ["a1-0", "a1-1", "a1-2"], partition=1)
        wait_for(lambda: len(sink.rows) == 5)
        create_topic(bootstrap, second_topic)
        produce(bootstrap, second_topic, ["b0-0"])
        wait_for(lambda: len(sink.rows) == 6)
        assert values_of(sink.rows) == ["a0-0", "a0-1", "a1-0", "a1-1", "a1-2", "b0-0"]
    finally:
        query.stop()


def test_data_loss_fails_by_default_and_skips_with_fail_on_data_loss_false(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, [f"old{i}" for i in range(10)])
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    frame = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest")
    assert len(run_available_now(frame, strict).rows) == 10
    assert len(run_available_now(frame, lenient).rows) == 10

    produce(bootstrap, topic_name, [f"new{i}" for i in range(10)])  # offsets 10-19
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic_name, 0, 15)])[TopicPartition(topic_name, 0, 15)].result(30)

    with pytest.raises(
        Exception, match=rf"topic '{topic_name}' partition 0.*requested offset 10, available offset 15"
    ):
        run_available_now(frame, strict)

    tolerant = stream(
        spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", failOnDataLoss="false"
    )
    assert values_of(run_available_now(tolerant, lenient).rows) == [f"new{i}" for i in range(5, 10)]

    # Batch reads check an explicit start offset the same way.
    start_at_zero = f'{{"{topic_name}":{{"0":0}}}}'
    with pytest.raises(Exception, match="was 0 but the earliest available offset is 15"):
        batch_read(spark, bootstrap, subscribe=topic_name, startingOffsets=start_at_zero).collect()
    skipped = batch_read(
        spark, bootstrap, subscribe=topic_name, startingOffsets=start_at_zero, failOnDataLoss="false"
    )
    assert values_of(skipped.collect()) == [f"new{i}" for i in range(5, 10)]


def test_deleted_and_recreated_topics_are_data_loss(broker: Kafka, topic_name: str) -> None:
    """The driver-side offset logic on its own (as in the Spark driver's Python process)."""
    bootstrap = broker.bootstrap_servers
    kept, recreated, deleted = (f"{topic_name}-{suffix}" for suffix in ("kept", "recreated", "deleted"))
    for topic in (kept, recreated, deleted):
        create_topic(bootstrap, topic)
        produce(bootstrap, topic, [f"{topic}-{i}" for i in range(10)])
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": f"{kept},{recreated},{deleted}",
        "startingOffsets": "latest",
        "kafkaConsumer.pollTimeoutMs": "3000",
    }
    strict = KafkaStreamReader(SourceOptions.parse({k.lower(): v for k, v in options.items()}).for_stream())
    lenient_options = {**options, "failOnDataLoss": "false"}
    lenient = KafkaStreamReader(
        SourceOptions.parse({k.lower(): v for k, v in lenient_options.items()}).for_stream()
    )
    # A new query's first micro-batch resolves startingOffsets and reads nothing.
    unresolved = strict.initialOffset()
    start = strict.latestOffset(unresolved, ReadAllAvailable())
    assert strict.partitions(unresolved, start) == []
    assert lenient.latestOffset(lenient.initialOffset(), ReadAllAvailable()) == start
    assert decode_offsets(start) == {(kept, 0): 10, (recreated, 0): 10, (deleted, 0): 10}

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (recreated, deleted):
        admin.delete_topics([topic])[topic].result(30)
    create_topic(bootstrap, recreated)
    produce(bootstrap, recreated, ["again0", "again1", "again2"])
    wait_for(lambda: recreated in admin.list_topics(timeout=10).topics)

    with pytest.raises(DataLossError, match=rf"partitions \[{deleted}-0\] are gone"):
        strict.latestOffset(start, ReadAllAvailable())
    # The deleted topic is dropped; the recreated one restarts at its earliest offset next batch.
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert decode_offsets(end) == {(kept, 0): 10, (recreated, 0): 0}
    assert lenient.partitions(start, end) == []
    following = lenient.latestOffset(end, ReadAllAvailable())
    assert decode_offsets(following) == {(kept, 0): 10, (recreated, 0): 3}
    assert lenient.partitions(end, following) == [OffsetRange(recreated, 0, 0, 3)]

    # An executor asked to read offsets of a deleted partition: fail, or skip them.
    gone = OffsetRange(deleted, 0, 10, 20)
    with pytest.raises(DataLossError, match=rf"topic '{deleted}' partition 0 lost offsets \[10, 20\)"):
        list(strict.read(gone))
    assert list(lenient.read(gone)) == []


def _reader(bootstrap: str, **options: str) -> KafkaStreamReader:
    given = {"kafka.bootstrap.servers": bootstrap, **options}
    return KafkaStreamReader(SourceOptions.parse({k.lower(): v for k, v in given.items()}).for_stream())


def test_a_start_past_the_last_stable_offset_waits_for_the_open_transaction(
    broker: Kafka, topic_name: str
) -> None:
    """With read_committed, a start between the last stable offset and the high watermark (a group
    committed by a read_uncommitted consumer, explicit offsets) is no data loss: the query waits
    there until the transaction ends, and reads on from there."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, [f"v{i}" for i in range(10)])
    writer = open_transaction(bootstrap, f"{topic_name}-txn", topic_name, b"open")  # offset 10
    plain = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-g", "enable.auto.commit": False}
    )
    plain.commit(offsets=[TopicPartition(topic_name, 0, 11)], asynchronous=False)  # read past it
    plain.close()

    group = _reader(
        bootstrap, subscribe=topic_name, startingOffsets="group", **{"kafka.group.id": f"{topic_name}-g"}
    )
    explicit = _reader(bootstrap, subscribe=topic_name, startingOffsets=f'{{"{topic_name}":{{"0":11}}}}')
    starts: dict[KafkaStreamReader, dict[str, dict[str, int]]] = {}
    for reader in (group, explicit):
        start = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert decode_offsets(start) == {(topic_name, 0): 11}
        assert reader.latestOffset(start, ReadAllAvailable()) == start  # held, not data loss
        starts[reader] = start
    writer.commit_transaction(30)  # its marker is offset 11
    produce(bootstrap, topic_name, ["after"])  # offset 12
    for reader in (group, explicit):
        end = reader.latestOffset(starts[reader], ReadAllAvailable())
        assert decode_offsets(end) == {(topic_name, 0): 13}
        assert reader.partitions(starts[reader], end) == [OffsetRange(topic_name, 0, 11, 13)]
        batches = reader.read(OffsetRange(topic_name, 0, 11, 13))
        assert [row["value"] for batch in batches for row in batch.to_pylist()] == [b"after"]
        reader.stop()


def test_a_held_starting_offset_stays_held_while_other_partitions_move_on(
    broker: Kafka, topic_name: str
) -> None:
    """Partition 0 starts past its last stable offset (an open transaction); partition 1 keeps
    getting records. The batches partition 1 runs carry partition 0's hold forward: no data loss,
    and partition 0 is read from its starting offset once the transaction ends."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    produce(bootstrap, topic_name, [f"v{i}" for i in range(10)], partition=0)
    writer = transactional_producer(bootstrap, f"{topic_name}-txn")
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(topic_name, value=b"open", partition=0)  # offset 10, left open
    assert writer.flush(30) == 0
    start_at = f'{{"{topic_name}":{{"0":11,"1":0}}}}'
    reader = _reader(bootstrap, subscribe=topic_name, startingOffsets=start_at)
    start = reader.initialOffset()
    batches = []
    for round_ in range(3):
        produce(bootstrap, topic_name, [f"p1-{round_}"], partition=1)
        end = reader.latestOffset(start, ReadAllAvailable())
        assert decode_offsets(end) == {(topic_name, 0): 11, (topic_name, 1): round_ + 1}
        batches.append(reader.partitions(start, end))
        start = end
    assert batches == [[OffsetRange(topic_name, 1, n, n + 1)] for n in range(3)]
    writer.commit_transaction(30)  # its marker is offset 11
    produce(bootstrap, topic_name, ["after"], partition=0)  # offset 12
    end = reader.latestOffset(start, ReadAllAvailable())
    assert reader.partitions(start, end) == [OffsetRange(topic_name, 0, 11, 13)]
    reader.stop()


def test_a_recreated_topic_is_data_loss_even_while_a_new_transaction_reaches_past_the_start(
    broker: Kafka, topic_name: str
) -> None:
    """Only the query's starting offsets wait for an open transaction. A start the query reached
    itself, reading read_committed, is below the last stable offset only when the log went back."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, [f"v{i}" for i in range(10)])
    reader = _reader(bootstrap, subscribe=topic_name, startingOffsets="earliest")
    first = reader.initialOffset()
    reached = reader.latestOffset(first, ReadAllAvailable())
    assert reader.partitions(first, reached) == [OffsetRange(topic_name, 0, 0, 10)]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(30)
    wait_for(lambda: topic_name not in admin.list_topics(timeout=10).topics)
    create_topic(bootstrap, topic_name)
    writer = transactional_producer(bootstrap, f"{topic_name}-txn")
    writer.init_transactions(30)
    writer.begin_transaction()
    for i in range(15):  # offsets 0-14: past the start, all in a transaction left open
        writer.produce(topic_name, value=f"new{i}".encode())
    assert writer.flush(30) == 0
    try:
        with pytest.raises(DataLossError, match="the latest offset went back from 10 to 0"):
            reader.latestOffset(reached, ReadAllAvailable())
    finally:
        writer.abort_transaction(30)
        reader.stop()


def test_a_range_past_the_end_of_its_partition_is_data_loss_at_once(broker: Kafka, topic_name: str) -> None:
    """A replayed range the log no longer reaches (topic recreated, log truncated), wholly or from
    some offset on, fails or is cut short at once: there is nothing to wait for. What the log still
    has of the range is read."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, [f"v{i}" for i in range(10)])
    for gone, lost in (
        (OffsetRange(topic_name, 0, 50, 60), "50, 60"),
        (OffsetRange(topic_name, 0, 5, 20), "10, 20"),
    ):
        for fail_on_data_loss in ("true", "false"):
            reader = _reader(
                bootstrap,
                subscribe=topic_name,
                failOnDataLoss=fail_on_data_loss,
                **{"kafkaConsumer.pollTimeoutMs": "60000"},
            )
            started = time.monotonic()
            if fail_on_data_loss == "true":
                with pytest.raises(DataLossError, match=rf"lost offsets \[{lost}\).*now ends at offset 10"):
                    list(reader.read(gone))
            else:
                rows = [row["value"] for batch in reader.read(gone) for row in batch.to_pylist()]
                assert rows == [f"v{i}".encode() for i in range(gone.start, 10)]
            assert time.monotonic() - started < 10  # not kafkaConsumer.pollTimeoutMs


def test_processed_offsets_are_committed_to_the_group_and_group_start_resumes(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    group = f"lag-{topic_name}"
    create_topic(bootstrap, topic_name, partitions=2)
    produce(bootstrap, topic_name, [f"a{i}" for i in range(10)], partition=0)
    produce(bootstrap, topic_name, [f"b{i}" for i in range(6)], partition=1)

    frame = stream(
        spark,
        bootstrap,
        subscribe=topic_name,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="5",
        **{"kafka.group.id": group},
    )
    sink = run_available_now(frame, tmp_path / "first")
    assert len(sink.rows) == 16
    assert group_offsets(bootstrap, group, topic_name, 2) == {0: 10, 1: 6}

    produce(bootstrap, topic_name, ["a10", "a11"], partition=0)
    produce(bootstrap, topic_name, ["b6"], partition=1)
    resumed = stream(
        spark,
        bootstrap,
        subscribe=topic_name,
        startingOffsets="group",
        commitOffsetsOnBatch="false",
        **{"kafka.group.id": group},
    )
    assert sorted(values_of(run_available_now(resumed, tmp_path / "second").rows)) == ["a10", "a11", "b6"]
    assert group_offsets(bootstrap, group, topic_name, 2) == {0: 10, 1: 6}  # commits were switched off

    fresh_group = {"kafka.group.id": f"new-{topic_name}", "startingOffsets": "group"}
    everything = batch_read(
        spark, bootstrap, subscribe=topic_name, groupOffsetsFallback="earliest", **fresh_group
    )
    assert everything.count() == 19
    with pytest.raises(Exception, match="has no committed offset"):
        batch_read(
            spark, bootstrap, subscribe=topic_name, groupOffsetsFallback="none", **fresh_group
        ).collect()

    # A read_committed query waits for the offsets a transaction is about to commit for its group
    # (KIP-447): asked before the commit, it would find none.
    pending_group = f"pending-{topic_name}"
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": pending_group})
    writer = transactional_producer(bootstrap, f"tx-{pending_group}")
    writer.init_transactions(30)
    writer.begin_transaction()
    held = [TopicPartition(topic_name, 0, 11), TopicPartition(topic_name, 1, 7)]
    writer.send_offsets_to_transaction(held, member.consumer_group_metadata(), 30)
    member.close()
    committer = threading.Timer(1.0, writer.commit_transaction, args=(30,))
    committer.start()
    after_commit = batch_read(
        spark,
        bootstrap,
        subscribe=topic_name,
        groupOffsetsFallback="none",
        **{"kafka.group.id": pending_group, "startingOffsets": "group"},
    )
    assert values_of(after_commit.collect()) == ["a11"]
    committer.join()


def test_streaming_starts_at_latest_by_default(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, ["before"])
    sink = Batches()
    query = start(
        stream(spark, bootstrap, subscribe=topic_name), sink, tmp_path / "checkpoint", available_now=False
    )
    try:
        query.processAllAvailable()
        produce(bootstrap, topic_name, ["after"])
        wait_for(lambda: len(sink.rows) == 1)
        assert values_of(sink.rows) == ["after"]
    finally:
        query.stop()


# -- errors ----------------------------------------------------------------------------------------


def test_option_mistakes_fail_when_the_dataframe_is_created(spark: SparkSession, broker: Kafka) -> None:
    bootstrap = broker.bootstrap_servers
    with pytest.raises(Exception, match=r"unknown option 'subscirbe'; did you mean 'subscribe'\?"):
        stream(spark, bootstrap, subscirbe="t")
    with pytest.raises(Exception, match="One of the following options must be specified for Kafka source"):
        stream(spark, bootstrap)
    with pytest.raises(Exception, match="Only one of the following options can be specified"):
        batch_read(spark, bootstrap, subscribe="t", subscribePattern="t.*")
    with pytest.raises(
        Exception, match=r"Kafka option 'auto\.offset\.reset' is not supported\. Instead set the source"
    ):
        stream(spark, bootstrap, subscribe="t", **{"kafka.auto.offset.reset": "earliest"})
    with pytest.raises(Exception, match="Java Kafka client property; sparkafka uses librdkafka"):
        stream(spark, bootstrap, subscribe="t", **{"kafka.ssl.truststore.location": "/x"})
    with pytest.raises(Exception, match="starting offset can't be latest for batch queries"):
        batch_read(spark, bootstrap, subscribe="t", startingOffsets="latest").collect()


def test_ending_offsets_are_rejected_by_streaming_queries(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    frame = stream(spark, broker.bootstrap_servers, subscribe=topic_name, endingOffsets="latest")
    with pytest.raises(Exception, match="option 'endingOffsets' is not valid in streaming queries"):
        run_available_now(frame, tmp_path / "checkpoint")


def test_missing_topics_are_named(
    spark: SparkSession, broker: Kafka, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    with pytest.raises(Exception, match=f"topic '{topic_name}' named by option 'subscribe' does not exist"):
        batch_read(spark, bootstrap, subscribe=topic_name).collect()
    with pytest.raises(Exception, match=f"topic '{topic_name}' named by option 'assign' does not exist"):
        batch_read(spark, bootstrap, assign=f'{{"{topic_name}":[0]}}').collect()
    frame = stream(spark, bootstrap, subscribe=topic_name)
    with pytest.raises(Exception, match=f"topic '{topic_name}' named by option 'subscribe' does not exist"):
        run_available_now(frame, tmp_path / "checkpoint")


def test_unreachable_servers_fail_after_the_bounded_wait(spark: SparkSession, tmp_path: Path) -> None:
    nobody = "127.0.0.1:9"  # discard port: nothing listens there
    options = {"subscribe": "t", "kafka.default.api.timeout.ms": "2000"}
    started = time.monotonic()
    with pytest.raises(
        Exception, match=r"Kafka at bootstrap servers '127\.0\.0\.1:9' did not answer within 2 s"
    ) as failure:
        batch_read(spark, nobody, **options).collect()
    # The cause the client saw, not only the failed request's "transport failure".
    assert "the client reported: 127.0.0.1:9/bootstrap: Connect to" in str(failure.value)
    assert "Connection refused" in str(failure.value)
    assert time.monotonic() - started < 30
    with pytest.raises(Exception, match=r"Kafka at bootstrap servers '127\.0\.0\.1:9' did not answer"):
        run_available_now(stream(spark, nobody, **options), tmp_path / "checkpoint")
