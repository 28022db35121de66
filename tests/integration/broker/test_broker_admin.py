"""Topic administration as Kafka answers it (ReplicationControlManager, ControllerApis, LogConfig):
every Kafka topic config is accepted and range-checked, errors come in Kafka's order, names that
collide or repeat are refused, and manual replica assignments name this broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.jvm_order import java_hash_set
from sparkafka.broker.runner import BrokerProcess
from sparkafka.broker.settings import SETTINGS
from sparkafka.tools.harness import wait_until
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import create_topic, producer
from tests.integration.raw_kafka import RawConnection


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's broker: the embedded broker, then Apache Kafka (``kafka`` in conftest): the same
    assertions hold for both, or the embedded broker is wrong."""
    return kafka


def _create_error(admin: AdminClient, topic: NewTopic) -> int:
    with pytest.raises(KafkaException) as raised:
        admin.create_topics([topic])[topic.topic].result(30)
    return int(raised.value.args[0].code())


def _node_id(admin: AdminClient) -> int:
    """The id of the one broker, which a manual assignment or a broker resource names."""
    return int(next(iter(admin.list_topics(timeout=10).brokers)))


def _described_once_known(admin: AdminClient, resource: ConfigResource) -> dict[str, ConfigEntry]:
    """DescribeConfigs of a topic just created: Apache Kafka's broker answers UNKNOWN_TOPIC_OR_PARTITION
    until its metadata has the topic, which comes after CreateTopics' answer; a client retries."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return dict(admin.describe_configs([resource])[resource].result(30))
        except KafkaException as error:
            if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


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
    # Given, and described as Kafka describes it: parsed and written back (ConfigDef.convertToString).
    configs = {
        "compression.type": ("gzip", "gzip"),
        "segment.ms": (" +3600000 ", "3600000"),
        "unclean.leader.election.enable": ("False", "false"),
        "preallocate": ("TRUE", "true"),
        "min.cleanable.dirty.ratio": ("0.250", "0.25"),
        "cleanup.policy": ("delete , compact", "delete,compact"),
        "retention.bytes": ("-2", "-2"),  # any negative value: no size limit
        "leader.replication.throttled.replicas": ("0:1,1:1", "0:1,1:1"),
    }
    topic = CreateTopicsRequest.CreatableTopic
    request = CreateTopicsRequest(
        topics=[
            topic(
                name=name,
                num_partitions=1,
                replication_factor=1,
                assignments=[],
                configs=[
                    topic.CreatableTopicConfig(name=key, value=value) for key, (value, _) in configs.items()
                ],
            )
        ],
        timeout_ms=30000,
        validate_only=False,
    )
    with RawConnection(broker.port) as connection:
        created = connection.roundtrip(request, CreateTopicsResponse, 5).topics[0]
    assert created.error_code == ErrorCode.NONE
    # The controller's answer has the values as given.
    answered = {entry.name: entry.value for entry in created.configs}
    assert {key: answered[key] for key in configs} == {key: value for key, (value, _) in configs.items()}
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = _described_once_known(admin, resource)
    for key, (_, value) in configs.items():
        assert described[key].value == value, key
    # The topic's synonym, first of each config's, carries the same value.
    with RawConnection(broker.port) as connection:
        raw = connection.roundtrip(
            DescribeConfigsRequest(
                resources=[
                    DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=2, resource_name=name, configuration_keys=list(configs)
                    )
                ],
                include_synonyms=True,
                include_documentation=False,
            ),
            DescribeConfigsResponse,
            version=4,
        )
    synonyms = {
        entry.name: (entry.synonyms[0].name, entry.synonyms[0].value) for entry in raw.results[0].configs
    }
    assert synonyms == {key: (key, value) for key, (_, value) in configs.items()}
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
    """Kafka's ControllerApis: CreateTopics answers the names given once in the request's order, then
    those given more than once (in a java.util.HashSet's order) and __cluster_metadata, refused;
    CreatePartitions answers the repeated names first, then the others in a java.util.HashSet's
    order."""
    twice, again, once, existing = _name(), _name(), _name(), _name()
    create_topic(broker.bootstrap_servers, existing)
    topic = CreateTopicsRequest.CreatableTopic

    def creatable(name: str, partitions: int = 1) -> Any:
        return topic(name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[])

    with RawConnection(broker.port) as connection:
        created = connection.roundtrip(
            CreateTopicsRequest(
                topics=[
                    creatable(twice),
                    creatable("__cluster_metadata"),
                    creatable(again),
                    creatable(once),
                    creatable(twice, 2),
                    creatable(again),
                    creatable(twice),
                ],
                timeout_ms=10_000,
                validate_only=False,
            ),
            CreateTopicsResponse,
            version=5,
        )
        assert [(t.name, t.error_code, t.error_message) for t in created.topics] == [
            (once, ErrorCode.NONE, None),
            *(
                (name, ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
                for name in java_hash_set([twice, again])
            ),
            (
                "__cluster_metadata",
                ErrorCode.INVALID_REQUEST,
                "Creation of internal topic __cluster_metadata is prohibited.",
            ),
        ]
        unknown = [_name() for _ in range(5)]
        grown = connection.roundtrip(
            CreatePartitionsRequest(
                topics=[
                    CreatePartitionsRequest.CreatePartitionsTopic(name=name, count=count, assignments=None)
                    for name, count in [(existing, 2), *((name, 2) for name in unknown), (existing, 3)]
                ],
                timeout_ms=10_000,
                validate_only=False,
            ),
            CreatePartitionsResponse,
            version=2,
        )
        assert [(t.name, t.error_code) for t in grown.results] == [
            (existing, ErrorCode.INVALID_REQUEST),
            *(
                (name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                for name in java_hash_set([existing, *unknown])
                if name != existing
            ),
        ]
        deleted = connection.roundtrip(
            DeleteTopicsRequest(topic_names=[existing, existing], timeout_ms=10_000),
            DeleteTopicsResponse,
            version=4,
        )
        assert [(t.name, t.error_code) for t in deleted.responses] == [(existing, ErrorCode.INVALID_REQUEST)]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    assert wait_until(lambda: once in admin.list_topics(timeout=10).topics, 30)  # Kafka's metadata follows
    topics = admin.list_topics(timeout=10).topics
    assert not {twice, again, "__cluster_metadata", *unknown} & set(topics)
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
        describe = DescribeConfigsRequest(
            resources=[
                DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=2, resource_name=fine, configuration_keys=[]
                )
            ],
            include_synonyms=False,
            include_documentation=False,
        )
        # Apache Kafka answers CreateTopics once its controller committed the topic; the broker's
        # metadata image may learn of it a moment later, and until then DescribeConfigs answers
        # an error with no entries (UNKNOWN_TOPIC_OR_PARTITION), which a client retries.
        answers: list[Any] = []

        def described_without_error() -> bool:
            answers.append(connection.roundtrip(describe, DescribeConfigsResponse, version=4))
            return answers[-1].results[0].error_code == ErrorCode.NONE

        wait_until(described_without_error, timeout_s=30)
        described = answers[-1]
    assert [(t.name, t.error_code) for t in created.topics] == [
        (null_valued, ErrorCode.INVALID_CONFIG),
        (fine, ErrorCode.NONE),
    ]
    assert described.results[0].error_code == ErrorCode.NONE
    # An empty key list asks for every config (Kafka's ConfigHelper), each with its type (KIP-569).
    entries = {entry.name: entry for entry in described.results[0].configs}
    assert len(entries) > 30
    assert entries["retention.ms"].config_type == 5  # LONG
    assert entries["cleanup.policy"].config_type == 7  # LIST


def _commit_when_the_coordinator_answers(consumer: Consumer, offsets: list[TopicPartition]) -> None:
    """A group's first commit: Apache Kafka answers NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS)
    while the offsets topic's partition is still being created or loaded, and librdkafka hands a
    synchronous commit's retriable error back; the commit is made again, as a client retries it."""
    deadline = time.monotonic() + 60
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except KafkaException as error:
            retriable = error.args[0].code() in (
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_topic_deleted_and_created_again_has_no_committed_offsets(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name, group = _name(), _name()
    create_topic(broker.bootstrap_servers, name)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    _commit_when_the_coordinator_answers(consumer, [TopicPartition(name, 0, 5)])
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
    this broker's id (its configs), "" (cluster-wide dynamic defaults) or an error; a resource type
    Kafka does not know fails the whole request. Answers without a message of their own have the
    empty one."""
    node_id = _node_id(AdminClient({"bootstrap.servers": broker.bootstrap_servers}))
    resource = DescribeConfigsRequest.DescribeConfigsResource

    def describe(resources: list[Any]) -> Any:
        with RawConnection(broker.port) as connection:
            return connection.roundtrip(
                DescribeConfigsRequest(
                    resources=resources, include_synonyms=False, include_documentation=False
                ),
                DescribeConfigsResponse,
                version=4,
            )

    described = describe(
        [
            resource(resource_type=2, resource_name="bad/name", configuration_keys=None),
            resource(resource_type=4, resource_name=str(node_id), configuration_keys=None),
            resource(resource_type=4, resource_name="", configuration_keys=None),
            resource(resource_type=4, resource_name=str(node_id + 1), configuration_keys=None),
            resource(resource_type=4, resource_name="one", configuration_keys=None),
            resource(resource_type=4, resource_name=f"+{node_id}", configuration_keys=None),
            resource(resource_type=2, resource_name=_name(), configuration_keys=None),
        ]
    )
    answers = [(r.error_code, len(r.configs)) for r in described.results]
    assert answers[0] == (ErrorCode.INVALID_TOPIC_EXCEPTION, 0)
    assert answers[1][0] == ErrorCode.NONE and answers[1][1] > 0
    # Kafka 4.4 keeps a cluster-wide min.insync.replicas for its eligible leader replicas (KIP-966);
    # the embedded broker has no dynamic configs (docs/architecture.md).
    assert answers[2][0] == ErrorCode.NONE
    assert {entry.name for entry in described.results[2].configs} <= {"min.insync.replicas"}
    if isinstance(broker, BrokerProcess):
        assert answers[2][1] == 0
    assert [r.error_message for r in described.results[1:3]] == ["", ""]
    assert answers[3] == (ErrorCode.INVALID_REQUEST, 0)
    assert answers[5] == answers[1]  # Java's Integer.parseInt takes the sign
    assert [(r.error_code, r.error_message) for r in described.results[3:5] + described.results[6:]] == [
        (
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {node_id} or empty string, but received {node_id + 1}",
        ),
        (ErrorCode.INVALID_REQUEST, "Broker id must be an integer, but it is: one"),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ""),  # ConfigHelper sets the code alone
    ]
    unknown_type = describe(
        [
            resource(resource_type=4, resource_name=str(node_id), configuration_keys=None),
            resource(resource_type=99, resource_name="x", configuration_keys=None),
        ]
    )
    assert [(r.resource_type, r.error_code, r.error_message, r.configs) for r in unknown_type.results] == [
        (kind, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST.kafka_message, []) for kind in (4, 99)
    ]


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


def test_more_than_ten_thousand_partitions_in_one_request_are_refused_whole(broker: BrokerProcess) -> None:
    """Kafka's MAX_PARTITIONS_PER_BATCH: every topic of the request gets POLICY_VIOLATION, none is
    created; so does a CreatePartitions adding more than that."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    names = [_name(), _name()]
    futures = admin.create_topics([NewTopic(name, 5_001, 1) for name in names], operation_timeout=30)
    for name in names:
        with pytest.raises(KafkaException) as raised:
            futures[name].result(60)
        error = raised.value.args[0]
        assert error.code() == KafkaError.POLICY_VIOLATION
        assert error.str() == "Excessively large number of partitions per request."
    assert not set(names) & set(admin.list_topics(timeout=10).topics)
    name = _name()
    create_topic(broker.bootstrap_servers, name)
    with pytest.raises(KafkaException) as raised:
        admin.create_partitions([NewPartitions(name, 10_002)])[name].result(60)
    assert raised.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert raised.value.args[0].str() == "Excessively large number of additional partitions per request."
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 1


def _described(admin: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: (entry.value, entry.is_default) for name, entry in entries.items()}


def test_topic_configs_change_incrementally_and_take_effect_at_once(fresh_broker: BrokerProcess) -> None:
    """IncrementalAlterConfigs through confluent-kafka's admin client: SET, DELETE, APPEND and
    SUBTRACT on a topic's overrides; validate-only changes nothing; the log acts on the new
    cleanup.policy right away, and the overrides survive a restart."""
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap_servers})
    name = _name()
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.ms": "1000"})])[name].result(30)

    def alter(*entries: ConfigEntry, validate_only: bool = False) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=list(entries))
        admin.incremental_alter_configs([resource], validate_only=validate_only)[resource].result(30)

    op = AlterConfigOpType
    alter(ConfigEntry("max.message.bytes", "2000", incremental_operation=op.SET), validate_only=True)
    assert _described(admin, name)["max.message.bytes"][1]  # still the default
    alter(
        ConfigEntry("max.message.bytes", "2000", incremental_operation=op.SET),
        ConfigEntry("retention.ms", None, incremental_operation=op.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=op.APPEND),  # to the default
    )
    described = _described(admin, name)
    assert described["max.message.bytes"] == ("2000", False)
    assert described["retention.ms"] == ("604800000", True)
    assert described["cleanup.policy"] == ("delete,compact", False)
    alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=op.SUBTRACT))
    assert _described(admin, name)["cleanup.policy"] == ("compact", False)
    # Java's split drops a trailing empty item; Kafka 4 takes an empty list (neither policy) too.
    alter(ConfigEntry("cleanup.policy", "delete,", incremental_operation=op.APPEND))
    assert _described(admin, name)["cleanup.policy"] == ("compact,delete", False)
    alter(ConfigEntry("cleanup.policy", "delete,compact", incremental_operation=op.SUBTRACT))
    assert _described(admin, name)["cleanup.policy"] == ("", False)
    alter(ConfigEntry("cleanup.policy", "compact", incremental_operation=op.SET))

    # The log acts on it at once: DeleteRecords needs the delete policy (Kafka's POLICY_VIOLATION).
    sender = producer(fresh_broker.bootstrap_servers)
    sender.produce(name, key=b"k", value=b"v")
    assert sender.flush(30) == 0
    with pytest.raises(KafkaException) as refused:
        next(iter(admin.delete_records([TopicPartition(name, 0, 1)]).values())).result(30)
    assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION

    fresh_broker.terminate()
    fresh_broker.start()  # the same port and data directory
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap_servers})
    assert _described(admin, name)["cleanup.policy"] == ("compact", False)
    assert _described(admin, name)["max.message.bytes"] == ("2000", False)


