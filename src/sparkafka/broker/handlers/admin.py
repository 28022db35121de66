"""ApiVersions, SASL, Metadata and the topic administration APIs."""

from __future__ import annotations

import collections
import logging
import os
import re
import uuid
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DescribeClusterResponse,
    DescribeLogDirsResponse,
)
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from sparkafka.broker import jvm_order, protocol
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.handlers.configs import created_topic_config_entries, duplicate_error, names_given_twice
from sparkafka.broker.sasl import MECHANISMS, SaslState, plain_authentication_error
from sparkafka.broker.topics import INTERNAL_TOPIC_NAMES, Topic, validate_topic_name

if TYPE_CHECKING:
    from sparkafka.broker.connection import RequestContext
    from sparkafka.broker.server import Broker

log = logging.getLogger(__name__)
_ZERO_UUID = uuid.UUID(int=0)
# KRaft's metadata log, which Kafka's ControllerApis refuses to create as a topic.
CLUSTER_METADATA_TOPIC = "__cluster_metadata"
# KIP-511: what ApiVersions v3+ accepts as a client software name and version.
_CLIENT_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_versions_response(error: ErrorCode = ErrorCode.NONE) -> Any:
    """Every supported API; as Kafka's ApiVersionsRequest.getErrorResponse, an UNSUPPORTED_VERSION
    answer lists ApiVersions' own versions only, and any other error none."""
    versions = protocol.advertised_versions()
    if error == ErrorCode.UNSUPPORTED_VERSION:
        versions = [(key, span) for key, span in versions if key == protocol.ApiKey.API_VERSIONS]
    elif error != ErrorCode.NONE:
        versions = []
    return ApiVersionsResponse(
        error_code=error,
        api_keys=[
            ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in versions
        ],
        throttle_time_ms=0,
    )


async def api_versions(broker: Broker, request: Any, context: RequestContext) -> Any:
    if context.version >= 3 and not all(
        _CLIENT_SOFTWARE.fullmatch(value or "")
        for value in (request.client_software_name, request.client_software_version)
    ):
        return api_versions_response(ErrorCode.INVALID_REQUEST)
    if context.connection.sasl_state is SaslState.HANDSHAKE_OR_VERSIONS:
        context.connection.sasl_state = SaslState.HANDSHAKE
    return api_versions_response()


async def sasl_handshake(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's SaslServerAuthenticator: select the mechanism; v0 means a raw SASL token follows (no Kafka
    header), v1 means SaslAuthenticate requests follow. An unsupported mechanism closes the connection
    after the answer. Once authenticated, or on a listener without SASL, the answer is ILLEGAL_SASL_STATE
    (Kafka's KafkaApis.handleSaslHandshakeRequest)."""
    connection = context.connection
    if connection.authenticated:
        return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
    if request.mechanism not in MECHANISMS:
        connection.close_after_response = True
        return SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=MECHANISMS)
    connection.sasl_state = SaslState.RAW_TOKEN if context.version == 0 else SaslState.AUTHENTICATE
    return SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=MECHANISMS)


async def sasl_authenticate(broker: Broker, request: Any, context: RequestContext) -> Any:
    """A SASL/PLAIN token after a SaslHandshake v1 (the connection accepts this request only then,
    or once authenticated: then the answer is Kafka's KafkaApis.handleSaslAuthenticateRequest's)."""
    connection = context.connection
    if connection.authenticated:
        return SaslAuthenticateResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE,
            error_message="SaslAuthenticate request received after successful authentication",
            auth_bytes=b"",
        )
    error = plain_authentication_error(broker.config.sasl_plain_users, bytes(request.auth_bytes))
    if error is None:
        connection.sasl_state = SaslState.COMPLETE
        return SaslAuthenticateResponse(
            error_code=ErrorCode.NONE, error_message=None, auth_bytes=b"", session_lifetime_ms=0
        )
    # As Kafka: answer with the reason, then close the connection.
    connection.close_after_response = True
    connection.log_authentication_failure(error)
    return SaslAuthenticateResponse(
        error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=error, auth_bytes=b""
    )


# AclOperation codes (Kafka's org.apache.kafka.common.acl.AclOperation).
_ACL_OPERATION_CODES = {
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}


def _operations(*names: str) -> frozenset[int]:
    return frozenset(_ACL_OPERATION_CODES[name] for name in names)


