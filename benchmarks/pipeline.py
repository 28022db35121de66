"""End-to-end throughput and latency of a map pipeline (seed 001's EVENT(a,b)) run by `sparkafka run`,
exactly-once vs at-least-once vs none, at two trigger intervals, in one run on the embedded broker.

For each configuration:

* **throughput**: ``--records`` records of ``--value-bytes`` bytes are written to a 4-partition input
  topic first; the pipeline is started and reads them in micro-batches of at most 200,000 records;
  throughput is records/s from 10 % to 90 % of the output visible to a read_committed reader (start-up
  and the first batch's commit are left out; start-up is reported separately);
* **latency**: with the pipeline running, records are produced at ``--rate`` records/s for
  ``--seconds``; each output record carries its input record's create time in its key, and latency is
  the time it became visible to a read_committed reader minus that create time (p50/p99).

    python benchmarks/pipeline.py                                  # 1,000,000 records, 1 s and 10 s
    python benchmarks/pipeline.py --records 200000 --update-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Message, Producer

from sparkafka.harness import Cluster
from sparkafka.pipeline_process import PipelineProcess

if not __package__:  # run as `python benchmarks/pipeline.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import PARTITIONS, OutputWatcher, update_docs

SECTION_START = "<!-- benchmark:pipeline:start -->"
SECTION_END = "<!-- benchmark:pipeline:end -->"
# The backlog is read in micro-batches of this many records, as a user sizing batches would set it,
# so that output becomes visible batch by batch and the sustained rate can be measured.
MAX_OFFSETS_PER_TRIGGER = 200_000
# The input create time rides along in the key so the reader can compute end-to-end latency.
MAP_SQL = (
    "SELECT CAST(CAST(unix_millis(timestamp) AS STRING) AS BINARY) AS key, "
    "concat('EVENT(', CAST(value AS STRING), ')') AS value, partition FROM input"
)


@dataclass(frozen=True)
class Result:
    guarantee: str
    trigger: str
    records: int
    startup_s: float
    throughput: float
    latency_p50_ms: float
    latency_p99_ms: float


class CreateTimeWatcher(OutputWatcher):
    """Records when each output record became visible, with its input's create time (in its key)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.arrivals: list[tuple[float, int]] = []  # (visible at, input create time ms)
        super().__init__(bootstrap, topic, PARTITIONS)

    def on_record(self, visible_at: float, message: Message) -> None:
        self.arrivals.append((visible_at, int(message.key() or b"0")))


