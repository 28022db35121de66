"""Throughput of the sparkafka source against a bare confluent-kafka consume loop, same data, one run.

Starts an embedded broker (a child process), writes ``--records`` records of ``--value-bytes`` bytes,
then times, ``--repeats`` times each and after one untimed run of each,

* a bare confluent-kafka loop (one consumer, every partition assigned, counting records),
* ``spark.read.format("sparkafka")`` and ``count()``, and
* ``spark.readStream.format("sparkafka")`` with ``Trigger.AvailableNow`` and a ``count()`` per
  micro-batch, from query start to termination (the SparkSession is started before timing), then
  ``--settled-queries`` more such queries in the same session, reported on their own: the JVM's JIT
  compiler still compiles Spark's driver code in a session's first few queries, and these show
  what a query costs once that has died down,

prints a markdown table and replaces the "Source" section of docs/benchmarks.md. Every run is kept
in docs/benchmarks/source.json (``--results``), from which ``--from-results`` makes the section
again without running anything.

    python -m benchmarks.source                   # 1,000,000 records of 100 B
    python benchmarks/source.py --records 200000
    python -m benchmarks.source --from-results docs/benchmarks/source.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.source.options import PREFETCH_RECHECK_MS, PREFETCH_RECORDS

if not __package__:  # run as `python benchmarks/source.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import load_results, save_results, update_docs

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
SECTION_START = "<!-- benchmark:source:start -->"
SECTION_END = "<!-- benchmark:source:end -->"
TOPIC = "bench-source"
RESULTS = REPO / "docs" / "benchmarks" / "source.json"
# Every run is kept under its reader's kind; the table's rows are made from them (rows_of).
BARE, BATCH, STREAM = "bare loop", "batch", "stream"


@dataclass(frozen=True)
class Measurement:
    reader: str
    records: int
    seconds: float
    cpu_seconds: float | None = None  # of every process doing the reading (broker excluded)
    jvm_cpu_seconds: float | None = None  # the part of cpu_seconds in Spark's JVM
    runs: int = 1
    # A streaming query's micro-batch execution alone (its progress reports' triggerExecution).
    execution_s: float | None = None

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")

    def per_core_vs(self, baseline: Measurement) -> float | None:
        """Records per CPU second as a multiple of ``baseline``'s, if both are known."""
        mine, theirs = self.records_per_cpu_second, baseline.records_per_cpu_second
        return None if mine is None or theirs is None else mine / theirs

    @property
    def records_per_cpu_second(self) -> float | None:
        """Records/s per core used: records over the CPU time the readers' processes spent."""
        if self.cpu_seconds is None or self.cpu_seconds <= 0:
            return None
        return self.records / self.cpu_seconds


def median_of(reader: str, runs: list[Measurement]) -> Measurement:
    """One row for several runs: the median of each quantity (runs with the median CPU time agree
    with it only roughly, so each column is its own median)."""

    def middle(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    seconds = middle([m.seconds for m in runs])
    assert seconds is not None
    return Measurement(
        reader,
        runs[0].records,
        seconds,
        middle([m.cpu_seconds for m in runs]),
        middle([m.jvm_cpu_seconds for m in runs]),
        len(runs),
    )


@dataclass(frozen=True)
class SourceSetup:
    """What a run of the benchmark was: its data, its repetitions and the machine."""

    records: int
    value_bytes: int
    partitions: int
    produce_s: float
    repeats: int
    settled: int
    python: str
    cpus: int
    date: str
    command: str


def produce(bootstrap: str, records: int, partitions: int, value_bytes: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(60)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
        }
    )
    value = b"x" * value_bytes
    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    remaining = producer.flush(300)
    if remaining:
        raise RuntimeError(f"{remaining} records were not delivered")
    return time.perf_counter() - started


