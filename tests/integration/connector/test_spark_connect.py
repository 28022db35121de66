"""Pipelines from a Spark Connect client (PySpark 4's thin client): the data source, the planner and
the write tasks run on a Connect server started from the installed PySpark; the test process is
the client, with no JVM of its own. The source, the exactly-once sink, foreachBatch, the decoders
with a dead-letter topic and a refused option; then the server SIGKILLed with a transaction open,
restarted, and the query restarted from its checkpoint by a new client session."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sparkafka.connector.sink.transactional_ids import default_transactional_id_prefix
from sparkafka.functions import dead_letter, from_json, route_dead_letters, to_json
from sparkafka.tools.harness import wait_until
from tests.integration.conftest import EMBEDDED, Kafka
from tests.integration.connector.test_operator_actions import PARTITIONS, Topics
from tests.integration.kafka_clients import committed_markers, create_topic, producer, read_to_end
from tests.integration.spark_connect import CONNECT_ENVIRONMENT, ConnectServer

pytestmark = pytest.mark.parametrize("kafka", [EMBEDDED], indirect=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    with ConnectServer(tmp_path_factory.mktemp("connect")) as running:
        yield running


@pytest.fixture(scope="module", autouse=True)
def connect_mode_left_behind() -> Iterator[None]:
    """PySpark marks the whole process as a Connect client (SPARK_CONNECT_MODE_ENABLED in os.environ)
    once a remote session exists, and keeps the mark after the session stops: every process started
    from this one later (pipelines, examples) would then ask for a Connect server too. The mark goes
    with the module's last test."""
    before = {name: os.environ.get(name) for name in CONNECT_ENVIRONMENT}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def remote(server: ConnectServer) -> Iterator[SparkSession]:
    spark = server.session()
    yield spark
    spark.stop()


@pytest.fixture
def topics(kafka: Kafka, topic_name: str) -> Topics:
    return Topics(kafka.bootstrap_servers, topic_name)


def _events(spark: SparkSession, topics: Topics, **source: str) -> DataFrame:
    """Seed 001's map, EVENT(value), over the input topic from its start."""
    reader = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", topics.bootstrap)
        .option("subscribe", topics.source)
        .option("startingOffsets", "earliest")
        .options(**source)
    )
    return reader.load().select(
        F.concat(F.lit("EVENT("), F.col("value").cast("string"), F.lit(")")).alias("value")
    )


def _exactly_once(topics: Topics, frame: DataFrame, checkpoint: Path, **sink: str) -> StreamingQuery:
    return (
        frame.writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", topics.bootstrap)
        .option("topic", topics.sink)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .options(**sink)
        .trigger(availableNow=True)
        .start()
    )


def _events_written(topics: Topics) -> Counter[str]:
    return Counter(
        (m.value() or b"").decode()
        for m in read_to_end(topics.bootstrap, topics.sink, partitions=PARTITIONS, isolation="read_committed")
    )


def _all_events(topics: Topics) -> Counter[str]:
    return Counter({f"EVENT({record_id})": 1 for record_id in topics.all_ids()})


