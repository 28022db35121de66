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
