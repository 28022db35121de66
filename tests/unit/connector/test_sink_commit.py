"""The driver's commit of a micro-batch refuses a batch whose write tasks did not all report."""

from __future__ import annotations

import pytest

from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.writer import KafkaStreamWriter, SinkCommitMessage
from sparkafka.errors import SparkafkaError

OPTIONS = SinkOptions.parse(
    {"kafka.bootstrap.servers": "localhost:9092", "topic": "out", "deliveryGuarantee": "exactly-once"}
)


def test_a_batch_with_a_task_that_reported_nothing_is_not_marked_committed() -> None:
    """Spark hands the commit None for a task whose message it did not get; marking the batch
    committed then could skip rows no transaction wrote."""
    with pytest.raises(
        SparkafkaError,
        match=r"^batch 7: 1 of 2 write tasks reported no result; refusing to mark the batch committed$",
    ):
        KafkaStreamWriter(OPTIONS).commit(
            [SinkCommitMessage(partition=0, records=5, query_id="q-1", batch_id=7), None], 7
        )


def test_a_refusal_that_cannot_be_recorded_says_what_accepting_then_costs_more() -> None:
    """A refusal offering acceptReshapedBatch records its run so that accepting keeps what the run
    committed; where the marker topic cannot be written, the refusal says accepting writes that again
    too (test_marker_writes.py: a run Spark names no id for, recorded as unknown)."""
    from sparkafka.errors import ReshapedReplayRefused

    refused = ReshapedReplayRefused("micro-batch 3 is replayed in another shape", batch_id=3)
    nowhere = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "operationTimeoutMs": "1000",
        }
    )
    for run in ("run-r", None):
        unwritten = KafkaStreamWriter(nowhere)._recorded(refused, "p", "q-1", run)
        assert str(unwritten).startswith("micro-batch 3 is replayed in another shape. This refusal could not")
        assert "writing the refusal record to the commit-marker topic" in str(unwritten)
        assert "accepting the batch writes again also what this run's tasks committed" in str(unwritten)
        assert unwritten.batch_id == 3
