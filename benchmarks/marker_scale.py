"""What one exactly-once query's restart costs while the commit-marker topic holds the markers of many
other queries.

Every exactly-once sink keeps its commit markers in one compacted topic shared by every query of the
cluster (``_sparkafka_commit_markers``), and the first write of each transactional id in a query run
reads what the topic says about it. This benchmark measures how that read grows with the markers of
*other* queries:

1. an embedded broker (a child process) and one SparkSession (``local[2]``), kept for the whole run;
2. one query, 4 source partitions so 4 write tasks, exactly-once ``availableNow`` from a topic to
   another, run once on its checkpoint before anything is timed;
3. for each level of foreign markers (``--levels``, default 0, 100,000 and 1,000,000), the marker
   topic is filled up to that many markers of other queries (5,000 queries x 200 write partitions
   for 1,000,000: JSON markers as the sink writes them, each key once), then, once after the fill
   and ``--repeats`` times more, 2,000 new records are produced and the query is started again on
   its checkpoint (a new run: every write task reads what the marker topic holds of its query past
   the driver's snapshot, which the first restart after the fill reads on over the new markers) and
   timed from ``start()`` to its first output visible to a read_committed reader, and to its end.

Every run is kept in docs/benchmarks/marker-scale.json (``--results``), from which
``--from-results`` makes the section of docs/benchmarks.md again without running anything.

    python -m benchmarks.marker_scale
    python -m benchmarks.marker_scale --levels 0,100000 --repeats 1
    python -m benchmarks.marker_scale --from-results docs/benchmarks/marker-scale.json \\
        --update-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

if not __package__:  # run as `python benchmarks/marker_scale.py`
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
from sparkafka.connector.sink.commit_log import CommitMarker, MarkerLayout, marker_layout
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.transactional_ids import default_transactional_id_prefix
from sparkafka.connector.sink.transactional_ids import transactional_id as transactional_id_of
from sparkafka.runtime.session import spark_session

SECTION = ResultsSection(
    "marker-scale",
    REPO / "docs" / "benchmarks" / "marker-scale.json",
    "<!-- benchmark:marker-scale:start -->",
    "<!-- benchmark:marker-scale:end -->",
)
SOURCE_PARTITIONS = 4
RECORDS_PER_RUN = 2_000
FOREIGN_WRITE_PARTITIONS = 200


@dataclasses.dataclass(frozen=True)
class RestartRun:
    foreign_markers: int
    # Bytes of the marker topic when the run started (every record, the query's own included).
    marker_bytes: int
    first_output_s: float
    done_s: float
    # The marker topic's partitions (1: every record in one partition, as before layouts existed).
    marker_partitions: int = 1
    # The first restart after the foreign markers were written: its driver reads them once, as a
    # running query's driver would have while they came (the other runs find them read).
    first_after_fill: bool = False


@dataclasses.dataclass(frozen=True)
class MarkerScaleSetup:
    machine: str
    write_tasks: int
    records_per_run: int


class _FirstOutput(OutputWatcher):
    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic, SOURCE_PARTITIONS)
        self.first_at: float | None = None
        self.seen = 0
        self._lock = threading.Lock()

    def on_record(self, visible_at: float, message: Message) -> None:
        with self._lock:
            self.seen += 1
            if self.first_at is None:
                self.first_at = visible_at


def foreign_marker(number: int) -> tuple[str, bytes]:
    """The ``number``-th marker of another query: query ``number // 200``, write partition
    ``number % 200``, as the sink encodes it."""
    query = uuid.UUID(int=number // FOREIGN_WRITE_PARTITIONS + 1)
    partition = number % FOREIGN_WRITE_PARTITIONS
    transactional_id = transactional_id_of(default_transactional_id_prefix(str(query)), partition)
    marker = CommitMarker(
        transactional_id=transactional_id,
        query_id=str(query),
        batch_id=1_000 + number % 7,
        partition=partition,
        records=500,
        time_ms=1_765_000_000_000 + number,
        topic=f"out-{query.hex[:8]}",
        write_partitions=FOREIGN_WRITE_PARTITIONS,
        plan=hashlib.sha256(str(query).encode()).hexdigest()[:32],
        run_id=str(uuid.UUID(int=number // FOREIGN_WRITE_PARTITIONS + 10**9)),
    )
    return transactional_id, marker.encode()


def fill_markers(bootstrap: str, topic: str, first: int, end: int, layout: MarkerLayout) -> None:
    """Foreign markers ``first``..``end``, each in the partition the sink would write it to."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    for number in range(first, end):
        key, value = foreign_marker(number)
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=layout.partition_of_key(key))
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(300):
        raise RuntimeError(f"writing foreign markers {first}..{end} did not finish")


