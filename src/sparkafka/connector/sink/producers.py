"""Producers kept per Python worker, one per transactional id: a plain pool.

Spark runs a task in any idle Python worker, so an id moves between workers; the pool keeps a
producer only while this worker initialised its id last (:mod:`.ownership`). Which producer a
task gets and what its id committed (steps 2 and 3 of the protocol) is :mod:`.id_state`'s;
ending what an id left open is :mod:`.fencing`."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_errors import error_code, error_reason
from sparkafka.connector.sink.client_config import producer_config
from sparkafka.connector.sink.failures import (
    authorization_error,
    sink_unreachable_error,
    transaction_timeout_error,
)
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.ownership import initialised_here_last, record_initialised_here
from sparkafka.connector.sink.transactional_ids import prefix_of
from sparkafka.errors import SparkafkaError

log = logging.getLogger(__name__)

# -- producers cached per Python worker --------------------------------------------------------------


@dataclass(eq=False)  # one per client: compared and hashed by identity
class CachedProducer:
    producer: Producer
    transactional_id: str | None
    delivery_errors: list[KafkaError] = field(default_factory=list)
    # The client's latest error events: why it cannot reach the cluster (a refused login, a refused
    # connection), which a timed-out call does not say. Bounded: a producer may live for days.
    client_errors: deque[KafkaError] = field(default_factory=lambda: deque(maxlen=_CLIENT_ERRORS_KEPT))


_CLIENT_ERRORS_KEPT = 16
# A producer idle this long (its query stopped, its id moved to another worker for good) is closed at
# the next lookup. Only another task of the same Python worker looks, and a worker runs one task at a
# time: a producer in use is never taken for idle, whatever its transaction's timeout.
PRODUCER_IDLE_TIMEOUT_S = 30 * 60.0

CacheKey = tuple[str, str | None, str]


class ProducerCache:
    """Producers kept per Python worker from one write task to the next, one per (cluster,
    transactional id, delivery guarantee); thread-safe.

    Invariants: a Python worker runs one task at a time, so the producer of an id is used by one task
    at once; a cached producer is only reused while this worker initialised its id last
    (:func:`.id_state.task_producer` checks); a producer that failed is discarded, never reused."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[CacheKey, tuple[CachedProducer, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def get(self, key: CacheKey) -> CachedProducer | None:
        """The producer cached under ``key`` (now counted as used), after closing idle ones."""
        now = self._clock()
        with self._lock:
            idle = [
                other
                for other, (_, used_at) in self._entries.items()
                if now - used_at > PRODUCER_IDLE_TIMEOUT_S
            ]
            expired = [self._entries.pop(other)[0] for other in idle]
            found = self._entries.get(key)
            if found is not None:
                self._entries[key] = (found[0], now)
        for entry in expired:
            _close(entry)
        return None if found is None else found[0]

    def put(self, key: CacheKey, cached: CachedProducer) -> None:
        with self._lock:
            self._entries[key] = (cached, self._clock())

    def get_or_create(self, key: CacheKey, create: Callable[[], CachedProducer]) -> CachedProducer:
        with self._lock:
            found = self._entries.get(key)
            cached = create() if found is None else found[0]
            self._entries[key] = (cached, self._clock())
        return cached

    def discard_where(self, stale: Callable[[CacheKey], bool]) -> None:
        """Forget and close every producer whose key ``stale`` accepts."""
        with self._lock:
            keys = [key for key in self._entries if stale(key)]
            found = [self._entries.pop(key)[0] for key in keys]
        for cached in found:
            _close(cached)

    def discard(self, key: CacheKey) -> None:
        """Forget and close the producer under ``key``, if any."""
        with self._lock:
            found = self._entries.pop(key, None)
        if found is not None:
            _close(found[0])


def _close(cached: CachedProducer) -> None:
    try:
        cached.producer.flush(0)
    except Exception:  # a broken producer may fail to flush; it is being thrown away anyway
        log.debug("discarding producer %s", cached.transactional_id, exc_info=True)


PRODUCERS = ProducerCache()


def cache_key(options: SinkOptions, transactional_id: str | None) -> CacheKey:
    return (options.bootstrap_servers, transactional_id, options.delivery_guarantee)


