"""Incremental fetch sessions (KIP-227) as Kafka's FetchManager keeps them; the wire behaviour is
checked against Apache Kafka in tests/integration/broker/test_broker_clients.py."""

from __future__ import annotations

import random

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.fastpath import PartitionFetchResult
from sparkafka.broker.fetch_sessions import (
    FINAL_EPOCH,
    FetchResults,
    FetchSessionCache,
    FetchTopics,
    next_epoch,
)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def _results(
    topics: FetchTopics, *, high_watermark: int = 5, records: frozenset[tuple[str, int]] = frozenset()
) -> FetchResults:
    return [
        (
            topic,
            [
                PartitionFetchResult(
                    index,
                    high_watermark=high_watermark,
                    last_stable_offset=high_watermark,
                    log_start_offset=0,
                    records=[b"batch"] if (topic, index) in records else [],
                )
                for index, _, _ in partitions
            ],
        )
        for topic, partitions in topics
    ]


def _open(cache: FetchSessionCache, topics: FetchTopics) -> int:
    context = cache.context(12, 0, 0, topics)
    error, session_id, _ = cache.answer(context, _results(context.topics))
    assert error == ErrorCode.NONE
    return session_id


def test_epochs_follow_kafkas_next_epoch() -> None:
    assert [next_epoch(e) for e in (FINAL_EPOCH, 0, 1, 2**31 - 1)] == [FINAL_EPOCH, 1, 2, 1]


def test_an_incremental_fetch_reads_the_whole_session_and_answers_what_changed() -> None:
    cache = FetchSessionCache(Clock(), rng=random.Random(1))
    session_id = _open(cache, [("a", [(0, 5, 100), (1, 5, 100)]), ("b", [(0, 5, 100)])])
    assert session_id > 0
    # The request names a new partition and updates another's offset; all of the session is read.
    context = cache.context(12, session_id, 1, [("c", [(0, 0, 100)]), ("a", [(1, 3, 100)])])
    assert context.topics == [("a", [(0, 5, 100), (1, 3, 100)]), ("b", [(0, 5, 100)]), ("c", [(0, 0, 100)])]
    results = _results(context.topics, records=frozenset({("a", 1), ("c", 0)}))
    results[1][1][0].high_watermark = 6  # b-0 grew
    error, answered_id, answered = cache.answer(context, results)
    assert (error, answered_id) == (ErrorCode.NONE, session_id)
    assert [(t, [p.partition_index for p in ps]) for t, ps in answered] == [
        ("a", [1]),
        ("b", [0]),
        ("c", [0]),
    ]
    # Partitions that returned records moved to the end of the session.
    assert cache.context(12, session_id, 2, []).topics == [
        ("a", [(0, 5, 100)]),
        ("b", [(0, 5, 100)]),
        ("a", [(1, 3, 100)]),
        ("c", [(0, 0, 100)]),
    ]


def test_an_error_is_answered_every_time_and_its_partition_once_more_after() -> None:
    cache = FetchSessionCache(Clock())
    session_id = _open(cache, [("a", [(0, 5, 100)])])
    for epoch, (code, expected) in enumerate([(3, [0]), (3, [0]), (0, [0]), (0, [])], start=1):
        context = cache.context(12, session_id, epoch, [])
        results = _results(context.topics, high_watermark=-1 if code else 5)
        results[0][1][0].error_code = code
        _, _, answered = cache.answer(context, results)
        assert [p.partition_index for _, ps in answered for p in ps] == expected, epoch


def test_a_stale_concurrent_fetch_of_a_session_is_refused_when_answered() -> None:
    cache = FetchSessionCache(Clock())
    session_id = _open(cache, [("a", [(0, 5, 100)])])
    first = cache.context(12, session_id, 1, [])
    second = cache.context(12, session_id, 2, [])
    assert cache.answer(first, _results(first.topics)) == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        session_id,
        [],
    )
    assert cache.answer(second, _results(second.topics))[:2] == (ErrorCode.NONE, session_id)


def test_a_full_cache_evicts_a_stale_session_or_a_smaller_old_one() -> None:
    clock = Clock()
    cache = FetchSessionCache(clock, max_sessions=2, eviction_ms=1000)
    small = _open(cache, [("a", [(0, 0, 1)])])
    large = _open(cache, [("a", [(0, 0, 1), (1, 0, 1), (2, 0, 1)])])
    assert _open(cache, [("b", [(0, 0, 1)])]) == 0  # all young: no room
    clock.ms += 600
    cache.context(12, small, 1, [])  # both used now
    cache.context(12, large, 1, [])
    clock.ms += 600
    # Both are older than the eviction time; neither idle that long: the smallest makes room for
    # a session at least as large, never for a smaller one.
    assert _open(cache, [("b", [])]) == 0
    newcomer = _open(cache, [("b", [(0, 0, 1), (1, 0, 1)])])
    assert newcomer > 0 and set(cache.sessions) == {large, newcomer} and small not in cache.sessions
    clock.ms += 1001  # large idle for longer than the eviction time: the least recently used goes
    assert _open(cache, [("c", [])]) > 0 and large not in cache.sessions
