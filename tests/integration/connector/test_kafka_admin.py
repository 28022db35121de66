"""The connector's admin queries (sparkafka.connector.kafka_admin.KafkaAdmin) against a real broker: topics
asked for by name, consumer-group commits the broker refuses, consumer-group offsets a transaction
holds uncommitted (KIP-447), and consumer-group offsets asked of a cluster just started."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.kafka_admin import KafkaAdmin
from sparkafka.errors import KafkaUnavailableError
from tests.integration.conftest import ALL_APACHE_KAFKAS, EMBEDDED, Kafka
from tests.integration.kafka_clients import create_topic, open_transaction


def test_topics_asked_for_by_name_are_never_created(broker: BrokerProcess) -> None:
    """The broker auto-creates topics (its default, as Kafka's): a missing topic asked for by name is
    left out of the answer and stays missing."""
    existing, missing = f"t-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, existing, partitions=3)
    admin = KafkaAdmin({"bootstrap.servers": broker.bootstrap_servers}, timeout_s=30, retry_interval_s=0.2)
    try:
        assert admin.topic_partitions([existing, missing]) == {existing: [0, 1, 2]}
        assert admin.topic_partitions([]) == {}
        everything = admin.topic_partitions()
        assert everything[existing] == [0, 1, 2]
        assert missing not in everything
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("topics", "what"), [(["t"], "describe topics"), (None, "list topics")], ids=["by-name", "all"]
)
def test_topics_on_an_unreachable_cluster_fail_after_the_timeout(topics: list[str] | None, what: str) -> None:
    """By name (subscribe) or all of them (subscribePattern): the error names the address and the
    option that sets the wait."""
    admin = KafkaAdmin({"bootstrap.servers": "127.0.0.1:1"}, timeout_s=2, retry_interval_s=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailableError) as raised:
            admin.topic_partitions(topics)
    finally:
        admin.close()
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert f"could not {what}: Kafka at bootstrap servers '127.0.0.1:1' did not answer within 2 s" in message
    assert "Check kafka.bootstrap.servers" in message
    assert "kafka.default.api.timeout.ms" in message


def test_a_commit_for_a_partition_the_topic_lacks_names_it(broker: BrokerProcess) -> None:
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION for that partition alone and stores the others."""
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic)
    admin = KafkaAdmin({"bootstrap.servers": broker.bootstrap_servers}, timeout_s=5, retry_interval_s=0.2)
    try:
        with pytest.raises(KafkaException) as raised:
            admin.commit_offsets(group, {(topic, 0): 1, (topic, 3): 5}, retry=False)
        error = raised.value.args[0]
        assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert f"consumer group '{group}' topic '{topic}' partition 3: " in error.str()
        assert f"see sparkafka topics describe {topic}" in error.str()
        assert admin.committed_offsets(group, [(topic, 0), (topic, 3)]) == {(topic, 0): 1}
    finally:
        admin.close()


def _group_with_pending_offsets(broker: BrokerProcess, topic: str, group: str):  # type: ignore[no-untyped-def]
    """The group committed offset 3 plainly; an open transaction now holds offset 7 for it."""
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    writer = open_transaction(bootstrap, f"tx-{group}", topic, b"output")
    writer.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], consumer.consumer_group_metadata(), 30)
    consumer.close()
    return writer


def test_stable_group_offsets_wait_for_the_transaction_that_holds_them(broker: BrokerProcess) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    writer = _group_with_pending_offsets(broker, topic, group)
    admin = KafkaAdmin({"bootstrap.servers": broker.bootstrap_servers}, timeout_s=30, retry_interval_s=0.2)
    try:
        # Unstable: what was committed before the transaction.
        assert admin.committed_offsets(group, [(topic, 0)]) == {(topic, 0): 3}
        committer = threading.Timer(1.0, writer.commit_transaction, args=(30,))
        committer.start()
        started = time.monotonic()
        assert admin.committed_offsets(group, [(topic, 0)], require_stable=True) == {(topic, 0): 7}
        assert time.monotonic() - started >= 0.9
        committer.join()
    finally:
        admin.close()


def test_offsets_an_open_transaction_never_settles_fail_after_the_timeout(broker: BrokerProcess) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    writer = _group_with_pending_offsets(broker, topic, group)
    admin = KafkaAdmin({"bootstrap.servers": broker.bootstrap_servers}, timeout_s=2, retry_interval_s=0.2)
    try:
        with pytest.raises(KafkaException) as raised:
            admin.committed_offsets(group, [(topic, 0)], require_stable=True)
        message = raised.value.args[0].str()
        assert (
            f"a transaction of consumer group '{group}' still holds uncommitted offsets for {topic}-0"
            in message
        )
        assert "sparkafka transactions list" in message
    finally:
        admin.close()
        writer.abort_transaction(30)


# Run in a process of its own: a crash there fails the test, where it would kill pytest.
_STABLE_OFFSETS_OF_A_NEW_GROUP = """
import sys
from sparkafka.connector.kafka_admin import KafkaAdmin
admin = KafkaAdmin({"bootstrap.servers": sys.argv[1]}, timeout_s=15, retry_interval_s=0.2)
print(admin.committed_offsets(sys.argv[2], [("t", 0)], require_stable=True))
"""


@pytest.mark.parametrize("fresh_kafka", [EMBEDDED, *ALL_APACHE_KAFKAS], indirect=True)
def test_group_offsets_asked_of_a_cluster_just_started_are_answered(fresh_kafka: Kafka) -> None:
    """An Apache Kafka just started answers a group's first OffsetFetch with NOT_COORDINATOR while
    its group coordinator loads, and librdkafka's AdminClient crashed the process with a segmentation
    fault on that answer (librdkafka issue #5040). A group that never committed has no offsets."""
    asked = subprocess.run(
        [
            sys.executable,
            "-c",
            _STABLE_OFFSETS_OF_A_NEW_GROUP,
            fresh_kafka.bootstrap_servers,
            f"g-{uuid.uuid4().hex[:8]}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0, f"exit code {asked.returncode}:\n{asked.stderr[-3000:]}"
    assert asked.stdout.strip() == "{}"
