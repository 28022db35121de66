"""Event time with the sparkafka source: idle heartbeats close the last window, one idle partition
does not stall the watermark, and stateful queries (a keyed running sum, a watermarked window count)
stay exactly-once through SIGKILL in the middle of a transaction.

The first tests run in this process (the shared SparkSession); the crash tests run `sparkafka run`
with the pipelines of examples/keyed_running_sum.py and examples/windowed_count.py in a process
group of their own, as tests/integration/connector/test_sink_exactly_once.py does."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Message
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.eventtime import drop_heartbeats
from sparkafka.tools.pipeline_process import PipelineProcess
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.kafka_clients import create_topic, producer, read_all

REPO_ROOT = Path(__file__).resolve().parents[3]
WINDOW_S = 10


# -- helpers ---------------------------------------------------------------------------------------


def produce_at(
    bootstrap: str, topic: str, records: Sequence[tuple[int, float]], *, key: bytes | None = None
) -> None:
    """Produce one record per (partition, timestamp in seconds since the epoch), value = index."""
    sender = producer(bootstrap)
    for index, (partition, at_s) in enumerate(records):
        sender.produce(
            topic, key=key, value=str(index).encode(), partition=partition, timestamp=int(at_s * 1000)
        )
    assert sender.flush(30) == 0


def stream(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def window_counts(events: DataFrame) -> DataFrame:
    """Tumbling 10 s windows on the Kafka record timestamp, watermark 5 s, heartbeats dropped."""
    return (
        drop_heartbeats(events.withWatermark("timestamp", "5 seconds"))
        .groupBy(F.window("timestamp", f"{WINDOW_S} seconds"))
        .count()
        .select(F.col("window.start").alias("start"), "count")
    )


class Collected:
    """A foreachBatch sink keeping each micro-batch's rows by batch id (a replay overwrites its id)."""

    def __init__(self) -> None:
        self.by_batch: dict[int, list[Row]] = {}

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.by_batch[batch_id] = sorted(frame.collect(), key=str)

    @property
    def rows(self) -> list[Row]:
        return [row for batch_id in sorted(self.by_batch) for row in self.by_batch[batch_id]]

    def windows(self) -> Counter[tuple[datetime, int]]:
        """(window start in UTC, count) -> how many times it was emitted."""
        return Counter((row.start.astimezone(UTC), row["count"]) for row in self.rows)