def test_legacy_alter_configs_replaces_every_override(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    name = _name()
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.ms": "1000"})])[name].result(30)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, set_config={"segment.ms": "3600000"})
    admin.alter_configs([resource])[resource].result(30)
    described = _described(admin, name)
    assert described["segment.ms"] == ("3600000", False)
    assert described["retention.ms"] == ("604800000", True)  # not given again: dropped


def test_alter_configs_refuses_as_kafka(broker: BrokerProcess) -> None:
    """ConfigAdminManager.preprocess and the controller's checks, resource by resource, on the wire."""
    name = _name()
    create_topic(broker.bootstrap_servers, name)
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    change = resource.AlterableConfig

    def topic(topic_name: str, *changes: tuple[str, int, str | None]) -> Any:
        configs = [
            change(name=key, config_operation=operation, value=value) for key, operation, value in changes
        ]
        return resource(resource_type=2, resource_name=topic_name, configs=configs)

    node_id = str(_node_id(AdminClient({"bootstrap.servers": broker.bootstrap_servers})))
    request = IncrementalAlterConfigsRequest(
        resources=[
            topic(f"{name}-x", ("retention.ms", 0, "1")),
            topic(f"{name}-x", ("retention.ms", 0, "2")),  # the same resource twice
            topic(f"{name}-0", ("retention.ms", 0, "1"), ("retention.ms", 1, None)),
            topic(f"{name}-1", ("retention.ms", 0, None)),
            topic(f"{name}-2", ("retention.ms", 2, "5")),  # APPEND to a number
            topic(f"{name}-3", ("no.such.config", 0, "1")),
            topic(f"{name}-4", ("retention.ms", 0, "soon")),
            topic(f"{name}-missing", ("retention.ms", 0, "1")),
            topic("", ("retention.ms", 0, "1")),
            resource(
                resource_type=4,
                resource_name="",
                # Kafka cannot change log.dirs while running; the embedded broker no config at all.
                configs=[change(name="log.dirs", config_operation=0, value="/elsewhere")],
            ),
            resource(resource_type=99, resource_name="x", configs=[]),
            topic(f"{name}-5", ("min.compaction.lag.ms", 0, "10"), ("max.compaction.lag.ms", 0, "5")),
            resource(resource_type=4, resource_name=node_id, configs=[]),  # nothing to change: fine
            resource(resource_type=4, resource_name="one", configs=[]),
        ],
        validate_only=False,
    )
    with RawConnection(broker.port) as connection:
        answer = connection.roundtrip(request, IncrementalAlterConfigsResponse, version=1)
    got = [(r.error_code, r.error_message) for r in answer.responses]
    invalid_request, invalid_config = ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_CONFIG
    assert got[:4] == [
        (invalid_request, "Each resource must appear at most once."),
        (invalid_request, "Each resource must appear at most once."),
        (invalid_request, "Error due to duplicate config keys"),
        (invalid_request, "Null value not supported for : retention.ms"),
    ]
    assert got[4] == (invalid_config, "Can't APPEND to key retention.ms because its type is not LIST.")
    assert got[5] == (invalid_config, "Unknown topic config name: no.such.config")
    assert got[6] == (
        invalid_config,
        "Invalid value soon for configuration retention.ms: Not a number of type LONG",
    )
    assert got[7] == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}-missing' does not exist.")
    assert got[8] == (invalid_request, "Default topic resources are not allowed.")
    assert got[9] == (invalid_request, "Cannot update these configs dynamically: [log.dirs]")
    assert got[10] == (invalid_request, "Unknown resource type 99")
    assert got[11] == (
        invalid_config,
        "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)",
    )
    assert got[12:] == [
        (ErrorCode.NONE, None),
        (invalid_request, "Node id must be an integer, but it is: one"),
    ]
    assert _described(AdminClient({"bootstrap.servers": broker.bootstrap_servers}), name)["retention.ms"][1]


