"""kill -9 of a `sparkafka run` pipeline's process group ends every process of the pipeline: the
transaction a write task held open stays open until a restart aborts it, as seed 001 shows, and no
process of the killed pipeline commits it behind the kill's back."""

from __future__ import annotations

import time
from pathlib import Path

from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.pipeline import SEED_MAP_SQL
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from sparkafka.tools.verify import transaction_open
from tests.integration.kafka_clients import create_topic, producer, read_to_end

HOLD_S = 4


def test_a_killed_pipelines_open_transaction_stays_open_until_a_restart_aborts_it(
    broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """The write task holds its transaction open for HOLD_S before committing. The pipeline's process
    group is killed during the hold; well after the hold would have ended, the transaction is still
    open and nothing of it is visible to read_committed readers. (A worker forked by a daemon that
    leads its own process group once survived such a kill and committed.)"""
    bootstrap = broker.bootstrap_servers
    source, sink = topic_name, f"{topic_name}-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    args = run_arguments(
        bootstrap,
        source,
        sink,
        tmp_path / "checkpoint",
        sql=SEED_MAP_SQL,
        trigger="500ms",
        sink_options=("debug.pauseAt=beforeCommit", f"debug.pauseMs={HOLD_S * 1000}"),
    )
    pipeline = PipelineProcess(tmp_path / "pipeline.log", args).start()
    try:
        send = producer(bootstrap)
        for number in range(20):
            send.produce(source, key=f"k{number}".encode(), value=f"v{number}".encode())
        assert send.flush(30) == 0
        pipeline.wait_for("sparkafka debug pause: beforeCommit", 180)
    finally:
        pipeline.kill_group()
    assert transaction_open(bootstrap, sink, 2), "the kill came while the write task held its transaction"
    time.sleep(HOLD_S + 3)  # the hold's end, and then some: a surviving worker would have committed
    assert transaction_open(bootstrap, sink, 2)
    assert read_to_end(bootstrap, sink, partitions=2) == []
    assert len(read_to_end(bootstrap, sink, partitions=2, isolation="read_uncommitted")) > 0