# A resource's authorized operations on a broker without an authorizer: every operation its type
# supports (AuthHelper.authorizedOperations over AclEntry.supportedOperations). The protocol sends
# them as a bitfield; kafka-python's codec takes the set of bit numbers (None: not asked for).
CLUSTER_OPERATIONS = _operations(
    "CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER", "DESCRIBE"
)
TOPIC_OPERATIONS = _operations(
    "READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"
)
GROUP_OPERATIONS = _operations("READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")


def _topic_metadata(broker: Broker, topic: Topic, operations: frozenset[int] | None = None) -> Any:
    node = broker.config.node_id
    return MetadataResponse.MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=[
            MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                error_code=ErrorCode.NONE,
                partition_index=index,
                leader_id=node,
                leader_epoch=0,
                replica_nodes=[node],
                isr_nodes=[node],
                offline_replicas=[],
            )
            for index in range(topic.partitions)
        ],
        authorized_operations=operations,
    )


def _missing_topic(
    name: str | None, topic_id: uuid.UUID | None, error: ErrorCode, operations: frozenset[int] | None = None
) -> Any:
    return MetadataResponse.MetadataResponseTopic(
        error_code=error,
        name=name,
        topic_id=topic_id or _ZERO_UUID,
        is_internal=name in INTERNAL_TOPIC_NAMES,
        partitions=[],
        authorized_operations=operations,
    )


def _auto_create(broker: Broker, name: str) -> None:
    """Create a topic a Metadata request named, as Kafka 4's AutoTopicCreationManager does.

    Kafka forwards the creation to its controller and answers this Metadata request with
    UNKNOWN_TOPIC_OR_PARTITION for the topic, whether the creation will succeed or not: the client
    asks again and finds the topic once it exists. This broker creates it at once, so the next
    request finds it; the answer to this one is the same as Kafka's. A creation that fails (a name
    colliding with another once '.' and '_' are alike) is only logged, as Kafka's controller does.

    Kafka's internal topics are never created here: this broker keeps group offsets and transaction
    state in journals of its own, and an ordinary topic of that name would only mislead."""
    if name in INTERNAL_TOPIC_NAMES:
        log.info("not creating internal topic %r named in a Metadata request: this broker has none", name)
        return
    try:
        broker.topic_controller.create_topic(name, broker.config.default_partitions, {})
    except BrokerError as exc:
        log.warning("auto-creation of topic %r failed: %s", name, exc)


def _named_topic_metadata(
    broker: Broker, name: str, auto_create: bool, operations: frozenset[int] | None
) -> Any:
    topic = broker.topics.topics.get(name)
    if topic is not None:
        return _topic_metadata(broker, topic, operations)
    try:
        # Kafka's getTopicMetadata: a name that could never exist is INVALID_TOPIC_EXCEPTION.
        validate_topic_name(name)
    except BrokerError as exc:
        return _missing_topic(name, None, exc.code, operations)
    if auto_create and broker.config.auto_create_topics:
        _auto_create(broker, name)
    return _missing_topic(name, None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, operations)


