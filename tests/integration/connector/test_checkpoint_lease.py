"""Two processes on one checkpoint: the second is refused before it writes, naming the first; once
the first is SIGKILLed, a restart on the same host takes the checkpoint over at once. Real broker
processes (embedded and Apache Kafka), two `sparkafka run` pipelines."""

from __future__ import annotations

import socket
from pathlib import Path

from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import assert_exactly_once, committed_ids, create_topic, producer


def _send(bootstrap: str, topic: str, numbers: range) -> set[str]:
    sender = producer(bootstrap)
    for i in numbers:
        sender.produce(topic, value=f"r{i:05d}", partition=i % 2)
    assert sender.flush(30) == 0
    return {f"r{i:05d}" for i in numbers}


def test_a_second_process_on_a_running_querys_checkpoint_is_refused_naming_the_first(
    kafka: Kafka, tmp_path: Path, topic_name: str
) -> None:
    bootstrap = kafka.bootstrap_servers
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    arguments = run_arguments(
        bootstrap, source, sink, tmp_path / "checkpoint", sql="SELECT value FROM input", trigger="500ms"
    )
    sent = _send(bootstrap, source, range(200))
    first = PipelineProcess(tmp_path / "first.log", arguments).start()
    second = PipelineProcess(tmp_path / "second.log", arguments)
    try:
        committed_ids(bootstrap, sink, expect=200, partitions=2)
        second.start()
        assert second.process is not None
        assert second.process.wait(timeout=240) != 0, "the second process must stop"
        refusal = second.output()
        assert "is in use by another process" in refusal, refusal[-3000:]
        assert f"on host {socket.gethostname()}, started" in refusal
        second.process = None

        sent |= _send(bootstrap, source, range(200, 400))
        assert_exactly_once(committed_ids(bootstrap, sink, expect=400, partitions=2), sent)
        assert first.process is not None and first.process.poll() is None, "the first one runs on"

        first.kill_group()
        second.start()  # at once: the first's driver is gone, on this very host
        sent |= _send(bootstrap, source, range(400, 500))
        output = committed_ids(bootstrap, sink, expect=500, partitions=2)
        assert "taking over the lease of checkpoint" in second.output()
    finally:
        for pipeline in (first, second):
            if pipeline.process is not None:
                pipeline.kill_group()
    assert_exactly_once(output, sent)