def _produce(cluster: Cluster, topic: str, records: int, value_bytes: int, rate: float | None) -> None:
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "enable.idempotence": True}
    )
    payload = b"a" * (value_bytes // 2 - 1) + b"," + b"b" * (value_bytes - value_bytes // 2)
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=payload, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if rate is not None and i % 100 == 0:
            ahead = i / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        producer.poll(0)
    producer.flush(120)


def _wait(watcher: CreateTimeWatcher, count: int, timeout_s: float, pipeline: PipelineProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while len(watcher.arrivals) < count and time.monotonic() < deadline:
        if pipeline.process is None or pipeline.process.poll() is not None:
            raise RuntimeError(f"the pipeline exited; its output ends with:\n{pipeline.output()[-3000:]}")
        time.sleep(0.2)
    if len(watcher.arrivals) < count:
        raise RuntimeError(
            f"only {len(watcher.arrivals)} of {count} records arrived within {timeout_s:.0f} s"
        )


def measure(
    cluster: Cluster, work: Path, guarantee: str, trigger: str, args: argparse.Namespace, run: int
) -> Result:
    in_topic, out_topic = f"in-{run}", f"out-{run}"
    cluster.create_topics([in_topic, out_topic], PARTITIONS)
    _produce(cluster, in_topic, args.records, args.value_bytes, None)
    watcher = CreateTimeWatcher(cluster.bootstrap_servers, out_topic).start()
    pipeline = PipelineProcess(
        work / f"pipeline-{run}.log",
        [
            "--bootstrap-servers",
            cluster.bootstrap_servers,
            "--source-topic",
            in_topic,
            "--sink-topic",
            out_topic,
            "--checkpoint",
            str(work / f"checkpoint-{run}"),
            "--trigger",
            trigger,
            "--delivery-guarantee",
            guarantee,
            "--master",
            "local[2]",
            "--source-option",
            "startingOffsets=earliest",
            "--source-option",
            f"maxOffsetsPerTrigger={MAX_OFFSETS_PER_TRIGGER}",
            "--sql",
            MAP_SQL,
        ],
    )
    started = time.time()
    pipeline.start()
    try:
        _wait(watcher, args.records, args.timeout, pipeline)
        first = watcher.arrivals[0][0]
        # From 10 % to 90 % of the records visible: start-up and the first batch's commit stay out.
        low, high = args.records // 10, args.records * 9 // 10
        throughput = (high - low) / max(watcher.arrivals[high][0] - watcher.arrivals[low][0], 1e-3)
        steady = int(args.rate * args.seconds)
        _produce(cluster, in_topic, steady, args.value_bytes, args.rate)
        _wait(watcher, args.records + steady, args.timeout, pipeline)
        latencies = [visible * 1000 - created for visible, created in watcher.arrivals[args.records :]]
        quantiles = statistics.quantiles(latencies, n=100)
    finally:
        watcher.stop()
        if pipeline.process is not None:
            pipeline.terminate()
    return Result(guarantee, trigger, args.records, first - started, throughput, quantiles[49], quantiles[98])


def render(results: list[Result], args: argparse.Namespace) -> str:
    by_trigger = {(r.guarantee, r.trigger): r for r in results}
    lines = [
        "## Pipeline (source → map → sink)",
        "",
        f"`sparkafka run` with seed 001's map over {args.records:,} records of {args.value_bytes} B in "
        f"{PARTITIONS} partitions, read in micro-batches of at most {MAX_OFFSETS_PER_TRIGGER:,} records "
        "(maxOffsetsPerTrigger; throughput: records/s from 10 % to 90 % of the records visible to a "
        "read_committed reader), "
        f"then {args.rate:,.0f} records/s for {args.seconds:.0f} s (latency: input create time to visibility "
        "for a read_committed reader). One run per row, Spark local[2], embedded broker on the same machine.",
        "",
        "| delivery guarantee | trigger | records/s | vs at-least-once | start-up s "
        "| latency p50 ms | latency p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        baseline = by_trigger.get(("at-least-once", r.trigger))
        ratio = f"{r.throughput / baseline.throughput:.2f}x" if baseline else "-"
        lines.append(
            f"| {r.guarantee} | {r.trigger} | {r.throughput:,.0f} | {ratio} | {r.startup_s:.1f} | "
            f"{r.latency_p50_ms:,.0f} | {r.latency_p99_ms:,.0f} |"
        )
    lines += [
        "",
        f"- Machine: {platform.machine()}, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}",
        f"- Command: `python benchmarks/pipeline.py --records {args.records} --rate {args.rate:.0f} "
        f"--seconds {args.seconds:.0f} --update-docs docs/benchmarks.md`",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=5000.0, help="records/s of the latency phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the latency phase")
    parser.add_argument("--triggers", default="1s,10s")
    parser.add_argument("--guarantees", default="exactly-once,at-least-once,none")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--update-docs", type=Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-bench-") as work:
        cluster = Cluster(Path(work)).start()
        try:
            run = 0
            for trigger in args.triggers.split(","):
                for guarantee in args.guarantees.split(","):
                    run += 1
                    result = measure(cluster, Path(work), guarantee, trigger, args, run)
                    print(result, flush=True)
                    results.append(result)
        finally:
            cluster.stop()
    section = render(results, args)
    print(section)
    if args.update_docs is not None:
        update_docs(args.update_docs, section, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
