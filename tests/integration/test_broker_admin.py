"""Topic administration as Kafka answers it (ReplicationControlManager, ControllerApis, LogConfig):
every Kafka topic config is accepted and range-checked, errors come in Kafka's order, names that
collide or repeat are refused, and manual replica assignments name this broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.runner import BrokerProcess

from .kafka_clients import create_topic, producer
from .raw_kafka import RawConnection

pytestmark = pytest.mark.integration


def _create_error(admin: AdminClient, topic: NewTopic) -> int:
    with pytest.raises(KafkaException) as raised:
        admin.create_topics([topic])[topic.topic].result(30)
    return int(raised.value.args[0].code())


def _node_id(admin: AdminClient) -> int:
    """The id of the one broker, which a manual assignment or a broker resource names."""
    return int(next(iter(admin.list_topics(timeout=10).brokers)))


def _name() -> str:
    return f"admin-{uuid.uuid4().hex[:10]}"


def _metadata(broker: BrokerProcess) -> Any:
    """Metadata v12 of every topic: names with their topic ids."""
    with RawConnection(broker.port) as connection:
        request = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        return connection.roundtrip(request, MetadataResponse, version=12)


def test_every_kafka_topic_config_is_accepted_and_described(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name = _name()
    configs = {
        "compression.type": "gzip",
        "segment.ms": "3600000",
        "unclean.leader.election.enable": "False",
        "min.cleanable.dirty.ratio": "0.25",
        "cleanup.policy": "delete,compact",
        "retention.bytes": "-2",  # any negative value: no size limit
        "leader.replication.throttled.replicas": "0:1,1:1",
    }
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = admin.describe_configs([resource])[resource].result(30)
    for key, value in configs.items():
        assert described[key].value == value, key  # stored as given, not normalised
    assert described["segment.index.bytes"].value == "10485760"  # a default Kafka also describes
    assert "internal.segment.bytes" not in described  # internal: described only when set


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "1048575"),  # Kafka 4: at least 1 MiB
        ("segment.bytes", "0"),
        ("segment.bytes", "2147483648"),  # above an int
        ("retention.ms", "1_000"),  # Java's Long.parseLong takes no underscores
        ("retention.ms", "-2"),
        ("min.insync.replicas", "0"),
        ("max.message.bytes", "-1"),
        ("compression.type", "brotli"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("preallocate", "yes"),
        ("cleanup.policy", "delete,archive"),
        ("remote.storage.enable", "true"),  # no tiered storage on this broker
        ("no.such.config", "1"),
    ],
)
def test_an_invalid_topic_config_is_invalid_config(broker: BrokerProcess, key: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name = _name()
    assert _create_error(admin, NewTopic(name, 1, 1, config={key: value})) == KafkaError.INVALID_CONFIG
    assert name not in admin.list_topics(timeout=10).topics


def test_errors_come_in_kafkas_order(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    existing = _name()
    create_topic(broker.bootstrap_servers, existing)
    # "Create if not exists" code relies on TOPIC_ALREADY_EXISTS winning over the other checks.
    assert _create_error(admin, NewTopic(existing, 1, 3)) == KafkaError.TOPIC_ALREADY_EXISTS
    assert _create_error(admin, NewTopic("bad name!", 1, 3)) == KafkaError.TOPIC_EXCEPTION
    bad_config = NewTopic(_name(), 1, 3, config={"segment.bytes": "0"})
    assert _create_error(admin, bad_config) == KafkaError.INVALID_CONFIG
    assert _create_error(admin, NewTopic(_name(), 1, 3)) == KafkaError.INVALID_REPLICATION_FACTOR


def test_names_that_collide_or_end_in_a_newline_are_refused(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    base = _name()
    create_topic(broker.bootstrap_servers, f"{base}_x")
    # Kafka's Topic.hasCollision: '.' and '_' become the same character in metric names.
    assert _create_error(admin, NewTopic(f"{base}.x", 1, 1)) == KafkaError.TOPIC_EXCEPTION
    assert _create_error(admin, NewTopic(f"{base}\n", 1, 1)) == KafkaError.TOPIC_EXCEPTION


def test_a_manual_assignment_names_this_broker(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    node_id = _node_id(admin)
    name = _name()
    admin.create_topics([NewTopic(name, 2, replica_assignment=[[node_id], [node_id]])])[name].result(30)
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 2
    elsewhere = NewTopic(_name(), 1, replica_assignment=[[node_id + 1]])
    assert _create_error(admin, elsewhere) == KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_a_name_given_twice_in_one_request_is_refused_and_left_alone(broker: BrokerProcess) -> None:
    twice, once, existing = _name(), _name(), _name()
    create_topic(broker.bootstrap_servers, existing)
    topic = CreateTopicsRequest.CreatableTopic
    with RawConnection(broker.port) as connection:
        created = connection.roundtrip(
            CreateTopicsRequest(
                topics=[
                    topic(name=twice, num_partitions=1, replication_factor=1, assignments=[], configs=[]),
                    topic(name=once, num_partitions=1, replication_factor=1, assignments=[], configs=[]),
                    topic(name=twice, num_partitions=2, replication_factor=1, assignments=[], configs=[]),
                ],
                timeout_ms=10_000,
                validate_only=False,
            ),
            CreateTopicsResponse,
            version=5,
        )
        assert [(t.name, t.error_code) for t in created.topics] == [
            (twice, ErrorCode.INVALID_REQUEST),
            (once, ErrorCode.NONE),
        ]
        grown = connection.roundtrip(
            CreatePartitionsRequest(
                topics=[
                    CreatePartitionsRequest.CreatePartitionsTopic(name=existing, count=2, assignments=None),
                    CreatePartitionsRequest.CreatePartitionsTopic(name=existing, count=3, assignments=None),
                ],
                timeout_ms=10_000,
                validate_only=False,
            ),
            CreatePartitionsResponse,
            version=2,
        )
        assert [(t.name, t.error_code) for t in grown.results] == [(existing, ErrorCode.INVALID_REQUEST)]
        deleted = connection.roundtrip(
            DeleteTopicsRequest(topic_names=[existing, existing], timeout_ms=10_000),
            DeleteTopicsResponse,
            version=4,
        )
        assert [(t.name, t.error_code) for t in deleted.responses] == [(existing, ErrorCode.INVALID_REQUEST)]
    topics = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10).topics
    assert twice not in topics and once in topics
    assert len(topics[existing].partitions) == 1  # neither grown nor deleted


def test_delete_topics_v6_by_name_or_id_as_kafkas_controller(broker: BrokerProcess) -> None:
    """DeleteTopics v6 (Kafka's ControllerApis.deleteTopics): an entry names a topic or gives its id,
    not both nor neither; an unknown id is UNKNOWN_TOPIC_ID; an id given twice, or both by id and
    by name, deletes nothing."""
    by_name, by_id, twice, both_ways, kept = (_name() for _ in range(5))
    for name in (by_name, by_id, twice, both_ways, kept):
        create_topic(broker.bootstrap_servers, name)
    ids = {t.name: t.topic_id for t in _metadata(broker).topics}
    entry = DeleteTopicsRequest.DeleteTopicState
    zero, unknown = uuid.UUID(int=0), uuid.uuid4()
    request = DeleteTopicsRequest(
        topics=[
            entry(name=by_name, topic_id=zero),
            entry(name=None, topic_id=ids[by_id]),
            entry(name=kept, topic_id=ids[kept]),  # both: refused
            entry(name=None, topic_id=zero),  # neither: refused
            entry(name=None, topic_id=unknown),
            entry(name=f"{kept}-never", topic_id=zero),
            entry(name=None, topic_id=ids[twice]),
            entry(name=None, topic_id=ids[twice]),
            entry(name=None, topic_id=ids[both_ways]),
            entry(name=both_ways, topic_id=zero),
        ],
        timeout_ms=10_000,
    )
    with RawConnection(broker.port) as connection:
        answer = connection.roundtrip(request, DeleteTopicsResponse, version=6)
    # kafka-python reads the zero uuid as None.
    results = {(r.name, r.topic_id or zero): (r.error_code, r.error_message) for r in answer.responses}
    assert results == {
        (by_name, ids[by_name]): (ErrorCode.NONE, None),
        (by_id, ids[by_id]): (ErrorCode.NONE, None),
        (kept, ids[kept]): (ErrorCode.INVALID_REQUEST, "You may not specify both topic name and topic id."),
        (None, zero): (ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified."),
        (None, unknown): (ErrorCode.UNKNOWN_TOPIC_ID, "This server does not host this topic ID."),
        (f"{kept}-never", zero): (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "This server does not host this topic-partition.",
        ),
        (None, ids[twice]): (ErrorCode.INVALID_REQUEST, "Duplicate topic id."),
        (both_ways, ids[both_ways]): (
            ErrorCode.INVALID_REQUEST,
            "The provided topic name maps to an ID that was already supplied.",
        ),
    }
    left = {t.name for t in _metadata(broker).topics}
    assert {kept, twice, both_ways} <= left and not {by_name, by_id} & left


def test_a_null_config_value_is_invalid_config_and_the_rest_of_the_request_is_answered(
    broker: BrokerProcess,
) -> None:
    null_valued, fine = _name(), _name()
    topic = CreateTopicsRequest.CreatableTopic
    config = CreateTopicsRequest.CreatableTopic.CreatableTopicConfig
    with RawConnection(broker.port) as connection:
        created = connection.roundtrip(
            CreateTopicsRequest(
                topics=[
                    topic(
                        name=null_valued,
                        num_partitions=1,
                        replication_factor=1,
                        assignments=[],
                        configs=[config(name="retention.ms", value=None)],
                    ),
                    topic(name=fine, num_partitions=1, replication_factor=1, assignments=[], configs=[]),
                ],
                timeout_ms=10_000,
                validate_only=False,
            ),
            CreateTopicsResponse,
            version=5,
        )
        described = connection.roundtrip(
            DescribeConfigsRequest(
                resources=[
                    DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=2, resource_name=fine, configuration_keys=[]
                    )
                ],
                include_synonyms=False,
                include_documentation=False,
            ),
            DescribeConfigsResponse,
            version=4,
        )
    assert [(t.name, t.error_code) for t in created.topics] == [
        (null_valued, ErrorCode.INVALID_CONFIG),
        (fine, ErrorCode.NONE),
    ]
    # An empty key list asks for every config (Kafka's ConfigHelper), each with its type (KIP-569).
    entries = {entry.name: entry for entry in described.results[0].configs}
    assert len(entries) > 30
    assert entries["retention.ms"].config_type == 5  # LONG
    assert entries["cleanup.policy"].config_type == 7  # LIST


def test_a_topic_deleted_and_created_again_has_no_committed_offsets(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name, group = _name(), _name()
    create_topic(broker.bootstrap_servers, name)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    consumer.commit(offsets=[TopicPartition(name, 0, 5)], asynchronous=False)
    admin.delete_topics([name])[name].result(30)
    create_topic(broker.bootstrap_servers, name)
    # Kafka's GroupCoordinator.onPartitionsDeleted: offset 5 belonged to the old topic; resuming there
    # would skip the new topic's first five records.
    (committed,) = consumer.committed([TopicPartition(name, 0)], timeout=10)
    consumer.close()
    assert committed.offset == OFFSET_INVALID


def test_delete_records_on_a_topic_that_only_compacts_is_a_policy_violation(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name = _name()
    create_topic(broker.bootstrap_servers, name, config={"cleanup.policy": "compact"})
    sender = producer(broker.bootstrap_servers)
    for i in range(3):
        sender.produce(name, key=b"k", value=str(i).encode())
    assert sender.flush(30) == 0
    future = admin.delete_records([TopicPartition(name, 0, 2)])[TopicPartition(name, 0, 2)]
    with pytest.raises(KafkaException) as raised:
        future.result(30)
    assert raised.value.args[0].code() == KafkaError.POLICY_VIOLATION


def test_describe_configs_resources_as_kafka_names_them(broker: BrokerProcess) -> None:
    """Kafka's ConfigHelper: an impossible topic name is INVALID_TOPIC_EXCEPTION; a broker resource is
    this broker's id (its configs), "" (cluster-wide dynamic defaults: none here) or an error."""
    node_id = _node_id(AdminClient({"bootstrap.servers": broker.bootstrap_servers}))
    resource = DescribeConfigsRequest.DescribeConfigsResource
    with RawConnection(broker.port) as connection:
        described = connection.roundtrip(
            DescribeConfigsRequest(
                resources=[
                    resource(resource_type=2, resource_name="bad/name", configuration_keys=None),
                    resource(resource_type=4, resource_name=str(node_id), configuration_keys=None),
                    resource(resource_type=4, resource_name="", configuration_keys=None),
                    resource(resource_type=4, resource_name=str(node_id + 1), configuration_keys=None),
                ],
                include_synonyms=False,
                include_documentation=False,
            ),
            DescribeConfigsResponse,
            version=4,
        )
    answers = [(r.error_code, len(r.configs)) for r in described.results]
    assert answers[0] == (ErrorCode.INVALID_TOPIC_EXCEPTION, 0)
    assert answers[1][0] == ErrorCode.NONE and answers[1][1] > 0
    assert answers[2] == (ErrorCode.NONE, 0)
    assert answers[3] == (ErrorCode.INVALID_REQUEST, 0)


def test_create_partitions_checks_manual_assignments(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    node_id = _node_id(admin)
    name = _name()
    create_topic(broker.bootstrap_servers, name)
    for wrong in ([[node_id + 1]], [[node_id], [node_id]], [[node_id, node_id + 1]]):
        with pytest.raises(KafkaException) as raised:
            admin.create_partitions([NewPartitions(name, 2, replica_assignment=wrong)])[name].result(30)
        assert raised.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, wrong
    admin.create_partitions([NewPartitions(name, 2, replica_assignment=[[node_id]])])[name].result(30)
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 2