def test_a_batch_read_and_an_exactly_once_stream_run_from_a_connect_client(
    remote: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    assert type(remote).__module__.startswith("pyspark.sql.connect"), "a thin client, no JVM"
    topics.send(200)
    rows = (
        remote.read.format("sparkafka")
        .option("kafka.bootstrap.servers", topics.bootstrap)
        .option("subscribe", topics.source)
        .load()
    )
    assert rows.count() == 200
    _exactly_once(topics, _events(remote, topics), tmp_path / "checkpoint").awaitTermination()
    assert _events_written(topics) == _all_events(topics)
    # The query goes on from its checkpoint, as a local session's does.
    topics.send(100)
    _exactly_once(topics, _events(remote, topics), tmp_path / "checkpoint").awaitTermination()
    assert _events_written(topics) == _all_events(topics)


def test_foreach_batch_writes_exactly_once_from_a_connect_client(
    remote: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    """The foreachBatch function runs on the server, in a Python process of its own there, and its
    df.write runs as a command of its own, which Spark hands neither the query nor the micro-batch:
    without option batchId it is refused, saying so; with it, the batch is written exactly once, and
    a batch id other than the one foreachBatch gave is refused."""
    topics.send(150)
    batch_options = {
        "kafka.bootstrap.servers": topics.bootstrap,
        "topic": topics.sink,
        "deliveryGuarantee": "exactly-once",
        "transactionalIdPrefix": f"{topics.sink}-writes",
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }

    def undeclared(batch: DataFrame, _batch_id: int) -> None:
        batch.write.format("sparkafka").options(**batch_options).mode("append").save()

    def wrong_batch(batch: DataFrame, batch_id: int) -> None:
        batch.write.format("sparkafka").options(**batch_options).option("batchId", batch_id + 1).mode(
            "append"
        ).save()

    def declared(batch: DataFrame, batch_id: int) -> None:
        batch.write.format("sparkafka").options(**batch_options).option("batchId", batch_id).mode(
            "append"
        ).save()

    def run(write: Callable[[DataFrame, int], None]) -> None:
        (
            _events(remote, topics)
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )

    with pytest.raises(Exception, match=r"with \.option\('batchId', batch_id\)"):
        run(undeclared)
    with pytest.raises(
        Exception, match=r"option batchId=1, and the checkpoint at .* is writing micro-batch 0"
    ):
        run(wrong_batch)
    assert _events_written(topics) == Counter(), "nothing was written by the refused writes"
    run(declared)
    assert _events_written(topics) == _all_events(topics)


def test_decoders_route_corrupt_records_to_a_dead_letter_topic_from_a_connect_client(
    remote: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    dead_letters = f"{topics.sink}-dlq"
    create_topic(topics.bootstrap, dead_letters, partitions=1)
    sender = producer(topics.bootstrap)
    good = [json.dumps({"id": n, "item": f"i{n}"}) for n in range(6)]
    for value in [*good[:3], "{not json", *good[3:], '{"id": "seven"}']:
        sender.produce(topics.source, value=value, partition=0)
    assert sender.flush(30) == 0

    decoded = (
        remote.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", topics.bootstrap)
        .option("subscribe", topics.source)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            "key", from_json("value", "id INT NOT NULL, item STRING", dead_letter(dead_letters)).alias("o")
        )
    )
    routed = route_dead_letters(decoded, "o", topic=topics.sink, value=to_json("o.value"))
    (
        routed.writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", topics.bootstrap)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    written = read_to_end(topics.bootstrap, topics.sink, partitions=PARTITIONS)
    assert sorted(json.loads(m.value() or b"{}")["id"] for m in written) == list(range(6))
    letters = read_to_end(topics.bootstrap, dead_letters, partitions=1)
    assert sorted((m.value() or b"").decode() for m in letters) == ['{"id": "seven"}', "{not json"]


def test_a_refused_option_reaches_the_client_with_its_message(remote: SparkSession, topics: Topics) -> None:
    frame = remote.read.format("sparkafka").option("kafka.bootstrap.servers", topics.bootstrap)
    with pytest.raises(Exception, match="unknown option 'subscirbe'; did you mean 'subscribe'"):
        frame.option("subscirbe", topics.source).load().count()
    with pytest.raises(Exception, match="deliveryGuarantee"):
        (
            remote.range(3)
            .selectExpr("CAST(id AS STRING) AS value")
            .write.format("sparkafka")
            .option("kafka.bootstrap.servers", topics.bootstrap)
            .option("topic", topics.sink)
            .option("deliveryGuarantee", "exactly-twice")
            .mode("append")
            .save()
        )


def _held(topics: Topics, spark: SparkSession, checkpoint: Path, write_partitions: int) -> StreamingQuery:
    """The exactly-once map over ``write_partitions`` write partitions, write partition 1 holding
    its transaction open before its commit (the others commit)."""
    frame = _events(spark, topics).repartition(write_partitions)
    return _exactly_once(
        topics,
        frame,
        checkpoint,
        **{
            "debug.pauseAt": "beforeCommit",
            "debug.pausePartitions": "1",
            "debug.pauseMs": "600s",
            "kafka.transaction.timeout.ms": "600000",
        },
    )


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ConnectServer]:
    with ConnectServer(tmp_path / "connect") as running:
        yield running


def test_a_connect_server_killed_with_a_transaction_open_replays_exactly_once_for_a_new_client(
    own_server: ConnectServer, topics: Topics, tmp_path: Path
) -> None:
    """Seed 001 through Connect: write partition 1 of batch 0 holds its transaction open while 0
    commits; the server is SIGKILLed (driver, executors, Python workers). Restarted, a new client
    session first restarts the query split otherwise (three write partitions): the tasks learn the
    batch's width from the server's web UI, whose port register() announced, and refuse before
    writing. Restarted as it was, the query writes exactly what is missing."""
    checkpoint = tmp_path / "checkpoint"
    topics.send(400)
    spark = own_server.session()
    held = _held(topics, spark, checkpoint, 2)
    ours = f"{default_transactional_id_prefix(str(held.id))}-"
    assert wait_until(
        lambda: "sparkafka debug pause: beforeCommit partition=1 batch=0" in own_server.output(),
        timeout_s=180,
    ), own_server.output()[-3000:]
    assert wait_until(lambda: len(committed_markers(topics.bootstrap, 0, prefix=ours)) == 1, timeout_s=60)
    own_server.kill()
    before = topics.written("read_uncommitted")
    assert sum(before.values()) == 400, "partition 0 committed, 1 wrote and holds its transaction"

    own_server.start()
    again = own_server.session()
    with pytest.raises(Exception, match="is replayed split into 3 write partitions"):
        _exactly_once(topics, _events(again, topics).repartition(3), checkpoint).awaitTermination()
    assert topics.written("read_uncommitted") == before, "the refused replay wrote nothing"

    _exactly_once(topics, _events(again, topics).repartition(2), checkpoint).awaitTermination()
    assert _events_written(topics) == _all_events(topics)
