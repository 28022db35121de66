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

Every configuration is measured ``--repeats`` times (default 3), on fresh topics and a fresh checkpoint
each time. The runs alternate: each repetition runs every (trigger, guarantee) combination once, and the
order of the guarantees rotates from one repetition to the next, so that no guarantee always runs first
or last on a machine that warms up or gets busier. The table shows per configuration the median over the
repetitions with the min-max in parentheses, the exactly-once/at-least-once ratio of the medians, and
whether the targets are met by the medians.

    python benchmarks/pipeline.py                                  # 1,000,000 records, 1 s and 10 s
    python benchmarks/pipeline.py --records 200000 --repeats 5 --update-docs docs/benchmarks.md
    python -m benchmarks.pipeline --from-results docs/benchmarks/pipeline-embedded.json \
        --update-docs docs/benchmarks.md       # the section again from a run's raw results, running nothing

With --update-docs every run's measurements and the setup go to docs/benchmarks/pipeline-<kafka>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Message, Producer

from sparkafka.connector.options import parse_duration_ms
from sparkafka.tools.harness import Cluster
from sparkafka.tools.pipeline_process import PipelineProcess

if not __package__:  # run as `python benchmarks/pipeline.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    PARTITIONS,
    OutputWatcher,
    in_rotation,
    load_average,
    load_results,
    machine_line,
    save_results,
    update_docs,
)
from benchmarks.compare.report import Spread

SECTION_START = "<!-- benchmark:pipeline:start -->"
SECTION_END = "<!-- benchmark:pipeline:end -->"
KAFKA_SECTION_MARKERS = (
    "<!-- benchmark:pipeline-apache-kafka:start -->",
    "<!-- benchmark:pipeline-apache-kafka:end -->",
)
# The backlog is read in micro-batches of this many records, as a user sizing batches would set it,
# so that output becomes visible batch by batch and the sustained rate can be measured.
MAX_OFFSETS_PER_TRIGGER = 200_000
# The input create time rides along in the key so the reader can compute end-to-end latency.
MAP_SQL = (
    "SELECT CAST(CAST(unix_millis(timestamp) AS STRING) AS BINARY) AS key, "
    "concat('EVENT(', CAST(value AS STRING), ')') AS value, partition FROM input"
)
# The project's targets: exactly-once costs at most 15 % of at-least-once's throughput at a 1 s trigger,
# and a record is visible at most 2 s after the trigger interval that picks it up has ended.
THROUGHPUT_TARGET_TRIGGER_MS = 1000
THROUGHPUT_TARGET_RATIO = 0.85
LATENCY_TARGET_MARGIN_MS = 2000


@dataclass(frozen=True)
class Result:
    guarantee: str
    trigger: str
    records: int
    startup_s: float
    throughput: float
    latency_p50_ms: float
    latency_p99_ms: float


SEQUENCE_DIGITS = 9
_OUTPUT_PREFIX = b"EVENT("


class CreateTimeWatcher(OutputWatcher):
    """Records when each output record became visible, with its input's create time (in its key), and
    how often each input record (by the sequence number at the start of its value) appeared."""

    def __init__(self, bootstrap: str, topic: str, capacity: int) -> None:
        self.arrivals: list[tuple[float, int]] = []  # (visible at, input create time ms)
        self.copies = bytearray(capacity)  # per input sequence number, saturating at 255
        self.malformed = 0
        super().__init__(bootstrap, topic, PARTITIONS)

    def on_record(self, visible_at: float, message: Message) -> None:
        self.arrivals.append((visible_at, int(message.key() or b"0")))
        value = message.value() or b""
        start = len(_OUTPUT_PREFIX)
        digits = value[start : start + SEQUENCE_DIGITS]
        if not value.startswith(_OUTPUT_PREFIX) or not digits.isdigit() or int(digits) >= len(self.copies):
            self.malformed += 1
            return
        seq = int(digits)
        self.copies[seq] = min(self.copies[seq] + 1, 255)

    def problems(self, expected: int, guarantee: str) -> list[str]:
        """What contradicts the delivery guarantee among input records 0 .. expected - 1: a record
        missing (every guarantee but none), or seen twice (exactly-once)."""
        seen = self.copies[:expected]
        found = []
        missing = seen.count(0)
        if missing and guarantee != "none":
            found.append(f"{missing} input record(s) never appeared in the output")
        duplicated = expected - missing - seen.count(1)
        if duplicated and guarantee == "exactly-once":
            found.append(f"{duplicated} input record(s) appeared more than once")
        if self.malformed:
            found.append(f"{self.malformed} output record(s) are not EVENT(<input value>)")
        return found


