"""What the benchmark scripts share: the markdown section writer, a read_committed watcher of an output
topic, and a description of the machine a run was measured on."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from confluent_kafka import Consumer, Message, TopicPartition

from sparkafka.tools.harness import latest_offsets

Item = TypeVar("Item")
Run = TypeVar("Run")
Setup = TypeVar("Setup")

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4


def in_rotation(items: Sequence[Item], repetition: int) -> list[Item]:
    """``items`` in the order repetition ``repetition`` (from 0) runs them: rotated by one place each
    repetition, so that none always runs first on a machine that warms up or gets busier."""
    shift = repetition % len(items)
    return [*items[shift:], *items[:shift]]


def update_docs(path: Path, section: str, start_marker: str, end_marker: str) -> None:
    """Replace the text between ``start_marker`` and ``end_marker`` in ``path`` with ``section`` (or
    append a marked section); the rest of the file, other benchmarks' sections included, stays as is."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start_marker}\n{section}\n{end_marker}"
    pattern = re.compile(re.escape(start_marker) + ".*?" + re.escape(end_marker), re.S)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    path.write_text(text)


class OutputWatcher:
    """A read_committed reader of every partition of a topic from offset 0, in a background thread.

    Subclasses decide what to keep of each record in :meth:`on_record`, which runs in that thread and is
    given the wall-clock time at which the record became visible to the reader. Call :meth:`start` once
    the subclass is set up, and :meth:`stop` at the end; an exception in the thread lands in ``error``.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._bootstrap, self._topic, self._partitions = bootstrap, topic, partitions
        self._targets: dict[int, int] | None = None
        self._reached = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                # Short fetch waits: the arrival time is the latency being measured.
                "fetch.wait.max.ms": 10,
                # With librdkafka's default (1 s) the reader stopped fetching for a second whenever
                # 100,000 records of a partition were queued: it read 1 M outputs in 7.7 s, not 3.5 s,
                # and the arrival times measured that pause rather than the system under test.
                "fetch.queue.backoff.ms": 10,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._thread = threading.Thread(target=self._run, name=f"watch-{topic}", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def on_record(self, visible_at: float, message: Message) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # consume(n, timeout) waits for n records or the whole timeout, which would delay the
                # arrival times; poll() returns with the first record, consume(n, 0) takes what is queued.
                first = self._consumer.poll(0.1)
                self._check_reached()
                if first is None:
                    continue
                visible_at = time.time()
                for message in [first, *self._consumer.consume(10_000, 0)]:
                    if message.error() is None:
                        self.on_record(visible_at, message)
        except BaseException as error:  # the main thread reports it; a dead watcher must not look idle
            self.error = error
            self._reached.set()

    def read_to_latest(self, timeout_s: float = 120) -> None:
        """Until the watcher has read up to the last stable offsets the broker answers now: call it
        once the writer has stopped, and every record the topic holds for read_committed readers has
        been seen (a count reached is no proof that no copy follows). Raises TimeoutError naming the
        offsets otherwise."""
        targets = latest_offsets(self._bootstrap, self._topic, self._partitions, "read_committed")
        self._reached.clear()
        self._targets = targets
        if not self._reached.wait(timeout_s) and self.error is None:
            raise TimeoutError(f"the watcher of {self._topic} did not reach {targets} in {timeout_s} s")

    def _check_reached(self) -> None:
        targets = self._targets
        if targets is None or self._reached.is_set():
            return
        positions = self._consumer.position([TopicPartition(self._topic, p) for p in targets])
        # A partition nothing was read from has no position (a negative logical offset) yet.
        if all(max(tp.offset, 0) >= targets[tp.partition] for tp in positions):
            self._reached.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._consumer.close()


def save_results(path: Path, runs: list[Any], setup: Any) -> None:
    """A benchmark's raw results as JSON: every run (a dataclass each) and the run's setup (a
    dataclass), so that its section can be made again without running anything."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "version": 1,
        "setup": dataclasses.asdict(setup),
        "runs": [dataclasses.asdict(run) for run in runs],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def load_results(
    path: Path, run_type: type[Run], setup_type: type[Setup], what: str
) -> tuple[list[Run], Setup]:
    """What :func:`save_results` wrote to ``path``; ValueError naming the file and ``what`` it
    should have held otherwise."""
    try:
        document = json.loads(path.read_text())
        if document.get("version") != 1:
            raise ValueError(f"version {document.get('version')!r}, this code reads 1")
        return [run_type(**run) for run in document["runs"]], setup_type(**document["setup"])
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a {what} results file: {error}") from None


