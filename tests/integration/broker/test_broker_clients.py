"""The broker with unmodified clients: produce/fetch, admin, consumer groups, kafka-python, bad input."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from sparkafka.broker import jvm_order
from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.harness import wait_until
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.conftest import APACHE_KAFKA, EMBEDDED, Kafka
from tests.integration.kafka_clients import create_topic, producer, read_all, transactional_producer, values
from tests.integration.raw_kafka import RawConnection, fetch_partitions_request, fetch_request


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's broker: the embedded broker, then Apache Kafka (``kafka`` in conftest): the same
    assertions hold for both, or the embedded broker is wrong."""
    return kafka


def test_idempotent_produce_and_fetch_across_partitions(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name, partitions=3)
    sender = producer(broker.bootstrap_servers, acks="all")
    for i in range(300):
        sender.produce(topic_name, key=f"k{i % 7}".encode(), value=f"v{i}".encode(), partition=i % 3)
    assert sender.flush(30) == 0
    received = read_all(broker.bootstrap_servers, topic_name, expect=300, partitions=3)
    assert sorted(values(received)) == sorted(f"v{i}".encode() for i in range(300))
    for p in range(3):
        offsets = [m.offset() for m in received if m.partition() == p]
        assert offsets == list(range(100))


def _partitions_listed(admin: AdminClient, name: str) -> int | None:
    """How many partitions with a leader the metadata lists for ``name`` (None: no such topic)."""
    listed = admin.list_topics(name, timeout=10).topics.get(name)
    if listed is None or listed.error is not None:
        return None
    return sum(1 for partition in listed.partitions.values() if partition.leader >= 0)


def test_admin_topics_configs_and_partitions(broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, 2, 1, config={"cleanup.policy": "compact"})])[
        topic_name
    ].result(30)
    # Apache Kafka answers CreateTopics, CreatePartitions and DeleteTopics once its controller has
    # them; its broker's metadata follows: a client waits for it.
    assert wait_until(lambda: _partitions_listed(admin, topic_name) == 2, 30)
    with pytest.raises(KafkaException) as exists:
        admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaException) as bad_config:
        admin.create_topics([NewTopic(f"{topic_name}-x", 1, 1, config={"no.such.config": "1"})])[
            f"{topic_name}-x"
        ].result(30)
    assert bad_config.value.args[0].code() == KafkaError.INVALID_CONFIG
    with pytest.raises(KafkaException) as bad_name:
        admin.create_topics([NewTopic("bad name!", 1, 1)])["bad name!"].result(30)
    assert bad_name.value.args[0].code() == KafkaError.TOPIC_EXCEPTION

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["retention.ms"].value == "604800000"

    admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(30)
    assert wait_until(lambda: _partitions_listed(admin, topic_name) == 4, 30)

    admin.delete_topics([topic_name])[topic_name].result(30)
    assert wait_until(lambda: topic_name not in admin.list_topics(timeout=10).topics, 30)


def test_produce_to_missing_topic_fails_without_auto_create(tmp_path, topic_name: str) -> None:
    with BrokerProcess(tmp_path / "data", extra_args=["--no-auto-create-topics"]) as strict:
        sender = producer(strict.bootstrap_servers, message_timeout_ms=3000)
        errors: list[KafkaError] = []
        sender.produce(topic_name, value=b"x", on_delivery=lambda err, msg: errors.append(err))
        sender.flush(10)
        assert errors and errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._MSG_TIMED_OUT)


def test_list_offsets_by_timestamp_and_delete_records(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    sender = producer(broker.bootstrap_servers)
    for i in range(10):
        sender.produce(topic_name, value=f"v{i}".encode(), timestamp=1_000_000 + i * 1000)
        sender.flush(10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "ts"})
    found = consumer.offsets_for_times([TopicPartition(topic_name, 0, 1_004_500)], timeout=10)
    assert found[0].offset == 5
    past_end = consumer.offsets_for_times([TopicPartition(topic_name, 0, 9_000_000)], timeout=10)
    assert past_end[0].offset == -1
    consumer.close()

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    result = admin.delete_records([TopicPartition(topic_name, 0, 4)])
    assert next(iter(result.values())).result(30).low_watermark == 4
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=6)) == [
        f"v{i}".encode() for i in range(4, 10)
    ]


def test_log_append_time_topics_stamp_batches_with_the_brokers_time(
    broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, config={"message.timestamp.type": "LogAppendTime"})
    create_topic(bootstrap, f"{topic_name}-create")
    reports: list[tuple[KafkaError | None, tuple[int, int]]] = []
    sender = producer(bootstrap)
    before_ms = int(time.time() * 1000)
    for i in range(3):
        sender.produce(
            topic_name,
            value=f"v{i}".encode(),
            timestamp=1_000 + i,
            on_delivery=lambda error, message: reports.append((error, message.timestamp())),
        )
        assert sender.flush(10) == 0  # a batch each
    sender.produce(
        f"{topic_name}-create",
        value=b"c",
        timestamp=1_000,
        on_delivery=lambda error, message: reports.append((error, message.timestamp())),
    )
    assert sender.flush(10) == 0
    after_ms = int(time.time() * 1000)

    # The produce response carries the append time; the client puts it on the delivery report.
    stamped = reports[:3]
    assert all(error is None and kind == TIMESTAMP_LOG_APPEND_TIME for error, (kind, _) in stamped)
    assert all(before_ms <= ms <= after_ms for _, (_, ms) in stamped)
    assert reports[3] == (None, (TIMESTAMP_CREATE_TIME, 1_000))  # a CreateTime topic: as sent

    # Readers see the append time on every record, and the rewritten batches pass the CRC check.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "check.crcs": True})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    received = []
    deadline = time.monotonic() + 10
    while len(received) < 3 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            received.append(message)
    assert [m.timestamp() for m in received] == [ts for _, ts in stamped]
    # Timestamp lookups use the append time too.
    first = consumer.offsets_for_times([TopicPartition(topic_name, 0, before_ms)], timeout=10)
    assert first[0].offset == 0
    later = consumer.offsets_for_times([TopicPartition(topic_name, 0, after_ms + 1)], timeout=10)
    assert later[0].offset == -1
    consumer.close()