def _produce(
    cluster: Cluster, topic: str, first_seq: int, records: int, value_bytes: int, rate: float | None
) -> None:
    """Records ``first_seq`` .. ``first_seq + records - 1``: each value starts with its sequence number,
    so the output can be checked record by record."""
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "enable.idempotence": True}
    )
    padding_bytes = max(value_bytes - SEQUENCE_DIGITS - 1, 0)
    padding = b"," + b"b" * padding_bytes
    started = time.monotonic()
    for i in range(records):
        payload = b"%09d" % (first_seq + i) + padding
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
        # A dead watcher stops counting; without this the run would look slow until the timeout.
        if watcher.error is not None:
            raise RuntimeError("the output watcher failed") from watcher.error
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
    steady = int(args.rate * args.seconds)
    _produce(cluster, in_topic, 0, args.records, args.value_bytes, None)
    watcher = CreateTimeWatcher(cluster.bootstrap_servers, out_topic, args.records + steady).start()
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
            *[option for setting in args.spark_conf for option in ("--spark-conf", setting)],
        ],
        env={**pipeline_environment(args.pipeline_src), **dict(s.split("=", 1) for s in args.pipeline_env)},
    )
    started = time.time()
    pipeline.start()
    try:
        _wait(watcher, args.records, args.timeout, pipeline)
        first = watcher.arrivals[0][0]
        # From 10 % to 90 % of the records visible: start-up and the first batch's commit stay out.
        low, high = args.records // 10, args.records * 9 // 10
        throughput = (high - low) / max(watcher.arrivals[high][0] - watcher.arrivals[low][0], 1e-3)
        _produce(cluster, in_topic, args.records, steady, args.value_bytes, args.rate)
        _wait(watcher, args.records + steady, args.timeout, pipeline)
        # A duplicate would come after the last expected record: the check counts everything the
        # output holds once the pipeline has stopped.
        pipeline.terminate()
        watcher.read_to_latest()
        problems = watcher.problems(args.records + steady, guarantee)
        if problems:
            raise RuntimeError(f"{guarantee} at {trigger}: " + "; ".join(problems))
        latencies = [visible * 1000 - created for visible, created in watcher.arrivals[args.records :]]
        quantiles = statistics.quantiles(latencies, n=100)
    finally:
        watcher.stop()
        pipeline.terminate()
    return Result(guarantee, trigger, args.records, first - started, throughput, quantiles[49], quantiles[98])


def pipeline_environment(pipeline_src: Path | None) -> dict[str, str]:
    """The pipeline process's environment: with ``pipeline_src``, `sparkafka run` (and the Spark
    processes it starts, which inherit it) imports sparkafka from there, another version's ``src``;
    the harness and the embedded broker stay this checkout's."""
    if pipeline_src is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join([str(pipeline_src.resolve()), *_inherited_pythonpath()])}