def _topic_bytes(data_dir: Path, topic: str) -> int:
    """Bytes of every partition of ``topic`` on the broker's disk."""
    return sum(path.stat().st_size for path in data_dir.glob(f"{topic}-*/*.log"))


def measure(levels: list[int], repeats: int, layouts: list[int]) -> tuple[list[RestartRun], MarkerScaleSetup]:
    start_load = load_average()
    runs: list[RestartRun] = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-marker-scale-") as directory:
        work = Path(directory)
        with BrokerProcess(work / "broker", extra_args=["--log-level", "WARNING"]) as broker:
            spark = spark_session("sparkafka-marker-scale-benchmark", master="local[2]")
            try:
                for partitions in layouts:
                    runs += _measure_layout(
                        spark, broker.bootstrap_servers, work, partitions, levels, repeats
                    )
            finally:
                spark.stop()
    return runs, MarkerScaleSetup(machine_line(start_load), SOURCE_PARTITIONS, RECORDS_PER_RUN)


def _measure_layout(
    spark: SparkSession, bootstrap: str, work: Path, partitions: int, levels: list[int], repeats: int
) -> list[RestartRun]:
    """Every level with a marker topic of ``partitions`` partitions (created by the sink), a query
    and topics of its own."""
    source, sink = f"scale-in-{partitions}", f"scale-out-{partitions}"
    markers = f"scale-markers-{partitions}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(source, SOURCE_PARTITIONS, 1), NewTopic(sink, SOURCE_PARTITIONS, 1)]
    )
    for future in created.values():
        future.result(30)
    checkpoint = str(work / f"checkpoint-{partitions}")
    sink_options = {
        "kafka.bootstrap.servers": bootstrap,
        "deliveryGuarantee": "exactly-once",
        "commitMarkerTopic": markers,
        "commitMarkerTopicPartitions": str(partitions),
    }
    watcher = _FirstOutput(bootstrap, sink).start()
    runs = []

    def run_query() -> tuple[float, float]:
        _produce(bootstrap, source)
        seen_before = watcher.seen
        watcher.first_at = None
        started = time.time()
        writer = (
            spark.readStream.format("sparkafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("value")
            .writeStream.format("sparkafka")
            .option("topic", sink)
            .option("checkpointLocation", checkpoint)
            .options(**sink_options)
        )
        writer.trigger(availableNow=True).start().awaitTermination()
        done = time.time() - started
        watcher.read_to_latest()
        if watcher.error is not None:
            raise watcher.error
        if watcher.seen - seen_before != RECORDS_PER_RUN or watcher.first_at is None:
            raise RuntimeError(f"the query wrote {watcher.seen - seen_before} records, not {RECORDS_PER_RUN}")
        return watcher.first_at - started, done

    try:
        run_query()  # creates the marker topic and the checkpoint, untimed
        layout = marker_layout(SinkOptions.parse(sink_options))
        filled = 0
        for level in levels:
            filling = level > filled
            if filling:
                fill_markers(bootstrap, markers, filled, level, layout)
                filled = level
            for repeat in range(-1 if filling else 0, repeats):
                size = _topic_bytes(work / "broker", markers)
                first_output_s, done_s = run_query()
                print(
                    f"{partitions:>2} partition(s), {level:>9,} foreign markers ({size / 2**20:6.1f} MiB)"
                    f"{', first after the fill' if repeat < 0 else ''}: "
                    f"first output {first_output_s:5.1f} s, done {done_s:5.1f} s",
                    file=sys.stderr,
                )
                runs.append(
                    RestartRun(
                        level, size, first_output_s, done_s, layout.partitions, first_after_fill=repeat < 0
                    )
                )
    finally:
        watcher.stop()
    return runs


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for number in range(RECORDS_PER_RUN):
        producer.produce(topic, value=str(number).encode(), partition=number % SOURCE_PARTITIONS)
    if producer.flush(30):
        raise RuntimeError(f"producing to {topic} did not finish")


def render(runs: list[RestartRun], setup: MarkerScaleSetup) -> str:
    rows, verdicts = [], []
    for partitions in sorted({run.marker_partitions for run in runs}):
        firsts = {
            run.foreign_markers: run.first_output_s
            for run in runs
            if run.marker_partitions == partitions and run.first_after_fill
        }
        of_layout = [run for run in runs if run.marker_partitions == partitions and not run.first_after_fill]
        levels = sorted({run.foreign_markers for run in of_layout})
        baseline = statistics.median(r.first_output_s for r in of_layout if r.foreign_markers == levels[0])
        for level in levels:
            at_level = [run for run in of_layout if run.foreign_markers == level]
            first = [run.first_output_s for run in at_level]
            done = [run.done_s for run in at_level]
            size = max(run.marker_bytes for run in at_level)
            after_fill = f"{firsts[level]:.1f}" if level in firsts else "-"
            rows.append(
                f"| {partitions} | {level:,} | {size / 2**20:.1f} | {_spread(first)} "
                f"| {statistics.median(first) / baseline:.2f}x | {_spread(done)} | {after_fill} |"
            )
        ratio = (
            statistics.median(r.first_output_s for r in of_layout if r.foreign_markers == levels[-1])
            / baseline
        )
        verdicts.append(
            f"{partitions} partition(s): {ratio:.2f}x with {levels[-1]:,} foreign markers, the target "
            f"{'met' if ratio <= 1.10 else 'not met'}"
        )
    steady = [r for r in runs if not r.first_after_fill]
    repeats = max(sum(1 for r in steady if (r.marker_partitions, r.foreign_markers) == key) for key in
                  {(r.marker_partitions, r.foreign_markers) for r in steady})  # fmt: skip
    return "\n".join(
        [
            "## Restart of one query beside the commit markers of many",
            "",
            "Measured with `python -m benchmarks.marker_scale` (see `benchmarks/marker_scale.py`): one "
            f"exactly-once `availableNow` query ({setup.write_tasks} write tasks, {setup.records_per_run:,} "
            "new records per run) started again on its checkpoint in a running session (`local[2]`) while "
            "the commit-marker topic holds that many markers of other queries (200 write partitions each, "
            "each in the partition the sink would write it to), for a marker topic of one partition (every "
            "record there, as before layouts existed) and of several (the partitions of the query's prefix "
            "and query id are read). The driver keeps a snapshot of what those partitions hold of the "
            "query in the checkpoint and the write tasks read only past it: the first restart after the "
            "foreign markers were written pays for reading them once, on the driver (last column; a "
            "running query's driver reads them as they come, at most a minute or 10,000 records behind), "
            f"the others find them read; {repeats} run(s) per row, median (min-max). Target (issue: "
            "markers at scale): with 1,000,000 foreign markers, within 10 % of the empty topic's restart.",
            "",
            "| marker partitions | foreign markers | marker topic MiB | start to first output s | vs none "
            "| start to end s | first restart after the fill s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"{'; '.join(verdicts)}. {setup.machine}.",
        ]
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--levels", default="0,100000,1000000", help="foreign markers, comma-separated")
        parser.add_argument(
            "--layouts", default="1,16", help="marker-topic partition counts, comma-separated"
        )

    def measured(args: argparse.Namespace) -> tuple[list[RestartRun], MarkerScaleSetup]:
        levels = sorted(int(level) for level in args.levels.split(","))
        return measure(levels, args.repeats, [int(count) for count in args.layouts.split(",")])

    results_main(__doc__, SECTION, RestartRun, MarkerScaleSetup, measured, render, arguments)


if __name__ == "__main__":
    main()
