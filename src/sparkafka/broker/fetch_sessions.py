"""Incremental fetch sessions (KIP-227), as Kafka's FetchManager and FetchSessionCache keep them.

A Fetch request (v7+) carries a session id and epoch:

- epoch -1 (FINAL): a full fetch wanting no session; a session id with it closes that session;
- epoch 0 (INITIAL): a full fetch opening a session (closing the one it names, if any). The answer has
  every partition asked for and the new session's id, or id 0 when the cache has no room;
- any other epoch: an incremental fetch of the session it names, which must expect that epoch
  (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH otherwise, with no partitions). The request
  names only the partitions added or changed, and those to forget; the broker reads every partition
  of the session, and answers only those with records, a new high watermark or log start offset, or
  an error. A partition that returned records moves to the end of the session (fairness).

The cache holds up to ``max_sessions`` (Kafka's max.incremental.fetch.session.cache.slots); when
full, a new session may evict one idle for longer than ``eviction_ms``
(min.incremental.fetch.session.eviction.ms), else the smallest one older than that, when no larger
than the new one."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.fastpath import PartitionFetchResult
from sparkafka.broker.log_segment import FileRegion
from sparkafka.broker.settings import default_int

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
FIRST_SESSION_VERSION = 7
MAX_SESSIONS = default_int("max_incremental_fetch_session_cache_slots")
# Kafka fixes this one (KafkaServer.MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS): not a setting.
EVICTION_MS = 120_000
_INT32_MAX = 2**31 - 1

# (topic, [(partition, fetch offset, partition max bytes)]), in the order read and answered.
FetchTopics = list[tuple[str, list[tuple[int, int, int]]]]
FetchResults = list[tuple[str, list[PartitionFetchResult]]]


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: FINAL stays FINAL; after the largest int comes 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _INT32_MAX else epoch + 1


@dataclass(slots=True)
class _CachedPartition:
    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1  # as last answered; -1 until answered, and after an error
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchSession:
    session_id: int
    epoch: int  # the epoch the next incremental fetch must carry
    created_ms: int
    last_used_ms: int
    partitions: dict[tuple[str, int], _CachedPartition] = field(default_factory=dict)  # in session order

    def topics(self) -> FetchTopics:
        """The session's partitions in its order, consecutive ones of a topic together."""
        grouped: FetchTopics = []
        for (topic, index), cached in self.partitions.items():
            if not grouped or grouped[-1][0] != topic:
                grouped.append((topic, []))
            grouped[-1][1].append((index, cached.fetch_offset, cached.max_bytes))
        return grouped


@dataclass(slots=True)
class FetchContext:
    """How one Fetch request is served: what it reads (``topics``), then how it is answered."""

    topics: FetchTopics
    error: ErrorCode = ErrorCode.NONE
    open_session: bool = False  # a full fetch of epoch 0
    session: FetchSession | None = None  # an incremental fetch of this session
    request_epoch: int = FINAL_EPOCH


