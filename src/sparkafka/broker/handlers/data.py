"""Produce, Fetch, ListOffsets and DeleteRecords."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.producer import ProduceResponse

from sparkafka.broker.clock import now_ms
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.records import RecordValidationError

if TYPE_CHECKING:
    from sparkafka.broker.server import Broker, RequestContext

log = logging.getLogger(__name__)

_LATEST = -1
_EARLIEST = -2
_MAX_TIMESTAMP = -3
_READ_COMMITTED = 1


async def produce(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Append each partition's batches; answer per partition (nothing at all for acks=0).

    Every partition is attempted independently: one partition's failure never blocks another's
    append, and each error names the partition and the reason."""
    topic_class = ProduceResponse.TopicProduceResponse
    partition_class = topic_class.PartitionProduceResponse
    acks_ok = request.acks in (-1, 0, 1)
    responses = []
    appended = False
    now = now_ms()
    for topic_data in request.topic_data:
        topic = broker.topics.topics.get(topic_data.name)
        partition_results = []
        for entry in topic_data.partition_data:
            base_offset, log_start, error, message = -1, -1, ErrorCode.NONE, None
            record_errors: list[Any] = []
            try:
                if not acks_ok:
                    raise BrokerError(
                        ErrorCode.INVALID_REQUIRED_ACKS,
                        f"acks={request.acks} is invalid; use -1 (all), 0 or 1",
                    )
                if topic is None:
                    raise BrokerError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic_data.name!r} does not exist"
                    )
                partition = broker.partition(topic.name, entry.index)
                if entry.records is None:
                    raise BrokerError(ErrorCode.INVALID_RECORD, "produce request without records")
                result = partition.append_from_client(
                    bytes(entry.records),
                    now_ms=now,
                    max_message_bytes=int(topic.config("max.message.bytes", broker.config)),
                    verify_transaction=broker.transactions.verify_partition,
                    produce_version=context.version,
                )
                base_offset, log_start = result.base_offset, partition.log_start_offset
                appended = appended or not result.duplicate
            except BrokerError as exc:
                error, message = exc.code, exc.message
                if isinstance(exc, RecordValidationError):
                    # Produce v8+: which records of the batch were rejected and why (KIP-467).
                    record_errors = [
                        partition_class.BatchIndexAndErrorMessage(
                            batch_index=index, batch_index_error_message=text
                        )
                        for index, text in exc.record_errors
                    ]
                log.debug("produce to %s-%d rejected: %s", topic_data.name, entry.index, exc.message)
            partition_results.append(
                partition_class(
                    index=entry.index,
                    error_code=error,
                    base_offset=base_offset,
                    log_append_time_ms=-1,
                    log_start_offset=log_start,
                    record_errors=record_errors,
                    error_message=message,
                )
            )
        responses.append(topic_class(name=topic_data.name, partition_responses=partition_results))
    if appended:
        broker.notify_data()
    if request.acks == 0:
        return None
    return ProduceResponse(responses=responses, throttle_time_ms=0)


