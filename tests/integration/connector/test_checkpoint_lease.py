"""Two processes on one checkpoint: a second one started while the first is in the middle of a
micro-batch is refused before it writes, naming the first; once the first is SIGKILLed, a restart
on the same host takes the checkpoint over at once. Real broker processes (embedded and Apache
Kafka), two `sparkafka run` pipelines."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import (
    assert_exactly_once,
    committed_ids,
    create_topic,
    producer,
    record_ids,
    wait_for_committed,
)

PAUSE = "sparkafka debug pause: beforeCommit"


def _send(bootstrap: str, topic: str, numbers: range) -> set[str]:
    sender = producer(bootstrap)
    for i in numbers:
        sender.produce(topic, value=f"r{i:05d}", partition=i % 2)
    assert sender.flush(30) == 0
    return {f"r{i:05d}" for i in numbers}


def _holder(checkpoint: Path) -> dict[str, object]:
    lease = json.loads((checkpoint / "sparkafka" / "lease.json").read_text())
    return dict(lease["holder"])


def test_a_second_process_on_a_running_querys_checkpoint_is_refused_naming_the_first(
    kafka: Kafka, tmp_path: Path, topic_name: str
) -> None:
    bootstrap = kafka.bootstrap_servers
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    checkpoint = tmp_path / "checkpoint"

    def pipeline(log: str, *held: str) -> PipelineProcess:
        arguments = run_arguments(
            bootstrap,
            source,
            sink,
            checkpoint,
            sql="SELECT value FROM input",
            trigger="500ms",
            sink_options=held,
        )
        return PipelineProcess(tmp_path / log, arguments)

    # The first holds micro-batch 1 open for a while: the second starts meanwhile and replays it.
    first = pipeline(
        "first.log",
        "debug.pauseAt=beforeCommit",
        "debug.pauseFromBatch=1",
        "debug.pauseMs=45s",
        "kafka.transaction.timeout.ms=600000",
    )
    second = pipeline("second.log")
    sent = _send(bootstrap, source, range(200))
    first.start()
    try:
        wait_for_committed(bootstrap, sink, expect=200, partitions=2)
        first_holder = _holder(checkpoint)
        assert first_holder["host"] == socket.gethostname()
        sent |= _send(bootstrap, source, range(200, 400))
        first.wait_for(PAUSE, timeout_s=120)
        second.start()
        assert second.process is not None
        assert second.process.wait(timeout=240) != 0, "the second process must stop"
        refusal = second.output()
        assert "is in use by another process" in refusal, refusal[-3000:]
        assert f"process {first_holder['pid']} on host {socket.gethostname()}, started" in refusal
        second.process = None
        assert_exactly_once(record_ids(wait_for_committed(bootstrap, sink, expect=400, partitions=2)), sent)
        assert first.process is not None and first.process.poll() is None, "the first one runs on"
        assert _holder(checkpoint) == first_holder

        first.kill_group()
        second.start()  # at once: the first's driver is gone, on this very host
        sent |= _send(bootstrap, source, range(400, 500))
        wait_for_committed(bootstrap, sink, expect=500, partitions=2)
        assert _holder(checkpoint)["pid"] != first_holder["pid"], "the restart took the lease over"
        output = committed_ids(bootstrap, sink, expect=500, partitions=2, stop=second.terminate)
    finally:
        for run in (first, second):
            if run.process is not None:
                run.kill_group()
    assert_exactly_once(output, sent)
