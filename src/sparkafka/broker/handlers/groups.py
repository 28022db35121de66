"""FindCoordinator and the classic consumer-group APIs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.handlers.admin import GROUP_OPERATIONS

if TYPE_CHECKING:
    from sparkafka.broker.connection import RequestContext
    from sparkafka.broker.server import Broker

_KEY_TYPE_GROUP = 0
_KEY_TYPE_TRANSACTION = 1
_KEY_TYPE_SHARE = 2


async def find_coordinator(broker: Broker, request: Any, context: RequestContext) -> Any:
    """This broker coordinates every group and transactional id.

    As KafkaApis.getCoordinator and FindCoordinatorResponse: before v4 the answer's message is the
    error's text, "NONE" on success; an error names no node (-1, "", -1). A share group key (type 2,
    FindCoordinator v6+ only) is INVALID_REQUEST for its key alone; an unknown key type fails the whole
    request (CoordinatorType.forId throws) with INVALID_REQUEST and Kafka's default text."""
    key_type = request.key_type if context.version >= 1 else _KEY_TYPE_GROUP
    if key_type in (_KEY_TYPE_GROUP, _KEY_TYPE_TRANSACTION):
        error = ErrorCode.NONE
        node, host, port = broker.config.node_id, broker.config.host, broker.port
    else:
        error = ErrorCode.INVALID_REQUEST
        node, host, port = -1, "", -1
    whole_request_failed = key_type not in (_KEY_TYPE_GROUP, _KEY_TYPE_TRANSACTION, _KEY_TYPE_SHARE)
    if context.version >= 4:
        message = error.kafka_message if whole_request_failed else None
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                FindCoordinatorResponse.Coordinator(
                    key=key, node_id=node, host=host, port=port, error_code=error, error_message=message
                )
                for key in request.coordinator_keys
            ],
        )
    return FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=error,
        error_message=error.kafka_message,
        node_id=node,
        host=host,
        port=port,
    )


async def join_group(broker: Broker, request: Any, context: RequestContext) -> Any:
    result = await broker.groups.join_group(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if context.version >= 5 else None,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=request.rebalance_timeout_ms
        if context.version >= 1
        else request.session_timeout_ms,
        client_id=context.client_id,
        client_host=context.client_host,
        require_known_member_id=context.version >= 4,
        supports_skip_assignment=context.version >= 9,
    )
    # JoinGroup v7+ sends the protocol as null on errors; older versions have no null here.
    protocol_name = result.protocol_name if context.version >= 7 else result.protocol_name or ""
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            JoinGroupResponse.JoinGroupResponseMember(
                member_id=member_id, group_instance_id=instance_id, metadata=metadata
            )
            for member_id, instance_id, metadata in result.members
        ],
    )


async def sync_group(broker: Broker, request: Any, context: RequestContext) -> Any:
    if context.version >= 5 and (request.protocol_type is None or request.protocol_name is None):
        # KafkaApis.handleSyncGroupRequest: from v5 both are mandatory; refused before the group is
        # looked at (SyncGroupRequest.areMandatoryProtocolTypeAndNamePresent).
        return SyncGroupResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            protocol_type=None,
            protocol_name=None,
            assignment=b"",
        )
    result = await broker.groups.sync_group(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if context.version >= 3 else None,
        protocol_type=request.protocol_type if context.version >= 5 else None,
        protocol_name=request.protocol_name if context.version >= 5 else None,
        assignments=[(a.member_id, bytes(a.assignment)) for a in request.assignments],
    )
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def heartbeat(broker: Broker, request: Any, context: RequestContext) -> Any:
    error = broker.groups.heartbeat(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if context.version >= 3 else None,
    )
    return HeartbeatResponse(throttle_time_ms=0, error_code=error)


