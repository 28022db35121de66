"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch and DeleteRecords."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse, OffsetForLeaderEpochResponse
from kafka.protocol.producer import ProduceResponse

from sparkafka.broker import fastpath, records
from sparkafka.broker.clock import now_ms
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.fastpath import Buffer, PartitionFetchResult, PartitionProduceResult
from sparkafka.broker.log_segment import FileRegion
from sparkafka.broker.protocol import ApiKey
from sparkafka.broker.records import ProduceRequestRecordsError, RecordValidationError
from sparkafka.broker.transactions import TransactionVerificationError

if TYPE_CHECKING:
    from sparkafka.broker.connection import RequestContext
    from sparkafka.broker.partition import Partition
    from sparkafka.broker.server import Broker

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

# Produce errors answered without the partition's log start offset (-1): those Kafka finds before
# appending (KafkaApis, ReplicaManager.appendRecords) and those ReplicaManager.appendToLocalLog catches
# by type; every other append error carries the log start offset.
_NO_LOG_START_OFFSET_ERRORS = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.INVALID_REQUIRED_ACKS,
    }
)

# Returned by a fast handler that leaves the request to the general codec and handler.
NOT_HANDLED: Any = object()


# Record chunks at least this large are sent from the segment file with sendfile by the fast fetch path;
# smaller ones are read into memory, where one write costs less than a sendfile round.
SENDFILE_MIN_BYTES = 256 * 1024

ProduceTopics = Iterable[tuple[str, Iterable[tuple[int, Buffer | None]]]]


def _produce(
    broker: Broker, acks: int, transactional_id: str | None, topics: ProduceTopics, version: int
) -> list[tuple[str, list[PartitionProduceResult]]]:
    """Append each partition's batches and say how each went; shared by the general and fast paths.

    Every partition is attempted independently: one partition's failure never blocks another's
    append, and each error names the partition and the reason. Transactional batches are verified
    against the request's transactional id; with none, a request carrying any is refused as a whole
    (KafkaApis: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition)."""
    topics = [(name, list(partition_data)) for name, partition_data in topics]
    if transactional_id is None and any(
        records.first_batch_is_transactional(data)
        for _, partition_data in topics
        for _, data in partition_data
    ):
        refused = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return [
            (name, [PartitionProduceResult(index, error_code=refused) for index, _ in partition_data])
            for name, partition_data in topics
        ]

    def verify_transaction(producer_id: int, producer_epoch: int, topic: str, index: int) -> None:
        broker.transactions.verify_partition(
            transactional_id or "", producer_id, producer_epoch, topic, index
        )

    acks_ok = acks in (-1, 0, 1)
    responses: list[tuple[str, list[PartitionProduceResult]]] = []
    appended = False
    now = now_ms()
    known_topics = broker.topics.topics
    for name, partition_data in topics:
        topic = known_topics.get(name)
        results: list[PartitionProduceResult] = []
        for index, data in partition_data:
            result = PartitionProduceResult(index)
            partition: Partition | None = None
            try:
                if not acks_ok:
                    raise BrokerError(
                        ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} is invalid; use -1 (all), 0 or 1"
                    )
                if topic is None:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                partition = broker.partition(topic.name, index)
                if data is None:
                    raise BrokerError(ErrorCode.INVALID_RECORD, "produce request without records")
                appended_at = partition.append_from_client(
                    data,
                    now_ms=now,
                    max_message_bytes=partition.log.config.max_message_bytes,
                    verify_transaction=verify_transaction,
                    produce_version=version,
                )
                result.base_offset = appended_at.base_offset
                result.log_append_time_ms = appended_at.log_append_time
                result.log_start_offset = partition.log_start_offset
                appended = appended or not appended_at.duplicate
            except BrokerError as exc:
                result.error_code = exc.code
                # Kafka sends its own text only with the errors that have one
                # (LogAppendResult.hasCustomErrorMessage): record validation, and some verifications.
                if isinstance(exc, RecordValidationError):
                    # Produce v8+: which records of the batch were rejected and why (KIP-467).
                    result.record_errors = list(exc.record_errors)
                    result.error_message = exc.message
                elif isinstance(exc, TransactionVerificationError):
                    result.error_message = exc.kafka_text
                if (
                    partition is not None
                    and exc.code not in _NO_LOG_START_OFFSET_ERRORS
                    and not isinstance(exc, (ProduceRequestRecordsError, TransactionVerificationError))
                ):
                    result.log_start_offset = partition.log_start_offset
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
        request.transactional_id,
        ((t.name, ((p.index, p.records) for p in t.partition_data)) for t in request.topic_data),
        context.version,
    )
    if request.acks == 0:
        return _unanswered_produce(results, context)
    return produce_response_object(results)


