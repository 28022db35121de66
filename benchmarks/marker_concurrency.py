"""How one exactly-once query's commits slow down while other exactly-once queries commit into the same
commit-marker topic.

Every exactly-once write task commits its rows together with a marker in the shared commit-marker
topic (``_sparkafka_commit_markers``), so queries running at once share that topic's partitions (16 by
default, a prefix's markers in the partition of its hash). This benchmark runs 1, 4 and 16 queries at
once (``--queries``) and measures each query's commit latency:

1. one SparkSession (``local[2]``), kept for the whole run, and an embedded broker (a child
   process) of each round's own;
2. for each count of queries, that many exactly-once queries, each from a topic of its own
   (``WRITE_TASKS`` partitions, so as many write tasks) to another, with a 1-second processing-time
   trigger and one marker topic shared by all of them; a feeder sends ``--rate`` records per second
   to every input topic;
3. after ``--warmup`` seconds, for ``--seconds`` seconds, every commit marker of these queries is read
   by a read_committed reader of the marker topic; a commit's latency is the time from the marker's
   own timestamp (taken by the write task just before it produces the marker and commits the
   transaction) to the moment the reader sees it: the commit round trip with the broker plus the
   reader's fetch. Spark's own ``addBatch`` duration of every micro-batch is kept too;
4. the feeder stops, every query drains its input and stops, and every output topic is read to its end
   with read_committed: each must hold every record fed to its query exactly once, or the run fails.

Every run is kept in docs/benchmarks/marker-concurrency.json (``--results``), from which
``--from-results`` makes the section of docs/benchmarks.md again without running anything.

    python -m benchmarks.marker_concurrency
    python -m benchmarks.marker_concurrency --queries 1,4 --seconds 30 --repeats 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

if not __package__:  # run as `python benchmarks/marker_concurrency.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    REPO,
    OutputWatcher,
    ResultsSection,
    load_average,
    machine_line,
    results_main,
)

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.commit_log import CommitMarker
from sparkafka.connector.sink.options import DEFAULT_MARKER_PARTITIONS, is_marker_key
from sparkafka.runtime.session import spark_session
from sparkafka.tools.harness import TopicReader

SECTION = ResultsSection(
    "marker-concurrency",
    REPO / "docs" / "benchmarks" / "marker-concurrency.json",
    "<!-- benchmark:marker-concurrency:start -->",
    "<!-- benchmark:marker-concurrency:end -->",
)
WRITE_TASKS = 2


@dataclasses.dataclass(frozen=True)
class QueryRun:
    """One query of one round: ``queries`` of them ran at once."""

    queries: int
    repeat: int
    query: int
    commits: int
    commit_p50_ms: float
    commit_p99_ms: float
    add_batch_p50_ms: float
    add_batch_p99_ms: float
    records: int


@dataclasses.dataclass(frozen=True)
class ConcurrencySetup:
    machine: str
    write_tasks: int
    rate_per_query: int
    measured_s: float
    marker_partitions: int


class _MarkerLatencies(OutputWatcher):
    """Every commit marker of the round's queries: its latency from its own timestamp, per query."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, query_ids: dict[str, int]) -> None:
        super().__init__(bootstrap, topic, partitions)
        self.query_ids = query_ids
        self.measure_from_ms = float("inf")
        self.measure_until_ms = float("inf")
        self.latencies_ms: dict[int, list[float]] = {number: [] for number in query_ids.values()}
        self._lock = threading.Lock()

    def on_record(self, visible_at: float, message: Message) -> None:
        key = message.key()
        if key is None or not is_marker_key(key.decode()):
            return
        marker = CommitMarker.decode(message.value() or b"")
        number = self.query_ids.get(marker.query_id)
        if number is None or not self.measure_from_ms <= marker.time_ms < self.measure_until_ms:
            return
        with self._lock:
            self.latencies_ms[number].append(visible_at * 1000 - marker.time_ms)


class _Feeder:
    """``rate`` records a second to each topic, numbered per topic, until stopped."""

    def __init__(self, bootstrap: str, topics: list[str], rate: int) -> None:
        self.sent = Counter[str]()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._topics, self._rate = topics, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> _Feeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            tick = 0.1
            per_tick = max(1, round(self._rate * tick))
            while not self._stop.wait(tick):
                for topic in self._topics:
                    for _ in range(per_tick):
                        number = self.sent[topic]
                        self._producer.produce(
                            topic, value=str(number).encode(), partition=number % WRITE_TASKS
                        )
                        self.sent[topic] += 1
                self._producer.poll(0)
        except BaseException as error:  # reported by stop(): a dead feeder must not look idle
            self.error = error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._producer.flush(60):
            raise RuntimeError("the feeder's records were not all delivered")
        if self.error is not None:
            raise self.error


