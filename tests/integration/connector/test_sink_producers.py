"""The sink's transactional producers against a real broker: what a new producer knows before its
first transaction (librdkafka's own statistics, not timings)."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.commit_log import ensure_marker_topic
from sparkafka.connector.sink.id_state import task_producer
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.producers import discard_producer, learn_marker_partition_leaders
from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY
from sparkafka.connector.sink.task import TaskIdentity
from sparkafka.errors import CommitMarkerError, SparkafkaOptionError


class Statistics:
    """librdkafka's statistics of one client, as its stats_cb hands them over on a poll."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def config(self) -> dict[str, Any]:
        return {"statistics.interval.ms": 20, "stats_cb": lambda raw: self.reports.append(json.loads(raw))}

    def latest(self, producer: Producer) -> dict[str, Any]:
        """A report made after this call began (those queued before it are served first)."""
        producer.poll(0)
        seen = len(self.reports)
        deadline = time.monotonic() + 10
        while len(self.reports) <= seen + 1 and time.monotonic() < deadline:
            producer.poll(0.05)
        assert len(self.reports) > seen + 1, "librdkafka reported no statistics within 10 s"
        return self.reports[-1]


def _leaders(report: dict[str, Any], topic: str) -> dict[int, int]:
    """Partition -> leader the client knows for ``topic`` (librdkafka's -1 is its unassigned queue)."""
    partitions = report["topics"].get(topic, {}).get("partitions", {})
    return {int(p): stats["leader"] for p, stats in partitions.items() if int(p) >= 0}


def _options(bootstrap: str, marker_topic: str, **config: Any) -> SinkOptions:
    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": f"{marker_topic}-out",
            "deliveryGuarantee": "exactly-once",
            "commitMarkerTopic": marker_topic,
            "commitMarkerTopicPartitions": "4",
            "operationTimeoutMs": "20s",
        }
    )
    return dataclasses.replace(options, client_config={**options.client_config, **config})


def test_looking_up_the_marker_topic_teaches_a_new_producer_every_partitions_leader(
    broker: BrokerProcess, topic_name: str
) -> None:
    options = _options(broker.bootstrap_servers, topic_name)
    ensure_marker_topic(options)
    statistics = Statistics()
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, **statistics.config()})
    try:
        assert _leaders(statistics.latest(producer), topic_name) == {}
        learn_marker_partition_leaders(producer, topic_name, 20)
        assert _leaders(statistics.latest(producer), topic_name) == {0: 1, 1: 1, 2: 1, 3: 1}
    finally:
        producer.flush(5)


def test_a_producer_made_for_an_id_another_worker_had_knows_the_marker_leaders_before_its_first_write(
    broker: BrokerProcess, topic_name: str
) -> None:
    """An id that moved between Python workers: its registration exists, so the new producer writes
    nothing before the task's transaction. Its first transaction produces the marker just after the
    rows; had it to look up the marker topic then, librdkafka would ask only at its next fast refresh
    (retry.backoff.ms later), so the leaders must be known when the producer is handed out — and the
    output topic is not asked for (a look-up may create a topic; only a row written may)."""
    options = _options(broker.bootstrap_servers, topic_name)
    ensure_marker_topic(options)
    transactional_id = f"{topic_name}-prefix-0"
    identity = TaskIdentity(
        partition=0,
        stage_id=1,
        query_id=str(uuid.uuid4()),
        batch_id=0,
        spark_run_id=str(uuid.uuid4()),
        properties={},
    )
    first, first_run = task_producer(options, identity, transactional_id, other_prefixes=False)
    assert first_run.state.registered_query == identity.query_id  # the first write registered the id
    discard_producer(options, transactional_id)  # as if the next task ran in another worker

    statistics = Statistics()
    watched = _options(broker.bootstrap_servers, topic_name, **statistics.config())
    later = dataclasses.replace(identity, batch_id=1)
    moved, moved_run = task_producer(watched, later, transactional_id, other_prefixes=False)
    try:
        assert moved is not first
        assert moved_run.state.registered_query == identity.query_id  # nothing written to register it
        report = statistics.latest(moved.producer)
        assert _leaders(report, topic_name) == {0: 1, 1: 1, 2: 1, 3: 1}
        assert f"{topic_name}-out" not in report["topics"]
    finally:
        discard_producer(watched, transactional_id)


def test_a_look_up_that_gets_no_answer_is_logged_and_left_to_the_produce_that_needs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "logger": logging.getLogger("unreachable")}
    )
    with caplog.at_level(logging.DEBUG, logger="sparkafka.connector.sink.producers"):
        learn_marker_partition_leaders(producer, "markers", 0.2)
    assert "looking up the leaders of markers failed" in caplog.text


