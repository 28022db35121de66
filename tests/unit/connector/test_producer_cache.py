"""The sink's per-worker producer cache: reuse by key, discard, and idle producers closed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

from sparkafka.connector.sink.ownership import record_initialised_here
from sparkafka.connector.sink.producers import (
    PRODUCER_IDLE_TIMEOUT_S,
    CachedProducer,
    ProducerCache,
    initialised_elsewhere,
)


class FlushRecorder:
    """Stands in for a confluent-kafka Producer: the cache only flushes what it closes."""

    def __init__(self) -> None:
        self.flushed: list[float] = []

    def flush(self, timeout: float) -> int:
        self.flushed.append(timeout)
        return 0


def _cached(name: str) -> tuple[CachedProducer, FlushRecorder]:
    recorder = FlushRecorder()
    producer: Any = recorder
    return CachedProducer(producer, name), recorder


KEY_A = ("127.0.0.1:9092", "prefix-0", "exactly-once")
KEY_B = ("127.0.0.1:9092", "prefix-1", "exactly-once")


def test_a_producer_is_found_under_its_key_until_discarded() -> None:
    cache = ProducerCache()
    cached, recorder = _cached("prefix-0")
    cache.put(KEY_A, cached)
    assert cache.get(KEY_A) is cached
    assert cache.get(KEY_B) is None
    cache.discard(KEY_A)
    assert cache.get(KEY_A) is None
    assert recorder.flushed == [0]


def test_get_or_create_creates_once() -> None:
    cache = ProducerCache()
    made: list[CachedProducer] = []

    def create() -> CachedProducer:
        made.append(_cached("plain")[0])
        return made[-1]

    first = cache.get_or_create(KEY_A, create)
    assert cache.get_or_create(KEY_A, create) is first
    assert made == [first]


def test_producers_idle_longer_than_the_timeout_are_closed_at_the_next_lookup() -> None:
    now = [1000.0]
    cache = ProducerCache(clock=lambda: now[0])
    idle, idle_recorder = _cached("prefix-0")
    used, used_recorder = _cached("prefix-1")
    cache.put(KEY_A, idle)
    cache.put(KEY_B, used)
    now[0] += PRODUCER_IDLE_TIMEOUT_S * 0.6
    assert cache.get(KEY_B) is used  # used now: not idle
    now[0] += PRODUCER_IDLE_TIMEOUT_S * 0.6
    assert cache.get(KEY_B) is used
    assert cache.get(KEY_A) is None, "the idle producer was kept"
    assert idle_recorder.flushed == [0]
    assert used_recorder.flushed == []


def test_producers_whose_ids_another_worker_initialised_since_are_closed_and_the_others_kept() -> None:
    """Another worker of this machine (here another process) initialising an id fences this
    worker's producer of it: it is closed at once; the producer of an id this worker initialised
    last, and a plain producer, are kept."""
    moved, kept = f"moved-{uuid.uuid4().hex}", f"kept-{uuid.uuid4().hex}"
    record_initialised_here(moved)
    record_initialised_here(kept)
    cache = ProducerCache()
    moved_key, kept_key = ("b:9092", moved, "exactly-once"), ("b:9092", kept, "exactly-once")
    plain_key = ("b:9092", None, "at-least-once")
    moved_producer, moved_recorder = _cached(moved)
    kept_producer, kept_recorder = _cached(kept)
    cache.put(moved_key, moved_producer)
    cache.put(kept_key, kept_producer)
    cache.put(plain_key, _cached("plain")[0])
    assert not any(initialised_elsewhere(key) for key in (moved_key, kept_key, plain_key))
    other_worker = (
        "from sparkafka.connector.sink.ownership import record_initialised_here; "
        f"record_initialised_here({moved!r})"
    )
    subprocess.run([sys.executable, "-c", other_worker], check=True)
    assert initialised_elsewhere(moved_key)
    cache.discard_where(initialised_elsewhere)
    assert cache.get(moved_key) is None
    assert moved_recorder.flushed == [0]
    assert cache.get(kept_key) is kept_producer and kept_recorder.flushed == []
    assert cache.get(plain_key) is not None