def test_records_stamped_more_than_an_hour_ahead_are_refused_unless_the_topic_allows_it(
    broker: BrokerProcess, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    create_topic(bootstrap, f"{topic_name}-lenient", config={"message.timestamp.after.max.ms": "86400000"})
    ahead_ms = int(time.time() * 1000) + 2 * 3_600_000
    reports: list[KafkaError | None] = []
    sender = producer(bootstrap)
    for topic in (topic_name, f"{topic_name}-lenient"):
        sender.produce(topic, value=b"ahead", timestamp=ahead_ms, on_delivery=lambda e, _m: reports.append(e))
        assert sender.flush(10) == 0
    refused, taken = reports
    assert refused is not None and refused.code() == KafkaError.INVALID_TIMESTAMP, refused
    assert taken is None
    assert read_all(bootstrap, f"{topic_name}-lenient", expect=1)[0].timestamp() == (
        TIMESTAMP_CREATE_TIME,
        ahead_ms,
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic_name)])
    described = next(iter(configs.values())).result(10)
    assert described["message.timestamp.after.max.ms"].value == "3600000"
    assert described["message.timestamp.before.max.ms"].value == "9223372036854775807"


def test_min_insync_replicas_above_the_replication_factor_still_takes_acks_all(
    broker: BrokerProcess, topic_name: str
) -> None:
    # Kafka counts min(min.insync.replicas, replication factor): with one replica, acks=all succeeds.
    create_topic(broker.bootstrap_servers, topic_name, config={"min.insync.replicas": "2"})
    sender = producer(broker.bootstrap_servers, acks="all")
    sender.produce(topic_name, value=b"v")
    assert sender.flush(10) == 0
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"v"]


def test_consumer_group_commits_and_resumes(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name, partitions=2)
    sender = producer(broker.bootstrap_servers)
    for i in range(20):
        sender.produce(topic_name, value=f"v{i}".encode(), partition=i % 2)
    sender.flush(10)
    group = f"group-{topic_name}"

    def consume(count: int) -> list[bytes]:
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic_name])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(message.value())
                consumer.commit(message, asynchronous=False)
        consumer.close()
        return got

    first = consume(12)
    second = consume(8)
    assert len(first) == 12 and len(second) == 8
    assert sorted(first + second) == sorted(f"v{i}".encode() for i in range(20))

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    listed = admin.list_consumer_groups().result(30)
    assert group in {g.group_id for g in listed.valid}
    # ListGroups v5 (KIP-848): every group here is a classic one, and the types filter says so.
    classic = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(30).valid
    assert {g.type for g in classic if g.group_id == group} == {ConsumerGroupType.CLASSIC}
    modern = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(30).valid
    assert group not in {g.group_id for g in modern}


def test_kafka_python_admin_deletes_a_groups_offsets(broker: BrokerProcess, topic_name: str) -> None:
    """OffsetDelete over the wire: a subscribed topic's offsets stay (GROUP_SUBSCRIBED_TO_TOPIC), an
    unsubscribed one's go; an unknown group is GROUP_ID_NOT_FOUND."""
    import kafka.errors
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KafkaTopicPartition

    other = f"{topic_name}-other"
    for name in (topic_name, other):
        create_topic(broker.bootstrap_servers, name)
    group = f"group-{topic_name}"
    member = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    member.subscribe([topic_name])
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    assert member.assignment()
    member.commit(offsets=[TopicPartition(topic_name, 0, 3), TopicPartition(other, 0, 4)], asynchronous=False)

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        errors = admin.delete_group_offsets(
            group, [KafkaTopicPartition(topic_name, 0), KafkaTopicPartition(other, 0)]
        )
        assert errors == {
            KafkaTopicPartition(topic_name, 0): kafka.errors.GroupSubscribedToTopicError,
            KafkaTopicPartition(other, 0): kafka.errors.NoError,
        }
        committed = member.committed([TopicPartition(topic_name, 0), TopicPartition(other, 0)], timeout=10)
        assert [tp.offset for tp in committed] == [3, OFFSET_INVALID]
        # Partitions no topic has never reach the coordinator; its top-level error is the whole answer.
        missing = [KafkaTopicPartition(other, 5), KafkaTopicPartition(f"{other}-none", 0)]
        assert admin.delete_group_offsets(group, missing) == {
            tp: kafka.errors.UnknownTopicOrPartitionError for tp in missing
        }
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            admin.delete_group_offsets(f"no-{group}", [KafkaTopicPartition(other, 0), *missing])
    finally:
        admin.close()
        member.close()