async def metadata(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Metadata as Kafka's handleTopicMetadataRequest. From v8 on, the authorized operations asked
    for are those of a broker without an authorizer: every one (v8-10 also for the cluster); topics
    asked for by an unknown id get none."""
    cluster_operations = topic_operations = None
    if context.version >= 8:
        if context.version <= 10 and request.include_cluster_authorized_operations:
            cluster_operations = CLUSTER_OPERATIONS
        if request.include_topic_authorized_operations:
            topic_operations = TOPIC_OPERATIONS
    # Kafka's useTopicId: once a request names any topic id (v10+; the zero id reads as None), the
    # ids alone say what is asked: unknown ones first (UNKNOWN_TOPIC_ID, no name), names are ignored.
    topic_ids = list(dict.fromkeys(t.topic_id for t in request.topics or () if getattr(t, "topic_id", None)))
    if request.topics is None or (context.version == 0 and not request.topics):
        # Kafka lists every topic in the order of a Scala mutable.HashSet of their names.
        topics = [
            _topic_metadata(broker, broker.topics.topics[name], topic_operations)
            for name in jvm_order.scala_mutable_hash_set(broker.topics.topics)
        ]
    elif topic_ids:
        found = {topic_id: broker.topics.by_id(topic_id) for topic_id in topic_ids}
        topics = [
            _missing_topic(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID)
            for topic_id, topic in found.items()
            if topic is None
        ] + [
            _topic_metadata(broker, topic, topic_operations) for topic in found.values() if topic is not None
        ]
    else:
        auto_create = context.version < 4 or request.allow_auto_topic_creation
        # Kafka's handleTopicMetadataRequest takes the names as a Scala set: a name given twice is
        # answered once. Its getTopicMetadata lists the topics it has in that set's order, then the
        # missing ones in the order of a java.util.HashSet copied from it (jvm_order).
        names = jvm_order.scala_set(t.name for t in request.topics if t.name is not None)
        present = [name for name in names if name in broker.topics.topics]
        missing = jvm_order.java_hash_set(
            (name for name in names if name not in broker.topics.topics),
            capacity=jvm_order.java_copied_hash_set_capacity(len(names)),
        )
        topics = [
            _named_topic_metadata(broker, name, auto_create, topic_operations) for name in present + missing
        ]
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponse.MetadataResponseBroker(
                node_id=broker.config.node_id, host=broker.config.host, port=broker.port, rack=None
            )
        ],
        cluster_id=broker.config.cluster_id,
        controller_id=broker.config.node_id,
        topics=topics,
        authorized_operations=cluster_operations,
    )


# Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH: one CreateTopics or CreatePartitions
# request may ask for this many partitions in all; a larger one is refused whole.
MAX_PARTITIONS_PER_REQUEST = 10_000


def _too_many_partitions(*, additional: bool = False) -> BrokerError:
    what = "additional partitions" if additional else "partitions"
    return BrokerError(ErrorCode.POLICY_VIOLATION, f"Excessively large number of {what} per request.")


def _requested_partitions(broker: Broker, wanted: Any) -> int:
    """What a CreatableTopic asks for, counted as Kafka's validateTotalNumberOfPartitions does."""
    if wanted.assignments:
        return len(wanted.assignments)
    if wanted.num_partitions == -1:
        return broker.config.default_partitions
    return max(wanted.num_partitions, 0)


async def create_topics(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's ControllerApis.createTopics: its controller answers the names given once, in the
    request's order (each refused alike when together they ask for more than
    :data:`MAX_PARTITIONS_PER_REQUEST` partitions); then come the names given more than once, and
    __cluster_metadata, refused."""
    results = []
    result_class = CreateTopicsResponse.CreatableTopicResult
    given_twice = names_given_twice(t.name for t in request.topics)
    answered = [t for t in request.topics if t.name not in given_twice and t.name != CLUSTER_METADATA_TOPIC]
    too_many = sum(_requested_partitions(broker, t) for t in answered) > MAX_PARTITIONS_PER_REQUEST
    for wanted in answered:
        try:
            if too_many:
                raise _too_many_partitions()
            topic = await broker.topic_controller.create(
                wanted.name,
                wanted.num_partitions,
                {c.name: c.value for c in wanted.configs},
                replication_factor=wanted.replication_factor,
                assignments=[(a.partition_index, a.broker_ids) for a in wanted.assignments],
                validate_only=bool(request.validate_only),
            )
        except BrokerError as exc:
            results.append(
                result_class(
                    name=wanted.name,
                    topic_id=_ZERO_UUID,
                    error_code=exc.code,
                    error_message=exc.message,
                    num_partitions=-1,
                    replication_factor=-1,
                    configs=None,
                )
            )
            continue
        results.append(
            result_class(
                name=topic.name,
                topic_id=topic.topic_id,
                error_code=ErrorCode.NONE,
                error_message=None,
                num_partitions=topic.partitions,
                replication_factor=1,
                configs=created_topic_config_entries(broker, topic),
            )
        )
    refused = [(name, duplicate_error().message) for name in given_twice]
    if (
        any(t.name == CLUSTER_METADATA_TOPIC for t in request.topics)
        and CLUSTER_METADATA_TOPIC not in given_twice
    ):
        refused.append(
            (CLUSTER_METADATA_TOPIC, f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.")
        )
    for name, message in refused:
        results.append(
            result_class(
                name=name,
                topic_id=_ZERO_UUID,
                error_code=ErrorCode.INVALID_REQUEST,
                error_message=message,
                num_partitions=-1,
                replication_factor=-1,
                configs=None,
            )
        )
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


async def delete_topics(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's ControllerApis.deleteTopics: topics by name (v0-5, and v6 entries without an id) or by
    id (v6 entries without a name).

    1. A v6 entry with neither, or with both, is INVALID_REQUEST.
    2. A name or id given more than once is INVALID_REQUEST, once for all its entries.
    3. An unknown id is UNKNOWN_TOPIC_ID, an unknown name UNKNOWN_TOPIC_OR_PARTITION, each with the
       error's default message, as Kafka's ApiError(Errors) gives.
    4. A name whose topic's id is also given is INVALID_REQUEST, and that topic is not deleted (the
       id gets no answer of its own, as in Kafka).
    5. Every other topic is deleted; its answer carries name and id."""
    results: list[Any] = []

    def answer(
        name: str | None, topic_id: uuid.UUID, error: ErrorCode = ErrorCode.NONE, message: str | None = None
    ) -> None:
        results.append(
            DeleteTopicsResponse.DeletableTopicResult(
                name=name, topic_id=topic_id, error_code=error, error_message=message
            )
        )

    # Topics being created, extended or deleted by another request are answered once that is done.
    while True:
        named = [*(request.topic_names or []), *(entry.name for entry in request.topics or () if entry.name)]
        by_id = (broker.topics.by_id(entry.topic_id) for entry in request.topics or () if entry.topic_id)
        involved = {*named, *(topic.name for topic in by_id if topic is not None)}
        if not any(name in broker.topics.creating or name in broker.topics.changing for name in involved):
            break
        await broker.topics.settled(involved)
    names: list[str] = list(request.topic_names or [])
    ids: list[uuid.UUID] = []
    for entry in request.topics or []:
        has_id = entry.topic_id is not None and entry.topic_id != _ZERO_UUID
        if entry.name is not None and has_id:
            answer(
                entry.name,
                entry.topic_id,
                ErrorCode.INVALID_REQUEST,
                "You may not specify both topic name and topic id.",
            )
        elif entry.name is not None:
            names.append(entry.name)
        elif has_id:
            ids.append(entry.topic_id)
        else:
            answer(None, _ZERO_UUID, ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified.")
    name_counts, id_counts = collections.Counter(names), collections.Counter(ids)
    duplicate = duplicate_error()
    for name in (n for n, count in name_counts.items() if count > 1):
        answer(name, _ZERO_UUID, duplicate.code, duplicate.message)
    for topic_id in (i for i, count in id_counts.items() if count > 1):
        answer(None, topic_id, ErrorCode.INVALID_REQUEST, "Duplicate topic id.")
    doomed: dict[uuid.UUID, str] = {}
    for topic_id in (i for i, count in id_counts.items() if count == 1):
        found = broker.topics.by_id(topic_id)
        if found is None:
            answer(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.UNKNOWN_TOPIC_ID.kafka_message)
        else:
            doomed[topic_id] = found.name
    for name in (n for n, count in name_counts.items() if count == 1):
        topic = broker.topics.topics.get(name)
        if topic is None:
            answer(
                name,
                _ZERO_UUID,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_message,
            )
        elif topic.topic_id in doomed or id_counts[topic.topic_id] > 1:
            doomed.pop(topic.topic_id, None)
            answer(
                name,
                topic.topic_id,
                ErrorCode.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied.",
            )
        else:
            doomed[topic.topic_id] = name
    deleted = await broker.topic_controller.delete_topics(list(doomed.values()))
    for topic_id, name in doomed.items():
        error = deleted[name]
        if error is None:
            answer(name, topic_id)
        else:
            answer(name, topic_id, error.code, error.message)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


async def create_partitions(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's ControllerApis.createPartitions: the names given more than once first, refused; then
    the others in the order of the java.util.HashSet of every name given."""
    duplicate = duplicate_error()
    given_twice = names_given_twice(t.name for t in request.topics)
    results = [
        CreatePartitionsResponse.CreatePartitionsTopicResult(
            name=name, error_code=duplicate.code, error_message=duplicate.message
        )
        for name in given_twice
    ]
    by_name = {t.name: t for t in request.topics}
    added = sum(
        max(t.count - broker.topics.topics[t.name].partitions, 0)
        for t in request.topics
        if t.name not in given_twice and t.name in broker.topics.topics
    )
    for name in jvm_order.java_hash_set(t.name for t in request.topics):
        if name in given_twice:
            continue
        wanted = by_name[name]
        try:
            if added > MAX_PARTITIONS_PER_REQUEST:
                raise _too_many_partitions(additional=True)
            await broker.topic_controller.add_partitions(
                wanted.name,
                wanted.count,
                assignments=None
                if wanted.assignments is None
                else [assignment.broker_ids for assignment in wanted.assignments],
                validate_only=bool(request.validate_only),
            )
            error, message = ErrorCode.NONE, None
        except BrokerError as exc:
            error, message = exc.code, exc.message
        results.append(
            CreatePartitionsResponse.CreatePartitionsTopicResult(
                name=wanted.name, error_code=error, error_message=message
            )
        )
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


_BROKER_ENDPOINT, _CONTROLLER_ENDPOINT = 1, 2  # Kafka's EndpointType ids


async def describe_cluster(broker: Broker, request: Any, context: RequestContext) -> Any:
    """DescribeCluster as Kafka's handleDescribeCluster (AuthHelper.computeDescribeClusterResponse):
    a broker describes the broker endpoint only (v1+ may ask for another: UNSUPPORTED_ENDPOINT_TYPE
    for an unknown one, MISMATCHED_ENDPOINT_TYPE for the controllers'); this single broker is every
    broker and the "random alive broker" a broker names as controller."""
    endpoint = request.endpoint_type if context.version >= 1 else _BROKER_ENDPOINT
    error: ErrorCode | None = None
    if endpoint not in (_BROKER_ENDPOINT, _CONTROLLER_ENDPOINT):
        error, message = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {endpoint}"
    elif endpoint != _BROKER_ENDPOINT:
        error = ErrorCode.MISMATCHED_ENDPOINT_TYPE
        message = (
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER"
        )
    if error is not None:
        return DescribeClusterResponse(
            throttle_time_ms=0,
            error_code=error,
            error_message=message,
            endpoint_type=_BROKER_ENDPOINT,
            cluster_id="",
            controller_id=-1,
            brokers=[],
            authorized_operations=None,
        )
    node = broker.config.node_id
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        error_message=None,
        endpoint_type=_BROKER_ENDPOINT,
        cluster_id=broker.config.cluster_id,
        controller_id=node,
        brokers=[
            DescribeClusterResponse.DescribeClusterBroker(
                broker_id=node, host=broker.config.host, port=broker.port, rack=None, is_fenced=False
            )
        ],
        authorized_operations=CLUSTER_OPERATIONS if request.include_cluster_authorized_operations else None,
    )


async def describe_log_dirs(broker: Broker, request: Any, context: RequestContext) -> Any:
    """DescribeLogDirs as Kafka's ReplicaManager.describeLogDirs, for this broker's one log directory:
    each asked partition (all, for a null topic list) with its size and an offset lag of 0 (this
    broker leads every partition, and its high watermark is its log end); topics left with no
    partition are left out; the volume's total and usable bytes (v4+)."""
    if request.topics is None:
        wanted = set(broker.partitions)
    else:
        wanted = {(t.topic, index) for t in request.topics for index in t.partitions}
    by_topic: dict[str, list[Any]] = {}
    for topic, index in sorted(wanted & set(broker.partitions)):
        by_topic.setdefault(topic, []).append(
            DescribeLogDirsResponse.DescribeLogDirsResult.DescribeLogDirsTopic.DescribeLogDirsPartition(
                partition_index=index,
                partition_size=broker.partitions[(topic, index)].log.size_bytes(),
                offset_lag=0,
                is_future_key=False,
            )
        )
    directory = broker.config.data_dir.absolute()
    volume = os.statvfs(directory)
    result = DescribeLogDirsResponse.DescribeLogDirsResult
    return DescribeLogDirsResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        results=[
            result(
                error_code=ErrorCode.NONE,
                log_dir=str(directory),
                topics=[
                    result.DescribeLogDirsTopic(name=topic, partitions=partitions)
                    for topic, partitions in by_topic.items()
                ],
                total_bytes=volume.f_blocks * volume.f_frsize,
                usable_bytes=volume.f_bavail * volume.f_frsize,
            )
        ],
    )