def measure(
    counts: list[int], repeats: int, rate: int, warmup_s: float, seconds: float
) -> tuple[list[QueryRun], ConcurrencySetup]:
    start_load = load_average()
    runs: list[QueryRun] = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-marker-concurrency-") as directory:
        work = Path(directory)
        spark = spark_session("sparkafka-marker-concurrency-benchmark", master="local[2]")
        try:
            for repeat in range(repeats):
                for count in counts:
                    # A broker of each round's own, so that no round inherits the topics, connections
                    # and transactional ids of the earlier ones. (One broker for all rounds once stopped
                    # answering in the eighth: the session's workers held about 1,000 pooled client
                    # connections, and the broker's max.connections was 1000; it is now half the
                    # open-file limit, and all rounds pass on one broker.)
                    broker_dir = work / f"broker-{repeat}-{count}"
                    with BrokerProcess(broker_dir, extra_args=["--log-level", "WARNING"]) as broker:
                        runs += _round(
                            spark, broker.bootstrap_servers, work, count, repeat, rate, warmup_s, seconds
                        )
        finally:
            spark.stop()
    setup = ConcurrencySetup(machine_line(start_load), WRITE_TASKS, rate, seconds, DEFAULT_MARKER_PARTITIONS)
    return runs, setup


def _round(
    spark: SparkSession,
    bootstrap: str,
    work: Path,
    count: int,
    repeat: int,
    rate: int,
    warmup_s: float,
    seconds: float,
) -> list[QueryRun]:
    """``count`` queries at once on topics of their own, one marker topic shared by all of them."""
    name = f"r{repeat}-q{count}"
    inputs = [f"conc-in-{name}-{n}" for n in range(count)]
    outputs = [f"conc-out-{name}-{n}" for n in range(count)]
    markers = f"conc-markers-{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, WRITE_TASKS, 1) for topic in inputs + outputs])
    for future in created.values():
        future.result(30)
    feeder = _Feeder(bootstrap, inputs, rate).start()
    queries = []
    for n, (source, sink) in enumerate(zip(inputs, outputs, strict=True)):
        # One a second, as queries of a cluster start: 16 first batches at once on 2 cores once kept
        # one task's init_transactions unanswered past operationTimeoutMs (60 s).
        queries.append(_start_query(spark, bootstrap, source, sink, markers, work / f"checkpoint-{name}-{n}"))
        time.sleep(1)
    watcher: _MarkerLatencies | None = None
    try:
        _wait_for_first_batches(queries, timeout_s=300)
        query_ids = {str(query.id): n for n, query in enumerate(queries)}
        watcher = _MarkerLatencies(bootstrap, markers, DEFAULT_MARKER_PARTITIONS, query_ids)
        watcher.start()
        time.sleep(warmup_s)
        watcher.measure_from_ms = time.time() * 1000
        time.sleep(seconds)
        watcher.measure_until_ms = time.time() * 1000
        measured_from, measured_until = watcher.measure_from_ms, watcher.measure_until_ms
        feeder.stop()
        for query, source in zip(queries, inputs, strict=True):
            _wait_drained(query, source, feeder.sent[source])
        watcher.read_to_latest()
        if watcher.error is not None:
            raise watcher.error
    finally:
        for query in queries:
            query.stop()
        if watcher is not None:
            watcher.stop()
    runs = []
    for n, (query, source, sink) in enumerate(zip(queries, inputs, outputs, strict=True)):
        records = _exactly_once(bootstrap, sink, feeder.sent[source])
        latencies = watcher.latencies_ms[n]
        add_batch = _add_batch_ms(query, measured_from, measured_until)
        if not latencies or not add_batch:
            raise RuntimeError(f"query {n} of {count} committed nothing in the measured {seconds} s")
        runs.append(
            QueryRun(
                count,
                repeat,
                n,
                len(latencies),
                statistics.median(latencies),
                _p99(latencies),
                statistics.median(add_batch),
                _p99(add_batch),
                records,
            )
        )
    print(
        f"{count:>2} queries (repeat {repeat}): commit p99 per query "
        + ", ".join(f"{run.commit_p99_ms:.0f}" for run in runs)
        + " ms",
        file=sys.stderr,
    )
    return runs