def test_two_consumers_share_partitions_in_one_group(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name, partitions=4)
    group = f"group-{topic_name}"
    consumers = [
        Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "session.timeout.ms": 6000}
        )
        for _ in range(2)
    ]
    for consumer in consumers:
        consumer.subscribe([topic_name])
    deadline = time.monotonic() + 30
    assignments: list[list[TopicPartition]] = [[], []]
    while time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            consumer.poll(0.2)
            assignments[i] = consumer.assignment()
        if sum(len(a) for a in assignments) == 4 and all(assignments):
            break
    assert sorted(tp.partition for a in assignments for tp in a) == [0, 1, 2, 3]
    for consumer in consumers:
        consumer.close()


def test_kafka_python_client_transactions_and_groups(broker: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    admin.create_topics([KpNewTopic(topic_name, 1, 1)])
    admin.close()
    sender = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id=f"kp-{topic_name}")
    sender.init_transactions()
    sender.begin_transaction()
    sender.send(topic_name, b"aborted")
    sender.abort_transaction()
    sender.begin_transaction()
    sender.send(topic_name, b"committed")
    sender.commit_transaction()
    sender.close()

    reader = KafkaConsumer(
        topic_name,
        bootstrap_servers=broker.bootstrap_servers,
        group_id=f"kp-group-{topic_name}",
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    assert [m.value for m in reader] == [b"committed"]
    reader.commit()
    reader.close()


def _send_frame(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        try:
            return conn.recv(1024)
        except (ConnectionResetError, TimeoutError):
            return b""


def test_garbage_frames_close_only_their_connection(broker: BrokerProcess, topic_name: str) -> None:
    port = broker.port
    assert (
        _send_frame(port, struct.pack(">i", 2**30 + 1) + b"x") == b""
    )  # larger than socket.request.max.bytes
    assert (
        _send_frame(port, struct.pack(">i", 6) + b"\x00\x01\x00") == b""
    )  # truncated header, never completed
    assert (
        _send_frame(port, struct.pack(">i", 14) + struct.pack(">hhih", 999, 0, 7, 0) + b"ab") == b""
    )  # unknown api
    garbage_body = struct.pack(">hhih", 0, 9, 8, 0) + b"\xff" * 20  # Produce v9 with an undecodable body
    assert _send_frame(port, struct.pack(">i", len(garbage_body)) + garbage_body) == b""
    # A null where Kafka's schema has none fails the parse, as Kafka's generated readers fail it.
    from kafka.protocol.admin import AlterConfigsRequest

    resource = AlterConfigsRequest.AlterConfigsResource
    null_name = AlterConfigsRequest(
        resources=[
            resource(
                resource_type=2,
                resource_name=topic_name,
                configs=[resource.AlterableConfig(name=None, value="1")],
            )
        ],
        validate_only=False,
    )
    null_name.with_header(correlation_id=9, client_id="test")
    assert _send_frame(port, bytes(null_name.encode(version=1, header=True, framed=True))) == b""
    if isinstance(broker, BrokerProcess):  # the embedded broker's own log says why
        broker_log = broker.log_path.read_text()
        assert "non-nullable field Resources.Configs.Name was serialized as null" in broker_log
        assert "Traceback" not in broker_log
    # ApiVersions with an unknown version is answered (KIP-511) with UNSUPPORTED_VERSION; as of v3 its
    # header is a flexible one, which ends with tagged fields: without them it cannot be read.
    request = struct.pack(">hhih", 18, 99, 42, 0)
    assert _send_frame(port, struct.pack(">i", len(request)) + request) == b""
    request += b"\x00"  # no tagged fields
    answer = _send_frame(port, struct.pack(">i", len(request)) + request)
    _size, correlation_id, error, key_count = struct.unpack(">iihi", answer[:14])
    assert (correlation_id, error) == (42, 35)
    # Only ApiVersions' own versions, as Kafka's ApiVersionsRequest.getErrorResponse.
    assert key_count == 1 and struct.unpack(">h", answer[14:16])[0] == 18

    create_topic(broker.bootstrap_servers, topic_name)
    sender = transactional_producer(broker.bootstrap_servers, f"tx-{topic_name}")
    sender.init_transactions(30)
    sender.begin_transaction()
    sender.produce(topic_name, value=b"still serving")
    sender.commit_transaction(30)
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"still serving"]


def test_corrupt_batch_is_rejected_with_corrupt_message(broker: BrokerProcess, topic_name: str) -> None:
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    from sparkafka.broker.record_builder import encode_batch
    from sparkafka.broker.records import Record

    create_topic(broker.bootstrap_servers, topic_name)
    batch = bytearray(encode_batch([Record(0, int(time.time() * 1000), None, b"hello")], base_offset=0))
    batch[-1] ^= 0xFF  # flip a payload byte: the CRC32C no longer matches
    partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic_name, partition_data=[partition_class(index=0, records=bytes(batch))]
            )
        ],
    )
    request.with_header(correlation_id=5, client_id="test")
    answer = b""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as conn:
        conn.sendall(bytes(request.encode(version=8, header=True, framed=True)))
        while len(answer) < 4 or len(answer) < 4 + struct.unpack(">i", answer[:4])[0]:
            chunk = conn.recv(65536)
            assert chunk, "connection closed before the response"
            answer += chunk
    response = ProduceResponse.decode(answer, version=8, header=True, framed=True)
    assert response.responses[0].partition_responses[0].error_code == 2  # CORRUPT_MESSAGE


def test_broker_cli_rejects_bad_listen_address() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkafka", "broker", "--listen", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "HOST:PORT" in result.stderr