async def leave_group(broker: Broker, request: Any, context: RequestContext) -> Any:
    if context.version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        members = [(request.member_id, None)]
    error, results = broker.groups.leave_group(group_id=request.group_id, members=members)
    if context.version < 3 and error == ErrorCode.NONE and results:
        error = results[0][2]
    return LeaveGroupResponse(
        throttle_time_ms=0,
        error_code=error,
        members=[
            LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
            for m, i, e in results
        ],
    )


def requested_offsets(
    topics: list[Any], *, with_leader_epoch: bool
) -> dict[tuple[str, int], tuple[int, int, str | None]]:
    """(topic, partition) -> (offset, leader epoch, metadata) of an OffsetCommit/TxnOffsetCommit."""
    return {
        (t.name, p.partition_index): (
            p.committed_offset,
            p.committed_leader_epoch if with_leader_epoch else -1,
            p.committed_metadata,
        )
        for t in topics
        for p in t.partitions
    }


async def offset_commit(broker: Broker, request: Any, context: RequestContext) -> Any:
    offsets = requested_offsets(request.topics, with_leader_epoch=context.version >= 6)
    unknown = {tp for tp in offsets if tp not in broker.partitions}
    known = {tp: v for tp, v in offsets.items() if tp not in unknown}
    errors: dict[tuple[str, int], ErrorCode] = {}
    # KafkaApis.handleOffsetCommitRequest: with no partition it has, the coordinator is not asked
    # (so such a commit creates no group).
    if known:
        errors = broker.groups.commit_offsets(
            group_id=request.group_id,
            generation_id=request.generation_id_or_member_epoch,
            member_id=request.member_id,
            group_instance_id=request.group_instance_id if context.version >= 7 else None,
            offsets=known,
            retention_time_ms=request.retention_time_ms if 2 <= context.version <= 4 else -1,
        )
    errors.update(dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    topic_class = OffsetCommitResponse.OffsetCommitResponseTopic
    partition_class = topic_class.OffsetCommitResponsePartition
    return OffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            topic_class(
                name=t.name,
                partitions=[
                    partition_class(
                        partition_index=p.partition_index, error_code=errors[(t.name, p.partition_index)]
                    )
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


def _fetch_group_offsets(
    broker: Broker, group_id: str, topics: list[Any] | None, require_stable: bool
) -> dict[str, list[tuple[int, tuple[int, int, str | None, ErrorCode]]]]:
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    found = broker.groups.fetch_offsets(group_id, wanted, require_stable=require_stable)
    # OffsetMetadataManager.fetchOffsets: every topic asked for has an entry, even with no partition.
    by_topic: dict[str, list[tuple[int, tuple[int, int, str | None, ErrorCode]]]] = {
        t.name: [] for t in topics or ()
    }
    for (topic, index), value in found.items():
        by_topic.setdefault(topic, []).append((index, value))
    return by_topic


def _offset_fetch_topics(
    topic_class: Any,
    partition_class: Any,
    by_topic: dict[str, list[tuple[int, tuple[int, int, str | None, ErrorCode]]]],
) -> list[Any]:
    """Topics of an OffsetFetch answer (v8+ nests them per group, under other class names)."""
    return [
        topic_class(
            name=name,
            partitions=[
                partition_class(
                    partition_index=index,
                    committed_offset=offset,
                    committed_leader_epoch=epoch,
                    metadata=metadata,
                    error_code=error,
                )
                for index, (offset, epoch, metadata, error) in entries
            ],
        )
        for name, entries in by_topic.items()
    ]


async def offset_fetch(broker: Broker, request: Any, context: RequestContext) -> Any:
    require_stable = bool(request.require_stable) if context.version >= 7 else False
    if context.version >= 8:
        group_class = OffsetFetchResponse.OffsetFetchResponseGroup
        groups = [
            group_class(
                group_id=group.group_id,
                error_code=ErrorCode.NONE,
                topics=_offset_fetch_topics(
                    group_class.OffsetFetchResponseTopics,
                    group_class.OffsetFetchResponseTopics.OffsetFetchResponsePartitions,
                    _fetch_group_offsets(broker, group.group_id, group.topics, require_stable),
                ),
            )
            for group in request.groups
        ]
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    by_topic = _fetch_group_offsets(broker, request.group_id, request.topics, require_stable)
    return OffsetFetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        topics=_offset_fetch_topics(
            OffsetFetchResponse.OffsetFetchResponseTopic,
            OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition,
            by_topic,
        ),
    )


_CLASSIC_GROUP_TYPE = "classic"  # Kafka's Group.GroupType.CLASSIC


async def list_groups(broker: Broker, request: Any, context: RequestContext) -> Any:
    """ListGroups as Kafka 4's GroupMetadataManager.listGroups: the states filter (v4+) and the types
    filter (v5+, names compared in lower case as GroupType.parse does) must both admit a group; every
    group here is a classic one."""
    states = list(request.states_filter) if context.version >= 4 and request.states_filter else None
    types = {name.lower() for name in request.types_filter} if context.version >= 5 else set()
    listed = broker.groups.list_groups(states) if not types or _CLASSIC_GROUP_TYPE in types else []
    return ListGroupsResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        groups=[
            ListGroupsResponse.ListedGroup(
                group_id=group_id,
                protocol_type=protocol_type,
                group_state=state,
                group_type=_CLASSIC_GROUP_TYPE,
            )
            for group_id, protocol_type, state in listed
        ],
    )


async def describe_groups(broker: Broker, request: Any, context: RequestContext) -> Any:
    group_class = DescribeGroupsResponse.DescribedGroup
    member_class = group_class.DescribedGroupMember
    groups = []
    for group_id in request.groups:
        described = broker.groups.describe_group(group_id)
        groups.append(
            group_class(
                error_code=described.error,
                group_id=group_id,
                group_state=described.state,
                protocol_type=described.protocol_type,
                protocol_data=described.protocol,
                members=[
                    member_class(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in described.members
                ],
                # Kafka's handleDescribeGroupsRequest: asked for (v3+), a group described without
                # error gets its operations, here those of a broker without an authorizer.
                authorized_operations=GROUP_OPERATIONS
                if context.version >= 3
                and request.include_authorized_operations
                and described.error == ErrorCode.NONE
                else None,
            )
        )
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)


async def delete_groups(broker: Broker, request: Any, context: RequestContext) -> Any:
    results = broker.groups.delete_groups(list(request.groups_names))
    return DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[
            DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=error)
            for group_id, error in results.items()
        ],
    )