def test_describe_configs_lists_synonyms_and_the_source_they_give(tmp_path: Path, topic_name: str) -> None:
    """As Kafka's ConfigHelper: an unset topic config's source is its broker synonym's, and the
    synonyms run from the topic's override through the broker's static value to the default."""
    topic_source, static_source, default_source = 1, 4, 5
    with BrokerProcess(tmp_path / "data", extra_args=["--flush-messages", "5"]) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(topic_name, 1, 1, config={"segment.bytes": "5242880"})])[
            topic_name
        ].result(30)
        resource = DescribeConfigsRequest.DescribeConfigsResource
        request = DescribeConfigsRequest(
            resources=[resource(resource_type=2, resource_name=topic_name, configuration_keys=None)],
            include_synonyms=True,
            include_documentation=False,
        )
        with RawConnection(broker.port) as connection:
            answer = connection.roundtrip(request, DescribeConfigsResponse, version=4)
        entries = {entry.name: entry for entry in answer.results[0].configs}

        def synonyms(name: str) -> list[tuple[str, str, int]]:
            return [(s.name, s.value, s.source) for s in entries[name].synonyms]

        assert entries["segment.bytes"].config_source == topic_source
        assert synonyms("segment.bytes") == [
            ("segment.bytes", "5242880", topic_source),
            ("log.segment.bytes", "1073741824", default_source),
        ]
        assert (entries["flush.messages"].value, entries["flush.messages"].config_source) == (
            "5",
            static_source,
        )
        assert synonyms("flush.messages") == [
            ("log.flush.interval.messages", "5", static_source),
            ("log.flush.interval.messages", str(2**63 - 1), default_source),
        ]
        assert synonyms("retention.ms") == [] and entries["retention.ms"].config_source == default_source
        assert entries["retention.ms"].value == "604800000"  # log.retention.hours' 168 hours

        # The broker's own configs: Kafka leaves log.retention.ms unset (null) and lists the hours; the
        # broker configs behind topic configs are the dynamically changeable (not read-only) ones.
        node = str(_node_id(admin))
        request.resources = [resource(resource_type=4, resource_name=node, configuration_keys=None)]
        with RawConnection(broker.port) as connection:
            answer = connection.roundtrip(request, DescribeConfigsResponse, version=4)
        assert answer.results[0].error_code == 0
        configs = {
            e.name: (e.value, e.config_source, e.read_only, e.config_type) for e in answer.results[0].configs
        }
        int_type, long_type = 3, 5
        assert configs["log.retention.ms"] == (None, default_source, False, long_type)
        assert configs["log.retention.hours"] == ("168", default_source, True, int_type)
        assert configs["log.flush.interval.messages"] == ("5", static_source, False, long_type)
        assert configs["num.partitions"] == ("1", default_source, True, int_type)
        assert configs["log.roll.hours"] == ("168", default_source, True, int_type)
        # confluent-kafka's admin client reads the same answer (its synonyms keyed by name).
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic_name)])
        flush = next(iter(described.values())).result(30)["flush.messages"]
        assert flush.source == ConfigSource.STATIC_BROKER_CONFIG.value and not flush.is_default