def _inherited_pythonpath() -> list[str]:
    return [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def schedule(triggers: list[str], guarantees: list[str], repeats: int) -> list[tuple[int, str, str]]:
    """(repetition, trigger, guarantee) in run order: every combination once per repetition, the
    guarantees' order rotated by one each repetition."""
    runs = []
    for repetition in range(repeats):
        in_order = in_rotation(guarantees, repetition)
        runs += [(repetition, trigger, guarantee) for trigger in triggers for guarantee in in_order]
    return runs


def _spread(runs: list[Result], metric: Callable[[Result], float]) -> Spread:
    spread = Spread.of([metric(run) for run in runs])
    if spread is None:
        raise ValueError("a configuration without runs has no spread")
    return spread


def _throughput_ratio(
    by_config: dict[tuple[str, str], list[Result]], guarantee: str, trigger: str
) -> float | None:
    """``guarantee``'s median records/s over at-least-once's at ``trigger``, if both were measured."""
    ours, baseline = by_config.get((guarantee, trigger)), by_config.get(("at-least-once", trigger))
    if not ours or not baseline:
        return None
    return _spread(ours, lambda r: r.throughput).median / _spread(baseline, lambda r: r.throughput).median


def targets(by_config: dict[tuple[str, str], list[Result]], triggers: list[str]) -> list[str]:
    """Whether the medians meet the throughput target (at the 1 s trigger) and the latency target (at
    every trigger), both for exactly-once."""
    throughput_what = (
        f"exactly-once ≥ {THROUGHPUT_TARGET_RATIO}x at-least-once at "
        f"{THROUGHPUT_TARGET_TRIGGER_MS / 1000:g} s trigger"
    )
    target_trigger = next(
        (t for t in triggers if parse_duration_ms("--triggers", t) == THROUGHPUT_TARGET_TRIGGER_MS), None
    )
    ratio = _throughput_ratio(by_config, "exactly-once", target_trigger) if target_trigger else None
    if ratio is None:
        lines = [f"- {throughput_what}: not measured"]
    else:
        verdict = "met" if ratio >= THROUGHPUT_TARGET_RATIO else "not met"
        lines = [f"- {throughput_what}: {verdict} ({ratio:.2f}x)"]
    for trigger in triggers:
        limit_ms = parse_duration_ms("--triggers", trigger) + LATENCY_TARGET_MARGIN_MS
        latency_what = f"exactly-once p99 ≤ trigger + 2 s at {trigger} trigger ({limit_ms:,} ms)"
        runs = by_config.get(("exactly-once", trigger))
        if not runs:
            lines.append(f"- {latency_what}: not measured")
            continue
        p99 = _spread(runs, lambda r: r.latency_p99_ms).median
        verdict = "met" if p99 <= limit_ms else "not met"
        lines.append(f"- {latency_what}: {verdict} (median p99 {p99:,.0f} ms)")
    return lines


KAFKA_DESCRIPTIONS = {
    "embedded": "embedded broker",
    "apache-kafka": "Apache Kafka (one KRaft node, JVM heap 1 GiB, default settings)",
}


@dataclass(frozen=True)
class RunSetup:
    """How a run was made: what the section says about it, saved with its raw results."""

    records: int
    value_bytes: int
    rate: float
    seconds: float
    repeats: int
    kafka: str
    triggers: list[str]
    command: str
    machine: str


def render(results: list[Result], setup: RunSetup, results_file: Path | None = None) -> str:
    by_config: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        by_config.setdefault((result.guarantee, result.trigger), []).append(result)
    lines = [
        "## Pipeline (source → map → sink)" + ("" if setup.kafka == "embedded" else " on Apache Kafka"),
        "",
        f"`sparkafka run` with seed 001's map over {setup.records:,} records of {setup.value_bytes} B in "
        f"{PARTITIONS} partitions, read in micro-batches of at most {MAX_OFFSETS_PER_TRIGGER:,} records "
        "(maxOffsetsPerTrigger; throughput: records/s from 10 % to 90 % of the records visible to a "
        "read_committed reader), "
        f"then {setup.rate:,.0f} records/s for {setup.seconds:.0f} s (latency: input create time to "
        "visibility for a read_committed reader). "
        f"{setup.repeats} repetition(s) of every row, the runs alternating: each repetition runs every "
        "trigger and guarantee once, the order of the guarantees rotating from one repetition to the next. "
        "Cells are medians over the repetitions, with the min-max in parentheses; latency p50 and p99 are "
        "each run's, then the median; vs at-least-once is the ratio of the medians at the same trigger. "
        "Every run's output is checked record by record (inputs carry a sequence number): none missing, "
        "and for exactly-once none twice. "
        f"Spark local[2], {KAFKA_DESCRIPTIONS[setup.kafka]} on the same machine.",
        "",
        "| delivery guarantee | trigger | records/s | vs at-least-once | start-up s "
        "| latency p50 ms | latency p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (guarantee, trigger), runs in by_config.items():
        ratio = _throughput_ratio(by_config, guarantee, trigger)
        lines.append(
            f"| {guarantee} | {trigger} | {_spread(runs, lambda r: r.throughput).format()} | "
            f"{f'{ratio:.2f}x' if ratio is not None else '-'} | "
            f"{_spread(runs, lambda r: r.startup_s).format(1)} | "
            f"{_spread(runs, lambda r: r.latency_p50_ms).median:,.0f} | "
            f"{_spread(runs, lambda r: r.latency_p99_ms).format()} |"
        )
    lines += [
        "",
        "Targets, from the medians:",
        "",
        *targets(by_config, setup.triggers),
        "",
        f"- Machine: {setup.machine}",
        f"- Command: `{setup.command}`",
    ]
    if results_file is not None:
        lines.append(
            f"- Raw results: `{results_file.as_posix()}`; this section is made from them, running "
            f"nothing, by `python -m benchmarks.pipeline --from-results {results_file.as_posix()} "
            "--update-docs FILE`"
        )
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
    parser.add_argument("--repeats", type=int, default=3, help="runs of every (trigger, guarantee)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--update-docs", type=Path, default=None)
    parser.add_argument(
        "--from-results",
        type=Path,
        default=None,
        help="render the section from a results file an earlier run saved, running nothing",
    )
    parser.add_argument(
        "--kafka",
        choices=["embedded", "apache-kafka"],
        default="embedded",
        help="the embedded broker, or Apache Kafka (one KRaft node from the jars scripts/install --test "
        "fetches); the section written to --update-docs is the pipeline's on that Kafka",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="keep the raw results in this file (with --update-docs: docs/benchmarks/pipeline-<kafka>.json)",
    )
    parser.add_argument(
        "--pipeline-src",
        type=Path,
        default=None,
        help="run `sparkafka run` with the sparkafka package of this directory (another version's src), "
        "the harness and the embedded broker staying this checkout's",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting passed to `sparkafka run --spark-conf` (repeatable)",
    )
    parser.add_argument(
        "--pipeline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the pipeline process (repeatable), e.g. JAVA_TOOL_OPTIONS=...",
    )
    args = parser.parse_args()
    for setting in [*args.spark_conf, *args.pipeline_env]:
        if "=" not in setting:
            parser.error(f"{setting!r} is not NAME=VALUE")
    if args.pipeline_src is not None and not (args.pipeline_src / "sparkafka" / "__init__.py").is_file():
        parser.error(f"--pipeline-src {args.pipeline_src}: no sparkafka package there")
    if args.from_results is not None:
        try:
            saved, setup = load_results(args.from_results, Result, RunSetup, "pipeline")
        except ValueError as error:
            parser.error(str(error))
        section = render(saved, setup, args.from_results)
        print(section)
        if args.update_docs is not None:
            update_docs(args.update_docs, section, *_markers(setup.kafka))
        return
    triggers, guarantees = args.triggers.split(","), args.guarantees.split(",")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    # The targets need each trigger in milliseconds; a typo should stop the benchmark before its first
    # run, not after hours of them.
    for trigger in triggers:
        try:
            parse_duration_ms("--triggers", trigger)
        except ValueError as error:
            parser.error(str(error))
    script = ["python", "-m", "benchmarks.pipeline"] if __package__ else ["python", "benchmarks/pipeline.py"]
    command = shlex.join([*script, *sys.argv[1:]])
    start_load = load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-bench-") as work, contextlib.ExitStack() as stack:
        if args.kafka == "apache-kafka":
            from tests.integration.apache_kafka import NEWEST, ApacheKafka

            kafka = stack.enter_context(ApacheKafka(Path(work) / "apache-kafka", NEWEST, heap="1g"))
            cluster = Cluster(Path(work), kafka.bootstrap_servers).start()
        else:
            cluster = Cluster(Path(work)).start()
        try:
            # Fresh topics and checkpoint per run: numbered across repetitions.
            for run, (repetition, trigger, guarantee) in enumerate(
                schedule(triggers, guarantees, args.repeats), start=1
            ):
                result = measure(cluster, Path(work), guarantee, trigger, args, run)
                print(f"repetition {repetition + 1}/{args.repeats}: {result}", flush=True)
                results.append(result)
        finally:
            cluster.stop()
    # Rows in the order the options name them, not in the rotated order the runs had.
    results.sort(key=lambda r: (triggers.index(r.trigger), guarantees.index(r.guarantee)))
    setup = RunSetup(
        args.records,
        args.value_bytes,
        args.rate,
        args.seconds,
        args.repeats,
        args.kafka,
        triggers,
        command,
        f"{machine_line(start_load)}; Python {sys.version.split()[0]}",
    )
    results_file = args.results
    if results_file is None and args.update_docs is not None:
        results_file = args.update_docs.parent / "benchmarks" / f"pipeline-{args.kafka}.json"
    if results_file is not None:
        save_results(results_file, results, setup)
    section = render(results, setup, results_file)
    print(section)
    if args.update_docs is not None:
        update_docs(args.update_docs, section, *_markers(args.kafka))


def _markers(kafka: str) -> tuple[str, str]:
    return (SECTION_START, SECTION_END) if kafka == "embedded" else KAFKA_SECTION_MARKERS


if __name__ == "__main__":
    main()
