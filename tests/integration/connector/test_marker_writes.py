"""The driver's own writes to the commit-marker topic when the topic refuses them: the write fails
naming the topic and what happens next; nothing is taken as written (real broker, the sink's own
code)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.commit_log import ProgressRecord, read_marker_partition, write_progress
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.errors import CommitMarkerError
from tests.integration.kafka_clients import create_topic


def _options(bootstrap: str, marker_topic: str) -> SinkOptions:
    return SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": "out",
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "operationTimeoutMs": "20s",
        }
    )


def test_a_progress_record_the_marker_topic_refuses_fails_the_commit_naming_the_topic(
    broker: BrokerProcess,
) -> None:
    """A marker topic whose max.message.bytes is below the progress record's size: the driver's
    commit fails (Spark then retries the batch) instead of going on without the record."""
    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(
        broker.bootstrap_servers,
        marker_topic,
        config={"cleanup.policy": "compact", "max.message.bytes": "100"},
    )
    options = _options(broker.bootstrap_servers, marker_topic)
    record = ProgressRecord("p", "q-1", 3, "plan", ('{"in":{"0":10}}',), int(time.time() * 1000))
    with pytest.raises(CommitMarkerError) as refused:
        write_progress(options, record)
    message = str(refused.value)
    assert f"writing the progress record to the commit-marker topic '{marker_topic}' failed" in message
    assert "the batch fails, and Spark retries it" in message
    assert read_marker_partition(options) == {}, "nothing of the record is in the topic"


def test_the_driver_writes_progress_with_one_producer_and_a_new_one_after_a_failure(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progress record every micro-batch goes through one idempotent producer per process and
    cluster, not a new one each time; a write that failed discards it, and the next write, once
    the topic accepts it again, starts a new one and lands; so does a write after the producer sat
    idle too long."""
    from sparkafka.connector.sink import commit_log

    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, marker_topic, config={"cleanup.policy": "compact"})
    options = _options(broker.bootstrap_servers, marker_topic)
    records = [ProgressRecord("p", "q-1", batch, None, None, int(time.time() * 1000)) for batch in range(3)]
    write_progress(options, records[0])
    first = commit_log.marker_producer(options)
    write_progress(options, records[1])
    assert commit_log.marker_producer(options) is first, "one producer for every batch"
    assert ProgressRecord.decode(read_marker_partition(options)["progress/p"]).batch_id == 1

    too_small = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(
        broker.bootstrap_servers, too_small, config={"cleanup.policy": "compact", "max.message.bytes": "100"}
    )
    with pytest.raises(CommitMarkerError):
        commit_log.produce_to_markers(
            options, too_small, {"progress/p": records[2].encode()}, "the progress record"
        )
    replacement = commit_log.marker_producer(options)
    assert replacement is not first, "a producer whose write failed is not used again"
    write_progress(options, records[2])
    assert ProgressRecord.decode(read_marker_partition(options)["progress/p"]).batch_id == 2
    assert commit_log.marker_producer(options) is replacement
    monkeypatch.setattr(commit_log, "MARKER_PRODUCER_IDLE_S", -1.0)
    assert commit_log.marker_producer(options) is not replacement, "an idle producer is dropped"


def test_a_write_sharing_the_producer_is_judged_by_its_own_records(tmp_path: Path) -> None:
    """Two writes in one process share the marker producer (one cluster): one whose topic does not
    exist (no auto-creation) waits out its timeout, and the other, started meanwhile, still succeeds
    at once, its record in its topic, instead of waiting for and failing by the other's record."""
    import threading

    from tests.conftest import FAST_BROKER_ARGS

    with BrokerProcess(
        tmp_path / "data", extra_args=[*FAST_BROKER_ARGS, "--no-auto-create-topics"]
    ) as broker:
        good = f"markers-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap_servers, good, config={"cleanup.policy": "compact"})
        healthy = _options(broker.bootstrap_servers, good)
        stuck = dataclasses.replace(
            healthy, marker_topic=f"missing-{uuid.uuid4().hex[:8]}", operation_timeout_s=8.0
        )
        write_progress(healthy, ProgressRecord("a", "q-a", 0, None, None, 0))  # the shared producer exists
        outcome: list[BaseException] = []

        def write_stuck() -> None:
            try:
                write_progress(stuck, ProgressRecord("b", "q-b", 0, None, None, 0))
            except BaseException as error:
                outcome.append(error)

        waiting = threading.Thread(target=write_stuck)
        waiting.start()
        time.sleep(0.5)
        started = time.monotonic()
        write_progress(healthy, ProgressRecord("a", "q-a", 1, None, None, 0))
        took = time.monotonic() - started
        waiting.join()
        assert took < 6, f"the healthy write waited {took:.1f} s for the other's record"
        assert ProgressRecord.decode(read_marker_partition(healthy)["progress/a"]).batch_id == 1
        assert len(outcome) == 1 and "not acknowledged in time" in str(outcome[0]), outcome


def test_a_refusal_is_recorded_with_the_run_of_the_writer_that_refused(broker: BrokerProcess) -> None:
    """The refusal record names the run by the writer's own id, made on the driver for each write
    of a batch (two writers, two runs), whatever job group or description Spark's tasks carry."""
    from sparkafka.connector.sink.commit_log import RefusalRecord
    from sparkafka.connector.sink.writer import KafkaStreamWriter
    from sparkafka.errors import ReshapedReplayRefused

    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, marker_topic, config={"cleanup.policy": "compact"})
    options = _options(broker.bootstrap_servers, marker_topic)
    writer, later = KafkaStreamWriter(options), KafkaStreamWriter(options)
    assert writer.run_id != later.run_id
    refused = ReshapedReplayRefused("micro-batch 4 is replayed in another shape", batch_id=4)
    assert writer._recorded(refused, "p", "q-1", writer.run_id) is refused
    recorded = RefusalRecord.decode(read_marker_partition(options)["refusal/p"])
    assert (recorded.query_id, recorded.batch_id, recorded.run_id) == ("q-1", 4, writer.run_id)


def test_an_acceptance_in_a_wrong_shape_is_recorded_as_rejected(broker: BrokerProcess) -> None:
    """The refusal record keeps its refused run and gains the rejected acceptance's, once."""
    from sparkafka.connector.sink.commit_log import RefusalRecord
    from sparkafka.connector.sink.writer import KafkaStreamWriter
    from sparkafka.errors import WrongShapeAcceptance

    marker_topic = f"markers-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, marker_topic, config={"cleanup.policy": "compact"})
    writer = KafkaStreamWriter(_options(broker.bootstrap_servers, marker_topic))
    refusal = RefusalRecord("p", "q-1", 4, "run-r", 1)
    refused = WrongShapeAcceptance("micro-batch 4 is accepted as written in another shape", batch_id=4)
    assert writer._rejected(refused, refusal, "run-d") is refused
    recorded = RefusalRecord.decode(read_marker_partition(writer.options)["refusal/p"])
    assert (recorded.run_id, recorded.rejected_runs) == ("run-r", ("run-d",))
    assert writer._rejected(refused, recorded, "run-d") is refused, "recorded once"