def test_a_new_producer_finds_a_marker_topic_deleted_meanwhile_gone_and_does_not_create_it_again(
    broker: BrokerProcess, topic_name: str
) -> None:
    """The embedded broker, as Kafka by default, creates a topic a producer's metadata request names
    (auto.create.topics.enable): the look-up of the marker topic's leaders must come after the read
    that finds a deleted marker topic gone, or it would leave an empty, deleting topic in its place."""
    options = _options(broker.bootstrap_servers, topic_name)
    ensure_marker_topic(options)
    transactional_id = f"{topic_name}-prefix-0"
    identity = TaskIdentity(0, 1, str(uuid.uuid4()), 0, str(uuid.uuid4()), {})
    task_producer(options, identity, transactional_id, other_prefixes=False)
    discard_producer(options, transactional_id)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_topics([topic_name], operation_timeout=20)[topic_name].result(20)

    later = dataclasses.replace(identity, batch_id=1, spark_run_id=str(uuid.uuid4()))
    with pytest.raises(CommitMarkerError, match=f"the commit-marker topic '{topic_name}'"):
        task_producer(options, later, transactional_id, other_prefixes=False)
    time.sleep(1)  # what a look-up would have created is listed by now
    assert topic_name not in admin.list_topics(timeout=10).topics


def test_a_marker_topic_a_client_created_again_after_its_deletion_is_refused_naming_the_deletion(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Any producer that knows the marker topic (every one that wrote a marker, every new one after
    its look-up) refreshes its metadata now and then, and a broker with auto.create.topics.enable
    creates the topic again after an operator deleted it, with the broker's defaults. The driver's
    next check refuses it for its cleanup policy, and must say that a deleted topic may be why: the
    markers are gone then, which compacting the new topic does not bring back."""
    options = _options(broker.bootstrap_servers, topic_name)
    ensure_marker_topic(options)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_topics([topic_name], operation_timeout=20)[topic_name].result(20)
    knowing = Producer({"bootstrap.servers": broker.bootstrap_servers})
    knowing.list_topics(topic_name, timeout=10)  # what a metadata refresh of a producer sends
    assert topic_name in admin.list_topics(timeout=10).topics

    with pytest.raises(SparkafkaOptionError) as refused:
        ensure_marker_topic(options)
    message = str(refused.value)
    assert f"'{topic_name}' has cleanup.policy=delete" in message
    assert "If the marker topic was deleted" in message
    assert "Restore the topic from a backup" in message


def test_a_producers_reading_of_its_id_serves_one_run_and_goes_with_the_producer(
    broker: BrokerProcess, topic_name: str
) -> None:
    """Steps 2 and 3 of the protocol: a pooled producer's reading of what its id committed serves
    the later batches of the run it was read in; a new run on the same producer reads again; a
    producer discarded after a failure takes its reading with it, and the next task's new producer
    reads again, whatever run it is in."""
    options = _options(broker.bootstrap_servers, topic_name)
    ensure_marker_topic(options)
    transactional_id = f"{topic_name}-prefix-0"
    identity = TaskIdentity(0, 1, str(uuid.uuid4()), 0, str(uuid.uuid4()), {APP_ID_PROPERTY: "local-1"})
    try:
        pooled, reading = task_producer(options, identity, transactional_id, other_prefixes=False)
        assert (reading.query_id, reading.spark_run_id, reading.first_batch) == (
            identity.query_id,
            identity.spark_run_id,
            0,
        )
        later = dataclasses.replace(identity, batch_id=1)
        assert task_producer(options, later, transactional_id, other_prefixes=False) == (pooled, reading)

        restarted = dataclasses.replace(identity, batch_id=2, spark_run_id=str(uuid.uuid4()))
        same, read_again = task_producer(options, restarted, transactional_id, other_prefixes=False)
        assert same is pooled and read_again is not reading
        assert (read_again.spark_run_id, read_again.first_batch) == (restarted.spark_run_id, 2)

        discard_producer(options, transactional_id)  # as step 6 does after a failed transaction
        retried = dataclasses.replace(restarted, batch_id=3)
        new, new_reading = task_producer(options, retried, transactional_id, other_prefixes=False)
        assert new is not pooled and new_reading is not read_again
        # Read again, but the run's first batch is still the one this machine recorded for the run.
        assert new_reading.first_batch == 2
        assert new_reading.state.registered_query == identity.query_id

        discard_producer(options, transactional_id)
        another_run = dataclasses.replace(restarted, batch_id=4, spark_run_id=str(uuid.uuid4()))
        _, other_reading = task_producer(options, another_run, transactional_id, other_prefixes=False)
        assert other_reading.first_batch == 4  # another run's record says nothing of this one
    finally:
        discard_producer(options, transactional_id)
