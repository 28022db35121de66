"""Produce, Fetch, ListOffsets and DeleteRecords."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.producer import ProduceResponse

from sparkafka.broker import fastpath
from sparkafka.broker.clock import now_ms
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.fastpath import Buffer, PartitionFetchResult, PartitionProduceResult
from sparkafka.broker.log import FileRegion
from sparkafka.broker.protocol import ApiKey
from sparkafka.broker.records import RecordValidationError

if TYPE_CHECKING:
    from sparkafka.broker.server import Broker, RequestContext

log = logging.getLogger(__name__)

_LATEST = -1
_EARLIEST = -2
_MAX_TIMESTAMP = -3
_EARLIEST_LOCAL = -4  # KIP-405: the local log start, here the log start (no tiered storage)
_LATEST_TIERED = -5  # KIP-1005: nothing tiered here
_EARLIEST_PENDING_UPLOAD = -6  # KIP-1023: nothing tiered here
# The first ListOffsets version that accepts each special timestamp (Kafka's ReplicaManager
# timestampMinSupportedVersion); any other negative timestamp is unsupported at every version.
_SPECIAL_TIMESTAMP_MIN_VERSION = {
    _LATEST: 1,
    _EARLIEST: 1,
    _MAX_TIMESTAMP: 7,
    _EARLIEST_LOCAL: 8,
    _LATEST_TIERED: 9,
    _EARLIEST_PENDING_UPLOAD: 11,
}
_READ_COMMITTED = 1

# Returned by a fast handler that leaves the request to the general codec and handler.
NOT_HANDLED: Any = object()


# Record chunks at least this large are sent from the segment file with sendfile by the fast fetch path;
# smaller ones are read into memory, where one write costs less than a sendfile round.
SENDFILE_MIN_BYTES = 256 * 1024

ProduceTopics = Iterable[tuple[str, Iterable[tuple[int, Buffer | None]]]]


def _produce(
    broker: Broker, acks: int, topics: ProduceTopics, version: int
) -> list[tuple[str, list[PartitionProduceResult]]]:
    """Append each partition's batches and say how each went; shared by the general and fast paths.

    Every partition is attempted independently: one partition's failure never blocks another's
    append, and each error names the partition and the reason."""
    acks_ok = acks in (-1, 0, 1)
    responses: list[tuple[str, list[PartitionProduceResult]]] = []
    appended = False
    now = now_ms()
    known_topics = broker.topics.topics
    for name, partition_data in topics:
        topic = known_topics.get(name)
        results: list[PartitionProduceResult] = []
        for index, records in partition_data:
            result = PartitionProduceResult(index)
            try:
                if not acks_ok:
                    raise BrokerError(
                        ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} is invalid; use -1 (all), 0 or 1"
                    )
                if topic is None:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                partition = broker.partition(topic.name, index)
                if records is None:
                    raise BrokerError(ErrorCode.INVALID_RECORD, "produce request without records")
                appended_at = partition.append_from_client(
                    records,
                    now_ms=now,
                    max_message_bytes=partition.log.config.max_message_bytes,
                    verify_transaction=broker.transactions.verify_partition,
                    produce_version=version,
                )
                result.base_offset = appended_at.base_offset
                result.log_append_time_ms = appended_at.log_append_time
                result.log_start_offset = partition.log_start_offset
                appended = appended or not appended_at.duplicate
            except BrokerError as exc:
                result.error_code, result.error_message = exc.code, exc.message
                if isinstance(exc, RecordValidationError):
                    # Produce v8+: which records of the batch were rejected and why (KIP-467).
                    result.record_errors = list(exc.record_errors)
                log.debug("produce to %s-%d rejected: %s", name, index, exc.message)
            results.append(result)
        responses.append((name, results))
    if appended:
        broker.notify_data()
    return responses


async def produce(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Produce through the general codec: append, answer per partition (nothing at all for acks=0)."""
    results = _produce(
        broker,
        request.acks,
        ((t.name, ((p.index, p.records) for p in t.partition_data)) for t in request.topic_data),
        context.version,
    )
    if request.acks == 0:
        return None
    return produce_response_object(results)


