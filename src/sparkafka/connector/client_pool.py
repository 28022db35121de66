"""Kafka consumers kept per Python process from one Spark task to the next.

Spark runs every read task, and every exactly-once write task's commit-marker lookup, in whichever
Python worker is idle. A fresh librdkafka client first connects and learns the cluster; and about
one fresh client in thirty then waited 0.7 s for its first topic lookup (librdkafka sends it on the
bootstrap connection, closes that connection once it knows the brokers, and retries the lost request
on a timer). A micro-batch starts a dozen such clients, so those waits landed in every third batch's
latency. Spark's JVM connector pools its executors' consumers for the same reasons.

Only consumers that are assigned partitions by hand (never subscribed, never in a group) belong here:
their whole state is the assignment, which every borrower sets again.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaException

_MAX_IDLE_PER_CONFIG = 4
# An idle consumer keeps connections and librdkafka threads; one left idle this long (its cluster
# gone, its query stopped) is closed at the next borrow. Spark's JVM pool evicts after 5 minutes.
IDLE_TIMEOUT_S = 60.0
_PLAIN_VALUES = (str, int, float, bool, type(None))


def _config_key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    # Callbacks and loggers compare by identity: the same object means the same client behaviour.
    return tuple(
        (name, value if isinstance(value, _PLAIN_VALUES) else ("id", id(value)))
        for name, value in sorted(config.items())
    )


class ConsumerPool:
    """Idle consumers by configuration; thread-safe."""

    def __init__(self) -> None:
        self._idle: dict[tuple[tuple[str, Any], ...], list[tuple[Consumer, float]]] = {}
        self._spoiled: set[int] = set()
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self, config: Mapping[str, Any]) -> Iterator[Consumer]:
        """A consumer built from ``config``: an idle one when there is one, else a new one.

        Invariants: a borrowed consumer belongs to its borrower alone until the block ends. When the
        block ends normally the consumer is unassigned and goes back to the pool; unassigning also
        makes librdkafka drop whatever was fetched for the old assignment, so the next borrower,
        after its own ``assign``, sees only records at its own positions. When the block raises
        (including ``GeneratorExit`` from a reader Spark stopped early) the consumer's state is
        unknown, so it is closed instead; so is one the borrower passed to :meth:`do_not_reuse`."""
        key = _config_key(config)
        with self._lock:
            expired = self._take_expired(time.monotonic() - IDLE_TIMEOUT_S)
            idle = self._idle.get(key)
            consumer = idle.pop()[0] if idle else None
        for stale in expired:
            _close_quietly(stale)
        if consumer is None:
            consumer = Consumer(dict(config))
        try:
            yield consumer
        except BaseException:
            self._forget(consumer)
            _close_quietly(consumer)
            raise
        if self._forget(consumer):
            _close_quietly(consumer)
            return
        try:
            consumer.unassign()
        except (KafkaException, RuntimeError):
            _close_quietly(consumer)
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < _MAX_IDLE_PER_CONFIG:
                idle.append((consumer, time.monotonic()))
                return
        _close_quietly(consumer)

    def do_not_reuse(self, consumer: Consumer) -> None:
        """Close ``consumer`` when its borrower is done instead of pooling it: for a consumer that
        saw an error event. librdkafka queues some errors (a partition gone from the metadata, an
        offset reset) without an assignment version, so unassigning does not discard them, and the
        next borrower assigning the same partition would receive them as its own."""
        with self._lock:
            self._spoiled.add(id(consumer))

    def _forget(self, consumer: Consumer) -> bool:
        with self._lock:
            if id(consumer) in self._spoiled:
                self._spoiled.discard(id(consumer))
                return True
            return False

    def close_all(self) -> None:
        with self._lock:
            consumers = self._take_expired(float("inf"))
        for consumer in consumers:
            _close_quietly(consumer)

    def _take_expired(self, returned_before: float) -> list[Consumer]:
        """Remove and return the idle consumers returned before ``returned_before``; lock held."""
        expired: list[Consumer] = []
        for key, idle in list(self._idle.items()):
            expired += [consumer for consumer, returned_at in idle if returned_at < returned_before]
            kept = [entry for entry in idle if entry[1] >= returned_before]
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        return expired


def _close_quietly(consumer: Consumer) -> None:
    with contextlib.suppress(KafkaException, RuntimeError):  # already closed, or the cluster went away
        consumer.close()


CONSUMERS = ConsumerPool()
atexit.register(CONSUMERS.close_all)
