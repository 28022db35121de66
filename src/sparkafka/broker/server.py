"""The broker process: state it owns, the asyncio TCP server and per-connection request handling.

All state lives on one asyncio event loop; a handler runs to completion (or to an ``await`` that
waits for data or a rebalance) without interleaving with other handlers' state changes, so no
locks are needed. Per connection, requests are handled one at a time and answered in order, as
Kafka does by muting a channel while its request is in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkafka.broker import protocol
from sparkafka.broker.clock import now_ms
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.connection import Connection, Listener, RequestContext, current_listener
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.fetch_sessions import FetchSessionCache
from sparkafka.broker.group_metadata import GroupConfig
from sparkafka.broker.groups import GroupCoordinator
from sparkafka.broker.handlers import HANDLERS
from sparkafka.broker.journal import Journal
from sparkafka.broker.limits import (
    ConnectionQuotas,
    RequestMemory,
    default_max_connections,
    raise_open_file_limit,
)
from sparkafka.broker.log_cleaner import CleanableRange
from sparkafka.broker.partition import Partition
from sparkafka.broker.tls import server_context
from sparkafka.broker.topic_controller import TopicController
from sparkafka.broker.transactions import TransactionCoordinator

log = logging.getLogger("sparkafka.broker")

READY_LINE = "sparkafka broker ready on {host}:{port}"
SSL_READY_LINE = "sparkafka broker SSL listener ready on {host}:{port}"
# Partitions are closed this many at a time at shutdown: closing one is mostly waiting for fsyncs,
# which overlap (a journaling file system commits concurrent ones together).
_CLOSE_THREADS = 32


_STOP_GRACE_S = 1.0


class Broker:
    """A single-node broker: node ``config.node_id`` leads every partition and coordinates every
    group and transactional id."""

    def __init__(self, config: BrokerConfig) -> None:
        # Before any partition is opened: the limit decides how many files the broker may hold.
        raise_open_file_limit()
        self._config = config
        # Before anything is opened: a broker that cannot serve its TLS listener does not start.
        self._ssl_context: ssl.SSLContext | None = (
            None if config.ssl_listener is None else server_context(config.ssl_listener)
        )
        self._ssl_server: asyncio.base_events.Server | None = None
        self.ssl_listener: Listener | None = None
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock_data_dir(config.data_dir)
        # The registry and the open partitions are the controller's; the broker reads them.
        self.topic_controller = TopicController(config, on_partitions_deleted=self._forget_deleted_partitions)
        self.topics = self.topic_controller.topics
        self.partitions = self.topic_controller.partitions
        self.groups = GroupCoordinator(
            Journal(config.data_dir / "__consumer_offsets.journal", fsync=config.flush_messages == 1),
            GroupConfig(
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                max_group_size=config.group_max_size,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
                offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
                max_offset_metadata_bytes=config.offset_metadata_max_bytes,
            ),
            now_ms=now_ms,
        )
        self._transaction_journal = Journal(
            config.data_dir / "__transaction_state.journal", fsync=config.flush_messages == 1
        )
        self.transactions = TransactionCoordinator(
            self._transaction_journal,
            max_timeout_ms=config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
            write_marker=self._write_marker,
            complete_offsets=lambda group, pid, commit: self.groups.complete_transaction(
                group_id=group, producer_id=pid, commit=commit
            ),
            partition_exists=lambda topic, index: (topic, index) in self.partitions,
            now_ms=now_ms,
        )
        self.transactions.recover()
        self.fetch_sessions = FetchSessionCache(
            now_ms, max_sessions=config.max_incremental_fetch_session_cache_slots
        )
        self._data_arrived: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        self.connections: set[Connection] = set()
        self.request_memory = RequestMemory(
            None if config.queued_max_request_bytes == -1 else config.queued_max_request_bytes
        )
        self.connection_quotas: ConnectionQuotas[Connection] = ConnectionQuotas(
            default_max_connections() if config.max_connections is None else config.max_connections,
            config.max_connections_per_ip,
        )
        self._background: list[asyncio.Task[None]] = []
        # Kafka's log cleaner: one thread, so a long cleaning pass never holds up requests.
        self._cleaner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cleaner")
        self._cleaning: concurrent.futures.Future[int] | None = None
        self._uncleanable: set[tuple[str, int]] = set()
        self._port = config.port
        self.started_ms = now_ms()

    @property
    def config(self) -> BrokerConfig:
        """The broker's settings; ``host`` and ``port`` are those advertised on the listener the
        current request arrived on (:data:`_LISTENER`)."""
        listener = current_listener()
        return self._config if listener is None else listener.config

    @property
    def port(self) -> int:
        """The port advertised on the listener the current request arrived on (the plaintext
        listener's outside a request)."""
        listener = current_listener()
        return self._port if listener is None else listener.config.port

    # -- topics and partitions --------------------------------------------------------------------

    def _forget_deleted_partitions(self, deleted: Sequence[tuple[str, int]]) -> None:
        """What the broker keeps of a deleted topic's partitions beside their logs: the cleaner's
        record of logs it could not clean (a topic created again gets a clean slate), and the
        groups' committed offsets of them."""
        self._uncleanable.difference_update(deleted)
        self.groups.on_partitions_deleted(deleted)

    def partition(self, topic: str, index: int) -> Partition:
        found = self.partitions.get((topic, index))
        if found is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"this broker has no partition {topic}-{index}"
            )
        return found

    def _write_marker(self, topic: str, index: int, producer_id: int, epoch: int, commit: bool) -> None:
        partition = self.partitions.get((topic, index))
        if partition is None:
            return  # the topic was deleted while the transaction was open: nothing left to mark
        partition.write_txn_marker(
            producer_id=producer_id, producer_epoch=epoch, commit=commit, coordinator_epoch=0, now_ms=now_ms()
        )
        self.notify_data()

    # -- fetch long polling -----------------------------------------------------------------------

    def notify_data(self) -> None:
        """Wake every fetch waiting for data; later waiters wait on a fresh event."""
        if self._data_arrived is not None:
            self._data_arrived.set()
            self._data_arrived = asyncio.Event()

    async def wait_for_data(self, timeout_s: float) -> None:
        assert self._data_arrived is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._data_arrived.wait(), timeout_s)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._data_arrived = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), self.config.host, self.config.port, reuse_address=True
        )
        sockets = self._server.sockets or ()
        self._port = sockets[0].getsockname()[1]
        if (tls := self.config.ssl_listener) is not None:
            try:
                self._ssl_server = await loop.create_server(
                    lambda: Connection(self, self.ssl_listener),
                    tls.host,
                    tls.port,
                    reuse_address=True,
                    ssl=self._ssl_context,
                )
            except OSError:
                self._server.close()
                raise
            port = (self._ssl_server.sockets or ())[0].getsockname()[1]
            host = tls.advertised_host or tls.host
            if host in ("", "0.0.0.0", "::"):
                # Kafka advertises the machine's canonical name for a listener on every address.
                host = socket.getfqdn()
            self.ssl_listener = Listener(
                "SASL_SSL" if self.config.sasl_plain_users else "SSL",
                dataclasses.replace(self._config, host=host, port=port),
            )
        self._background = [
            asyncio.create_task(
                self._every(self.config.transaction_abort_check_interval_ms, self._abort_expired)
            ),
            asyncio.create_task(self._every(100, self.groups.expire_sessions)),
            asyncio.create_task(
                self._every(self.config.retention_check_interval_ms, self._enforce_retention)
            ),
            asyncio.create_task(self._clean_logs()),
            asyncio.create_task(
                self._every(self.config.producer_id_expiration_check_interval_ms, self._expire_producers)
            ),
            asyncio.create_task(
                self._every(
                    self.config.transactional_id_expiration_check_interval_ms,
                    self.transactions.remove_expired_transactional_ids,
                )
            ),
        ]
        if (idle_ms := self.config.connections_max_idle_ms) != -1:
            self._background.append(
                asyncio.create_task(
                    self._every(min(1000, max(10, idle_ms // 10)), self._close_idle_connections)
                )
            )

    def _close_idle_connections(self) -> None:
        """Kafka's connections.max.idle.ms: close connections that neither received nor sent since."""
        idle_s = self.config.connections_max_idle_ms / 1000
        now = time.monotonic()
        for connection in list(self.connections):
            if connection.task is not None and now - connection.last_active > idle_s:
                log.debug(
                    "closing connection from %s: idle for more than connections.max.idle.ms=%d",
                    connection.client_host,
                    self.config.connections_max_idle_ms,
                )
                connection.cancel()

    async def _every(self, interval_ms: int, action: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                action()
            except Exception:
                log.exception("periodic broker task %s failed", getattr(action, "__name__", action))

    def _abort_expired(self) -> None:
        # Decided outcomes whose markers failed to be written are retried first: their partitions'
        # last stable offsets wait for them.
        completed = self.transactions.complete_prepared()
        if self.transactions.abort_timed_out() or completed:
            self.notify_data()

    def _enforce_retention(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            partition.enforce_retention(now)

    async def _clean_logs(self) -> None:
        """Kafka's log cleaner (LogCleaner.CleanerThread with LogCleanerManager's choice): clean the
        dirtiest compacted log that is due (CleanableRange.due: min.cleanable.dirty.ratio or
        max.compaction.lag.ms) on the cleaner thread, and again at once; wait log.cleaner.backoff.ms
        only when none is due. A log whose cleaning failed is left alone until the broker restarts
        or the topic is deleted, as Kafka marks it uncleanable, with the error logged once.

        Invariant: a pass moves its log's checkpoint to the first uncleanable offset it was chosen
        by, so the log is due again only once new writes made it dirty; a log that is due again
        with the very same range (which would be a bug) waits for the next round instead of
        spinning."""
        while True:
            just_cleaned: dict[tuple[str, int], CleanableRange] = {}
            while (chosen := self._dirtiest_log(just_cleaned)) is not None:
                key, weighed = chosen
                just_cleaned[key] = weighed
                try:
                    self._cleaning = self._cleaner.submit(self.partitions[key].compaction(now_ms(), weighed))
                    await asyncio.wrap_future(self._cleaning)
                except Exception:
                    self._uncleanable.add(key)
                    log.exception("cleaning %s-%d failed; it is not cleaned again until a restart", *key)
            await asyncio.sleep(self.config.log_cleaner_backoff_ms / 1000)

    def _dirtiest_log(
        self, just_cleaned: Mapping[tuple[str, int], CleanableRange]
    ) -> tuple[tuple[str, int], CleanableRange] | None:
        now = now_ms()
        dirtiest: tuple[tuple[str, int], CleanableRange] | None = None
        for key, partition in list(self.partitions.items()):
            if key in self._uncleanable or partition.log.closed:
                continue
            try:
                cleanable = partition.cleanable_range(now)
            except Exception:
                self._uncleanable.add(key)
                log.exception("weighing %s-%d for cleaning failed; it is not cleaned until a restart", *key)
                continue
            if cleanable is None or not cleanable.due(partition.log.config.min_cleanable_dirty_ratio):
                continue
            if just_cleaned.get(key) == cleanable:
                continue
            if dirtiest is None or cleanable.cleanable_ratio > dirtiest[1].cleanable_ratio:
                dirtiest = (key, cleanable)
        return dirtiest

    def _expire_producers(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            partition.expire_producers(now)

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        for server in (self._server, self._ssl_server):
            if server is not None:
                server.close()
        connections = list(self.connections)
        for connection in connections:
            connection.abort()
        tasks = [c.task for c in connections if c.task is not None]
        if tasks:
            # A request being handled finishes; a task still waiting after the grace period waits on
            # a client that stopped reading.
            _, stuck = await asyncio.wait(tasks, timeout=_STOP_GRACE_S)
            for connection in connections:
                if connection.task in stuck:
                    connection.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in (self._server, self._ssl_server):
            if server is not None:
                with contextlib.suppress(Exception):
                    await server.wait_closed()
        await asyncio.gather(*self._background, return_exceptions=True)
        # A pass under way finishes first: it writes into the partitions' directories. (One that
        # had not started was cancelled with the task that waited for it.)
        await asyncio.to_thread(self._cleaner.shutdown)
        self.close_storage()

    def close_storage(self) -> None:
        self.groups.shutdown()
        self._transaction_journal.close()
        try:
            self._close_partitions()
        finally:
            self._lock_file.close()

    def _close_partitions(self) -> None:
        """Close every partition (fsync, index files, producer-state snapshot, clean-shutdown marker),
        :data:`_CLOSE_THREADS` at a time. One that fails to close is logged and the others still
        close: it lacks only its clean-shutdown marker, so the next start recovers it, checking every
        batch. The first failure is raised once all are done."""
        partitions = list(self.partitions.values())
        failures: list[BaseException] = []

        def close(partition: Partition) -> None:
            try:
                partition.close()
            except Exception as error:
                log.error(
                    "closing %s-%d failed (%s); the next start recovers it",
                    partition.topic,
                    partition.index,
                    error,
                )
                failures.append(error)

        if len(partitions) <= 1:
            for partition in partitions:
                close(partition)
        else:
            with concurrent.futures.ThreadPoolExecutor(
                min(_CLOSE_THREADS, len(partitions)), thread_name_prefix="close-partition"
            ) as pool:
                for _ in pool.map(close, partitions):
                    pass
        if failures:
            raise failures[0]

    # -- dispatch ---------------------------------------------------------------------------------

    async def handle(self, request: Any, context: RequestContext) -> Any:
        return await HANDLERS[protocol.ApiKey(context.api_key)](self, request, context)


def _lock_data_dir(data_dir: Path) -> Any:
    """Hold an exclusive lock on the data directory so two brokers never write the same logs."""
    import fcntl

    handle = open(data_dir / ".lock", "a+")  # noqa: SIM115 - held for the broker's lifetime
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise RuntimeError(
            f"data directory {data_dir} is in use by another broker; stop it or choose another --data-dir"
        ) from exc
    return handle
