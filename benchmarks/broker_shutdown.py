"""How long the embedded broker takes to stop cleanly with many idle partitions: the target is under
2 s for 3,000 partitions.

A broker process gets one topic of ``--partitions`` partitions with a record in each, is restarted
(so every partition is opened from disk, as after any restart), left idle, and then sent SIGTERM;
the time is from the signal to the process's exit, every partition closed (fsynced, producer state
snapshotted, clean-shutdown marker written). The median of ``--repeats`` stops is reported.

Every stop is kept in docs/benchmarks/broker-shutdown.json (``--results``), from which
``--from-results`` makes the section again without running anything.

    python -m benchmarks.broker_shutdown
    python -m benchmarks.broker_shutdown --update-docs docs/benchmarks.md
    python -m benchmarks.broker_shutdown --from-results docs/benchmarks/broker-shutdown.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.broker.runner import BrokerProcess

if not __package__:  # run as `python benchmarks/broker_shutdown.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import REPO, load_average, load_results, machine_line, save_results, update_docs

SECTION_START = "<!-- benchmark:broker-shutdown:start -->"
SECTION_END = "<!-- benchmark:broker-shutdown:end -->"
TARGET_S = 2.0
RESULTS = REPO / "docs" / "benchmarks" / "broker-shutdown.json"


@dataclasses.dataclass(frozen=True)
class Stop:
    seconds: float


@dataclasses.dataclass(frozen=True)
class ShutdownSetup:
    partitions: int
    machine: str


def measure(partitions: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as directory:
        broker = BrokerProcess(Path(directory) / "data").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            admin.create_topics([NewTopic("idle", partitions, 1)])["idle"].result(timeout=120)
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
            for partition in range(partitions):
                producer.produce("idle", value=b"x", partition=partition)
            if producer.flush(120):
                raise RuntimeError("records were not all delivered")
            del producer, admin  # their reconnection attempts would only add noise
            stops = []
            for _ in range(repeats + 1):  # the first stop closes partitions that were written to
                started = time.monotonic()
                broker.terminate()
                stops.append(time.monotonic() - started)
                broker.start()
                time.sleep(1)  # idle
            return stops[1:]
        finally:
            broker.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--update-docs", type=Path, help="rewrite this file's broker-shutdown section")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to keep every stop as JSON")
    parser.add_argument(
        "--from-results", type=Path, help="make the section from these kept stops, running nothing"
    )
    args = parser.parse_args()
    if args.from_results is not None:
        runs, setup = load_results(args.from_results, Stop, ShutdownSetup, "broker shutdown benchmark")
    else:
        start_load = load_average()
        runs = [Stop(seconds) for seconds in measure(args.partitions, args.repeats)]
        setup = ShutdownSetup(args.partitions, machine_line(start_load))
        save_results(args.results, runs, setup)
    line = render(runs, setup)
    print(line)
    if args.update_docs is not None:
        section = (
            "## Broker shutdown\n\nMeasured with `python -m benchmarks.broker_shutdown` (see "
            "`benchmarks/broker_shutdown.py`).\n\n" + line
        )
        update_docs(args.update_docs, section, SECTION_START, SECTION_END)


def render(runs: list[Stop], setup: ShutdownSetup) -> str:
    stops = [run.seconds for run in runs]
    median = statistics.median(stops)
    verdict = "met" if median < TARGET_S else "not met"
    return (
        f"Clean stop (SIGTERM to exit) with {setup.partitions:,} idle partitions: median {median:.2f} s over "
        f"{len(stops)} stops (min {min(stops):.2f}, max {max(stops):.2f}); target < {TARGET_S:.0f} s: "
        f"{verdict}. {setup.machine}"
    )


if __name__ == "__main__":
    main()