def test_metadata_names_an_impossible_topic_name_invalid(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's getTopicMetadata without auto-creation: INVALID_TOPIC_EXCEPTION for a name no topic can
    have, UNKNOWN_TOPIC_OR_PARTITION for a valid name of a topic that does not exist."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    wanted = [
        MetadataRequest.MetadataRequestTopic(topic_id=None, name=name) for name in ("bad/name", topic_name)
    ]
    with RawConnection(broker.port) as connection:
        for version in (8, 12):
            request = MetadataRequest(
                topics=wanted, allow_auto_topic_creation=False, include_topic_authorized_operations=False
            )
            response = connection.roundtrip(request, MetadataResponse, version=version)
            expected = {
                "bad/name": ErrorCode.INVALID_TOPIC_EXCEPTION,
                topic_name: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
            # Missing topics come in the order of Kafka's java.util.HashSet of them.
            assert [(t.name, t.error_code) for t in response.topics] == [
                (name, expected[name]) for name in jvm_order.java_hash_set(expected)
            ]


def test_metadata_lists_topics_in_kafkas_order(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's getTopicMetadata: the topics it has in the order of the Scala set of the names asked
    for (the order asked up to four names, then by hash), then the missing ones in the order of a
    java.util.HashSet copied from that set; a name given twice is answered once. Asked for every
    topic, it lists them in the order of a Scala mutable.HashSet."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    present = [f"{topic_name}-{i}" for i in range(6)]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in present]).values():
        future.result(30)
    assert wait_until(lambda: all(_partitions_listed(admin, name) == 1 for name in present), 30)
    missing = [f"{topic_name}-missing-{i}" for i in range(10)]

    def ask(names: list[str]) -> list[str]:
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=name) for name in names],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        with RawConnection(broker.port) as connection:
            return [t.name for t in connection.roundtrip(request, MetadataResponse, version=12).topics]

    def kafkas_order(names: list[str]) -> list[str]:
        asked = jvm_order.scala_set(names)
        copy_capacity = jvm_order.java_copied_hash_set_capacity(len(asked))
        return [n for n in asked if n in present] + jvm_order.java_hash_set(
            (n for n in asked if n not in present), capacity=copy_capacity
        )

    few = [missing[0], present[3], present[1], present[3]]
    assert ask(few) == [present[3], present[1], missing[0]]
    many = [*missing[::-1], *present, missing[0], *present[:2]]
    assert ask(many) == kafkas_order(many)
    assert ask(many) != [*present, *missing]  # ordered by hash, not as asked
    # Every topic: in the order of a Scala mutable.HashSet of their names.
    with RawConnection(broker.port) as connection:
        everything = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        listed = [t.name for t in connection.roundtrip(everything, MetadataResponse, version=12).topics]
    assert set(present) <= set(listed) and listed == jvm_order.scala_mutable_hash_set(sorted(listed))