def new_cached_producer(options: SinkOptions, transactional_id: str | None) -> CachedProducer:
    """A producer whose failed deliveries land in its ``delivery_errors`` (producer-wide callback,
    so the per-row produce call carries no callback of its own)."""
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            errors.append(error)

    client_errors: deque[KafkaError] = deque(maxlen=_CLIENT_ERRORS_KEPT)
    config = {
        **producer_config(options, transactional_id),
        "on_delivery": on_delivery,
        "error_cb": client_errors.append,
    }
    return CachedProducer(
        Producer(config), transactional_id, delivery_errors=errors, client_errors=client_errors
    )


def initialised_elsewhere(key: CacheKey) -> bool:
    """Whether the transactional producer under ``key`` lost its id to another worker of this
    machine, which initialised the id since: the broker has fenced it, so it can never commit again
    (a task commits its own transaction: nothing of it is left open), yet it keeps its connections
    until it is closed."""
    transactional_id = key[1]
    return transactional_id is not None and not initialised_here_last(transactional_id)


def discard_producer(options: SinkOptions, transactional_id: str | None) -> None:
    PRODUCERS.discard(cache_key(options, transactional_id))


# Bounded apart from operationTimeoutMs: the look-up only saves about 100 ms, and the produce that
# needs the leaders looks them up again if it did not answer (a cluster gone since the read fails
# the task there, not here).
_LEADER_LOOKUP_TIMEOUT_S = 2.0


def learn_marker_partition_leaders(producer: Producer, marker_topic: str, timeout_s: float) -> None:
    """Have a new producer look up the leaders of the commit-marker topic before its first
    transaction (the end of step 3 of the protocol, sink package docstring).

    Why: a producer meeting a topic at a produce looks up its leader, and while one look-up is in
    flight librdkafka asks for the next unknown topic only at its next fast refresh, ``retry.backoff.ms``
    (100 ms) later. The marker is produced just after the rows, so the first commit of a new producer
    often waited those 100 ms for the marker topic's leader; and a write task's id moves between the
    Python workers of its executor, so most batches run on a new producer (about one commit in ten,
    on Apache Kafka as on the embedded broker).

    Only after step 3 read the marker topic: a producer's look-up of a topic that does not exist
    makes a broker with ``auto.create.topics.enable`` (Kafka's default) create it, with the broker's
    defaults (one partition, deleting instead of compacting), and a marker topic deleted since the
    driver ensured it must be found gone by that read, which refuses naming it. Later, as any
    producer that wrote a marker, this one refreshes what it knows of the topic every
    ``topic.metadata.refresh.interval.ms`` (5 minutes by default), which re-creates a marker topic
    deleted while it is cached; the driver then refuses that topic for its cleanup policy, saying a
    deleted topic may be the cause (:func:`~.commit_log.ensure_marker_topic`). The output topic is
    left to its produce, which may create it, and only when a row is written. A look-up that fails
    is logged and left to that produce."""
    try:
        producer.list_topics(marker_topic, timeout=min(timeout_s, _LEADER_LOOKUP_TIMEOUT_S))
    except KafkaException as error:
        log.debug("looking up the leaders of %s failed: %s", marker_topic, error_reason(error))


def init_transactions(
    options: SinkOptions, cached: CachedProducer, transactional_id: str, partition: int
) -> None:
    """Step 2 of the protocol (sink package docstring), part (b) of :func:`.id_state.task_producer`:
    initialise the id (the broker aborts and fences what an earlier attempt left open), or fail
    naming the cause and its fix."""
    producer = cached.producer
    try:
        producer.init_transactions(options.operation_timeout_s)
        record_initialised_here(transactional_id)
    except KafkaException as error:
        if error_code(error) == kafka_errors.TRANSACTION_TIMEOUT_REFUSED:
            raise transaction_timeout_error(options) from None
        if error_code(error) in kafka_errors.NOT_ANSWERED:
            producer.poll(0)  # error events reach client_errors on a poll
            raise sink_unreachable_error(
                options, f"initialise transactional id '{transactional_id}'", error, cached.client_errors
            ) from None
        refused = authorization_error(
            options,
            f"initialising transactional id '{transactional_id}'",
            error,
            prefix=prefix_of(transactional_id, partition),
        )
        if refused is not None:
            raise refused from None
        raise SparkafkaError(
            f"init_transactions for transactional id '{transactional_id}' failed: {error_reason(error)}"
        ) from None


def plain_producer(options: SinkOptions) -> CachedProducer:
    return PRODUCERS.get_or_create(cache_key(options, None), lambda: new_cached_producer(options, None))