# Broker configs the test harness sets for Apache Kafka in server.properties at Kafka's default (Kafka
# then reports them as static), and for the embedded broker on the command line (FAST_BROKER_ARGS).
_SET_BY_THE_HARNESS = {"num.partitions", "min.insync.replicas", "group.initial.rebalance.delay.ms"}


def test_every_broker_setting_is_described_with_kafkas_type_read_only_flag_and_default(broker: Kafka) -> None:
    """Each setting of the broker's table (sparkafka.broker.settings) under its Kafka name, as Kafka 4
    describes it: the same type and read-only flag (whether Kafka can change it on a running broker);
    where both brokers run with Kafka's default, the same value, source and synonyms. Kafka's internal
    configs are listed by neither."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest(
        resources=[resource(resource_type=4, resource_name=str(_node_id(admin)), configuration_keys=None)],
        include_synonyms=True,
        include_documentation=False,
    )
    with RawConnection(broker.port) as connection:
        answer = connection.roundtrip(request, DescribeConfigsResponse, version=4)
    assert answer.results[0].error_code == 0
    entries = {entry.name: entry for entry in answer.results[0].configs}
    default_source = 5
    for setting in SETTINGS:
        if not setting.described:  # an internal config of Kafka's
            assert setting.kafka_name not in entries
            continue
        assert setting.kafka_name in entries, f"{setting.kafka_name} is not described"
        entry = entries[setting.kafka_name]
        described = (entry.config_type, entry.read_only)
        assert described == (int(setting.type), setting.read_only), setting.kafka_name
        runs_with_kafkas_default = setting.kafka_default_text == setting.text(setting.default)
        if runs_with_kafkas_default and setting.kafka_name not in _SET_BY_THE_HARNESS:
            assert (entry.value, entry.config_source) == (setting.kafka_default_text, default_source), (
                setting.kafka_name
            )
            synonyms = [(s.name, s.value, s.source) for s in entry.synonyms]
            assert synonyms == [(setting.kafka_name, setting.kafka_default_text, default_source)]


def _creatable(
    name: str, partitions: int, factor: int, assignments: Sequence[tuple[int, list[int]]] = ()
) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    assignment = topic.CreatableReplicaAssignment
    return topic(
        name=name,
        num_partitions=partitions,
        replication_factor=factor,
        assignments=[assignment(partition_index=i, broker_ids=ids) for i, ids in assignments],
        configs=[],
    )


def test_create_topics_and_create_partitions_refuse_in_kafkas_order_and_words(broker: BrokerProcess) -> None:
    """The checks and messages of Kafka's ReplicationControlManager (createTopic, createPartitions,
    validateManualPartitionAssignment) and Topic.validate, which Java and librdkafka clients show."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    node = _node_id(admin)
    names = [_name() for _ in range(9)]
    cases = [
        (
            _creatable(names[0], 1, 0),
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        ),
        (
            _creatable(names[1], 0, 0),
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        ),
        (
            _creatable(names[2], 0, 1),
            ErrorCode.INVALID_PARTITIONS,
            "Number of partitions was set to an invalid non-positive value.",
        ),
        (
            _creatable(names[3], 1, 3),
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be "
            "reached because only 1 broker(s) are registered or some brokers have all their log directories "
            "cordoned.",
        ),
        (
            _creatable(names[4], -1, 1, [(0, [node])]),
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set to -1.",
        ),
        (
            _creatable(names[5], 1, -1, [(0, [node])]),
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        ),
        (
            _creatable(names[6], -1, -1, [(0, [node]), (0, [node])]),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "Found multiple manual partition assignments for partition 0",
        ),
        (
            _creatable(names[7], -1, -1, [(1, [node])]),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        ),
        (
            _creatable(names[8], -1, -1, [(0, [node, node])]),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment includes the broker {node} more than once.",
        ),
        (
            _creatable("a b", 1, 1),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            "Topic name is invalid: 'a b' contains one or more characters other than ASCII alphanumerics, "
            "'.', '_' and '-'",
        ),
        (
            _creatable("..", 1, 1),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            "Topic name is invalid: '..' is not allowed",
        ),
    ]
    existing = _name()
    create_topic(broker.bootstrap_servers, existing, partitions=2)
    grow = CreatePartitionsRequest.CreatePartitionsTopic
    growths = [
        (grow(name=_name(), count=3, assignments=None), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None),
        (
            grow(name=existing, count=2, assignments=None),
            ErrorCode.INVALID_PARTITIONS,
            "Topic already has 2 partition(s).",
        ),
        (
            grow(name=existing, count=1, assignments=None),
            ErrorCode.INVALID_PARTITIONS,
            f"The topic {existing} currently has 2 partition(s); 1 would not be an increase.",
        ),
    ]
    assignment = CreatePartitionsRequest.CreatePartitionsTopic.CreatePartitionsAssignment
    for replicas, message in (
        (
            [node + 4],
            f"The manual partition assignment includes broker {node + 4}, but no such broker is registered.",
        ),
        ([], "The manual partition assignment includes an empty replica list."),
        ([node, node], f"The manual partition assignment includes the broker {node} more than once."),
    ):
        growths.append(
            (
                grow(name=existing, count=3, assignments=[assignment(broker_ids=replicas)]),
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                message,
            )
        )
    with RawConnection(broker.port) as connection:
        for wanted, code, message in cases:
            created = connection.roundtrip(
                CreateTopicsRequest(topics=[wanted], timeout_ms=10_000, validate_only=False),
                CreateTopicsResponse,
                version=5,
            )
            assert [(t.error_code, t.error_message) for t in created.topics] == [(code, message)], wanted.name
        for wanted, code, message in growths:
            grown = connection.roundtrip(
                CreatePartitionsRequest(topics=[wanted], timeout_ms=10_000, validate_only=True),
                CreatePartitionsResponse,
                version=2,
            )
            assert [(t.error_code, t.error_message) for t in grown.results] == [(code, message)], wanted
    assert not set(names) & set(admin.list_topics(timeout=10).topics)