def test_metadata_by_topic_id_answers_the_ids_alone(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's handleTopicMetadataRequest (useTopicId): once a request names a topic id, the ids say
    what is asked (unknown ones first, as UNKNOWN_TOPIC_ID without a name) and names are ignored."""
    import uuid as uuid_module

    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    create_topic(broker.bootstrap_servers, topic_name)
    entry = MetadataRequest.MetadataRequestTopic
    with RawConnection(broker.port) as connection:
        everything = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        listed = connection.roundtrip(everything, MetadataResponse, version=12)
        topic_id = next(t.topic_id for t in listed.topics if t.name == topic_name)
        unknown = uuid_module.uuid4()
        request = MetadataRequest(
            topics=[
                entry(topic_id=None, name=f"{topic_name}-by-name"),
                entry(topic_id=topic_id, name=None),
                entry(topic_id=unknown, name=f"{topic_name}-named-too"),
            ],
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
        response = connection.roundtrip(request, MetadataResponse, version=12)
        after = connection.roundtrip(everything, MetadataResponse, version=12)
    assert [(t.name, t.topic_id, t.error_code) for t in response.topics] == [
        (None, unknown, ErrorCode.UNKNOWN_TOPIC_ID),
        (topic_name, topic_id, ErrorCode.NONE),
    ]
    # The names were not even looked at: auto-creation, allowed, created neither.
    assert not {f"{topic_name}-by-name", f"{topic_name}-named-too"} & {t.name for t in after.topics}


def test_metadata_auto_creates_a_topic_as_kafka_4_does(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka 4's AutoTopicCreationManager: the request naming a missing topic gets
    UNKNOWN_TOPIC_OR_PARTITION while the creation goes ahead, the next finds the topic. A name
    colliding with a topic once '.' and '_' are alike is never created, and neither is one of Kafka's
    internal topics; a Metadata v12 request not allowing auto-creation creates nothing."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    create_topic(broker.bootstrap_servers, f"{topic_name}.dotted")

    def ask(names: list[str], allow: bool = True) -> list[tuple[str, int, bool, int]]:
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=name) for name in names],
            allow_auto_topic_creation=allow,
            include_topic_authorized_operations=False,
        )
        with RawConnection(broker.port) as connection:
            response = connection.roundtrip(request, MetadataResponse, version=12)
        return [(t.name, t.error_code, t.is_internal, len(t.partitions)) for t in response.topics]

    unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert ask([f"{topic_name}-not-allowed"], allow=False) == [
        (f"{topic_name}-not-allowed", unknown, False, 0)
    ]
    wanted = [topic_name, f"{topic_name}_dotted"]
    # A name given twice is answered once; the topics Kafka has come first, then the missing ones
    # (test_metadata_lists_topics_in_kafkas_order).
    first = ask([*wanted, topic_name])
    assert first == [(name, unknown, False, 0) for name in jvm_order.java_hash_set(wanted)]
    created = [(topic_name, 0, False, 1), (f"{topic_name}_dotted", unknown, False, 0)]
    if isinstance(broker, BrokerProcess):
        assert ask(wanted) == created  # the very next request finds it
    # Kafka's controller creates the topic after the answer: a client's next requests find it.
    assert wait_until(lambda: ask(wanted) == created, 30)

    # Kafka's internal topics are internal on both; Kafka creates them as it creates any other
    # (50 partitions), the embedded broker has none and creates none (docs/architecture.md).
    internal = ask(["__consumer_offsets", "__transaction_state"])
    assert sorted((name, is_internal) for name, _, is_internal, _ in internal) == [
        ("__consumer_offsets", True),
        ("__transaction_state", True),
    ]
    names = set(AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10).topics)
    assert topic_name in names and not names & {f"{topic_name}-not-allowed", f"{topic_name}_dotted"}
    if isinstance(broker, BrokerProcess):
        internal_names = ["__consumer_offsets", "__transaction_state"]
        assert internal == [(name, unknown, True, 0) for name in jvm_order.java_hash_set(internal_names)]
        assert not names & {"__consumer_offsets", "__transaction_state"}


def test_a_producer_writes_to_a_topic_it_has_auto_created(broker: BrokerProcess, topic_name: str) -> None:
    """The client retries the Metadata answer UNKNOWN_TOPIC_OR_PARTITION and then delivers."""
    sender = producer(broker.bootstrap_servers)
    sender.produce(topic_name, value=b"first")
    assert sender.flush(30) == 0
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"first"]


def test_fetch_sessions_and_failed_reads_answer_as_kafka(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-227, as Kafka's FetchManager: a full fetch of epoch 0 opens a session and names it; an
    incremental fetch of the session answers only the partitions with records, a new high watermark or
    an error, and must carry the session's next epoch; forgetting its last partition closes it, as
    does a full fetch naming it. An unknown session is FETCH_SESSION_ID_NOT_FOUND, a wrong epoch
    INVALID_FETCH_SESSION_EPOCH, both with no partitions and session id 0."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    create_topic(broker.bootstrap_servers, topic_name)
    sender = producer(broker.bootstrap_servers)
    sender.produce(topic_name, value=b"v")
    assert sender.flush(10) == 0
    produced = 1

    def fetch(
        session_id: int,
        epoch: int,
        version: int,
        offset: int | None = 0,
        *,
        forget: bool = False,
    ) -> tuple[int, int, list[tuple[int, int, int, int, bool]]]:
        """(error, session id, [(error, high watermark, last stable offset, log start offset, records?)]);
        no partition in the request when ``offset`` is None."""
        request = fetch_request(topic_name, offset or 0, session_id=session_id, session_epoch=epoch)
        request.max_wait_ms = 100
        if offset is None:
            request.topics = []
        if forget:
            request.forgotten_topics_data = [FetchRequest.ForgottenTopic(topic=topic_name, partitions=[0])]
        with RawConnection(broker.port) as connection:
            response = connection.roundtrip(request, FetchResponse, version)
        partitions = [
            (p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset, bool(p.records))
            for t in response.responses
            for p in t.partitions
        ]
        return response.error_code, response.session_id, partitions

    not_found, wrong_epoch = ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH
    for version in (7, 12):
        # A full fetch wanting no session; one opening a session.
        assert fetch(0, -1, version) == (0, 0, [(0, produced, produced, 0, True)])
        error, session, partitions = fetch(0, 0, version)
        assert (error, partitions) == (0, [(0, produced, produced, 0, True)]) and session > 0
        # At the end, nothing changed: the partition is left out. The same epoch again is refused.
        assert fetch(session, 1, version, offset=produced) == (0, session, [])
        assert fetch(session, 1, version, offset=None) == (wrong_epoch, 0, [])
        assert fetch(session, 2, version, offset=None) == (0, session, [])
        sender.produce(topic_name, value=b"v")
        assert sender.flush(10) == 0
        produced += 1
        # A record came: the partition is answered, with it, at the offset the session keeps.
        assert fetch(session, 3, version, offset=None) == (0, session, [(0, produced, produced, 0, True)])
        # Forgetting its only partition closes the session: answered without one.
        assert fetch(session, 4, version, offset=None, forget=True) == (0, 0, [])
        assert fetch(session, 5, version, offset=None) == (not_found, 0, [])
        # A full fetch naming a session closes it too.
        _, other, _ = fetch(0, 0, version)
        assert fetch(other, -1, version) == (0, 0, [(0, produced, produced, 0, True)])
        assert fetch(other, 1, version, offset=None) == (not_found, 0, [])
        assert fetch(1234, 1, version) == (not_found, 0, [])
        assert fetch(0, 3, version) == (not_found, 0, [])
        # A failed partition read carries no offsets, as in Kafka's ReplicaManager.
        assert fetch(0, -1, version, offset=5) == (0, 0, [(ErrorCode.OFFSET_OUT_OF_RANGE, -1, -1, -1, False)])


def test_api_versions_lists_kafka_4s_lowest_versions(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-896: Kafka 4 refuses the versions below its new baselines (CreateTopics v0-1, DeleteTopics
    v0, DescribeConfigs v0, Produce v0-2, ...) by closing the connection, and keeps Metadata v0. It
    still lists Produce from v0 (KAFKA-18659), while a Produce v2 request closes the connection."""
    from kafka.protocol.metadata import (
        ApiVersionsRequest,
        ApiVersionsResponse,
        MetadataRequest,
        MetadataResponse,
    )

    with RawConnection(broker.port) as connection:
        answer = connection.roundtrip(
            ApiVersionsRequest(client_software_name="tests", client_software_version="1"),
            ApiVersionsResponse,
            version=3,
        )
    listed = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert listed[0][0] == 0 and listed[3][0] == 0  # Produce, Metadata
    assert (listed[19][0], listed[20][0], listed[32][0]) == (
        2,
        1,
        1,
    )  # CreateTopics, DeleteTopics, DescribeConfigs

    create_topic(broker.bootstrap_servers, topic_name)
    with RawConnection(broker.port) as connection:  # v0: an empty list means every topic
        everything = connection.roundtrip(MetadataRequest(topics=[]), MetadataResponse, version=0)
    assert topic_name in {t.name for t in everything.topics}
    for api_key, version in ((0, 2), (19, 1), (20, 0), (32, 0)):
        header = struct.pack(">hhih", api_key, version, 7, 0)
        assert _send_frame(broker.port, struct.pack(">i", len(header) + 8) + header + bytes(8)) == b""


@pytest.mark.parametrize(
    "software", [("", "1.0"), ("my client", "1.0"), ("kafka-python", "2.0.2+local"), ("-x", "1")]
)
def test_api_versions_v3_refuses_an_invalid_client_software_name_or_version(
    broker: BrokerProcess, software: tuple[str, str]
) -> None:
    """KIP-511, as Kafka's ApiVersionsRequest.isValid: letters, digits, '-' and '.', starting and
    ending with a letter or digit; otherwise INVALID_REQUEST and no API keys."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    name, version = software
    request = ApiVersionsRequest(client_software_name=name, client_software_version=version)
    request.with_header(correlation_id=7, client_id="sparkafka-tests")
    with RawConnection(broker.port) as connection:
        connection.send_frame(bytes(request.encode(version=3, header=True)))
        # Decoded by hand: kafka-python reads any ApiVersions error answer as v0.
        refused = connection.read_frame()
        valid = ApiVersionsRequest(client_software_name="kafka-python", client_software_version="3.0.12")
        answered = connection.roundtrip(valid, ApiVersionsResponse, version=3)
    _size, correlation_id, error, compact_key_count = struct.unpack(">iihB", refused[:11])
    assert (correlation_id, error, compact_key_count - 1) == (7, ErrorCode.INVALID_REQUEST, 0)
    assert answered.error_code == ErrorCode.NONE and len(answered.api_keys) > 20


def test_fetch_waits_as_kafka_whatever_partitions_it_names(broker: BrokerProcess, topic_name: str) -> None:
    """KafkaApis.handleFetchRequest: partitions the broker lacks are answered UNKNOWN_TOPIC_OR_PARTITION
    beside the read, so a fetch of a known partition at its end still waits max_wait_ms; with no known
    partition (or none at all) the answer is immediate; min_bytes counts at most max_bytes."""
    from kafka.protocol.consumer import FetchResponse

    create_topic(broker.bootstrap_servers, topic_name)
    sender = producer(broker.bootstrap_servers)
    sender.produce(topic_name, value=b"v" * 50)
    assert sender.flush(10) == 0

    def fetch(request: Any) -> tuple[float, list[tuple[str, int, int, int]]]:
        with RawConnection(broker.port) as connection:
            started = time.monotonic()
            response = connection.roundtrip(request, FetchResponse, 12)
            took = time.monotonic() - started
        return took, [
            (t.topic, p.partition_index, p.error_code, len(p.records or b""))
            for t in response.responses
            for p in t.partitions
        ]

    unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    took, partitions = fetch(
        fetch_partitions_request(
            [(topic_name, 0, 1), (topic_name, 5, 0), ("no-such-topic", 0, 0)], max_wait_ms=1500
        )
    )
    assert took >= 1.2, took
    assert partitions == [
        (topic_name, 0, 0, 0),
        (topic_name, 5, unknown, 0),
        ("no-such-topic", 0, unknown, 0),
    ]
    took, partitions = fetch(
        fetch_partitions_request([(topic_name, 5, 0), ("no-such-topic", 0, 0)], max_wait_ms=5000)
    )
    assert took < 2.5 and partitions == [(topic_name, 5, unknown, 0), ("no-such-topic", 0, unknown, 0)]
    took, partitions = fetch(fetch_partitions_request([], max_wait_ms=5000))
    assert took < 2.5 and partitions == []
    # 50 bytes of value are there: min_bytes above max_bytes is max_bytes, which they exceed.
    took, partitions = fetch(
        fetch_partitions_request([(topic_name, 0, 0)], max_wait_ms=5000, min_bytes=10_000, max_bytes=60)
    )
    assert took < 2.5 and partitions[0][2] == 0 and partitions[0][3] > 50


def _produce_once(connection: RawConnection, topic: str, batch: bytes, *, acks: int = -1) -> Any:
    """One raw ProduceRequest v9 for partition 0; its partition response (None for acks=0)."""
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
    request = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[partition_class(index=0, records=batch)]
            )
        ],
    )
    if acks == 0:
        request.with_header(correlation_id=99, client_id="sparkafka-tests")
        connection._socket.sendall(bytes(request.encode(version=9, header=True, framed=True)))
        return None
    return connection.roundtrip(request, ProduceResponse, version=9).responses[0].partition_responses[0]


def test_produce_errors_carry_what_kafka_puts_in_them(broker: BrokerProcess, topic_name: str) -> None:
    """ReplicaManager.appendToLocalLog: an append that fails in the log answers the partition's log
    start offset, except for the errors it catches by type (too large, corrupt, unknown partition:
    -1); only a record validation error brings its own text (LogAppendResult.hasCustomErrorMessage)."""
    from sparkafka.broker.record_builder import encode_batch
    from sparkafka.broker.records import Record

    create_topic(broker.bootstrap_servers, topic_name, config={"max.message.bytes": "5000"})
    sender = producer(broker.bootstrap_servers)
    for i in range(3):
        sender.produce(topic_name, value=f"v{i}".encode())
    assert sender.flush(10) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    assert (
        next(iter(admin.delete_records([TopicPartition(topic_name, 0, 2)]).values())).result(30).low_watermark
        == 2
    )

    now = int(time.time() * 1000)
    good = encode_batch([Record(0, now, b"k", b"v")], base_offset=0)
    with RawConnection(broker.port) as connection:
        answers = {
            "offset": _produce_once(
                connection, topic_name, encode_batch([Record(7, now, b"k", b"v")], base_offset=7)
            ),
            "large": _produce_once(
                connection, topic_name, encode_batch([Record(0, now, b"k", b"x" * 6000)], base_offset=0)
            ),
            "future": _produce_once(
                connection, topic_name, encode_batch([Record(0, now + 7_200_000, b"k", b"v")], base_offset=0)
            ),
            "unknown": _produce_once(connection, "no-such-topic", good),
            "good": _produce_once(connection, topic_name, good),
        }
    got = {name: (a.error_code, a.log_start_offset, a.error_message) for name, a in answers.items()}
    assert got["offset"] == (ErrorCode.INVALID_RECORD, 2, None)
    assert got["large"] == (ErrorCode.MESSAGE_TOO_LARGE, -1, None)
    assert got["future"][:2] == (ErrorCode.INVALID_TIMESTAMP, 2)
    assert got["future"][2] == "One or more records have been rejected due to invalid timestamp"
    assert got["unknown"] == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, None)
    assert got["good"] == (ErrorCode.NONE, 2, None)


def test_a_failed_acks_0_produce_closes_the_connection(broker: BrokerProcess, topic_name: str) -> None:
    """KafkaApis.handleProduceRequest: acks=0 gets no answer; when a partition failed the broker closes
    the connection instead, the only way such a producer learns of it (and refreshes its metadata)."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    from sparkafka.broker.record_builder import encode_batch
    from sparkafka.broker.records import Record

    create_topic(broker.bootstrap_servers, topic_name)
    batch = encode_batch([Record(0, int(time.time() * 1000), b"k", b"v")], base_offset=0)
    with RawConnection(broker.port) as connection:
        _produce_once(connection, topic_name, batch, acks=0)
        # Still open: the next request on it is answered.
        versions = connection.roundtrip(ApiVersionsRequest(), ApiVersionsResponse, 0)
        assert versions.error_code == 0
        _produce_once(connection, "no-such-topic", batch, acks=0)
        assert connection.closed_by_peer()
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"v"]