class CpuCgroup:
    """A cgroup that counts the CPU of every process started into it (:meth:`command`) and of every
    process those start, also after they leave the process tree: a daemon that outlives the JVM that
    started it, a child of a zygote that is not the measured process's, whose time ``wait4`` never
    sees. Linux only, and only where this user may make cgroups (cgroup v1's ``cpuacct``, or v2);
    :meth:`create` returns None elsewhere."""

    _V1 = Path("/sys/fs/cgroup/cpuacct")
    _V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))

    def __init__(self, directory: Path, members: str, version: int) -> None:
        self.directory, self._members, self.version = directory, members, version

    @classmethod
    def create(cls) -> CpuCgroup | None:
        name = f"sparkafka-benchmark-{os.getpid()}-{time.monotonic_ns()}"
        candidates = [(cls._V1, "tasks", 1)] + [(root, "cgroup.procs", 2) for root in cls._V2_ROOTS]
        for root, members, version in candidates:
            usage = "cpuacct.usage" if version == 1 else "cpu.stat"
            if not (root / members).exists() or not (root / usage).exists():
                continue
            with contextlib.suppress(OSError):
                (root / name).mkdir()
                if (root / name / usage).exists():
                    return cls(root / name, members, version)
                (root / name).rmdir()
        return None

    def command(self, argv: list[str]) -> list[str]:
        """``argv``, run by a shell that first moves itself into this cgroup, so that no process of
        the run starts outside it."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.directory / self._members), *argv]

    def cpu_seconds(self, settle_s: float = 30.0) -> float:
        """The CPU time of every process that was in the cgroup, once none is left in it (waiting up
        to ``settle_s`` for stragglers to end)."""
        deadline = time.monotonic() + settle_s
        while (self.directory / self._members).read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.version == 1:
            return int((self.directory / "cpuacct.usage").read_text()) / 1e9
        fields = dict(line.split() for line in (self.directory / "cpu.stat").read_text().splitlines())
        return int(fields["usage_usec"]) / 1e6

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.directory.rmdir()


@dataclasses.dataclass(frozen=True)
class ResultsSection:
    """Where a benchmark keeps its raw results and its section of docs/benchmarks.md."""

    name: str  # "start-up", in "rewrite this file's start-up section"
    results: Path
    start_marker: str
    end_marker: str


def results_main(
    doc: str | None,
    section: ResultsSection,
    run_type: type[Run],
    setup_type: type[Setup],
    measure: Callable[[argparse.Namespace], tuple[list[Run], Setup]],
    render: Callable[[list[Run], Setup], str],
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _parser: None,
) -> None:
    """A benchmark's command line: measure (with ``--repeats`` and ``add_arguments``' options) and keep
    every run in ``--results``, or render again from ``--from-results`` without running anything;
    print the section, and with ``--update-docs`` rewrite it in that file."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    parser.add_argument("--update-docs", type=Path, help=f"rewrite this file's {section.name} section")
    parser.add_argument("--results", type=Path, default=section.results, help="where to keep the raw results")
    parser.add_argument("--from-results", type=Path, help="render from these raw results, running nothing")
    args = parser.parse_args()
    if args.from_results is not None:
        runs, setup = load_results(args.from_results, run_type, setup_type, f"{section.name} benchmark")
    else:
        runs, setup = measure(args)
        save_results(args.results, runs, setup)
    text = render(runs, setup)
    print(text)
    if args.update_docs is not None:
        update_docs(args.update_docs, text, section.start_marker, section.end_marker)


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """What a measured child process reported (its last ``RESULT {json}`` line), how long it took,
    and the CPU of its whole run (see :func:`run_reporting_child`)."""

    reported: dict[str, Any]
    total_s: float
    cpu_s: float
    cpu_counted_by: str


def run_reporting_child(command: list[str], environ: dict[str, str], what: str) -> ChildRun:
    """Run ``command``, which prints ``RESULT {json}``, and count its CPU: every process of the run by
    a cgroup where one can be made (:class:`CpuCgroup`), else what ``wait4`` sees of it. Fails naming
    ``what`` when the child fails or reports nothing."""
    cgroup = CpuCgroup.create()
    started = time.monotonic()
    process = subprocess.Popen(
        command if cgroup is None else cgroup.command(command),
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    total_s = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"the {what} run failed (exit code {process.returncode}):\n{output[-2000:]}")
    reported = json.loads(lines[-1].removeprefix("RESULT "))
    if cgroup is None:
        return ChildRun(reported, total_s, usage.ru_utime + usage.ru_stime, "wait4")
    try:
        return ChildRun(reported, total_s, cgroup.cpu_seconds(), f"cgroup v{cgroup.version}")
    finally:
        cgroup.remove()


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_description() -> str:
    """``, 24 GiB RAM`` (empty where /proc/meminfo is not available)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        return f", {kib / 1024 / 1024:.0f} GiB RAM"
    return ""


def machine_line(start_load: float) -> str:
    """CPU model, cores, RAM, OS and kernel, and the 1-minute load average at the start and now."""
    load = ""
    with contextlib.suppress(OSError):
        end_load = os.getloadavg()[0]
        load = f"; load average {start_load:.1f} when the run started, {end_load:.1f} when it finished"
    return (
        f"{cpu_model()}, {os.cpu_count()} cores{memory_description()}; "
        f"{platform.system()} {platform.release()}{load}"
    )