def test_a_topic_created_under_an_internal_name_is_internal_as_on_kafka(fresh_broker: BrokerProcess) -> None:
    """Kafka's Topic.isInternal goes by the name alone."""
    create_topic(fresh_broker.bootstrap_servers, "__consumer_offsets")
    create_topic(fresh_broker.bootstrap_servers, "plain")
    for _ in range(2):
        listed = {t.name: t.is_internal for t in _metadata(fresh_broker).topics}
        assert listed == {"__consumer_offsets": True, "plain": False}
        fresh_broker.terminate()
        fresh_broker.start()


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        (
            {"retention.ms": None, "segment.ms": None, "flush.ms": "1"},
            "Null value not supported for topic configs: retention.ms,segment.ms",
        ),
        ({"retention.ms": "x", "no.such": "1"}, "Unknown topic config name: no.such"),
        (
            {"max.message.bytes": " 99999999999"},
            "Invalid value  99999999999 for configuration max.message.bytes: Not a number of type INT",
        ),
        (
            {"preallocate": "yes"},
            "Invalid value yes for configuration preallocate: Expected value to be either true or false",
        ),
        (
            {"min.cleanable.dirty.ratio": "half"},
            "Invalid value half for configuration min.cleanable.dirty.ratio: Not a number of type DOUBLE",
        ),
        (
            {"min.cleanable.dirty.ratio": "1.5"},
            "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no more than 1",
        ),
        (
            {"retention.ms": "-2"},
            "Invalid value -2 for configuration retention.ms: Value must be at least -1",
        ),
        (
            {"compression.type": " brotli "},
            "Invalid value brotli for configuration compression.type: String must be one of: uncompressed, "
            "zstd, lz4, snappy, gzip, producer",
        ),
        (
            {"cleanup.policy": "delete, archive"},
            "Invalid value archive for configuration cleanup.policy: String must be one of: compact, delete",
        ),
        (
            {"compression.gzip.level": "0"},
            "Invalid value 0 for configuration compression.gzip.level: Value must be between 1 and 9 or "
            "equal to -1",
        ),
        (
            {"leader.replication.throttled.replicas": "0:1,x"},
            "Invalid value [0:1, x] for configuration leader.replication.throttled.replicas: "
            "leader.replication.throttled.replicas must be the literal '*' or a list of replicas in the "
            "following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
        ),
        (
            {"remote.storage.enable": "true"},
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote "
            "log storage.",
        ),
    ],
)
def test_create_topics_refuses_a_config_in_kafkas_words(
    broker: BrokerProcess, configs: dict[str, str | None], message: str
) -> None:
    """Kafka's controller: null values (all named), then LogConfig.validate's unknown names, then
    ConfigDef's parse and validator messages (ConfigException: 'Invalid value V for configuration N: ...')."""
    topic = CreateTopicsRequest.CreatableTopic
    wanted = topic(
        name=_name(),
        num_partitions=1,
        replication_factor=1,
        assignments=[],
        configs=[topic.CreatableTopicConfig(name=key, value=value) for key, value in configs.items()],
    )
    with RawConnection(broker.port) as connection:
        created = connection.roundtrip(
            CreateTopicsRequest(topics=[wanted], timeout_ms=10_000, validate_only=True),
            CreateTopicsResponse,
            version=5,
        )
    assert [(t.error_code, t.error_message) for t in created.topics] == [(ErrorCode.INVALID_CONFIG, message)]