def _unanswered_produce(
    results: Iterable[tuple[str, Iterable[PartitionProduceResult]]], context: RequestContext
) -> Literal[False] | None:
    """acks=0: no response; but if any partition failed, False (close the connection). A producer that
    expects no answer learns of a failure only by the disconnect, which makes it refresh its metadata
    (KafkaApis.handleProduceRequest)."""
    failed = [
        f"{name}-{result.index}: {ErrorCode(result.error_code).name}"
        for name, partitions in results
        for result in partitions
        if result.error_code != ErrorCode.NONE
    ]
    if not failed:
        return None
    log.info(
        "closing the connection of client %r after a failed acks=0 produce request (correlation id %d): %s",
        context.client_id,
        context.correlation_id,
        ", ".join(failed),
    )
    return False


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
    results = _produce(broker, request.acks, request.transactional_id, request.topics, context.version)
    if request.acks == 0:
        return _unanswered_produce(results, context)
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
    regions (see log.FileRegion) that the caller must send or close.

    As Kafka's KafkaApis.handleFetchRequest and ReplicaManager.fetchMessages:
      1. ``max_bytes`` is at most the broker's fetch.max.bytes (requests before v3 have none: that
         limit alone), ``min_bytes`` at most ``max_bytes``;
      2. partitions this broker does not have are answered UNKNOWN_TOPIC_OR_PARTITION and take no
         further part; with none left (or none asked for) the answer is immediate;
      3. the answer is immediate when ``min_bytes`` are there or a partition's read failed
         (OFFSET_OUT_OF_RANGE, …); else it waits for new data up to ``max_wait_ms``, and stops waiting
         as soon as a partition it reads is gone (deleted topic)."""
    limit = broker.config.fetch_max_bytes
    max_bytes = min(max_bytes if version >= 3 else limit, limit)
    min_bytes = min(min_bytes, max_bytes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(max_wait_ms, 0) / 1000
    readable_at_start: int | None = None
    while True:
        responses, total_bytes, read_failed, readable = _read_fetch(
            broker, max_bytes, isolation_level, topics, version, region_min_bytes
        )
        if readable_at_start is None:
            readable_at_start = readable
        remaining = deadline - loop.time()
        if (
            total_bytes >= min_bytes
            or read_failed
            or readable == 0
            or readable < readable_at_start
            or remaining <= 0
        ):
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
    """Fetch through the general codec. Same semantics as fetch_frame()."""
    session = broker.fetch_sessions.context(
        context.version,
        getattr(request, "session_id", 0),
        getattr(request, "session_epoch", -1),
        [
            (t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
            for t in request.topics
        ],
        [(t.topic, t.partitions) for t in getattr(request, "forgotten_topics_data", None) or ()],
    )
    results = await _fetch_for(broker, request, session.topics, context.version, None)
    return fetch_response_object(*broker.fetch_sessions.answer(session, results))


async def _fetch_for(
    broker: Broker,
    request: Any,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
    version: int,
    region_min_bytes: int | None,
) -> list[tuple[str, list[PartitionFetchResult]]]:
    """_fetch of ``topics`` with the request's limits; nothing at all for a session error (no topics:
    Kafka answers a fetch without partitions at once)."""
    return await _fetch(
        broker,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        topics=topics,
        version=version,
        region_min_bytes=region_min_bytes,
    )


def fetch_response_object(
    error_code: int,
    session_id: int,
    results: Iterable[tuple[str, Iterable[PartitionFetchResult]]],
) -> Any:
    """The general codec's FetchResponse for these results, whose records must all be bytes (fastpath
    encodes the same bytes)."""
    topic_class = FetchResponse.FetchableTopicResponse
    partition_class = topic_class.PartitionData
    aborted_class = partition_class.AbortedTransaction
    return FetchResponse(
        throttle_time_ms=0,
        error_code=error_code,
        session_id=session_id,
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
    session = broker.fetch_sessions.context(
        context.version, request.session_id, request.session_epoch, request.topics, request.forgotten
    )
    results = await _fetch_for(broker, request, session.topics, context.version, SENDFILE_MIN_BYTES)
    error_code, session_id, results = broker.fetch_sessions.answer(session, results)
    try:
        return fastpath.encode_fetch_response(
            context.version, context.correlation_id, results, error_code=error_code, session_id=session_id
        )
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
) -> tuple[list[tuple[str, list[PartitionFetchResult]]], int, bool, int]:
    """One pass over the requested partitions: (results per topic, bytes read, whether a partition's
    read failed, how many partitions this broker has)."""
    read_committed = isolation_level == _READ_COMMITTED
    budget = max_bytes
    first_data = True
    total = 0
    read_failed = False
    readable = 0
    responses: list[tuple[str, list[PartitionFetchResult]]] = []
    for name, wanted_partitions in topics:
        results: list[PartitionFetchResult] = []
        for index, fetch_offset, partition_max_bytes in wanted_partitions:
            result = PartitionFetchResult(index)
            partition = broker.partitions.get((name, index))
            if partition is None:
                # KafkaApis leaves it out of the read (the metadata cache does not list it).
                results.append(PartitionFetchResult(index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            readable += 1
            try:
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
                code = exc.code
                if code == ErrorCode.KAFKA_STORAGE_ERROR and version <= 5:
                    # KafkaApis.maybeDownConvertStorageError: clients of Fetch v5 and older may not know
                    # the code and would give up; NOT_LEADER_OR_FOLLOWER makes them refresh and retry.
                    code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                result = PartitionFetchResult(index, error_code=code)
                read_failed = True
            results.append(result)
        responses.append((name, results))
    return responses, total, read_failed, readable


async def list_offsets(broker: Broker, request: Any, context: RequestContext) -> Any:
    topic_class = ListOffsetsResponse.ListOffsetsTopicResponse
    partition_class = topic_class.ListOffsetsPartitionResponse
    read_committed = request.isolation_level == _READ_COMMITTED
    # As Kafka's ReplicaManager.fetchOffset: one answer per partition (INVALID_REQUEST for a partition
    # named more than once), grouped by topic.
    named = Counter((t.name, p.partition_index) for t in request.topics for p in t.partitions)
    answers: dict[str, list[Any]] = {}
    answered: set[tuple[str, int]] = set()
    for wanted_topic in request.topics:
        partitions = answers.setdefault(wanted_topic.name, [])
        for wanted in wanted_topic.partitions:
            if (wanted_topic.name, wanted.partition_index) in answered:
                continue
            answered.add((wanted_topic.name, wanted.partition_index))
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
    topics = [topic_class(name=name, partitions=partitions) for name, partitions in answers.items()]
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


# A single-node broker leads every partition from its creation, in leader epoch 0 (the epoch its
# Metadata, ListOffsets and record batches carry): Kafka's leader-epoch cache holds one entry, (0, 0).
_LEADER_EPOCH = 0
_UNDEFINED_EPOCH = -1
_UNDEFINED_EPOCH_OFFSET = -1


async def offset_for_leader_epoch(broker: Broker, request: Any, context: RequestContext) -> Any:
    """KIP-320: where each asked leader epoch ends in the partition's log, as Kafka's
    ``Partition.lastOffsetForLeaderEpoch`` answers a consumer (``replica_id`` -1), for a log with one
    epoch. Steps, per partition: an unknown partition is UNKNOWN_TOPIC_OR_PARTITION; a
    ``current_leader_epoch`` other than -1 must be the leader's (older: FENCED_LEADER_EPOCH, newer:
    UNKNOWN_LEADER_EPOCH); then ``LeaderEpochFileCache.endOffsetFor``: the latest epoch ends at the
    log end offset, an epoch past it or undefined has no end (-1, -1)."""
    topic_class = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
    partition_class = topic_class.EpochEndOffset
    topics = []
    for wanted_topic in request.topics:
        answers = []
        for wanted in wanted_topic.partitions:
            error, epoch, end_offset = ErrorCode.NONE, _UNDEFINED_EPOCH, _UNDEFINED_EPOCH_OFFSET
            try:
                partition = broker.partition(wanted_topic.topic, wanted.partition)
                current = wanted.current_leader_epoch
                if current not in (-1, _LEADER_EPOCH):
                    code = (
                        ErrorCode.FENCED_LEADER_EPOCH
                        if current < _LEADER_EPOCH
                        else ErrorCode.UNKNOWN_LEADER_EPOCH
                    )
                    raise BrokerError(
                        code, f"current leader epoch {current}, the leader's is {_LEADER_EPOCH}"
                    )
                if wanted.leader_epoch == _LEADER_EPOCH:
                    epoch, end_offset = _LEADER_EPOCH, partition.log.log_end_offset
            except BrokerError as exc:
                error = exc.code
            answers.append(
                partition_class(
                    error_code=error, partition=wanted.partition, leader_epoch=epoch, end_offset=end_offset
                )
            )
        topics.append(topic_class(topic=wanted_topic.topic, partitions=answers))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)


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
                low_watermark = partition.delete_records_before(wanted.offset)
            except BrokerError as exc:
                error = exc.code
            partitions.append(
                partition_class(
                    partition_index=wanted.partition_index, low_watermark=low_watermark, error_code=error
                )
            )
        topics.append(topic_class(name=wanted_topic.name, partitions=partitions))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


# Handlers that take the raw request frame (see connection.Connection): tried first for their api key.
FAST_HANDLERS = {ApiKey.PRODUCE: produce_frame, ApiKey.FETCH: fetch_frame}
