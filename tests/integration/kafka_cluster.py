"""What the tests of sparkafka on a 3-node Apache Kafka cluster (the ``cluster`` fixture, topics
``in`` and ``out`` replicated three times) share: input that keeps arriving while nodes die, and a
``sparkafka run`` pipeline from ``in`` to ``out`` that restarts from its checkpoint."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from sparkafka.connector.sink.transactional_ids import default_transactional_id_prefix, transactional_id
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.kafka_clients import producer, read_all

PARTITIONS = 2
# Each write task writes the rows of its input partition to the same output partition.
SAME_PARTITION = "SELECT value, partition FROM input"


class Feeder(threading.Thread):
    """Produces ``per_step`` records (ids ``r00000|…``) to ``in`` every half second, for ``steps``
    half seconds or, without ``steps``, until :meth:`finish`: input keeps arriving while nodes die,
    however long the pipeline takes to get there. The idempotent producer retries through outages of
    up to four minutes."""

    def __init__(self, bootstrap: str, *, per_step: int = 25, steps: int | None = None) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.per_step, self.steps = bootstrap, per_step, steps
        self.sent = 0
        self.undelivered = -1
        self._finishing = threading.Event()

    def run(self) -> None:
        sender = producer(self.bootstrap, acks="all", message_timeout_ms=240000)
        step = 0
        while not self._finishing.is_set() and (self.steps is None or step < self.steps):
            for i in range(self.sent, self.sent + self.per_step):
                sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=i % PARTITIONS)
            self.sent += self.per_step
            sender.poll(0)
            step += 1
            self._finishing.wait(0.5)
        self.undelivered = sender.flush(240)

    def finish(self) -> set[str]:
        """Stop sending, wait until every record sent is delivered, and return their ids."""
        self._finishing.set()
        self.join(timeout=300)
        assert not self.is_alive(), "the input producer did not finish within 300 s"
        assert self.undelivered == 0, "the input producer could not deliver every record"
        return {f"r{i:05d}" for i in range(self.sent)}


def pipeline_failures(pipeline: PipelineProcess) -> list[str]:
    """The start of each failure this run of a restarting pipeline logged (the error, without the
    query plan Spark appends), so an assertion names why the pipeline restarted."""
    return [failure[:1500] for failure in pipeline.output().split("pipeline failed (")[1:]]


def cluster_pipeline(
    kafka: ApacheKafka, tmp_path: Path, sink_options: tuple[str, ...] = ()
) -> PipelineProcess:
    """``in`` → ``out`` exactly-once, partition to partition, restarting up to five times."""
    args = run_arguments(
        kafka.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=SAME_PARTITION, trigger="500ms",
        sink_options=sink_options, extra=("--restart-attempts", "5", "--restart-delay", "2s"),
    )  # fmt: skip
    return PipelineProcess(tmp_path / "pipeline.log", args)


def committed_count(kafka: ApacheKafka, partition: int | None = None) -> int:
    """Records read_committed readers see in ``out`` (in one partition, or in all)."""
    messages = read_all(kafka.bootstrap_servers, "out", timeout_s=4, partitions=PARTITIONS)
    return len(messages) if partition is None else sum(1 for m in messages if m.partition() == partition)


def transactional_id_of(tmp_path: Path, write_partition: int) -> str:
    """The pipeline's transactional id of a write partition (its query id is in the checkpoint)."""
    query_id = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    return transactional_id(default_transactional_id_prefix(query_id), write_partition)