def _described_group(admin: AdminClient, group: str) -> Any:
    """The group's description with its authorized operations. A fresh Apache Kafka's group
    coordinator answers NOT_COORDINATOR while it loads its offsets partition, which librdkafka's
    DescribeConsumerGroups hands back instead of asking again: asked again here, as Kafka's own
    admin client would."""
    retriable = {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
    deadline = time.monotonic() + 60
    while True:
        future = admin.describe_consumer_groups([group], include_authorized_operations=True)[group]
        try:
            return future.result(30)
        except KafkaException as error:
            if error.args[0].code() not in retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_describe_cluster_and_authorized_operations_answer_as_kafka_without_an_authorizer(
    broker: BrokerProcess, topic_name: str
) -> None:
    """DescribeCluster (Kafka's handleDescribeCluster) and the authorized operations Metadata and
    DescribeGroups report when asked: without an authorizer, every operation the resource type
    supports (AclEntry.supportedOperations)."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    create_topic(broker.bootstrap_servers, topic_name)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    node = _node_id(admin)
    assert cluster.cluster_id  # Kafka's is the one it was formatted with
    if isinstance(broker, BrokerProcess):
        assert cluster.cluster_id == "sparkafka-embedded"
    assert [(n.id, n.port) for n in cluster.nodes] == [(node, broker.port)]
    assert cluster.controller.id == node
    assert {op.name for op in cluster.authorized_operations} == {
        "CREATE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
        "ALTER",
        "DESCRIBE",
    }
    assert admin.describe_cluster().result(30).authorized_operations is None
    described = admin.describe_topics(TopicCollection([topic_name]), include_authorized_operations=True)
    assert {op.name for op in described[topic_name].result(30).authorized_operations} == {
        "READ",
        "WRITE",
        "CREATE",
        "DESCRIBE",
        "DELETE",
        "ALTER",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }
    group = f"g-{topic_name}"
    admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic_name, 0, 0)])]
    )[group].result(30)
    assert {op.name for op in _described_group(admin, group).authorized_operations} == {
        "READ",
        "DESCRIBE",
        "DELETE",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }
    assert AclOperation.DESCRIBE in cluster.authorized_operations

    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    with RawConnection(broker.port) as connection:
        answers = [
            connection.roundtrip(
                DescribeClusterRequest(
                    include_cluster_authorized_operations=False,
                    endpoint_type=endpoint,
                    include_fenced_brokers=False,
                ),
                DescribeClusterResponse,
                version=version,
            )
            for endpoint, version in [(1, 2), (2, 1), (7, 1)]
        ]
    assert [(a.error_code, a.error_message, a.controller_id, len(a.brokers)) for a in answers] == [
        (ErrorCode.NONE, None, node, 1),
        (
            ErrorCode.MISMATCHED_ENDPOINT_TYPE,
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type "
            "CONTROLLER",
            -1,
            0,
        ),
        (ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, "Unsupported endpoint type 7", -1, 0),
    ]
    assert answers[0].brokers[0].is_fenced is False


def test_describe_log_dirs_lists_the_asked_partitions_of_the_one_log_directory(
    broker: BrokerProcess, topic_name: str
) -> None:
    """As Kafka's ReplicaManager.describeLogDirs: the log directory with each asked partition's size
    (offset lag 0 on the leader), topics without an asked partition left out, the volume's bytes."""
    from kafka.protocol.admin import DescribeLogDirsRequest, DescribeLogDirsResponse

    create_topic(broker.bootstrap_servers, topic_name, partitions=2)
    writer = producer(broker.bootstrap_servers)
    writer.produce(topic_name, value=b"x" * 500, partition=1)
    assert writer.flush(30) == 0
    asked = DescribeLogDirsRequest.DescribableLogDirTopic
    with RawConnection(broker.port) as connection:
        some = connection.roundtrip(
            DescribeLogDirsRequest(
                topics=[asked(topic=topic_name, partitions=[1, 7]), asked(topic="nope", partitions=[0])]
            ),
            DescribeLogDirsResponse,
            version=4,
        )
        every = connection.roundtrip(DescribeLogDirsRequest(topics=None), DescribeLogDirsResponse, version=4)
    (directory,) = some.results
    assert (some.error_code, directory.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
    assert Path(directory.log_dir).is_absolute()
    assert 0 < directory.usable_bytes <= directory.total_bytes
    assert [
        (t.name, [(p.partition_index, p.offset_lag, p.is_future_key) for p in t.partitions])
        for t in directory.topics
    ] == [(topic_name, [(1, 0, False)])]
    assert directory.topics[0].partitions[0].partition_size > 500
    listed = {t.name: sorted(p.partition_index for p in t.partitions) for t in every.results[0].topics}
    assert listed[topic_name] == [0, 1]
