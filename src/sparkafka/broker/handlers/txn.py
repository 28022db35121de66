"""Transaction APIs (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit)
and the admin views of producers and transactions."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitResponse,
)

from sparkafka.broker.clock import now_ms
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.handlers.groups import requested_offsets
from sparkafka.broker.topics import validate_topic_name
from sparkafka.broker.transactions import OFFSETS_TOPIC, TxnState, offsets_partition_for

if TYPE_CHECKING:
    from sparkafka.broker.connection import RequestContext
    from sparkafka.broker.server import Broker


def _for_version(error: ErrorCode, version: int, first_version_with_fenced: int) -> ErrorCode:
    """KIP-588: clients older than the version that introduced PRODUCER_FENCED get INVALID_PRODUCER_EPOCH."""
    if error == ErrorCode.PRODUCER_FENCED and version < first_version_with_fenced:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


async def init_producer_id(broker: Broker, request: Any, context: RequestContext) -> Any:
    try:
        if context.version >= 3 and (request.producer_id == -1) != (request.producer_epoch == -1):
            # KafkaApis.handleInitProducerIdRequest: a producer id and epoch come together or not at all.
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"producer id {request.producer_id} and epoch {request.producer_epoch}: give both or neither",
            )
        producer_id, epoch = broker.transactions.init_producer_id(
            request.transactional_id,
            request.transaction_timeout_ms,
            request.producer_id if context.version >= 3 else -1,
            request.producer_epoch if context.version >= 3 else -1,
        )
        error = ErrorCode.NONE
    except BrokerError as exc:
        producer_id, epoch, error = -1, -1, _for_version(exc.code, context.version, 4)
    broker.notify_data()
    return InitProducerIdResponse(
        throttle_time_ms=0, error_code=error, producer_id=producer_id, producer_epoch=epoch
    )


async def add_partitions_to_txn(broker: Broker, request: Any, context: RequestContext) -> Any:
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    try:
        errors = broker.transactions.add_partitions(
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
        )
    except BrokerError as exc:
        errors = dict.fromkeys(wanted, _for_version(exc.code, context.version, 2))
    topic_class = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    partition_class = topic_class.AddPartitionsToTxnPartitionResult
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append(
            partition_class(partition_index=index, partition_error_code=error)
        )
    return AddPartitionsToTxnResponse(
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            topic_class(name=name, results_by_partition=results) for name, results in by_topic.items()
        ],
    )


async def add_offsets_to_txn(broker: Broker, request: Any, context: RequestContext) -> Any:
    try:
        broker.transactions.add_offsets(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
        error = ErrorCode.NONE
    except BrokerError as exc:
        error = _for_version(exc.code, context.version, 2)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=error)


async def end_txn(broker: Broker, request: Any, context: RequestContext) -> Any:
    try:
        broker.transactions.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed)
        )
        error = ErrorCode.NONE
    except BrokerError as exc:
        error = _for_version(exc.code, context.version, 2)
    broker.notify_data()
    return EndTxnResponse(throttle_time_ms=0, error_code=error)


async def txn_offset_commit(broker: Broker, request: Any, context: RequestContext) -> Any:
    """As KafkaApis.handleTxnOffsetCommitRequest: partitions this broker lacks are answered
    UNKNOWN_TOPIC_OR_PARTITION first and take no further part (with none left, nothing else is
    asked); the transaction's and the group's checks then answer for the others. The answer lists
    them in that order, as Kafka's TxnOffsetCommitResponse.Builder: a topic where it first comes,
    the lacking partitions before the others."""
    offsets = requested_offsets(request.topics, with_leader_epoch=context.version >= 2)
    unknown = {tp for tp in offsets if tp not in broker.partitions}
    errors: dict[tuple[str, int], ErrorCode] = dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    error = ErrorCode.NONE
    try:
        if len(unknown) < len(offsets):
            broker.transactions.verify_offset_commit(
                request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
            )
            if context.version >= 3:
                error = broker.groups.validate_txn_offset_commit_member(
                    group_id=request.group_id,
                    generation_id=request.generation_id,
                    member_id=request.member_id,
                    group_instance_id=request.group_instance_id,
                )
            if error == ErrorCode.NONE:
                broker.transactions.include_group(request.transactional_id, request.group_id)
                errors.update(
                    broker.groups.stage_transactional_offsets(
                        group_id=request.group_id,
                        producer_id=request.producer_id,
                        offsets={tp: v for tp, v in offsets.items() if tp not in unknown},
                    )
                )
    except BrokerError as exc:
        # TxnOffsetCommit reports a stale epoch as INVALID_PRODUCER_EPOCH in every version (it is
        # validated like a produce to the offsets partition).
        error = ErrorCode.INVALID_PRODUCER_EPOCH if exc.code == ErrorCode.PRODUCER_FENCED else exc.code
    topic_class = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    partition_class = topic_class.TxnOffsetCommitResponsePartition
    answered: dict[str, list[Any]] = {}
    for lacking in (True, False):
        for t in request.topics:
            for p in t.partitions:
                if ((t.name, p.partition_index) in unknown) == lacking:
                    answered.setdefault(t.name, []).append(
                        partition_class(
                            partition_index=p.partition_index,
                            error_code=errors.get((t.name, p.partition_index), error),
                        )
                    )
    return TxnOffsetCommitResponse(
        throttle_time_ms=0,
        topics=[topic_class(name=name, partitions=partitions) for name, partitions in answered.items()],
    )


async def describe_producers(broker: Broker, request: Any, context: RequestContext) -> Any:
    topic_class = DescribeProducersResponse.TopicResponse
    partition_class = topic_class.PartitionResponse
    state_class = partition_class.ProducerState
    topics = []
    for wanted in request.topics:
        # Kafka's handleDescribeProducersRequest: the name, then the topic, then each partition.
        topic_error: tuple[ErrorCode, str | None] | None = None
        try:
            validate_topic_name(wanted.name)
        except BrokerError as exc:
            topic_error = (exc.code, exc.message)
        if topic_error is None and wanted.name not in broker.topics.topics:
            unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            topic_error = (unknown, unknown.kafka_message)
        partitions = []
        for index in wanted.partition_indexes:
            partition = None if topic_error else broker.partitions.get((wanted.name, index))
            if partition is None:
                # A missing partition of a topic: the code alone (ReplicaManager.getPartitionOrError).
                code, message = topic_error or (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
                partitions.append(
                    partition_class(
                        partition_index=index, error_code=code, error_message=message, active_producers=[]
                    )
                )
                continue
            partitions.append(
                partition_class(
                    partition_index=index,
                    error_code=ErrorCode.NONE,
                    error_message=None,
                    active_producers=[
                        state_class(
                            producer_id=producer_id,
                            producer_epoch=entry.epoch,
                            last_sequence=entry.last_sequence,
                            last_timestamp=entry.last_timestamp,
                            coordinator_epoch=entry.coordinator_epoch,
                            current_txn_start_offset=partition.open_txn_first_offset.get(producer_id, -1),
                        )
                        for producer_id, entry in sorted(partition.producers.items())
                    ],
                )
            )
        topics.append(topic_class(name=wanted.name, partitions=partitions))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


async def list_transactions(broker: Broker, request: Any, context: RequestContext) -> Any:
    # Kafka's TransactionState.fromName knows two states this coordinator never enters (a removed
    # id, and the fence of a timed-out transaction, which here aborts at once): not "unknown".
    known_states = {s.value for s in TxnState} | {"Dead", "PrepareEpochFence"}
    state_filters = set(request.state_filters or [])
    producer_filters = set(request.producer_id_filters or [])
    min_duration = request.duration_filter if context.version >= 1 else -1
    pattern = (
        re.compile(request.transactional_id_pattern)
        if context.version >= 2 and request.transactional_id_pattern
        else None
    )
    now = now_ms()
    states = []
    for txn in broker.transactions.transactions.values():
        if state_filters and txn.state.value not in state_filters:
            continue
        if producer_filters and txn.producer_id not in producer_filters:
            continue
        # KIP-994, as Kafka's TransactionStateManager: only transactions running longer than the
        # filter; one that never started (start -1) counts as running since the epoch.
        if min_duration is not None and min_duration >= 0 and now - txn.start_ms <= min_duration:
            continue
        if pattern is not None and not pattern.fullmatch(txn.transactional_id):
            continue
        states.append(
            ListTransactionsResponse.TransactionState(
                transactional_id=txn.transactional_id,
                producer_id=txn.producer_id,
                transaction_state=txn.state.value,
            )
        )
    return ListTransactionsResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        unknown_state_filters=sorted(state_filters - known_states),
        transaction_states=states,
    )


async def describe_transactions(broker: Broker, request: Any, context: RequestContext) -> Any:
    state_class = DescribeTransactionsResponse.TransactionState
    topic_class = state_class.TopicData
    states = []
    for transactional_id in request.transactional_ids:
        txn = broker.transactions.transactions.get(transactional_id)
        if txn is None or not transactional_id:
            # Kafka's TransactionCoordinator.handleDescribeTransactions: the error and the schema's
            # defaults (0) in every other field; an empty id is an invalid request.
            states.append(
                state_class(
                    error_code=ErrorCode.INVALID_REQUEST
                    if not transactional_id
                    else ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                    transactional_id=transactional_id,
                    transaction_state="",
                    transaction_timeout_ms=0,
                    transaction_start_time_ms=0,
                    producer_id=0,
                    producer_epoch=0,
                    topics=[],
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        # AddOffsetsToTxn adds the group's offsets partition to the transaction (KafkaApis).
        offsets_partitions = {(OFFSETS_TOPIC, offsets_partition_for(group)) for group in txn.groups}
        for topic, index in sorted(txn.partitions | offsets_partitions):
            by_topic.setdefault(topic, []).append(index)
        states.append(
            state_class(
                error_code=ErrorCode.NONE,
                transactional_id=transactional_id,
                transaction_state=txn.state.value,
                transaction_timeout_ms=txn.timeout_ms,
                transaction_start_time_ms=txn.start_ms,
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                topics=[topic_class(topic=t, partitions=p) for t, p in by_topic.items()],
            )
        )
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)
