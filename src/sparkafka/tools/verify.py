"""`sparkafka verify`: the chaos proof. While keyed records stream in, SIGKILL the pipeline's process
group (and optionally the broker) at random moments, restart it, and check the read_committed output:
every input exactly once, per-key order preserved.

Steps: the input is sent in one part more than there are kills, each over an equal share of
``send_seconds``. Each kill waits until the pipeline it hits runs micro-batches (a restarted one
takes seconds to start), then for a random moment while its part of the input streams in, so that
every kill lands in a pipeline that is writing; with exactly-once, every other kill (chosen at
random) then also waits for a write task to announce that it holds its transaction open (each does
for ``TRANSACTION_HOLD_MS`` before its commit). After the kill the pipeline is restarted and the
next part is sent. Whether each kill caught a transaction open is observed, not inferred from the
readers: right after the kill, before anything is restarted, an output partition whose last stable
offset is below its high watermark holds the killed pipeline's open transaction. After the run the
ABORT markers in the output are counted from the broker's files (embedded broker only). The random
moments come from a seeded generator; the seed is printed so a failing run can be replayed with
``--seed``.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sparkafka.errors import SparkafkaError
from sparkafka.tools.harness import (
    Cluster,
    Seen,
    Verdict,
    judge,
    last_connection_failure,
    latest_offsets,
    readers,
    wait_until,
)
from sparkafka.tools.pipeline_process import PipelineProcess, quick_start_environment, run_arguments

MAP_SQL = "SELECT key, concat('EVENT(', CAST(value AS STRING), ')') AS value, partition FROM input"
# An exactly-once pipeline under test holds each write task's transaction open this long before its
# commit (the sink's debug.pauseAt hook), and announces it: small batches commit within milliseconds,
# so random kills alone almost never catch a transaction open.
TRANSACTION_HOLD_MS = 400
HOLD_ANNOUNCEMENT = "sparkafka debug pause: beforeCommit"


@dataclass(frozen=True)
class VerifySettings:
    records: int = 2000
    kills: int = 3
    partitions: int = 2
    keys: int = 20
    delivery_guarantee: str = "exactly-once"
    bootstrap_servers: str | None = None
    kill_broker: bool = False
    seed: int | None = None
    send_seconds: float = 20.0
    catch_up_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if self.records < 1 or self.kills < 0 or self.partitions < 1 or self.keys < 1:
            raise SparkafkaError("--records, --partitions and --keys must be at least 1, --kills at least 0")
        if self.kill_broker and self.bootstrap_servers:
            raise SparkafkaError(
                "--kill-broker kills the embedded broker; it cannot be used with --bootstrap-servers"
            )


def reordered_keys(records: list[Seen]) -> int:
    """Keys whose sequence numbers do not increase along the output (read in offset order per partition)."""
    by_key: dict[bytes | None, list[int]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key[record.key].append(int(record.value[len(b"EVENT(") : -1]))
    return sum(1 for sequence in by_key.values() if any(b <= a for a, b in itertools.pairwise(sequence)))


class ChaosRun:
    def __init__(self, console: Console, settings: VerifySettings, work_dir: Path) -> None:
        self.console = console
        self.settings = settings
        self.work_dir = work_dir
        self.seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(2**31)
        self.random = random.Random(self.seed)
        self.cluster = Cluster(work_dir, settings.bootstrap_servers)
        self.in_topic = self.cluster.topic("verify-in")
        self.out_topic = self.cluster.topic("verify-out")
        self.sent = 0
        self.send_error: BaseException | None = None

    def _pipeline(self) -> PipelineProcess:
        args = run_arguments(
            self.cluster.bootstrap_servers,
            self.in_topic,
            self.out_topic,
            self.work_dir / "checkpoint",
            sql=MAP_SQL,
            trigger="500ms",
            delivery_guarantee=self.settings.delivery_guarantee,
            sink_options=self._hold_transactions_open(),
            extra=("--restart-attempts", "20", "--restart-delay", "1s"),
        )
        return PipelineProcess(self.work_dir / "pipeline.log", args, env=quick_start_environment())

    def _hold_transactions_open(self) -> tuple[str, ...]:
        if self.settings.delivery_guarantee != "exactly-once":
            return ()
        return ("debug.pauseAt=beforeCommit", f"debug.pauseMs={TRANSACTION_HOLD_MS}")

    def _send(self, producer: Producer, numbers: range, seconds: float) -> None:
        """Send the keyed records ``numbers`` spread over ``seconds``; idempotent, so a broker restart
        neither loses nor duplicates input."""
        try:
            pause = seconds / max(len(numbers), 1)
            for i in numbers:
                key = f"k{i % self.settings.keys}".encode()
                producer.produce(self.in_topic, key=key, value=str(i).encode())
                producer.poll(0)
                self.sent = i + 1
                time.sleep(pause)
            if producer.flush(120):
                raise SparkafkaError(
                    "the input producer could not deliver every record within 120 s"
                    + last_connection_failure()
                )
        except BaseException as error:
            self.send_error = error

    def _sending(self, producer: Producer, numbers: range, seconds: float) -> threading.Thread:
        sender = threading.Thread(
            target=self._send, args=(producer, numbers, seconds), name="verify-input", daemon=True
        )
        sender.start()
        return sender

    def run(self) -> tuple[Verdict, int, int]:
        """The verdict, the seed, and how many kills caught a transaction open."""
        settings = self.settings
        self.console.print(f"random seed: {self.seed} (replay with --seed {self.seed})", markup=False)
        parts = _split(settings.records, settings.kills + 1)
        part_seconds = settings.send_seconds / len(parts)
        kills_in_transactions = 0
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.cluster.start()
        pipeline: PipelineProcess | None = None
        try:
            self.cluster.create_topics([self.in_topic, self.out_topic], settings.partitions)
            with (
                progress,
                readers(self.cluster, self.out_topic, settings.partitions) as (uncommitted, committed),
            ):
                task = progress.add_task("starting the pipeline", total=settings.records)
                pipeline = self._pipeline().start()
                producer = self.cluster.producer()
                for number, part in enumerate(parts, start=1):
                    pipeline.wait_for("batch ", 180)  # it runs micro-batches: a kill now hits it working
                    sender = self._sending(producer, part, part_seconds)
                    if number > settings.kills:
                        sender.join()
                        break
                    kill_at = time.monotonic() + self.random.uniform(0.3, part_seconds)
                    inside_a_transaction = bool(self._hold_transactions_open()) and self.random.random() < 0.5
                    while time.monotonic() < kill_at:
                        progress.update(
                            task, completed=len(committed.records), description="sending and processing"
                        )
                        time.sleep(0.1)
                    # Else wherever the moment falls; so too when the part has been written and no
                    # more transactions come.
                    # At once: the task flushed its records before announcing the hold, and of the
                    # hold's TRANSACTION_HOLD_MS the log's polling may already have taken a part.
                    if inside_a_transaction:
                        pipeline.printed_within(HOLD_ANNOUNCEMENT, 10, new=True)
                    progress.update(task, description=f"kill -9 number {number} of {settings.kills}")
                    pipeline.kill_group()
                    # Nothing runs now that could end the killed pipeline's transaction.
                    bootstrap = self.cluster.bootstrap_servers
                    caught = transaction_open(bootstrap, self.out_topic, settings.partitions)
                    kills_in_transactions += caught
                    if settings.kill_broker:
                        self.cluster.restart_broker(kill=True)
                    time.sleep(self.random.uniform(0, 2))
                    pipeline = self._pipeline().start()
                    sender.join()
                if self.send_error is not None:
                    raise SparkafkaError(f"sending the input failed: {self.send_error}")
                progress.update(task, description="waiting for the pipeline to catch up")

                def all_arrived() -> bool:
                    progress.update(task, completed=len(committed.records))
                    return len(committed.records) >= settings.records

                caught_up = wait_until(all_arrived, settings.catch_up_timeout_s)
                pipeline.terminate()
                pipeline = None
                # A duplicate can arrive after the count was reached: the verdict counts everything the
                # output holds once its writer has stopped, read up to the latest offsets.
                progress.update(task, description="reading the output to its latest offsets")
                for reader in (uncommitted, committed):
                    reader.read_to_latest()
                progress.update(task, completed=len(committed.records))
                for reader in (uncommitted, committed):
                    if reader.error is not None:
                        raise SparkafkaError(
                            f"the {reader.isolation_level} output reader failed: {reader.error}"
                        )
                if not caught_up:
                    self.console.print(
                        "the pipeline did not catch up in time; the verdict counts what arrived"
                        + last_connection_failure(),
                        markup=False,
                    )
            expected = [f"EVENT({i})".encode() for i in range(settings.records)]
            verdict = judge(
                expected,
                committed.values(),
                uncommitted.values(),
                reordered=reordered_keys(committed.records),
            )
            return verdict, self.seed, kills_in_transactions
        finally:
            if pipeline is not None:
                pipeline.kill_group()
            self.cluster.stop()


def transaction_open(bootstrap_servers: str, topic: str, partitions: int) -> bool:
    """Whether a transaction is open on an output partition now: its last stable offset (the latest
    offset for read_committed readers) below its high watermark. Asked with the high watermarks first,
    so a transaction that ends between the two answers is not counted."""
    high = latest_offsets(bootstrap_servers, topic, partitions, "read_uncommitted")
    stable = latest_offsets(bootstrap_servers, topic, partitions, "read_committed")
    return any(stable[p] < high[p] for p in high)


def abort_markers(cluster: Cluster, topic: str) -> int | None:
    """The ABORT markers in ``topic``'s log, read from the embedded broker's files (as
    kafka-dump-log.sh prints them); None on another cluster, whose files are not at hand."""
    if not cluster.embedded:
        return None
    from sparkafka.broker.dumplog import dump_topic

    return sum("endTxnMarker: ABORT" in line for line in dump_topic(cluster.data_dir, topic))


def _split(records: int, parts: int) -> list[range]:
    """``range(records)`` cut into ``parts`` consecutive ranges of (nearly) equal length."""
    bounds = [records * part // parts for part in range(parts + 1)]
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


def run_verify(console: Console, settings: VerifySettings) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="sparkafka-verify-") as work:
        chaos = ChaosRun(console, settings, Path(work))
        verdict, seed, kills_in_transactions = chaos.run()
        aborts = abort_markers(chaos.cluster, chaos.out_topic)
    console.print(
        f"records={settings.records} kills={settings.kills} partitions={settings.partitions} "
        f"delivery-guarantee={settings.delivery_guarantee} kill-broker={settings.kill_broker} seed={seed}",
        markup=False,
    )
    console.print(
        f"lost={verdict.lost} duplicates={verdict.duplicates} reordered keys={verdict.reordered} "
        f"read_uncommitted duplicates={verdict.uncommitted_duplicates}",
        markup=False,
    )
    if settings.kills and settings.delivery_guarantee == "exactly-once":
        console.print(
            f"kills that caught a transaction open: {kills_in_transactions} of {settings.kills}"
            + ("" if kills_in_transactions else " (run again with another --seed, or more --records)"),
            markup=False,
        )
        counted = "not counted: the broker's files are not at hand" if aborts is None else str(aborts)
        console.print(f"ABORT markers in the output: {counted}", markup=False)
    console.print(verdict.line(), markup=False, highlight=False, soft_wrap=True)
    return verdict