def bare_consume(bootstrap: str, records: int, partitions: int) -> Measurement:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-bare",  # never joined: assign() and no commits
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # The prefetch bounds the source's read consumers use (source.executor_consumer_config):
            # the loop reads with the same client settings, so the comparison is about Spark alone.
            "queued.min.messages": PREFETCH_RECORDS,
            "fetch.queue.backoff.ms": PREFETCH_RECHECK_MS,
        }
    )
    started = time.perf_counter()
    cpu_started = time.process_time()  # this process only: librdkafka's threads are in it
    consumer.assign([TopicPartition(TOPIC, partition, 0) for partition in range(partitions)])
    count = 0
    deadline = time.monotonic() + 600
    while count < records and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=10_000, timeout=0.5):
            error = message.error()
            if error is None:
                count += 1
            elif error.code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"consumer error: {error}")
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    consumer.close()
    if count != records:
        raise RuntimeError(f"the bare consumer read {count} of {records} records")
    return Measurement(BARE, count, seconds, cpu_seconds)


def spark_readers(
    bootstrap: str, records: int, checkpoints: Path, broker_pid: int, repeats: int, settled: int
) -> list[Measurement]:
    """Time ``repeats`` batch ``count()`` runs and ``repeats + settled`` AvailableNow streaming
    queries, after one untimed batch read (the first Spark job of a JVM pays for class loading and
    Python worker start-up). The first streaming query also starts the streaming machinery and has
    the JVM compile its code paths: it is reported on its own, queries 2 to ``repeats`` as their
    median, and the ``settled`` queries after them as theirs. CPU time is that of this process and
    its children (Spark's JVM, the Python workers it forks), the broker excluded."""
    from benchmarks.compare.process_tree import ProcessTreeSampler

    from sparkafka.runtime.session import spark_session

    spark = spark_session(
        "sparkafka-benchmark", master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}
    )
    sampler = ProcessTreeSampler(os.getpid(), exclude_pids=frozenset({broker_pid})).start()

    def timed(reader: str, run: Callable[[], int]) -> Measurement:
        sampler.sample()
        cpu_started = sampler.cpu_seconds_by(_process_kind)
        started = time.perf_counter()
        count = run()
        seconds = time.perf_counter() - started
        sampler.sample()
        cpu = sampler.cpu_seconds_by(_process_kind)
        if count != records:
            raise RuntimeError(f"{reader}: read {count} of {records} records")
        used = {kind: cpu.get(kind, 0.0) - cpu_started.get(kind, 0.0) for kind in cpu}
        return Measurement(reader, count, seconds, sum(used.values()), used.get("jvm", 0.0))

    def batch_count() -> int:
        return (
            spark.read.format("sparkafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .load()
            .count()
        )

    executing_ms: list[float] = []

    def stream_count(run: int) -> int:
        counts: list[int] = []
        query = (
            spark.readStream.format("sparkafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(lambda batch, _batch_id: counts.append(batch.count()))
            .option("checkpointLocation", str(checkpoints / f"run-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        executing_ms.append(sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress))
        return sum(counts)

    try:
        batch_count()  # warm-up
        batches = [timed(BATCH, batch_count) for _ in range(repeats)]
        streams = [timed(STREAM, lambda run=run: stream_count(run)) for run in range(repeats + settled)]
    finally:
        sampler.stop()
        spark.stop()
    return batches + [
        replace(run, execution_s=ms / 1000) for run, ms in zip(streams, executing_ms, strict=True)
    ]


def rows_of(runs: list[Measurement], setup: SourceSetup) -> list[Measurement]:
    """The table's rows from every run: the bare loop's and the batch reads' medians; the first
    streaming query on its own, queries 2 to ``repeats`` as their median (and their micro-batch
    execution alone), the ``settled`` queries after them as theirs."""
    bare = [run for run in runs if run.reader == BARE]
    batches = [run for run in runs if run.reader == BATCH]
    streams = [run for run in runs if run.reader == STREAM]
    repeats, settled = setup.repeats, setup.settled
    later, after_later = streams[1:repeats], streams[repeats:]
    warm_execution_s = [run.execution_s for run in later if run.execution_s is not None]
    rows = [
        median_of("confluent-kafka consume loop (1 consumer)", bare),
        median_of("sparkafka `spark.read` + count() (local[2])", batches),
        replace(
            streams[0],
            reader="sparkafka AvailableNow + count() per batch, first query (local[2])",
            execution_s=None,
        ),
        median_of(f"sparkafka AvailableNow + count() per batch, {_queries(2, repeats)} (local[2])", later),
        Measurement(
            f"{_queries(2, repeats)}, micro-batch execution only (triggerExecution)",
            setup.records,
            statistics.median(warm_execution_s),
            runs=len(warm_execution_s),
        ),
    ]
    if after_later:
        rows.append(
            median_of(
                f"sparkafka AvailableNow + count() per batch, {_queries(repeats + 1, repeats + settled)} "
                "(local[2])",
                after_later,
            )
        )
    return rows


def _queries(first: int, last: int) -> str:
    return f"query {first}" if first == last else f"queries {first}-{last}"


def _process_kind(name: str) -> str:
    return "jvm" if name == "java" else "python"


def render(measurements: list[Measurement], setup: SourceSetup) -> str:
    bare = measurements[0]
    lines = [
        f"{setup.records:,} records of {setup.value_bytes} B in {setup.partitions} partitions on the "
        f"embedded broker (written in {setup.produce_s:.1f} s); {setup.python}, {setup.cpus} CPUs, "
        f"{setup.date}.",
        "",
        "| reader | runs | records | seconds | records/s | vs bare loop | CPU s (of it JVM) "
        "| records per CPU s | per core vs bare loop |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in measurements:
        per_core = m.records_per_cpu_second
        cpu = "-" if m.cpu_seconds is None else f"{m.cpu_seconds:.2f}"
        if m.jvm_cpu_seconds is not None:
            cpu += f" ({m.jvm_cpu_seconds:.2f})"
        per_core_text = "-" if per_core is None else f"{per_core:,.0f}"
        per_core_ratio = m.per_core_vs(bare)
        ratio = "-" if per_core_ratio is None else f"{per_core_ratio:.2f}x"
        lines.append(
            f"| {m.reader} | {m.runs} | {m.records:,} | {m.seconds:.2f} | {m.records_per_second:,.0f} | "
            f"{m.records_per_second / bare.records_per_second:.2f}x | {cpu} | {per_core_text} | {ratio} |"
        )
    return "\n".join(lines)


TARGET_PER_CORE = 0.5  # of the bare loop's records per CPU second


def target_lines(measurements: list[Measurement]) -> list[str]:
    """The per-core target, judged for every AvailableNow row against the bare loop (the first row)."""
    lines = []
    for m in measurements[1:]:
        ratio = m.per_core_vs(measurements[0])
        if "AvailableNow" not in m.reader or ratio is None:
            continue
        verdict = "met" if ratio >= TARGET_PER_CORE else "not met"
        lines.append(f"- {m.reader}: {ratio:.2f}x, {verdict}")
    return lines


def docs_section(
    table: str, command: str, repeats: int, settled: int, measurements: list[Measurement]
) -> str:
    settled_text = (
        (
            f"Then {_queries(repeats + 1, repeats + settled)} run in the same session: the JVM's",
            "JIT compiler goes on compiling Spark's own driver code (planning, task serialization,",
            "closure cleaning) through a session's first queries, and their row shows a query once that",
            "has mostly died down, as in a long-running session.",
        )
        if settled
        else ()
    )
    return "\n".join(
        [
            "## Source",
            "",
            f"Measured with `{command}` (see `benchmarks/source.py`). Every reader reads the same records",
            f"{repeats} times; a row with several runs shows the median of each column. The SparkSession",
            "is created and one untimed batch read warms it up before timing; the bare loop also reads",
            "once untimed first. The first streaming query",
            "of a session also starts Spark's streaming machinery and has the JVM compile those code",
            "paths, so it has a row of its own; the AvailableNow wall time includes starting the query.",
            *settled_text,
            "CPU s is the CPU time of every process doing the reading (the bare loop's process; the",
            "Spark driver, its JVM and the Python workers; in brackets the JVM's part), the broker",
            "excluded: records per CPU second is the records/s per core used that the target (at least",
            "half the bare loop's) is about. The bare loop's consumer has the source's prefetch settings",
            "(queued.min.messages, fetch.queue.backoff.ms), so both read with the same client",
            "configuration. Expect run-to-run variation of 20-30 % on a small shared machine.",
            "",
            table,
            "",
            f"The target, at least {TARGET_PER_CORE}x the bare loop's records per CPU second, in this run:",
            "",
            *target_lines(measurements),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each reader (default 5)")
    parser.add_argument(
        "--settled-queries",
        type=int,
        default=5,
        help="AvailableNow queries run after the others and reported on their own (default 5; 0: none)",
    )
    parser.add_argument("--no-docs", action="store_true", help="print only, leave docs/benchmarks.md alone")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to keep every run as JSON")
    parser.add_argument(
        "--from-results", type=Path, help="make the section from these kept runs, running nothing"
    )
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2: the first streaming query is reported on its own")
    if args.settled_queries < 0:
        parser.error("--settled-queries must be 0 or more")

    if args.from_results is not None:
        runs, setup = load_results(args.from_results, Measurement, SourceSetup, "source benchmark")
    else:
        runs, setup = measure(args)
        save_results(args.results, runs, setup)
    measurements = rows_of(runs, setup)
    table = render(measurements, setup)
    print(table)
    print("\n".join(target_lines(measurements)))
    if not args.no_docs:
        update_docs(
            DOCS,
            docs_section(table, setup.command, setup.repeats, setup.settled, measurements),
            SECTION_START,
            SECTION_END,
        )
        print(f"\nupdated {DOCS.relative_to(REPO)}", file=sys.stderr)


def measure(args: argparse.Namespace) -> tuple[list[Measurement], SourceSetup]:
    """Every run of every reader, on a broker of its own, and what the run was."""
    with (
        tempfile.TemporaryDirectory(prefix="sparkafka-bench-") as work,
        BrokerProcess(Path(work) / "data") as broker,
    ):
        bootstrap = broker.bootstrap_servers
        print(f"writing {args.records:,} records ...", file=sys.stderr)
        produce_s = produce(bootstrap, args.records, args.partitions, args.value_bytes)
        time.sleep(2)  # let the broker finish writing before anything is timed
        print("bare consume loop ...", file=sys.stderr)
        # Untimed, as the Spark readers get one: the first reads after writing are slower (the broker
        # is still settling its files), and timing them would flatter whichever reader comes later.
        bare_consume(bootstrap, args.records, args.partitions)
        bare = [bare_consume(bootstrap, args.records, args.partitions) for _ in range(args.repeats)]
        print("spark source ...", file=sys.stderr)
        assert broker.process is not None
        spark = spark_readers(
            bootstrap,
            args.records,
            Path(work) / "checkpoint",
            broker.process.pid,
            args.repeats,
            args.settled_queries,
        )
    command = "python -m benchmarks.source" + (
        f" --records {args.records}" if args.records != 1_000_000 else ""
    )
    if args.repeats != 5:
        command += f" --repeats {args.repeats}"
    if args.settled_queries != 5:
        command += f" --settled-queries {args.settled_queries}"
    setup = SourceSetup(
        records=args.records,
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        produce_s=produce_s,
        repeats=args.repeats,
        settled=args.settled_queries,
        python=f"{platform.python_implementation()} {platform.python_version()}",
        cpus=os.cpu_count() or 1,
        date=time.strftime("%Y-%m-%d"),
        command=command,
    )
    return [*bare, *spark], setup


if __name__ == "__main__":
    main()