class FetchSessionCache:
    def __init__(
        self,
        now_ms: Callable[[], int],
        *,
        max_sessions: int = MAX_SESSIONS,
        eviction_ms: int = EVICTION_MS,
        rng: random.Random | None = None,
    ) -> None:
        self._now_ms = now_ms
        self._max_sessions = max_sessions
        self._eviction_ms = eviction_ms
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}

    def context(
        self,
        version: int,
        session_id: int,
        epoch: int,
        topics: FetchTopics,
        forgotten: Sequence[tuple[str, Iterable[int]]] = (),
    ) -> FetchContext:
        """Kafka's FetchManager.newContext for a request of this version, session id and epoch."""
        if version < FIRST_SESSION_VERSION:
            return FetchContext(topics)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.sessions.pop(session_id, None)
            return FetchContext(topics, open_session=epoch == INITIAL_EPOCH)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext([], ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return FetchContext([], ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        for topic, partitions in topics:
            for index, fetch_offset, max_bytes in partitions:
                cached = session.partitions.get((topic, index))
                if cached is None:
                    session.partitions[(topic, index)] = _CachedPartition(fetch_offset, max_bytes)
                else:
                    cached.fetch_offset, cached.max_bytes = fetch_offset, max_bytes
        for topic, indexes in forgotten:
            for index in indexes:
                session.partitions.pop((topic, index), None)
        if not session.partitions:
            # Nothing left: the session is closed, and this fetch answered without one.
            del self.sessions[session_id]
            return FetchContext(topics)
        session.last_used_ms = self._now_ms()
        session.epoch = next_epoch(session.epoch)
        return FetchContext(session.topics(), session=session, request_epoch=epoch)

    def answer(self, context: FetchContext, results: FetchResults) -> tuple[ErrorCode, int, FetchResults]:
        """(error, session id, partitions) of the answer to a fetch served with ``context``, whose
        reads gave ``results`` (for ``context.topics``, in its order). Partitions left out of an
        incremental answer are closed (their file regions) here."""
        if context.error != ErrorCode.NONE:
            return context.error, INVALID_SESSION_ID, []
        session = context.session
        if session is not None:
            return self._incremental_answer(session, context.request_epoch, results)
        if context.open_session:
            return ErrorCode.NONE, self._maybe_create(context.topics, results), results
        return ErrorCode.NONE, INVALID_SESSION_ID, results

    def _incremental_answer(
        self, session: FetchSession, request_epoch: int, results: FetchResults
    ) -> tuple[ErrorCode, int, FetchResults]:
        if session.epoch != next_epoch(request_epoch):
            # Another fetch of the session came in meanwhile: this one is stale.
            _close(results)
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.session_id, []
        answered: FetchResults = []
        for topic, partitions in results:
            kept: list[PartitionFetchResult] = []
            for result in partitions:
                key = (topic, result.partition_index)
                cached = session.partitions.get(key)
                if cached is None or _must_answer(cached, result):
                    kept.append(result)
                    if cached is not None and any(len(chunk) for chunk in result.records):
                        session.partitions[key] = session.partitions.pop(key)  # to the end
                else:
                    _close([(topic, [result])])
            if kept:
                if answered and answered[-1][0] == topic:
                    answered[-1][1].extend(kept)
                else:
                    answered.append((topic, kept))
        return ErrorCode.NONE, session.session_id, answered

    def _maybe_create(self, topics: FetchTopics, results: FetchResults) -> int:
        now = self._now_ms()
        size = sum(len(partitions) for _, partitions in topics)
        if len(self.sessions) >= self._max_sessions and not self._evict_for(size, now):
            return INVALID_SESSION_ID
        session_id = INVALID_SESSION_ID
        while session_id == INVALID_SESSION_ID or session_id in self.sessions:
            session_id = self._rng.randint(1, _INT32_MAX - 1)
        session = FetchSession(session_id, next_epoch(INITIAL_EPOCH), now, now)
        answered = {
            (topic, result.partition_index): result for topic, partitions in results for result in partitions
        }
        for topic, partitions in topics:
            for index, fetch_offset, max_bytes in partitions:
                result = answered.get((topic, index))
                cached = _CachedPartition(fetch_offset, max_bytes)
                if result is not None:
                    cached.high_watermark = -1 if result.error_code else result.high_watermark
                    cached.log_start_offset = result.log_start_offset
                session.partitions[(topic, index)] = cached
        self.sessions[session_id] = session
        return session_id

    def _evict_for(self, size: int, now: int) -> bool:
        """FetchSessionCacheShard.tryEvict: the least recently used session if idle for longer than
        the eviction time, else the smallest (then lowest id) of those older than it, if no larger
        than the new session."""
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.session_id))
        if now - stale.last_used_ms > self._eviction_ms:
            del self.sessions[stale.session_id]
            return True
        old = [s for s in self.sessions.values() if now - s.created_ms > self._eviction_ms]
        if not old:
            return False
        smallest = min(old, key=lambda s: (len(s.partitions), s.session_id))
        if (size, 0) < (len(smallest.partitions), smallest.session_id):
            return False
        del self.sessions[smallest.session_id]
        return True


def _must_answer(cached: _CachedPartition, result: PartitionFetchResult) -> bool:
    """Kafka's CachedPartition.maybeUpdateResponseData: records, a changed high watermark or log
    start offset, a preferred read replica or an error are answered; the cache takes the new values."""
    must = any(len(chunk) for chunk in result.records) or result.preferred_read_replica >= 0
    if cached.high_watermark != result.high_watermark:
        cached.high_watermark = result.high_watermark
        must = True
    if cached.log_start_offset != result.log_start_offset:
        cached.log_start_offset = result.log_start_offset
        must = True
    if result.error_code:
        cached.high_watermark = -1  # answered again once the error is gone
        must = True
    return must


def _close(results: FetchResults) -> None:
    for _, partitions in results:
        for result in partitions:
            for chunk in result.records:
                if isinstance(chunk, FileRegion):
                    chunk.close()
