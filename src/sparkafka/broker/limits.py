"""What clients may make the broker hold: memory for requests not yet handled (Kafka's
queued.max.request.bytes) and connections (max.connections, max.connections.per.ip).

Memory. A request's bytes count from the moment they are received until its handling ends: a frame
that fits a connection's receive buffer once cut from it, a larger one as its own buffer grows while
its body arrives (never from its declared size: a header alone costs nothing). Once the count
reaches the budget, connections stop reading (back-pressure, as Kafka mutes its channels when its
memory pool is empty), with one exception that keeps the broker from deadlocking: the connection
whose large frame started first may always finish it. So unhandled requests hold at most the budget
plus one request (at most socket.request.max.bytes), plus a receive step per connection; handling
them frees memory and reading resumes.

Connections. Over max.connections a new connection waits, unread and unanswered, until one ends,
as Kafka leaves it in the listen backlog (at most Kafka's socket.listen.backlog.size default, 50,
wait; any more are closed). Over max.connections.per.ip it is closed at once, as Kafka closes it.

Open files. Each connection is a socket and each partition keeps its active segment open. At start
the broker raises its soft open-file limit to the hard limit (:func:`raise_open_file_limit`), as the
JVM does for a Kafka broker, and max.connections defaults to half of that limit
(:func:`default_max_connections`): Kafka's own default is unbounded, and a broker whose connections
took every file descriptor would accept nothing and roll no segment.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import resource
from typing import Generic, Protocol, TypeVar

from sparkafka.broker.settings import setting

log = logging.getLogger("sparkafka.broker")

# Kafka's socket.listen.backlog.size default: connections waiting for a slot under max.connections.
LISTEN_BACKLOG = 50
# Kafka's max.connections default: no bound.
KAFKA_MAX_CONNECTIONS = int(setting("max_connections").kafka_default_text or "")
# The soft open-file limit the JVM takes where the system refuses the hard one (macOS's OPEN_MAX).
_OPEN_MAX_FALLBACK = 10240


def raise_open_file_limit() -> None:
    """Raise this process's soft open-file limit to its hard limit, as the JVM does when it starts a
    Kafka broker (-XX:+MaxFDLimit, on by default), before the broker opens its partitions. A
    desktop's usual soft limit (1024) would cap connections and partitions far below what the hard
    limit allows. Where the system refuses an unlimited soft limit (macOS), the JVM's fallback
    (OPEN_MAX, 10240) is taken. The process keeps the raised limit, as a JVM does, and so do the
    processes it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        if soft != resource.RLIM_INFINITY and soft < _OPEN_MAX_FALLBACK:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (_OPEN_MAX_FALLBACK, hard))


def default_max_connections() -> int:
    """max.connections unless set: half of the open files this process may have (the soft limit in
    effect, once :func:`raise_open_file_limit` raised it), so that connections alone cannot use up
    the files the logs need; Kafka's unbounded default where the limit is unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return KAFKA_MAX_CONNECTIONS
    return max(1, soft // 2)


_Connection = TypeVar("_Connection")


class Reader(Protocol):
    def update_reading(self) -> None: ...


class RequestMemory:
    """Bytes of requests received and not yet handled, against ``limit`` (None: unbounded)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        # Connections receiving a frame larger than their receive buffer, oldest first: the first
        # may grow its frame whatever the budget says.
        self._growing: dict[Reader, None] = {}
        self._waiting: dict[Reader, None] = {}

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    def is_first(self, reader: Reader) -> bool:
        return next(iter(self._growing), None) is reader

    def may_read(self, reader: Reader) -> bool:
        return not self.exhausted or self.is_first(reader)

    def room(self, reader: Reader) -> int | None:
        """How much more ``reader`` may take now; None: no bound."""
        if self.limit is None or self.is_first(reader):
            return None
        return max(self.limit - self.used, 0)

    def take(self, size: int) -> None:
        was_exhausted = self.exhausted
        self.used += size
        if self.exhausted and not was_exhausted:
            log.debug(
                "%d bytes of requests wait to be handled: reading pauses (queued.max.request.bytes=%s)",
                self.used,
                self.limit,
            )

    def give_back(self, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        if self._waiting and not self.exhausted:
            for reader in list(self._waiting):
                reader.update_reading()

    def start_frame(self, reader: Reader) -> None:
        self._growing[reader] = None

    def end_frame(self, reader: Reader) -> None:
        first = self.is_first(reader)
        self._growing.pop(reader, None)
        if first and self._growing:
            successor = next(iter(self._growing))
            if successor in self._waiting:
                successor.update_reading()

    def wait(self, reader: Reader) -> None:
        self._waiting[reader] = None

    def stop_waiting(self, reader: Reader) -> None:
        self._waiting.pop(reader, None)

    def forget(self, reader: Reader) -> None:
        self.stop_waiting(reader)
        self.end_frame(reader)


class ConnectionQuotas(Generic[_Connection]):
    """Connections served, in all and per client address, against max.connections and
    max.connections.per.ip."""

    def __init__(self, max_connections: int, max_connections_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.served = 0
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.waiting: collections.deque[_Connection] = collections.deque()

    @property
    def full(self) -> bool:
        return self.served >= self.max_connections

    def enter(self, ip: str) -> bool:
        """Count a connection from ``ip`` as served, unless its address is at its limit."""
        if self.per_ip[ip] >= self.max_connections_per_ip:
            return False
        self.per_ip[ip] += 1
        self.served += 1
        return True

    def leave(self, ip: str) -> None:
        self.served -= 1
        self.per_ip[ip] -= 1
        if not self.per_ip[ip]:
            del self.per_ip[ip]
