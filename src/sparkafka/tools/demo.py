"""`sparkafka demo`: seed 001's Flink + Kafka exactly-once experiment, on Spark, as one command.

Steps (each shown on the progress display):
1. start the embedded broker in a temporary directory (or use ``--bootstrap-servers``);
2. create ``in`` and ``out``; start a read_uncommitted and a read_committed reader of ``out``;
3. send ``aa,bb`` and ``cc,dd``; start the exactly-once pipeline (``in`` line ``a,b`` -> ``out`` value
   ``EVENT(a,b)``), told to pause inside the transaction of every micro-batch after the first;
4. once the first batch is committed, send ``xx,yy``, ``zz,aa``, ``cc,dd``, ``mm,nn``; the pipeline
   writes them in a transaction and pauses before committing — read_uncommitted sees them,
   read_committed does not;
5. SIGKILL the pipeline's whole process group (seed 001's ``kill -9``) while that transaction is open;
6. restart the pipeline from its checkpoint: the new producer aborts the open transaction (ABORT
   marker) and the replayed micro-batch is written again and committed (COMMIT marker);
7. print each reader's timeline, the dump-log of ``out`` and the verdict.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from sparkafka.errors import SparkafkaError
from sparkafka.tools.harness import (
    Cluster,
    TopicReader,
    Verdict,
    judge,
    last_connection_failure,
    readers,
    wait_until,
)
from sparkafka.tools.pipeline_process import PipelineProcess, quick_start_environment, run_arguments

FIRST_WAVE = [b"aa,bb", b"cc,dd"]
SECOND_WAVE = [b"xx,yy", b"zz,aa", b"cc,dd", b"mm,nn"]
PIPELINE_START_TIMEOUT_S = 120


@dataclass
class DemoResult:
    verdict: Verdict
    timeline: list[str]
    dump: list[str]


def _event(line: bytes) -> bytes:
    return b"EVENT(" + line + b")"


def _format(reader: TopicReader, topic: str) -> list[str]:
    kind = "committed" if reader.isolation_level == "read_committed" else "uncommitted"
    return [
        f"Reading {kind} messages, now time is {datetime.fromtimestamp(r.arrived):%H:%M:%S.%f}"[:-3]
        + f"  ConsumerRecord(topic = {topic}, partition = {r.partition}, offset = {r.offset}, "
        f"CreateTime = {r.create_time_ms}, value = {r.value.decode('utf-8', 'replace')})"
        for r in reader.records
    ]


class Demo:
    def __init__(self, console: Console, bootstrap_servers: str | None, work_dir: Path, keep: bool) -> None:
        self.console = console
        self.work_dir = work_dir
        self.keep = keep
        self.cluster = Cluster(work_dir, bootstrap_servers)
        self.in_topic = self.cluster.topic("in")
        self.out_topic = self.cluster.topic("out")

    def _pipeline(self, *sink_options: str) -> PipelineProcess:
        args = run_arguments(
            self.cluster.bootstrap_servers,
            self.in_topic,
            self.out_topic,
            self.work_dir / "checkpoint",
            sql="SELECT concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input",
            sink_options=sink_options,
        )
        return PipelineProcess(self.work_dir / "pipeline.log", args, env=quick_start_environment())

    def _send(self, lines: list[bytes]) -> None:
        producer = self.cluster.producer()
        for line in lines:
            producer.produce(self.in_topic, value=line)
        if producer.flush(30):
            raise SparkafkaError(
                f"could not write the demo input to {self.in_topic} within 30 s{last_connection_failure()}"
            )

    def run(self) -> DemoResult:
        progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console
        )
        with progress:
            step = progress.add_task("starting the embedded Kafka broker", total=7)

            def advance(description: str) -> None:
                progress.update(step, advance=1, description=description)

            self.cluster.start()
            pipeline: PipelineProcess | None = None
            try:
                advance(f"creating topics {self.in_topic} and {self.out_topic}")
                self.cluster.create_topics([self.in_topic, self.out_topic], partitions=1)
                with readers(self.cluster, self.out_topic, 1) as (uncommitted, committed):
                    advance("sending aa,bb and cc,dd; starting the exactly-once pipeline (Spark)")
                    self._send(FIRST_WAVE)
                    pipeline = self._pipeline(
                        "debug.pauseAt=beforeCommit", "debug.pauseFromBatch=1", "debug.pauseMs=10min"
                    ).start()
                    self._await(
                        lambda: len(committed.records) >= len(FIRST_WAVE), pipeline, "the first batch"
                    )
                    advance("sending xx,yy zz,aa cc,dd mm,nn; the pipeline pauses inside its transaction")
                    self._send(SECOND_WAVE)
                    pipeline.wait_for("sparkafka debug pause: beforeCommit", PIPELINE_START_TIMEOUT_S)
                    self._await(
                        lambda: len(uncommitted.records) >= len(FIRST_WAVE) + len(SECOND_WAVE),
                        pipeline,
                        "the open transaction",
                    )
                    time.sleep(1)
                    advance("kill -9 of the pipeline while its transaction is open")
                    pipeline.kill_group()
                    time.sleep(2)  # seed 001 waits a while before restarting
                    advance("restarting the pipeline from its checkpoint")
                    pipeline = self._pipeline().start()
                    total = len(FIRST_WAVE) + len(SECOND_WAVE)
                    self._await(lambda: len(committed.records) >= total, pipeline, "the replayed batch")
                    advance("stopping the pipeline (checkpoint kept); reading the output to its end")
                    pipeline.terminate()
                    pipeline = None
                    # A duplicate could arrive after the count was reached: the verdict counts all the
                    # output holds once its writer has stopped.
                    for reader in (uncommitted, committed):
                        reader.read_to_latest()
                for reader in (uncommitted, committed):
                    if reader.error is not None:
                        raise SparkafkaError(f"the {reader.isolation_level} reader failed: {reader.error}")
                expected = [_event(line) for line in FIRST_WAVE + SECOND_WAVE]
                verdict = judge(expected, committed.values(), uncommitted.values())
                timeline = [*_format(uncommitted, self.out_topic), "", *_format(committed, self.out_topic)]
                dump = self._dump()
                advance("done")
                return DemoResult(verdict, timeline, dump)
            finally:
                if pipeline is not None:
                    pipeline.kill_group()
                self.cluster.stop()

    def _await(self, condition: Callable[[], bool], pipeline: PipelineProcess, what: str) -> None:
        if not wait_until(condition, PIPELINE_START_TIMEOUT_S):
            raise SparkafkaError(
                f"timed out waiting for {what}; the pipeline's output ends with:\n{pipeline.output()[-3000:]}"
            )

    def _dump(self) -> list[str]:
        if not self.cluster.embedded:
            return [
                f"(dump-log reads the broker's files; run kafka-dump-log.sh on a broker of {self.out_topic})"
            ]
        from sparkafka.broker.dumplog import dump_topic

        return list(dump_topic(self.cluster.data_dir, self.out_topic))


def run_demo(console: Console, bootstrap_servers: str | None, keep: bool) -> Verdict:
    work_dir = Path(tempfile.mkdtemp(prefix="sparkafka-demo-"))
    try:
        result = Demo(console, bootstrap_servers, work_dir, keep).run()
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    console.rule("what the two readers of 'out' saw (seed 001, programs 2 and 3)")
    for line in result.timeline:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.rule(
        "dump-log of 'out': the ABORT marker of the killed transaction, then the COMMIT of its replay"
    )
    for line in result.dump:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if keep:
        console.print(f"work directory kept: {work_dir}", markup=False)
    console.print(result.verdict.line(), markup=False, highlight=False, soft_wrap=True)
    return result.verdict