def _start_query(
    spark: SparkSession, bootstrap: str, source: str, sink: str, markers: str, checkpoint: Path
) -> StreamingQuery:
    return (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("deliveryGuarantee", "exactly-once")
        .option("commitMarkerTopic", markers)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _wait_for_first_batches(queries: list[StreamingQuery], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(query.lastProgress is not None for query in queries):
        for query in queries:
            if query.exception() is not None:
                raise RuntimeError(f"a query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every query finished a micro-batch in {timeout_s} s")
        time.sleep(0.5)


def _wait_drained(query: StreamingQuery, source: str, sent: int, timeout_s: float = 300) -> None:
    """Until the query's source offsets reach every record fed to ``source``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if query.exception() is not None:
            raise RuntimeError(f"the query of {source} failed: {query.exception()}")
        progress = query.lastProgress
        if (
            progress is not None
            and _offsets_read(progress, source) >= sent
            and not query.status["isDataAvailable"]
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the query of {source} did not read its {sent} records in {timeout_s} s")
        time.sleep(0.5)


def _offsets_read(progress: dict[str, Any], source: str) -> int:
    """The sum of the end offsets of ``source`` in a progress report (the source's own JSON)."""
    ends = json.loads(progress["sources"][0]["endOffset"]) if progress.get("sources") else {}
    partitions = ends.get(source, {}) if isinstance(ends, dict) else {}
    return sum(int(offset) for offset in partitions.values()) if isinstance(partitions, dict) else 0


def _add_batch_ms(query: StreamingQuery, from_ms: float, until_ms: float) -> list[float]:
    """Spark's addBatch duration of the micro-batches that started in the measured window."""
    durations = []
    for progress in query.recentProgress:
        started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
        if from_ms <= started < until_ms and progress["numInputRows"] > 0:
            durations.append(float(progress["durationMs"].get("addBatch", 0)))
    return durations


def _exactly_once(bootstrap: str, sink: str, sent: int) -> int:
    """The output topic holds every number fed once, each exactly once; returns the count."""
    reader = TopicReader(bootstrap, sink, WRITE_TASKS, "read_committed").start()
    try:
        reader.read_to_latest(timeout_s=120)
    finally:
        reader.stop()
    if reader.error is not None:
        raise reader.error
    values = reader.values()
    counts = Counter(values)
    doubled = [value for value, seen in counts.items() if seen > 1]
    missing = sent - len(counts)
    if doubled or missing or len(values) != sent:
        raise RuntimeError(
            f"{sink}: {len(values)} records for {sent} fed, {len(doubled)} written twice, {missing} missing"
        )
    return len(values)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def render(runs: list[QueryRun], setup: ConcurrencySetup) -> str:
    counts = sorted({run.queries for run in runs})
    lone = statistics.median(run.commit_p99_ms for run in runs if run.queries == counts[0])
    rows, worst_ratio = [], 0.0
    for count in counts:
        of_count = [run for run in runs if run.queries == count]
        p99s = [run.commit_p99_ms for run in of_count]
        ratio = max(p99s) / lone
        worst_ratio = max(worst_ratio, ratio)
        add_batch = [run.add_batch_p99_ms for run in of_count]
        rows.append(
            f"| {count} | {sum(run.commits for run in of_count):,} "
            f"| {statistics.median(run.commit_p50_ms for run in of_count):.0f} "
            f"| {statistics.median(p99s):.0f} ({min(p99s):.0f}-{max(p99s):.0f}) | {ratio:.2f}x "
            f"| {statistics.median(add_batch):.0f} ({min(add_batch):.0f}-{max(add_batch):.0f}) |"
        )
    repeats = len({run.repeat for run in runs})
    return "\n".join(
        [
            "## Queries committing at once into one commit-marker topic",
            "",
            "Measured with `python -m benchmarks.marker_concurrency` (see "
            "`benchmarks/marker_concurrency.py`): "
            f"1 to {counts[-1]} exactly-once queries at once in one session (`local[2]`), each "
            f"{setup.write_tasks} write tasks, a 1-second trigger and {setup.rate_per_query} input records a "
            f"second, all committing into one marker topic of {setup.marker_partitions} partitions; "
            f"{setup.measured_s:.0f} s measured per round after a warm-up, {repeats} round(s) per count. A "
            "commit's latency runs from the marker's timestamp (taken by the write task just before it "
            "produces the marker and commits) to a read_committed reader of the marker topic seeing it. "
            "Per query, p99 of its commits; a row gives the median over its queries and rounds (min-max), "
            "the worst query against a lone query's p99, and Spark's addBatch time per micro-batch (p99, "
            "the whole write: tasks scheduled, rows sent, committed). Every round checks that each output "
            "holds every fed record exactly once. Target (issue: markers at scale): with 16 queries, each "
            "query's p99 commit latency within 1.5x of a lone query's.",
            "",
            "| queries at once | commits measured | commit p50 ms | commit p99 ms | worst vs lone "
            "| addBatch p99 ms |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"Worst query {worst_ratio:.2f}x a lone query's p99, the target "
            f"{'met' if worst_ratio <= 1.5 else 'not met'}. {setup.machine}.",
        ]
    )


def main() -> None:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queries", default="1,4,16", help="queries at once, comma-separated")
        parser.add_argument("--rate", type=int, default=50, help="input records a second per query")
        parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring")
        parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured per round")

    def measured(args: argparse.Namespace) -> tuple[list[QueryRun], ConcurrencySetup]:
        counts = sorted(int(count) for count in args.queries.split(","))
        return measure(counts, args.repeats, args.rate, args.warmup, args.seconds)

    results_main(__doc__, SECTION, QueryRun, ConcurrencySetup, measured, render, arguments)


if __name__ == "__main__":
    main()