def produce_response_object(results: Iterable[tuple[str, Iterable[PartitionProduceResult]]]) -> Any:
    """The general codec's ProduceResponse for these results (fastpath encodes the same bytes)."""
    topic_class = ProduceResponse.TopicProduceResponse
    partition_class = topic_class.PartitionProduceResponse
    error_class = partition_class.BatchIndexAndErrorMessage
    return ProduceResponse(
        responses=[
            topic_class(
                name=name,
                partition_responses=[
                    partition_class(
                        index=r.index,
                        error_code=r.error_code,
                        base_offset=r.base_offset,
                        log_append_time_ms=r.log_append_time_ms,
                        log_start_offset=r.log_start_offset,
                        record_errors=[
                            error_class(batch_index=i, batch_index_error_message=m)
                            for i, m in r.record_errors
                        ],
                        error_message=r.error_message,
                    )
                    for r in partitions
                ],
            )
            for name, partitions in results
        ],
        throttle_time_ms=0,
    )


async def produce_frame(broker: Broker, frame: Buffer, context: RequestContext) -> Any:
    """Produce through the hand-written codec (fastpath.py): NOT_HANDLED when the request needs the
    general one, else the framed response bytes, or None for acks=0. Same semantics as produce()."""
    request = fastpath.decode_produce_request(frame, context.version)
    if request is None:
        return NOT_HANDLED
    results = _produce(broker, request.acks, request.topics, context.version)
    if request.acks == 0:
        return None
    return fastpath.encode_produce_response(context.version, context.correlation_id, results)


async def _fetch(
    broker: Broker,
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
    version: int,
    region_min_bytes: int | None,
) -> list[tuple[str, list[PartitionFetchResult]]]:
    """Read up to ``max_bytes`` across the requested partitions, waiting up to ``max_wait_ms`` for
    ``min_bytes``. read_committed reads stop at each partition's last stable offset and carry the
    aborted transactions overlapping the returned range. Chunks of at least ``region_min_bytes`` are file
    regions (see log.FileRegion) that the caller must send or close."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(max_wait_ms, 0) / 1000
    while True:
        responses, total_bytes, had_error = _read_fetch(
            broker, max_bytes, isolation_level, topics, version, region_min_bytes
        )
        remaining = deadline - loop.time()
        if total_bytes >= min_bytes or had_error or remaining <= 0:
            return responses
        close_regions(responses)
        await broker.wait_for_data(remaining)


def close_regions(responses: Iterable[tuple[str, Iterable[PartitionFetchResult]]]) -> None:
    """Close the file regions of fetch results that will not be sent."""
    for _, partitions in responses:
        for result in partitions:
            for chunk in result.records:
                if isinstance(chunk, FileRegion):
                    chunk.close()


async def fetch(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Fetch through the general codec."""
    if (
        context.version >= fastpath.FIRST_FETCH_SESSION_VERSION
        and request.session_epoch not in fastpath.FULL_FETCH_EPOCHS
    ):
        # An incremental fetch of a session. This broker keeps none (it answers every full fetch
        # with session id 0), so, as Kafka's FetchSession for an unknown session id:
        # FETCH_SESSION_ID_NOT_FOUND and no partitions.
        return FetchResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
            session_id=0,
            responses=[],
        )
    results = await _fetch(
        broker,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        topics=[
            (t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
            for t in request.topics
        ],
        version=context.version,
        region_min_bytes=None,
    )
    return fetch_response_object(results)


def fetch_response_object(results: Iterable[tuple[str, Iterable[PartitionFetchResult]]]) -> Any:
    """The general codec's FetchResponse for these results, whose records must all be bytes (fastpath
    encodes the same bytes)."""
    topic_class = FetchResponse.FetchableTopicResponse
    partition_class = topic_class.PartitionData
    aborted_class = partition_class.AbortedTransaction
    return FetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        session_id=0,
        responses=[
            topic_class(
                topic=name,
                partitions=[
                    partition_class(
                        partition_index=r.partition_index,
                        error_code=r.error_code,
                        high_watermark=r.high_watermark,
                        last_stable_offset=r.last_stable_offset,
                        log_start_offset=r.log_start_offset,
                        aborted_transactions=None
                        if r.aborted_transactions is None
                        else [
                            aborted_class(producer_id=producer_id, first_offset=first_offset)
                            for producer_id, first_offset in r.aborted_transactions
                        ],
                        preferred_read_replica=r.preferred_read_replica,
                        records=b"".join(cast(list[bytes], r.records)),
                    )
                    for r in partitions
                ],
            )
            for name, partitions in results
        ],
    )


async def fetch_frame(broker: Broker, frame: Buffer, context: RequestContext) -> Any:
    """Fetch through the hand-written codec: NOT_HANDLED when the request needs the general one, else the
    response as pieces (bytes and file regions) for the connection to write. Same semantics as fetch()."""
    request = fastpath.decode_fetch_request(frame, context.version)
    if request is None:
        return NOT_HANDLED
    results = await _fetch(
        broker,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        topics=request.topics,
        version=context.version,
        region_min_bytes=SENDFILE_MIN_BYTES,
    )
    try:
        return fastpath.encode_fetch_response(context.version, context.correlation_id, results)
    except BaseException:
        close_regions(results)
        raise