def test_delete_records_checks_the_policy_before_the_offset(broker: BrokerProcess, topic_name: str) -> None:
    """Partition.deleteRecordsOnLeader: a compact-only topic is POLICY_VIOLATION even for an offset past
    its high watermark; a topic with an empty cleanup.policy may have its records deleted."""
    from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

    compact, unbounded = f"{topic_name}-compact", f"{topic_name}-none"
    create_topic(broker.bootstrap_servers, compact, config={"cleanup.policy": "compact"})
    create_topic(broker.bootstrap_servers, unbounded, config={"cleanup.policy": ""})
    sender = producer(broker.bootstrap_servers)
    for name in (compact, unbounded):
        for i in range(3):
            sender.produce(name, key=b"k", value=str(i).encode())
    assert sender.flush(10) == 0

    def delete(topic: str, offset: int) -> tuple[int, int]:
        topic_class = DeleteRecordsRequest.DeleteRecordsTopic
        request = DeleteRecordsRequest(
            topics=[
                topic_class(
                    name=topic,
                    partitions=[topic_class.DeleteRecordsPartition(partition_index=0, offset=offset)],
                )
            ],
            timeout_ms=5000,
        )
        with RawConnection(broker.port) as connection:
            response = connection.roundtrip(request, DeleteRecordsResponse, 2)
        (result,) = response.topics[0].partitions
        return result.error_code, result.low_watermark

    assert delete(compact, 100) == (ErrorCode.POLICY_VIOLATION, -1)
    assert delete(unbounded, 100) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert delete(unbounded, 2) == (ErrorCode.NONE, 2)
    assert delete(unbounded, -1) == (ErrorCode.NONE, 3)