def start_query(frame: DataFrame, sink: Collected, checkpoint: Path, mode: str = "append") -> StreamingQuery:
    return (
        frame.writeStream.foreachBatch(sink)
        .outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _watermark(query: StreamingQuery) -> datetime | None:
    """The event-time watermark of ``query``'s latest progress report."""
    progress = query.lastProgress
    if progress is None or "watermark" not in progress.get("eventTime", {}):
        return None
    return datetime.fromisoformat(progress["eventTime"]["watermark"].replace("Z", "+00:00"))


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# -- idle input and heartbeats ---------------------------------------------------------------------


def test_idle_input_closes_the_last_window_only_with_heartbeats(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """Windows W0 and W1 (10 s) hold 3 and 2 records; the newest record is 18 s into them, so the
    watermark (max event time - 5 s) closes W0 but not W1. Then all input stops. Heartbeats (wall
    clock, 30+ s after W0's start) close W1; without them it never appears."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    base = math.floor(time.time() / WINDOW_S) * WINDOW_S - 3 * WINDOW_S
    produce_at(
        bootstrap, topic_name, [(0, base + 1), (1, base + 2), (0, base + 3), (1, base + 16), (0, base + 18)]
    )
    expected = {(utc(base), 3): 1, (utc(base + WINDOW_S), 2): 1}

    plain, with_heartbeats = Collected(), Collected()
    queries = [
        start_query(window_counts(stream(spark, bootstrap, topic_name)), plain, tmp_path / "plain"),
        start_query(
            window_counts(stream(spark, bootstrap, topic_name, idleHeartbeatIntervalMs="1000")),
            with_heartbeats,
            tmp_path / "heartbeats",
        ),
    ]
    try:
        wait_for(lambda: len(with_heartbeats.windows()) == 2, "heartbeats to close the last window", 60)
        wait_for(lambda: len(plain.windows()) == 1, "the watermark to close the first window", 30)
        # Without heartbeats nothing can close W1: the watermark stays at the newest record's time
        # less 5 s, below W1's end, and the query has read all its input.
        progress = queries[0].lastProgress
        watermark = datetime.fromisoformat(progress["eventTime"]["watermark"].replace("Z", "+00:00"))
        assert watermark == utc(base + 18 - 5) < utc(base + 2 * WINDOW_S), progress
        end = progress["sources"][0]["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
        assert {int(p): offset for p, offset in end[topic_name].items()} == {0: 3, 1: 2}, progress
        assert plain.windows() == {(utc(base), 3): 1}, "without heartbeats the last window stays open"
        assert with_heartbeats.windows() == expected
        heartbeat_batches = len(with_heartbeats.by_batch)
        assert heartbeat_batches > len(plain.by_batch), "heartbeats are micro-batches of their own"
    finally:
        for query in queries:
            query.stop()


def test_a_replayed_heartbeat_batch_emits_the_identical_row(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    produce_at(bootstrap, topic_name, [(0, time.time())])
    checkpoint = tmp_path / "checkpoint"
    frame = stream(spark, bootstrap, topic_name, idleHeartbeatIntervalMs="300")
    first = Collected()
    query = start_query(frame, first, checkpoint)
    try:
        wait_for(lambda: sum(r.partition == -1 for r in first.rows) >= 2, "two heartbeat batches", 60)
    finally:
        query.stop()
    committed = sorted(int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit())
    last = committed[-1]
    heartbeat = first.by_batch[last]
    assert [(r.topic, r.partition, r.offset, r.key, r.value, r.timestampType) for r in heartbeat] == [
        ("", -1, -1, None, None, -1)
    ]
    # As if the driver died after the heartbeat batch ran but before Spark's commit log said so.
    for directory, batch_ids in (("offsets", range(last + 1, last + 100)), ("commits", [last])):
        for batch_id in batch_ids:
            (checkpoint / directory / str(batch_id)).unlink(missing_ok=True)
            (checkpoint / directory / f".{batch_id}.crc").unlink(missing_ok=True)

    second = Collected()
    replay = (
        frame.writeStream.foreachBatch(second)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert replay.awaitTermination(120), "the AvailableNow replay did not finish"
    finally:
        replay.stop()
    assert list(second.by_batch) == [last], "only the uncommitted batch runs; AvailableNow plans no heartbeat"
    assert second.by_batch[last] == heartbeat, "the replay emits the same heartbeat: same time, same row"


def test_one_idle_partition_does_not_hold_back_the_watermark(
    spark: SparkSession, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """Flink's per-partition watermark is the minimum over partitions, so a partition that stops
    receiving records stalls every window until idleness is declared (FLINK-5479). Spark's watermark
    is the maximum event time over all partitions: after one early record, partition 1 stays idle
    while partition 0 moves on, and windows close without heartbeats."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)
    base = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    produce_at(bootstrap, topic_name, [(0, base + 1), (1, base + 2)])
    sink = Collected()
    query = start_query(window_counts(stream(spark, bootstrap, topic_name)), sink, tmp_path / "checkpoint")
    try:
        wait_for(lambda: query.lastProgress is not None and query.lastProgress["numInputRows"] > 0, "batch 0")
        # From now on partition 1 gets nothing at all.
        produce_at(bootstrap, topic_name, [(0, base + 5), (0, base + 12), (0, base + 15), (0, base + 26)])
        wait_for(lambda: len(sink.windows()) == 2, "windows W0 and W1 to close", 60)
        # Max event time 26 s - 5 s delay = watermark 21 s: below W2's end, which stays open however
        # long the query runs, as partition 1's silence does not hold the watermark back.
        wait_for(lambda: _watermark(query) == utc(base + 26 - 5), "the watermark at 21 s", 30)
    finally:
        query.stop()
    assert sink.windows() == {(utc(base), 3): 1, (utc(base + WINDOW_S), 2): 1}


# -- stateful exactly-once through SIGKILL ----------------------------------------------------------
#
# Each scenario runs against a broker of its own: produce, run the pipeline until a write task pauses
# inside its open transaction (debug.pauseAt=beforeCommit), SIGKILL the whole process group there,
# produce more while it is down, restart it from the checkpoint, wait for the expected output, stop
# it. The two scenarios run at the same time (most of their time is Spark starting up and waiting);
# each test then checks its scenario's output.

PAUSE_BEFORE_COMMIT = ("--sink-option", "debug.pauseAt=beforeCommit", "--sink-option", "debug.pauseMs=120s")
RUNNING_SUM_ARGS = ("--transform", "examples.keyed_running_sum:transform", "--output-mode", "update")
WINDOW_COUNT_ARGS = ("--transform", "examples.windowed_count:transform")


def _pipeline(broker: BrokerProcess, workdir: Path, *extra: str) -> PipelineProcess:
    args = [
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--source-topic",
        "in",
        "--sink-topic",
        "out",
        "--checkpoint",
        str(workdir / "checkpoint"),
        "--trigger",
        "500ms",
        "--master",
        # Task retries, as on a cluster: a write partition that moves to another Python worker
        # fences the producer the first worker cached, whose next task then fails and is retried.
        "local[2,4]",
        "--source-option",
        "startingOffsets=earliest",
        *extra,
    ]
    # Two shuffle partitions: two stateful tasks and two transactional ids per batch, enough for a
    # crash to leave several transactions open, and quicker to start than the default four.
    # C1 only: these short-lived JVMs start markedly faster.
    env = {
        "PYTHONPATH": str(REPO_ROOT),
        "SPARKAFKA_SHUFFLE_PARTITIONS": "2",
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1",
    }
    return PipelineProcess(workdir / "pipeline.log", args, env=env)


@dataclass
class CrashRun:
    """What read_committed and read_uncommitted readers of `out` saw after the crash and restart."""

    committed: list[Message]
    uncommitted: list[Message]
    written_by_killed_run: int
    committed_by_killed_run: int


def _read_out(broker: BrokerProcess, isolation: str = "read_committed") -> list[Message]:
    return read_all(broker.bootstrap_servers, "out", isolation=isolation, timeout_s=5, partitions=2)


def _crash_and_restart(
    workdir: Path,
    transform_args: Sequence[str],
    produce_round_one: Callable[[str], None],
    produce_round_two: Callable[[str], None],
    done: Callable[[list[Message]], bool],
) -> CrashRun:
    with BrokerProcess(workdir / "data", extra_args=FAST_BROKER_ARGS) as broker:
        create_topic(broker.bootstrap_servers, "in", partitions=2)
        create_topic(broker.bootstrap_servers, "out", partitions=2)
        produce_round_one(broker.bootstrap_servers)

        killed = _pipeline(broker, workdir, *transform_args, *PAUSE_BEFORE_COMMIT).start()
        try:
            killed.wait_for("sparkafka debug pause: beforeCommit", timeout_s=180)
            wait_for(
                lambda: len(_read_out(broker, "read_uncommitted")) > 0, "the open transaction's rows", 30
            )
        finally:
            killed.kill_group()
        written, committed = len(_read_out(broker, "read_uncommitted")), len(_read_out(broker))
        produce_round_two(broker.bootstrap_servers)

        restarted = _pipeline(broker, workdir, *transform_args).start()
        try:
            wait_for(lambda: done(_read_out(broker)), "the expected output after the restart", 180)
            time.sleep(2)  # a duplicate committed late would show up now
        finally:
            restarted.terminate()
        return CrashRun(_read_out(broker), _read_out(broker, "read_uncommitted"), written, committed)


# seed 003's input: key,amount lines; positive amounts, so each key's sum only grows.
SUM_ROUND_ONE = [f"k{i % 4},{i + 1}" for i in range(20)]
SUM_ROUND_TWO = [f"k{i % 5},{10 * (i + 1)}" for i in range(15)]


def _true_sums() -> dict[str, int]:
    sums: Counter[str] = Counter()
    for line in SUM_ROUND_ONE + SUM_ROUND_TWO:
        key, amount = line.split(",")
        sums[key] += int(amount)
    return dict(sums)


def _last_sum_per_key(updates: list[Message]) -> dict[str, int]:
    # read_all yields each partition in offset order and a key always goes to the same partition,
    # so the last update of a key is its newest.
    return {m.key().decode(): int(m.value()) for m in updates}


def _produce_lines(lines: Sequence[str]) -> Callable[[str], None]:
    def send(bootstrap: str) -> None:
        sender = producer(bootstrap)
        for index, line in enumerate(lines):
            sender.produce("in", value=line.encode(), partition=index % 2)
        assert sender.flush(30) == 0

    return send


# Window scenario: round one fills W0, W1, W2 and moves the watermark to 20 s (max 25 s - 5 s), so
# the batch that emits W0 and W1 is the one killed. Round two, produced while the pipeline is down,
# adds to W2 and W3 and moves the watermark to 56 s: W2 and W3 close, the window of 61 s stays open.
EPOCH_2024 = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
WINDOW_ROUND_ONE = [EPOCH_2024 + s for s in (1, 2, 3, 11, 14, 21, 22, 23, 25)]
WINDOW_ROUND_TWO = [EPOCH_2024 + s for s in (27, 31, 35, 38, 61)]
EXPECTED_WINDOWS = {
    utc(EPOCH_2024): 3,
    utc(EPOCH_2024 + 10): 2,
    utc(EPOCH_2024 + 20): 5,
    utc(EPOCH_2024 + 30): 3,
}


def _produce_timestamps(timestamps: Sequence[float]) -> Callable[[str], None]:
    return lambda bootstrap: produce_at(bootstrap, "in", [(i % 2, at) for i, at in enumerate(timestamps)])


def _windows(records: list[Message]) -> list[tuple[datetime, int]]:
    return [(datetime.fromisoformat(m.key().decode()), int(m.value())) for m in records]


@pytest.fixture(scope="module")
def crash_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[CrashRun]]]:
    truth = _true_sums()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="crash") as pool:
        yield {
            "running_sum": pool.submit(
                _crash_and_restart,
                tmp_path_factory.mktemp("running-sum"),
                RUNNING_SUM_ARGS,
                _produce_lines(SUM_ROUND_ONE),
                _produce_lines(SUM_ROUND_TWO),
                lambda updates: _last_sum_per_key(updates) == truth,
            ),
            "window_count": pool.submit(
                _crash_and_restart,
                tmp_path_factory.mktemp("window-count"),
                WINDOW_COUNT_ARGS,
                _produce_timestamps(WINDOW_ROUND_ONE),
                _produce_timestamps(WINDOW_ROUND_TWO),
                lambda records: len(records) >= len(EXPECTED_WINDOWS),
            ),
        }


def test_keyed_running_sum_survives_sigkill_in_an_open_transaction(
    crash_runs: dict[str, Future[CrashRun]],
) -> None:
    run = crash_runs["running_sum"].result(timeout=500)
    assert run.written_by_killed_run > 0 and run.committed_by_killed_run == 0, "killed mid-transaction"
    assert _last_sum_per_key(run.committed) == _true_sums()
    pairs = [(m.key(), m.value()) for m in run.committed]
    assert len(pairs) == len(set(pairs)), "an update was committed twice"
    assert len(run.uncommitted) >= len(run.committed) + run.written_by_killed_run, "killed rows: aborted"


def test_window_count_survives_sigkill_in_an_open_transaction(
    crash_runs: dict[str, Future[CrashRun]],
) -> None:
    run = crash_runs["window_count"].result(timeout=500)
    assert run.written_by_killed_run > 0 and run.committed_by_killed_run == 0, "killed mid-transaction"
    windows = _windows(run.committed)
    assert Counter(start for start, _ in windows) == dict.fromkeys(EXPECTED_WINDOWS, 1), "each window once"
    assert dict(windows) == EXPECTED_WINDOWS
    assert len(run.uncommitted) >= len(run.committed) + run.written_by_killed_run, "killed rows: aborted"
