"""One run: one system, one guarantee, one workload, on fresh topics of the shared embedded broker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from benchmarks.common import PARTITIONS
from benchmarks.compare.process_tree import ProcessTreeSampler
from benchmarks.compare.systems import System
from benchmarks.compare.watchers import CompletionWatcher, CountWatcher, MapWatcher
from benchmarks.compare.workload import InputProducer, expected_counts
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.tools.harness import Cluster

# How the Spark-based runners size micro-batches (maxOffsetsPerTrigger), from the driver.
MAX_OFFSETS_VARIABLE = "BENCH_MAX_OFFSETS_PER_TRIGGER"


def max_offsets_per_trigger(records: int) -> int:
    """At least five micro-batches per backlog, and never fewer than 200,000 records each: Spark
    starts at most one micro-batch per trigger, so a fixed size would cap a larger run's rate."""
    return max(200_000, records // 5)


# The runner contract asks for an exit within ~10 s of SIGTERM; past this the group gets SIGKILL.
STOP_TIMEOUT_S = 20.0
LATENCY_CDF_POINTS = 1000


@dataclass(frozen=True)
class Settings:
    records: int
    rate: float
    seconds: float
    latency: bool
    commit_interval_ms: int
    timeout_s: float

    @property
    def steady_records(self) -> int:
        return int(self.rate * self.seconds) if self.latency else 0

    @property
    def grace_s(self) -> float:
        """How long the output is watched after it was complete, for late duplicates or overcounts."""
        return max(2.0, 2 * self.commit_interval_ms / 1000)


@dataclass(frozen=True)
class Config:
    system: System
    guarantee: str
    workload: str

    @property
    def label(self) -> str:
        return f"{self.system.label} {self.guarantee}"


@dataclass
class RunResult:
    config: Config
    repeat: int
    log: Path
    problems: list[str] = field(default_factory=list)
    startup_s: float | None = None  # runner start -> first output visible
    throughput: float | None = None  # inputs/s from 10 % to 90 % of the inputs accounted for
    total_s: float | None = None  # runner start -> complete
    cpu_s: float | None = None  # process tree, runner start -> complete
    cpu_s_per_million: float | None = None  # process tree, first output -> complete, per 1 M inputs
    peak_rss_mib: float | None = None  # process tree, whole run
    peak_pss_mib: float | None = None  # process tree, whole run, shared pages counted once
    # The tree at its peak RSS, per kind of process: {"process", "count", "rss_mib", "pss_mib"}.
    peak_memory_by_process: list[dict[str, Any]] | None = None
    broker_cpu_s: float | None = None  # broker process, runner start -> complete
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_quantiles_ms: list[float] = field(default_factory=list)
    steady_rate: float | None = None  # records/s the producer achieved in the latency phase
    stop_s: float | None = None
    killed: bool = False  # did not exit within STOP_TIMEOUT_S of SIGTERM

    @property
    def ok(self) -> bool:
        return not self.problems


class RunFailed(Exception):
    """The run cannot go on; the message says why."""


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sustained_window(records: int) -> tuple[int, int]:
    """From 10 % to 90 % of the inputs: leaves out start-up and the first commit, which shows a
    whole micro-batch or checkpoint interval at once, and the tail."""
    return records // 10, records * 9 // 10


def _cpu_seconds(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _log_tail(log: Path, characters: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-characters:]
    return ""


class Runner:
    """The system's runner as its own process group, with its process tree sampled."""

    def __init__(self, python: Path, config: Config, bootstrap: str, topics: tuple[str, str], work: Path,
                 commit_interval_ms: int, records: int) -> None:  # fmt: skip
        self.log = work / "runner.log"
        self.command = [
            str(python), str(config.system.runner_path),
            "--bootstrap-servers", bootstrap,
            "--input-topic", topics[0],
            "--output-topic", topics[1],
            "--workload", config.workload,
            "--guarantee", config.guarantee,
            "--work-dir", str(work),
            "--commit-interval-ms", str(commit_interval_ms),
            *config.system.runner_args,
        ]  # fmt: skip
        self.work = work
        self.environment = {
            **os.environ,
            MAX_OFFSETS_VARIABLE: str(max_offsets_per_trigger(records)),
            **dict(config.system.variables),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.sampler: ProcessTreeSampler | None = None

    def start(self) -> float:
        with open(self.log, "wb") as log:
            started = time.time()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                start_new_session=True,
                env=self.environment,
            )
        self.sampler = ProcessTreeSampler(self.process.pid).start()
        return started

    def check_alive(self) -> None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            raise RunFailed(f"the runner exited with code {code} (log: {self.log})")

    def stop(self) -> tuple[float, bool]:
        """SIGTERM the group, SIGKILL it after STOP_TIMEOUT_S; (seconds to stop, whether killed)."""
        assert self.process is not None and self.sampler is not None
        self.sampler.sample()
        began = time.monotonic()
        killed = False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            killed = True
        # Whatever of the group is left (a JVM that outlives its launcher, say) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        stopped = time.monotonic() - began
        self.sampler.stop()
        for survivor in self.sampler.survivors():  # descendants that left the process group
            with contextlib.suppress(psutil.Error):
                survivor.kill()
        return stopped, killed


def _wait_until(
    reached: Callable[[], float | None],
    what: str,
    timeout_s: float,
    runner: Runner,
    watcher: CompletionWatcher,
) -> float:
    deadline = time.monotonic() + timeout_s
    while (at := reached()) is None:
        if watcher.error is not None:
            raise RunFailed(f"the output watcher failed: {watcher.error!r}")
        runner.check_alive()
        if time.monotonic() > deadline:
            raise RunFailed(f"{what} not reached within {timeout_s:.0f} s")
        time.sleep(0.05)
    return at


def _admin(bootstrap: str) -> AdminClient:
    # Info-level lines of librdkafka (background queue purged at close) are noise in the progress.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def _create_topics(bootstrap: str, topics: list[str]) -> None:
    admin = _admin(bootstrap)  # kept referenced: the futures fail once the client is destroyed
    futures = admin.create_topics([NewTopic(t, PARTITIONS, -1) for t in topics], operation_timeout=30)
    for future in futures.values():
        future.result(60)


def _delete_topics(bootstrap: str, run_id: str) -> None:
    """Delete the run's topics, and those a system created for it (Quix's changelog topics carry the
    output topic's name): keeps the broker's disk use flat; a failure here only costs disk space."""
    admin = _admin(bootstrap)
    topics = [name for name in admin.list_topics(timeout=30).topics if run_id in name]
    if not topics:
        return
    for topic, future in admin.delete_topics(topics, operation_timeout=30).items():
        try:
            future.result(60)
        except Exception as error:
            print(f"  (could not delete topic {topic}: {error})", file=sys.stderr)


def measure(
    cluster: Cluster, python: Path, config: Config, settings: Settings, work: Path, run_id: str, repeat: int
) -> RunResult:
    bootstrap = cluster.bootstrap_servers
    broker_pid = cluster.broker.process.pid if cluster.broker and cluster.broker.process else None
    topics = (f"{run_id}-in", f"{run_id}-out")
    work.mkdir(parents=True)
    _create_topics(bootstrap, list(topics))
    records = settings.records
    producer = InputProducer(bootstrap)
    producer.produce(topics[0], 0, records)

    runner = Runner(python, config, bootstrap, topics, work, settings.commit_interval_ms, records)
    result = RunResult(config, repeat, runner.log)
    watcher: MapWatcher | CountWatcher
    complete: Callable[[], float | None]
    if config.workload == "map":
        map_watcher = MapWatcher(bootstrap, topics[1], records + settings.steady_records, records)
        map_watcher.expect(records)
        watcher, complete = map_watcher, lambda: map_watcher.reached[records]
    else:
        count_watcher = CountWatcher(bootstrap, topics[1], expected_counts(records))
        watcher, complete = count_watcher, lambda: count_watcher.complete_at
    for milestone in _sustained_window(records):
        watcher.expect(milestone)
    watcher.start()
    broker_cpu_before = _cpu_seconds(broker_pid)
    started = runner.start()
    try:
        _wait_until(lambda: watcher.first_visible, "the first output", settings.timeout_s, runner, watcher)
        assert runner.sampler is not None
        runner.sampler.sample()
        cpu_at_first_output, accounted_at_first_output = runner.sampler.cpu_seconds(), watcher.accounted_for()
        done = _wait_until(
            complete, f"all {records:,} records processed", settings.timeout_s, runner, watcher
        )
        assert watcher.first_visible is not None
        runner.sampler.sample()
        result.cpu_s = runner.sampler.cpu_seconds()
        # Only when most of the run comes after the first output: a run whose first commit holds
        # nearly everything leaves too few records to divide by.
        if records - accounted_at_first_output >= records / 2:
            million = (records - accounted_at_first_output) / 1e6
            result.cpu_s_per_million = (result.cpu_s - cpu_at_first_output) / million
        broker_cpu_after = _cpu_seconds(broker_pid)
        if broker_cpu_before is not None and broker_cpu_after is not None:
            result.broker_cpu_s = broker_cpu_after - broker_cpu_before
        result.startup_s = watcher.first_visible - started
        result.total_s = done - started
        result.throughput = watcher.sustained_rate(*_sustained_window(records))
        if isinstance(watcher, MapWatcher) and settings.steady_records:
            _steady_rate_phase(watcher, settings, producer, topics[0], runner, result)
        time.sleep(settings.grace_s)
        runner.check_alive()
    except RunFailed as failure:
        result.problems.append(str(failure))
    except Exception as error:  # e.g. the steady-rate producer failing: this run fails, the next ones run
        result.problems.append(f"{type(error).__name__}: {error}")
    finally:
        result.stop_s, result.killed = runner.stop()
        # What the output holds once the runner has stopped, to its last stable offsets: a late
        # duplicate or overcount is judged too, however long after the grace period it came.
        try:
            watcher.read_to_latest()
        except Exception as error:
            result.problems.append(f"the output could not be read to its end: {error}")
        watcher.stop()
        if runner.sampler is not None:
            result.peak_rss_mib = runner.sampler.peak_rss_bytes / 2**20
            if (pss := runner.sampler.peak_pss_bytes) is not None:
                result.peak_pss_mib = pss / 2**20
            result.peak_memory_by_process = runner.sampler.peak_by_label()
    if watcher.error is not None:
        result.problems.append(f"the output watcher failed: {watcher.error!r}")
    result.problems.extend(watcher.problems())
    if config.guarantee == "exactly-once" and result.ok:
        result.problems.extend(_no_transactions(bootstrap, topics[1], watcher.records_seen))
    # The map watcher was told the total of each phase before it was produced.
    missing = watcher.missing(max(watcher.reached)) if isinstance(watcher, MapWatcher) else watcher.missing()
    if missing:
        result.problems.append(missing)
    if not result.ok:
        print(f"  runner log {runner.log} ends with:\n{_log_tail(runner.log)}", file=sys.stderr)
    _delete_topics(bootstrap, run_id)
    return result


def _no_transactions(bootstrap: str, topic: str, records: int) -> list[str]:
    """A problem when an exactly-once run's output shows no transaction: every committed transaction
    leaves a COMMIT marker in each partition it wrote, which takes an offset, so the output's offsets
    must outnumber its records."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-markers-{topic}", "log_level": 4}
    )
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()
    if sum(ends) > records:
        return []
    return [
        f"no transaction markers in the output ({sum(ends)} offsets for {records} records): not exactly-once"
    ]


def _steady_rate_phase(
    watcher: MapWatcher,
    settings: Settings,
    producer: InputProducer,
    topic: str,
    runner: Runner,
    result: RunResult,
) -> None:
    """Produce at the steady rate with the runner caught up; latency = visible - produce time."""
    total = settings.records + settings.steady_records
    watcher.expect(total)
    produced = producer.produce(topic, settings.records, settings.steady_records, settings.rate)
    result.steady_rate = produced.rate
    _wait_until(lambda: watcher.reached[total], "the steady-rate records' output", settings.timeout_s,
                runner, watcher)  # fmt: skip
    ordered = sorted(watcher.latencies_ms)
    if ordered:
        result.latency_p50_ms = _quantile(ordered, 0.50)
        result.latency_p99_ms = _quantile(ordered, 0.99)
        result.latency_quantiles_ms = [
            _quantile(ordered, i / LATENCY_CDF_POINTS) for i in range(LATENCY_CDF_POINTS + 1)
        ]