async def offset_delete(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's KafkaApis.handleOffsetDeleteRequest: partitions of unknown topics, or that a topic
    does not have, are UNKNOWN_TOPIC_OR_PARTITION and never reach the coordinator; the others go to
    :meth:`GroupCoordinator.delete_offsets`, whose top-level error, if any, is the whole answer
    (OffsetDeleteResponse.Builder.merge)."""
    unknown: dict[str, list[tuple[int, ErrorCode]]] = {}
    known: list[tuple[str, list[int]]] = []
    for topic in request.topics:
        found = broker.topics.topics.get(topic.name)
        wanted = [p.partition_index for p in topic.partitions]
        present = [] if found is None else [i for i in wanted if 0 <= i < found.partitions]
        missing = [(i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for i in wanted if i not in present]
        if missing:
            unknown.setdefault(topic.name, []).extend(missing)
        if present:
            known.append((topic.name, present))
    error, answers = broker.groups.delete_offsets(request.group_id, known)
    merged = unknown if error == ErrorCode.NONE else {}
    for name, partitions in answers:
        merged.setdefault(name, []).extend(partitions)
    topic_class = OffsetDeleteResponse.OffsetDeleteResponseTopic
    partition_class = topic_class.OffsetDeleteResponsePartition
    return OffsetDeleteResponse(
        error_code=error,
        throttle_time_ms=0,
        topics=[
            topic_class(
                name=name,
                partitions=[partition_class(partition_index=p, error_code=e) for p, e in partitions],
            )
            for name, partitions in merged.items()
        ],
    )