def test_group_requests_answer_as_kafka_4(broker: BrokerProcess, topic_name: str) -> None:
    """KafkaApis before the group coordinator: an OffsetCommit of only unknown partitions asks no
    coordinator (no group comes of it); SyncGroup v5 without protocol type or name is
    INCONSISTENT_GROUP_PROTOCOL; FindCoordinator's old versions say "NONE" on success and name no node
    on an error; OffsetFetch has an entry for every topic asked for; ListGroups trims state names."""
    from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse
    from kafka.protocol.consumer import (
        OffsetCommitRequest,
        OffsetCommitResponse,
        OffsetFetchRequest,
        OffsetFetchResponse,
        SyncGroupRequest,
        SyncGroupResponse,
    )
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

    create_topic(broker.bootstrap_servers, topic_name)
    group = f"simple-{topic_name}"
    topic_class = OffsetCommitRequest.OffsetCommitRequestTopic
    with RawConnection(broker.port) as connection:
        committed = connection.roundtrip(
            OffsetCommitRequest(
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                retention_time_ms=-1,
                topics=[
                    topic_class(
                        name="no-such-topic",
                        partitions=[
                            topic_class.OffsetCommitRequestPartition(
                                partition_index=0,
                                committed_offset=3,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                        ],
                    )
                ],
            ),
            OffsetCommitResponse,
            8,
        )
        assert committed.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        listed = connection.roundtrip(
            ListGroupsRequest(states_filter=[], types_filter=[]), ListGroupsResponse, 5
        )
        assert group not in {g.group_id for g in listed.groups}

        synced = connection.roundtrip(
            SyncGroupRequest(
                group_id=group,
                generation_id=1,
                member_id="m",
                group_instance_id=None,
                protocol_type=None,
                protocol_name="range",
                assignments=[],
            ),
            SyncGroupResponse,
            5,
        )
        assert synced.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

        found = connection.roundtrip(
            FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse, 3
        )
        assert (found.error_code, found.error_message, found.port) == (0, "NONE", broker.port)
        unknown_type = connection.roundtrip(
            FindCoordinatorRequest(key=group, key_type=7), FindCoordinatorResponse, 3
        )
        assert (unknown_type.error_code, unknown_type.node_id, unknown_type.host, unknown_type.port) == (
            ErrorCode.INVALID_REQUEST,
            -1,
            "",
            -1,
        )
        assert unknown_type.error_message.startswith(
            "This most likely occurs because of a request being malformed"
        )

        sender = producer(broker.bootstrap_servers)
        sender.produce(topic_name, value=b"v")
        assert sender.flush(10) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 1)], asynchronous=False)
        consumer.close()
        listed = connection.roundtrip(
            ListGroupsRequest(states_filter=[" Empty "], types_filter=[]), ListGroupsResponse, 5
        )
        assert group in {g.group_id for g in listed.groups}
        fetch_topic = OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics
        fetched = connection.roundtrip(
            OffsetFetchRequest(
                groups=[
                    OffsetFetchRequest.OffsetFetchRequestGroup(
                        group_id=group,
                        topics=[
                            fetch_topic(name=topic_name, partition_indexes=[0]),
                            fetch_topic(name="no-partitions", partition_indexes=[]),
                        ],
                    )
                ],
                require_stable=False,
            ),
            OffsetFetchResponse,
            8,
        )
        answered = [
            (t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
            for t in fetched.groups[0].topics
        ]
        assert answered == [(topic_name, [(0, 1)]), ("no-partitions", [])]


@pytest.mark.parametrize("kind", [EMBEDDED, APACHE_KAFKA])
def test_group_settings_bound_what_members_may_ask_and_commit(kind: str, tmp_path: Path) -> None:
    """group.max.session.timeout.ms, group.max.size and offset.metadata.max.bytes set on the broker
    refuse a member, a group and a commit past them, with Kafka's errors (the settings come from the
    broker's table, sparkafka.broker.settings, as its options)."""
    settings = {
        "group.max.session.timeout.ms": "10000",
        "group.max.size": "1",
        "offset.metadata.max.bytes": "16",
    }
    if kind == EMBEDDED:
        args = [a for name, value in settings.items() for a in (f"--{name.replace('.', '-')}", value)]
        running: Kafka = BrokerProcess(tmp_path / "data", extra_args=args)
    else:
        running = ApacheKafka(tmp_path / "apache-kafka", settings=settings)
    with running as kafka:
        create_topic(kafka.bootstrap_servers, "t", partitions=2)

        def first_error(consumer: Consumer, *others: Consumer) -> KafkaError:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                message = consumer.poll(0.2)
                for other in others:
                    other.poll(0)
                if message is not None and message.error() is not None:
                    return message.error()
            raise AssertionError("no error within 60 s")

        def member(group: str, session_timeout_ms: int) -> Consumer:
            consumer = Consumer(
                {
                    "bootstrap.servers": kafka.bootstrap_servers,
                    "group.id": group,
                    "session.timeout.ms": session_timeout_ms,
                }
            )
            consumer.subscribe(["t"])
            return consumer

        too_long = member("a", 10_001)
        try:
            assert first_error(too_long).code() == KafkaError.INVALID_SESSION_TIMEOUT
        finally:
            too_long.close()

        first = member("b", 10_000)
        try:

            def assigned() -> bool:
                first.poll(0.2)
                return bool(first.assignment())

            assert wait_until(assigned, 60), "the first member got no partitions"
            second = member("b", 10_000)
            try:
                assert first_error(second, first).code() == KafkaError.GROUP_MAX_SIZE_REACHED
            finally:
                second.close()
            # confluent-kafka sends a metadata text with its terminating NUL byte: 15 characters are
            # the 16 bytes allowed.
            first.commit(offsets=[TopicPartition("t", 0, 1, metadata="x" * 15)], asynchronous=False)
            with pytest.raises(KafkaException) as refused:
                first.commit(offsets=[TopicPartition("t", 1, 1, metadata="x" * 16)], asynchronous=False)
            assert refused.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE
            committed = first.committed([TopicPartition("t", 0), TopicPartition("t", 1)], timeout=30)
            assert (committed[0].offset, committed[0].metadata) == (1, "x" * 15)
            assert committed[1].offset == OFFSET_INVALID, "the refused commit left nothing"
        finally:
            first.close()