async def fetch(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Read up to ``max_bytes`` across the requested partitions, waiting up to ``max_wait_ms`` for
    ``min_bytes``. read_committed reads stop at each partition's last stable offset and carry the
    aborted transactions overlapping the returned range."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
    while True:
        responses, total_bytes, had_error = _read_fetch(broker, request, context.version)
        remaining = deadline - loop.time()
        if total_bytes >= request.min_bytes or had_error or remaining <= 0:
            return FetchResponse(
                throttle_time_ms=0, error_code=ErrorCode.NONE, session_id=0, responses=responses
            )
        await broker.wait_for_data(remaining)


def _read_fetch(broker: Broker, request: Any, version: int) -> tuple[list[Any], int, bool]:
    topic_class = FetchResponse.FetchableTopicResponse
    partition_class = topic_class.PartitionData
    aborted_class = partition_class.AbortedTransaction
    read_committed = request.isolation_level == _READ_COMMITTED
    budget = request.max_bytes if version >= 3 else 2**31 - 1
    first_data = True
    total = 0
    had_error = False
    responses = []
    for wanted_topic in request.topics:
        partitions = []
        for wanted in wanted_topic.partitions:
            data, aborted = b"", None
            high_watermark = last_stable = log_start = -1
            error = ErrorCode.NONE
            try:
                partition = broker.partition(wanted_topic.topic, wanted.partition)
                high_watermark = partition.high_watermark
                last_stable = partition.last_stable_offset
                log_start = partition.log_start_offset
                limit = min(wanted.partition_max_bytes, max(budget, 0))
                data, aborted_txns = partition.read(
                    wanted.fetch_offset, limit, read_committed=read_committed, min_one_batch=first_data
                )
                if data:
                    first_data = False
                    budget -= len(data)
                    total += len(data)
                if read_committed:
                    aborted = [
                        aborted_class(producer_id=t.producer_id, first_offset=t.first_offset)
                        for t in aborted_txns
                    ]
            except BrokerError as exc:
                error = exc.code
                had_error = True
            partitions.append(
                partition_class(
                    partition_index=wanted.partition,
                    error_code=error,
                    high_watermark=high_watermark,
                    last_stable_offset=last_stable,
                    log_start_offset=log_start,
                    aborted_transactions=aborted,
                    preferred_read_replica=-1,
                    records=data,
                )
            )
        responses.append(topic_class(topic=wanted_topic.topic, partitions=partitions))
    return responses, total, had_error


async def list_offsets(broker: Broker, request: Any, context: RequestContext) -> Any:
    topic_class = ListOffsetsResponse.ListOffsetsTopicResponse
    partition_class = topic_class.ListOffsetsPartitionResponse
    read_committed = request.isolation_level == _READ_COMMITTED
    topics = []
    for wanted_topic in request.topics:
        partitions = []
        for wanted in wanted_topic.partitions:
            timestamp, offset, error = -1, -1, ErrorCode.NONE
            try:
                partition = broker.partition(wanted_topic.name, wanted.partition_index)
                if wanted.timestamp == _LATEST:
                    offset = partition.last_stable_offset if read_committed else partition.high_watermark
                elif wanted.timestamp == _EARLIEST:
                    offset = partition.log_start_offset
                elif wanted.timestamp == _MAX_TIMESTAMP:
                    found = partition.log.max_timestamp_offset()
                    if found is not None:
                        offset, timestamp = found
                elif wanted.timestamp < 0:
                    raise BrokerError(
                        ErrorCode.UNSUPPORTED_VERSION,
                        f"ListOffsets timestamp {wanted.timestamp} is not supported",
                    )
                else:
                    found = partition.log.offset_for_timestamp(wanted.timestamp)
                    upper = partition.last_stable_offset if read_committed else partition.high_watermark
                    if found is not None and found[0] < upper:
                        offset, timestamp = found
            except BrokerError as exc:
                error = exc.code
            partitions.append(
                partition_class(
                    partition_index=wanted.partition_index,
                    error_code=error,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=0 if error == ErrorCode.NONE else -1,
                )
            )
        topics.append(topic_class(name=wanted_topic.name, partitions=partitions))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


async def delete_records(broker: Broker, request: Any, context: RequestContext) -> Any:
    topic_class = DeleteRecordsResponse.DeleteRecordsTopicResult
    partition_class = topic_class.DeleteRecordsPartitionResult
    topics = []
    for wanted_topic in request.topics:
        partitions = []
        for wanted in wanted_topic.partitions:
            low_watermark, error = -1, ErrorCode.NONE
            try:
                partition = broker.partition(wanted_topic.name, wanted.partition_index)
                target = partition.high_watermark if wanted.offset == -1 else wanted.offset
                if not 0 <= target <= partition.high_watermark:
                    raise BrokerError(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"cannot delete records before {target}: "
                        f"high watermark is {partition.high_watermark}",
                    )
                low_watermark = partition.delete_records_before(target)
            except BrokerError as exc:
                error = exc.code
            partitions.append(
                partition_class(
                    partition_index=wanted.partition_index, low_watermark=low_watermark, error_code=error
                )
            )
        topics.append(topic_class(name=wanted_topic.name, partitions=partitions))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