def _read_fetch(
    broker: Broker,
    max_bytes: int,
    isolation_level: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
    version: int,
    region_min_bytes: int | None,
) -> tuple[list[tuple[str, list[PartitionFetchResult]]], int, bool]:
    read_committed = isolation_level == _READ_COMMITTED
    budget = max_bytes if version >= 3 else 2**31 - 1
    first_data = True
    total = 0
    had_error = False
    responses: list[tuple[str, list[PartitionFetchResult]]] = []
    for name, wanted_partitions in topics:
        results: list[PartitionFetchResult] = []
        for index, fetch_offset, partition_max_bytes in wanted_partitions:
            result = PartitionFetchResult(index)
            try:
                partition = broker.partition(name, index)
                result.high_watermark = partition.high_watermark
                result.last_stable_offset = partition.last_stable_offset
                result.log_start_offset = partition.log_start_offset
                limit = min(partition_max_bytes, max(budget, 0))
                chunks, size, aborted_txns = partition.read_chunks(
                    fetch_offset,
                    limit,
                    read_committed=read_committed,
                    min_one_batch=first_data,
                    region_min_bytes=region_min_bytes,
                )
                result.records = chunks
                if size:
                    first_data = False
                    budget -= size
                    total += size
                if read_committed:
                    result.aborted_transactions = [(t.producer_id, t.first_offset) for t in aborted_txns]
            except BrokerError as exc:
                # As Kafka's ReplicaManager for a failed read: the error alone, every offset unknown.
                result = PartitionFetchResult(index, error_code=exc.code)
                had_error = True
            results.append(result)
        responses.append((name, results))
    return responses, total, had_error


async def list_offsets(broker: Broker, request: Any, context: RequestContext) -> Any:
    topic_class = ListOffsetsResponse.ListOffsetsTopicResponse
    partition_class = topic_class.ListOffsetsPartitionResponse
    read_committed = request.isolation_level == _READ_COMMITTED
    # As Kafka's KafkaApis: a partition named twice is answered INVALID_REQUEST each time.
    named = Counter((t.name, p.partition_index) for t in request.topics for p in t.partitions)
    topics = []
    for wanted_topic in request.topics:
        partitions = []
        for wanted in wanted_topic.partitions:
            timestamp, offset, error = -1, -1, ErrorCode.NONE
            try:
                # Kafka's ReplicaManager.fetchOffset: a duplicate, then an unsupported timestamp for
                # this version, then the partition.
                if named[(wanted_topic.name, wanted.partition_index)] > 1:
                    raise BrokerError(ErrorCode.INVALID_REQUEST, "partition listed more than once")
                if wanted.timestamp < 0 and context.version < _SPECIAL_TIMESTAMP_MIN_VERSION.get(
                    wanted.timestamp, 1 << 15
                ):
                    raise BrokerError(
                        ErrorCode.UNSUPPORTED_VERSION,
                        f"ListOffsets v{context.version} timestamp {wanted.timestamp} is not supported",
                    )
                partition = broker.partition(wanted_topic.name, wanted.partition_index)
                # Partition.fetchOffsetForTimestamp: nothing at or past the last fetchable offset.
                upper = partition.last_stable_offset if read_committed else partition.high_watermark
                if wanted.timestamp == _LATEST:
                    offset = upper
                elif wanted.timestamp in (_EARLIEST, _EARLIEST_LOCAL):
                    offset = partition.log_start_offset
                elif wanted.timestamp in (_LATEST_TIERED, _EARLIEST_PENDING_UPLOAD):
                    pass  # UnifiedLog without remote storage: offset -1, epoch -1
                elif wanted.timestamp == _MAX_TIMESTAMP:
                    found = partition.log.max_timestamp_offset()
                    if found is not None and found[0] < upper:
                        offset, timestamp = found
                else:
                    found = partition.log.offset_for_timestamp(wanted.timestamp)
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
                    # No offset found (a timestamp search without a match): no epoch either.
                    leader_epoch=0 if error == ErrorCode.NONE and offset >= 0 else -1,
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


# Handlers that take the raw request frame (see server.Connection): tried first for their api key.
FAST_HANDLERS = {ApiKey.PRODUCE: produce_frame, ApiKey.FETCH: fetch_frame}
