"""The broker process: state it owns, the asyncio TCP server and per-connection request handling.

All state lives on one asyncio event loop; a handler runs to completion (or to an ``await`` that
waits for data or a rebalance) without interleaving with other handlers' state changes, so no
locks are needed. Per connection, requests are handled one at a time and answered in order, as
Kafka does by muting a channel while its request is in flight.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import logging
import os
import resource
import shutil
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from kafka.protocol.sasl import SaslHandshakeResponse

from sparkafka.broker import protocol
from sparkafka.broker.clock import now_ms
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.fetch_sessions import FetchSessionCache
from sparkafka.broker.groups import GroupConfig, GroupCoordinator
from sparkafka.broker.handlers import HANDLERS, api_versions_response
from sparkafka.broker.handlers.data import FAST_HANDLERS, NOT_HANDLED
from sparkafka.broker.journal import Journal
from sparkafka.broker.limits import (
    LISTEN_BACKLOG,
    ConnectionQuotas,
    RequestMemory,
    default_max_connections,
    raise_open_file_limit,
)
from sparkafka.broker.log import CleanableRange, FileRegion, LogConfig
from sparkafka.broker.partition import Partition
from sparkafka.broker.sasl import (
    SASL_MAX_RECEIVE_BYTES,
    SaslState,
    answered_out_of_order,
    plain_authentication_error,
)
from sparkafka.broker.tls import server_context
from sparkafka.broker.topic_configs import inert_configs, validate_topic_configs
from sparkafka.broker.topics import Topic, TopicRegistry, validate_topic_name
from sparkafka.broker.transactions import TransactionCoordinator

log = logging.getLogger("sparkafka.broker")

READY_LINE = "sparkafka broker ready on {host}:{port}"
SSL_READY_LINE = "sparkafka broker SSL listener ready on {host}:{port}"
# Partitions are closed this many at a time at shutdown: closing one is mostly waiting for fsyncs,
# which overlap (a journaling file system commits concurrent ones together).
_CLOSE_THREADS = 32


@dataclass(frozen=True, slots=True)
class Listener:
    """A listener other than the plaintext one, as its clients see the broker: ``config`` is the
    broker's config with ``host`` and ``port`` set to the address advertised on this listener."""

    name: str
    config: BrokerConfig


# The listener the current request arrived on, set in each TLS connection's task (tasks copy the
# context they start in); None: the plaintext listener. Kafka answers Metadata, FindCoordinator and
# DescribeCluster with the addresses of the listener the request came on, so a client that
# bootstrapped on the TLS port is sent to the TLS port.
_STOP_GRACE_S = 1.0
_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("listener", default=None)


@dataclass(slots=True)
class RequestContext:
    api_key: int
    version: int
    correlation_id: int
    client_id: str
    client_host: str
    connection: Connection


Handler = Callable[["Broker", Any, RequestContext], Awaitable[Any]]


def _warn_if_inert(topic: str, configs: Mapping[str, str]) -> None:
    if inert := inert_configs(configs):
        log.warning(
            "topic %s: this broker stores and reports %s but does not act on %s",
            topic,
            ", ".join(inert),
            "it" if len(inert) == 1 else "them",
        )


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
        for leftover in config.data_dir.glob(f"*{_DELETED_SUFFIX}"):  # of topics deleted before a crash
            shutil.rmtree(leftover, ignore_errors=True)
        self.topics = TopicRegistry(config.data_dir)
        self.partitions: dict[tuple[str, int], Partition] = {}
        for topic in self.topics.topics.values():
            for index in range(topic.partitions):
                self._open_partition(topic, index)
        self._report_orphans()
        self.groups = GroupCoordinator(
            Journal(config.data_dir / "__consumer_offsets.journal", fsync=config.flush_messages == 1),
            GroupConfig(initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms),
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
        self.fetch_sessions = FetchSessionCache(now_ms)
        self._data_arrived: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[Connection] = set()
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
        listener = _LISTENER.get()
        return self._config if listener is None else listener.config

    @property
    def port(self) -> int:
        """The port advertised on the listener the current request arrived on (the plaintext
        listener's outside a request)."""
        listener = _LISTENER.get()
        return self._port if listener is None else listener.config.port

    # -- topics and partitions --------------------------------------------------------------------

    def _partition_dir(self, topic: str, index: int) -> Path:
        return self.config.data_dir / f"{topic}-{index}"

    def _remove_stray(self, topic: str, index: int) -> None:
        """A new partition never opens a directory left by an earlier topic of that name (a deletion
        cut short, a registry restored from a backup): Kafka calls such a log stray and removes it."""
        directory = self._partition_dir(topic, index)
        if directory.exists():
            doomed = self.config.data_dir / deleted_dir_name(topic, index)
            directory.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            log.warning(
                "removed %s, left by an earlier topic %s: the new topic starts empty", directory, topic
            )

    def _report_orphans(self) -> None:
        """Directories of the data dir that look like a partition's (``<topic>-<n>``) but belong to
        no topic of the registry: left alone (they may be all that is left of a topic whose registry
        entry was lost), and named, with what to do."""
        known = {self._partition_dir(topic, index).name for topic, index in self.partitions}
        for entry in sorted(self.config.data_dir.iterdir()):
            name, _, number = entry.name.rpartition("-")
            if entry.is_dir() and name and number.isdigit() and entry.name not in known:
                log.warning(
                    "orphan directory %s: no topic in topics.json has this partition. A topic created "
                    "under that name replaces it; remove it yourself if its records are not needed",
                    entry,
                )

    def _open_partition(self, topic: Topic, index: int) -> Partition:
        partition = self.partition_files(topic.name, index, topic.log_config(self.config))
        self.partitions[(topic.name, index)] = partition
        return partition

    def partition_files(self, topic: str, index: int, log_config: LogConfig) -> Partition:
        """Open (creating if need be) a partition's directory and log, not yet served: safe to call
        off the event loop."""
        return Partition(
            topic,
            index,
            self._partition_dir(topic, index),
            log_config,
            producer_id_expiration_ms=self.config.producer_id_expiration_ms,
        )

    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None],
        *,
        replication_factor: int = -1,
        assignments: Sequence[tuple[int, Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> Topic:
        """Create a topic, checking in the order of Kafka's ReplicationControlManager.createTopic:

        1. the name (legal, not colliding with an existing name once '.' and '_' are alike);
        2. it does not exist yet (TOPIC_ALREADY_EXISTS);
        3. the configs (INVALID_CONFIG: unknown name, null or invalid value);
        4. replica assignments, or the partition count and replication factor.
        """
        validate_topic_name(name)
        if name in self.topics.topics:
            raise BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        self.topics.check_collision(name)
        valid_configs = validate_topic_configs(configs)
        if assignments:
            partitions = self._assigned_partition_count(partitions, replication_factor, assignments)
        else:
            if replication_factor < -1 or replication_factor == 0:
                raise BrokerError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    "Replication factor must be larger than 0, or -1 to use the default value.",
                )
            if partitions < -1 or partitions == 0:
                raise BrokerError(
                    ErrorCode.INVALID_PARTITIONS,
                    "Number of partitions was set to an invalid non-positive value.",
                )
            if partitions == -1:
                partitions = self.config.default_partitions
            if replication_factor not in (-1, 1):
                # Kafka 4.4's StripedReplicaPlacer (cordoned log directories: KIP-1066), as
                # ReplicationControlManager words its failure.
                raise BrokerError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"Unable to replicate the partition {replication_factor} time(s): The target "
                    f"replication factor of {replication_factor} cannot be reached because only 1 broker(s) "
                    "are registered or some brokers have all their log directories cordoned.",
                )
        topic = Topic(name, uuid.uuid4(), partitions, valid_configs)
        check_file_descriptors(partitions)
        if validate_only:
            return topic
        self.topics.topics[name] = topic
        for index in range(partitions):
            self._remove_stray(name, index)
            self._open_partition(topic, index)
        self.topics.save()
        log.info("created topic %s with %d partition(s) %s", name, partitions, valid_configs or "")
        _warn_if_inert(name, valid_configs)
        return topic

    def alter_topic_configs(self, name: str, configs: Mapping[str, str], *, validate_only: bool) -> None:
        """Make ``configs`` the topic's whole set of overrides, checking as Kafka's controller does
        (ControllerConfigurationValidator, then the existence check):

        1. the name: "" is INVALID_REQUEST (no default topic resource), an illegal one
           INVALID_TOPIC_EXCEPTION;
        2. the configs, as CreateTopics checks them (INVALID_CONFIG);
        3. the topic exists (UNKNOWN_TOPIC_OR_PARTITION).

        Unless ``validate_only``, the overrides are stored (topics.json) and every partition's log
        takes the new config at once: retention, compaction, segment size, record size and timestamp
        checks apply from the next operation on, as a Kafka broker applies a config change."""
        if not name:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "Default topic resources are not allowed.")
        validate_topic_name(name)
        valid_configs = validate_topic_configs(configs)
        topic = self.topics.topics.get(name)
        if topic is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
        try:
            log_config = dataclasses.replace(topic, configs=dict(valid_configs)).log_config(self.config)
        except ValueError as error:
            raise BrokerError(ErrorCode.INVALID_CONFIG, str(error)) from None
        if validate_only:
            return
        topic.configs = dict(valid_configs)
        self.topics.save()
        for index in range(topic.partitions):
            self.partitions[(name, index)].log.config = log_config
        log.info("topic %s: configs are now %s", name, valid_configs or "the defaults")
        _warn_if_inert(name, valid_configs)

    def _assigned_partition_count(
        self, partitions: int, replication_factor: int, assignments: Sequence[tuple[int, Sequence[int]]]
    ) -> int:
        """The partition count of a manual replica assignment, checked in the order and words of
        Kafka's ReplicationControlManager.createTopic: no factor, then no count beside it; each
        partition once, with a valid replica list as long as the previous ones; partitions 0..n-1."""
        if replication_factor != -1:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                "A manual partition assignment was specified, but replication factor was not set to -1.",
            )
        if partitions != -1:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                "A manual partition assignment was specified, but numPartitions was not set to -1.",
            )
        seen: set[int] = set()
        factor: int | None = None
        for index, replicas in assignments:
            if index in seen:
                raise BrokerError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Found multiple manual partition assignments for partition {index}",
                )
            seen.add(index)
            self._check_replicas(replicas, factor)
            factor = len(replicas)
        if seen != set(range(len(seen))):
            raise BrokerError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "partitions should be a consecutive 0-based integer sequence",
            )
        return len(seen)

    def _check_replicas(self, replicas: Sequence[int], replication_factor: int | None) -> None:
        """A manual assignment's replica list, as Kafka's validateManualPartitionAssignment checks it:
        not empty, only registered brokers (this one), none twice, as many as the other partitions'."""
        if not replicas:
            raise BrokerError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "The manual partition assignment includes an empty replica list.",
            )
        previous: int | None = None
        for broker_id in sorted(replicas):
            if broker_id != self.config.node_id:
                raise BrokerError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment includes broker {broker_id}, but no such broker is "
                    "registered.",
                )
            if broker_id == previous:
                raise BrokerError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment includes the broker {previous} more than once.",
                )
            previous = broker_id
        if replication_factor is not None and len(replicas) != replication_factor:
            raise BrokerError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment includes a partition with {len(replicas)} replica(s), but "
                f"this is not consistent with previous partitions, which have {replication_factor} "
                "replica(s).",
            )

    def delete_topic(self, name: str) -> None:
        """DeleteTopics for one topic, as Kafka's LogManager.asyncDelete: each partition's directory
        is renamed out of the way first (:func:`deleted_dir_name`), so that a topic created again
        under the name never opens what a crash or a failed removal left of the old one, then removed.

        Steps: close the partitions; rename every directory; only when all are renamed, drop the topic
        from the registry and remove the renamed directories. A rename that fails puts the renamed
        ones back and reopens the partitions: the topic is left whole, and the error says why."""
        topic = self.topics.topics.get(name)
        if topic is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        indexes = range(topic.partitions)
        for index in indexes:
            self.partitions[(name, index)].close(keep_state=False)
        renamed: list[tuple[Path, Path]] = []
        try:
            for index in indexes:
                directory = self._partition_dir(name, index)
                doomed = self.config.data_dir / deleted_dir_name(name, index)
                with contextlib.suppress(FileNotFoundError):
                    directory.rename(doomed)
                    renamed.append((directory, doomed))
        except OSError as error:
            for directory, doomed in reversed(renamed):
                doomed.rename(directory)
            for index in indexes:
                self._open_partition(topic, index)
            raise BrokerError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"topic {name!r} could not be deleted, and is left as it was: renaming its partition "
                f"directories failed ({error})",
            ) from None
        del self.topics.topics[name]
        self.topics.save()
        for index in indexes:
            del self.partitions[(name, index)]
            self._uncleanable.discard((name, index))  # a topic created again gets a clean slate
        for _, doomed in renamed:
            shutil.rmtree(doomed, ignore_errors=True)
        self.groups.on_partitions_deleted((name, index) for index in indexes)
        log.info("deleted topic %s", name)

    def add_partitions(
        self,
        name: str,
        count: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool,
    ) -> None:
        """CreatePartitions, checked as Kafka's ReplicationControlManager.createPartitions: the topic
        exists, the count grows, and manual assignments give one replica list, this broker alone,
        per new partition."""
        topic = self.topics.topics.get(name)
        if topic is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)  # Kafka sends no message
        if count == topic.partitions:
            raise BrokerError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {count} partition(s).")
        if count < topic.partitions:
            raise BrokerError(
                ErrorCode.INVALID_PARTITIONS,
                f"The topic {name} currently has {topic.partitions} partition(s); {count} would not be an "
                "increase.",
            )
        if assignments is not None:
            if len(assignments) != count - topic.partitions:
                raise BrokerError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Attempted to add {count - topic.partitions} additional partition(s), but only "
                    f"{len(assignments)} assignment(s) were specified.",
                )
            for replicas in assignments:
                self._check_replicas(replicas, 1)  # every partition here has one replica
        check_file_descriptors(count - topic.partitions)
        if validate_only:
            return
        for index in range(topic.partitions, count):
            self._remove_stray(name, index)
            self._open_partition(topic, index)
        topic.partitions = count
        self.topics.save()

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
        for connection in list(self._connections):
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
        connections = list(self._connections)
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


# Frames up to this size are received into a connection's reusable buffer and copied out; larger ones
# (produce batches) are received straight into a buffer of their own, with no further copy. Small
# enough that thousands of idle connections cost little memory.
_RECEIVE_BUFFER_BYTES = 64 * 1024
# A deleted topic's partition directories are renamed {topic}-{n}.{uuid}-delete, then removed.
_DELETED_SUFFIX = "-delete"
# Longest file name of the usual file systems (ext4, xfs, tmpfs).
_MAX_FILE_NAME = 255


# Open files kept free for what else the broker opens: connections, journals, files being cleaned.
FILE_DESCRIPTOR_RESERVE = 256


def check_file_descriptors(new_partitions: int) -> None:
    """Refuse, before anything is created, partitions the process could not open: each keeps its
    active segment open, and a broker out of file descriptors accepts no connection at all. The soft
    limit (``ulimit -n``) less the files open now less :data:`FILE_DESCRIPTOR_RESERVE` must hold them.
    Kafka leaves this to the operating system; a half-created topic is worse than a clear refusal."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or new_partitions <= 0:
        return
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: the limit alone
        open_now = 0
    free = soft - open_now - FILE_DESCRIPTOR_RESERVE
    if new_partitions > free:
        raise BrokerError(
            ErrorCode.POLICY_VIOLATION,
            f"{new_partitions} new partition(s) need as many open files, and the broker may open "
            f"{max(free, 0)} more (open file limit {soft}, {open_now} open, {FILE_DESCRIPTOR_RESERVE} kept "
            "for connections): raise the broker's limit (ulimit -n) or create fewer partitions",
        )


def deleted_dir_name(topic: str, index: int) -> str:
    """``{topic}-{index}.{uuid}-delete``, with the topic cut so the name fits in 255 bytes, as Kafka's
    LocalLog.logDeleteDirName does: a topic name may have 249 characters, and the suffix adds 42
    and more."""
    suffix = f"-{index}.{uuid.uuid4().hex}{_DELETED_SUFFIX}"
    return topic[: _MAX_FILE_NAME - len(suffix)] + suffix


# Read-ahead: stop reading from a client once this many bytes of requests wait to be handled, resume
# below half of it. Requests are still handled one at a time and answered in order.
_MAX_QUEUED_BYTES = 8 * 1024 * 1024
_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class _BadSize:
    """Queued in place of a frame whose announced size is out of bounds: the connection closes there."""

    size: int


class Connection(asyncio.BufferedProtocol):
    """One client connection: receive frames, handle them one at a time in order, write responses.

    Receiving (get_buffer/buffer_updated, called by the event loop): size-prefixed frames are cut from
    the received bytes and queued; a frame too large for the receive buffer gets a buffer of its own
    that the socket fills directly. A task (_serve) takes frames from the queue, handles each and writes
    its response before taking the next, as Kafka handles a connection's requests in order. Responses
    are bytes, or pieces (bytes and file regions sent with sendfile) from the fast fetch path.
    """

    def __init__(self, broker: Broker, listener: Listener | None = None) -> None:
        self.broker = broker
        # None: the plaintext listener
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.client_ip = "unknown"
        self.client_host = "/unknown"
        # For connections.max.idle.ms: when bytes last came in or a response went out.
        self.last_active = time.monotonic()
        # What the connection may send before it is authenticated (sparkafka.broker.sasl).
        self.sasl_state = (
            SaslState.HANDSHAKE_OR_VERSIONS if broker.config.sasl_plain_users else SaslState.COMPLETE
        )
        # Set by a handler whose answer ends the connection (failed authentication), as Kafka does.
        self.close_after_response = False
        self.task: asyncio.Task[Any] | None = None
        self._logged_bad_input = False
        self._max_request_bytes = broker.config.socket_request_max_bytes
        # Receive state: the first _end bytes of _buffer are received but not yet cut into frames; a
        # large frame being received goes to _frame (grown as its body arrives, up to _frame_size), of
        # which _filled bytes have arrived.
        self._buffer = bytearray(_RECEIVE_BUFFER_BYTES)
        self._buffer_view = memoryview(self._buffer)
        self._end = 0
        self._frame: bytearray | None = None
        self._frame_size = 0
        self._filled = 0
        self._stopped_receiving = False
        self._frames: collections.deque[bytes | bytearray | _BadSize] = collections.deque()
        self._queued_bytes = 0
        self._queue_full = False
        # Bytes of this connection's requests counted in broker.request_memory.
        self._held = 0
        self._reading_paused = False
        self._eof = False
        self._frame_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # -- asyncio protocol callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.client_ip = str(peer[0])
            self.client_host = f"/{self.client_ip}"
        self.broker._connections.add(self)  # now, so that a stop() from here on closes it
        quotas = self.broker.connection_quotas
        if quotas.full:
            # Kafka stops accepting at max.connections: the client waits, unanswered, in the backlog.
            if len(quotas.waiting) >= LISTEN_BACKLOG:
                log.info(
                    "closing connection from %s: max.connections=%d reached and %d connections waiting",
                    self.client_host,
                    quotas.max_connections,
                    LISTEN_BACKLOG,
                )
                self.close()
                return
            self._reading_paused = True
            transport.pause_reading()
            quotas.waiting.append(self)
            return
        self._admit()

    def _admit(self) -> None:
        """Serve the connection, unless its address has max.connections.per.ip connections already."""
        if not self.broker.connection_quotas.enter(self.client_ip):
            # Kafka's words (ConnectionQuotas.TooManyConnectionsException, logged by the Acceptor).
            log.info(
                "Rejected connection from %s, address already has the configured maximum of %d connections.",
                self.client_ip,
                self.broker.connection_quotas.max_connections_per_ip,
            )
            self.close()
            return
        self.last_active = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._serve())
        self.update_reading()

    def _leave(self) -> None:
        quotas = self.broker.connection_quotas
        quotas.leave(self.client_ip)
        while quotas.waiting and not quotas.full:
            waiting = quotas.waiting.popleft()
            if waiting.transport is not None and not waiting.transport.is_closing():
                waiting._admit()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            if self._filled == len(self._frame):
                self._grow_frame()
            return memoryview(self._frame)[self._filled :]
        return self._buffer_view[self._end :]

    def _grow_frame(self) -> None:
        """Room for more of a large frame's body, never from its declared size alone: double what
        has arrived (so a long body is copied about once in all), within the memory budget."""
        frame = self._frame
        assert frame is not None
        step = min(self._frame_size, max(2 * len(frame), _RECEIVE_BUFFER_BYTES)) - len(frame)
        room = self.broker.request_memory.room(self)
        if room is not None:
            step = min(step, max(room, _RECEIVE_BUFFER_BYTES))
        zeros = bytes(step)  # calloc'ed: pages not written stay out of the process's memory
        try:
            frame += zeros
        except BufferError:  # a view of the frame is still alive somewhere: grow a copy instead
            self._frame = bytearray(frame) + zeros
        self._held += step
        self.broker.request_memory.take(step)

    def buffer_updated(self, nbytes: int) -> None:
        if self._stopped_receiving:
            return
        self.last_active = time.monotonic()
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == self._frame_size:
                frame, self._frame = self._frame, None
                self.broker.request_memory.end_frame(self)
                self._enqueue(frame)
            elif self._filled == len(self._frame):
                self.update_reading()  # the rest needs memory: wait here if the budget is spent
            return
        self._end += nbytes
        self._cut_frames()

    def eof_received(self) -> bool:
        # Keep the transport open for the answers to requests already received (a half-closed client).
        self._eof = True
        self._wake_serve()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is None:  # never served: it waited for a free slot, or was refused
            with contextlib.suppress(ValueError):
                self.broker.connection_quotas.waiting.remove(self)
            self.broker._connections.discard(self)
        self._eof = True
        self._wake_serve()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- receiving --------------------------------------------------------------------------------

    def _receive_limit(self) -> int:
        """The largest request this connection takes now: Kafka's SaslServerAuthenticator holds every
        request before authentication to sasl.server.max.receive.size (512 KiB), so a client that
        has not logged in cannot make the broker buffer socket.request.max.bytes."""
        if self.authenticated:
            return self._max_request_bytes
        return min(self._max_request_bytes, SASL_MAX_RECEIVE_BYTES)

    def _cut_frames(self) -> None:
        """Queue every complete frame in the receive buffer; start a large frame's own buffer; move the
        rest to the buffer's start so a frame that fits the buffer always finds room."""
        buffer = self._buffer_view
        start, end = 0, self._end
        while end - start >= 4:
            (size,) = _SIZE.unpack_from(buffer, start)
            if size < 0 or size > self._receive_limit():
                self._enqueue(_BadSize(size))
                self._stopped_receiving = True  # nothing after a bad size is a request
                start = end
                break
            if end - start - 4 >= size:
                self._enqueue(bytes(buffer[start + 4 : start + 4 + size]))
                start += 4 + size
            elif size + 4 > len(buffer):
                # Its own buffer, grown by get_buffer as the body arrives.
                self._frame = bytearray(buffer[start + 4 : end])
                self._frame_size = size
                self._filled = len(self._frame)
                self._held += self._filled
                memory = self.broker.request_memory
                memory.take(self._filled)
                memory.start_frame(self)
                start = end
                break
            else:
                break
        if start:
            remaining = end - start
            buffer[:remaining] = bytes(buffer[start:end])
            self._end = remaining

    def _enqueue(self, frame: bytes | bytearray | _BadSize) -> None:
        """Queue a complete frame; a large frame's bytes are counted in request_memory already."""
        self._frames.append(frame)
        if not isinstance(frame, _BadSize):
            self._queued_bytes += len(frame)
            if isinstance(frame, bytes):
                self._held += len(frame)
                self.broker.request_memory.take(len(frame))
        if self._queued_bytes > _MAX_QUEUED_BYTES:
            self._queue_full = True
        if self._queue_full or self.broker.request_memory.exhausted:
            self.update_reading()
        self._wake_serve()

    def update_reading(self) -> None:
        """Pause reading while this connection's own queue is long (read-ahead) or while the
        broker's request memory is spent (unless this connection may finish its large frame);
        resume otherwise. Called again by request_memory when memory is given back."""
        transport = self.transport
        if transport is None or self.task is None or self._stopped_receiving:
            return
        memory = self.broker.request_memory
        blocked = not memory.may_read(self)
        if blocked:
            memory.wait(self)
        else:
            memory.stop_waiting(self)
        pause = self._queue_full or blocked
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _release(self, size: int) -> None:
        self._held -= size
        self.broker.request_memory.give_back(size)

    def _release_all(self) -> None:
        self._stopped_receiving = True
        self._frame = None
        self._frames.clear()
        self.broker.request_memory.forget(self)
        self._release(self._held)

    def _wake_serve(self) -> None:
        waiter, self._frame_waiter = self._frame_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _next_frame(self) -> bytes | bytearray | _BadSize | None:
        """The next received frame, or None once the client closed and every frame was handled."""
        while not self._frames:
            if self._eof:
                return None
            self._frame_waiter = asyncio.get_running_loop().create_future()
            await self._frame_waiter
        frame = self._frames.popleft()
        if not isinstance(frame, _BadSize):
            self._queued_bytes -= len(frame)
            if self._queue_full and self._queued_bytes <= _MAX_QUEUED_BYTES // 2:
                self._queue_full = False
                self.update_reading()
        return frame

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self, response: bytes | list[Any]) -> None:
        """Write a response: bytes, or pieces of which file regions go out with sendfile (each closed once
        sent). Returns when the transport's buffer is below its high-water mark."""
        transport = self.transport
        assert transport is not None
        self.last_active = time.monotonic()
        if isinstance(response, bytes):
            # A memoryview: the transport then keeps what the socket did not take without a copy first.
            transport.write(memoryview(response) if len(response) > 65536 else response)
        else:
            try:
                for piece in response:
                    if isinstance(piece, FileRegion):
                        await self._send_region(piece)
                    else:
                        transport.write(piece)
            finally:
                for piece in response:
                    if isinstance(piece, FileRegion):
                        piece.close()
        if self._writing_paused:
            if transport.is_closing():
                raise ConnectionResetError("connection lost")
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        self.last_active = time.monotonic()

    async def _send_region(self, region: FileRegion) -> None:
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            raise ConnectionResetError("connection lost")
        try:
            await asyncio.get_running_loop().sendfile(
                transport, cast(Any, region), region.offset, region.count, fallback=False
            )
        except (asyncio.SendfileNotAvailableError, NotImplementedError, RuntimeError):
            # An event loop, transport or platform without native sendfile (RuntimeError: "not
            # supported for transport"): the bytes go through memory instead.
            if transport.is_closing():
                raise ConnectionResetError("connection lost") from None
            transport.write(region.read())
        finally:
            region.close()

    # -- handling ---------------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.sasl_state is SaslState.COMPLETE

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping unsent output: a client that stopped reading would keep a
        graceful close (and with it the broker's stop) waiting for ever."""
        if self.transport is not None:
            self.transport.abort()

    def cancel(self) -> None:
        """End the connection's task too: a response going out with sendfile waits on the socket,
        and an aborted transport never wakes that wait."""
        self.abort()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def log_authentication_failure(self, reason: str) -> None:
        log.info("failed authentication with %s (%s)", self.client_host, reason)

    def _log_bad_input_once(self, message: str) -> None:
        if not self._logged_bad_input:
            self._logged_bad_input = True
            log.warning("closing connection from %s: %s", self.client_host, message)

    async def _serve(self) -> None:
        # Always set: a task admitted from another connection's teardown starts in a copy of that
        # task's context, whose listener may be the other one (TLS for a plaintext client).
        _LISTENER.set(self.listener)  # this task's own context: its requests, and what they start
        try:
            while True:
                frame = await self._next_frame()
                if frame is None:
                    return
                if isinstance(frame, _BadSize):
                    limit = (
                        f"socket.request.max.bytes={self._max_request_bytes}"
                        if self.authenticated
                        else f"sasl.server.max.receive.size={SASL_MAX_RECEIVE_BYTES} before authentication"
                    )
                    self._log_bad_input_once(f"request size {frame.size} is outside [0, {limit}]")
                    return
                response: bytes | list[Any] | Literal[False] | None
                if self.sasl_state is SaslState.RAW_TOKEN:
                    response = self._raw_sasl_token(bytes(frame))
                else:
                    response = await self._respond(frame)
                if response is False:
                    return
                if self.close_after_response:
                    # Kafka holds the answer to a failed authentication for
                    # connection.failed.authentication.delay.ms (default 100 ms), then closes: a
                    # guesser learns nothing sooner by dropping the connection, and answering before
                    # the close lets clients such as kafka-python read the error.
                    await asyncio.sleep(self.broker.config.connection_failed_authentication_delay_ms / 1000)
                if response is not None:
                    await self._write(response)
                self._release(len(frame))
                if self.close_after_response:
                    return
        except ConnectionError:
            return
        except Exception:
            log.exception("unexpected error serving %s; connection closed", self.client_host)
        finally:
            self.close()
            self._release_all()
            self.broker._connections.discard(self)
            self._leave()

    def _raw_sasl_token(self, token: bytes) -> bytes | None:
        """The SASL/PLAIN token that follows a SaslHandshake v0: on success the (empty) server challenge,
        size-prefixed; on failure the connection is closed without an answer (after the failed
        authentication delay), as Kafka does."""
        error = plain_authentication_error(self.broker.config.sasl_plain_users, token)
        if error is not None:
            self.log_authentication_failure(error)
            self.close_after_response = True
            return None
        self.sasl_state = SaslState.COMPLETE
        return struct.pack(">i", 0)

    def _refuse_before_authentication(self, header: protocol.RequestHeader) -> bytes | Literal[False]:
        """A request SASL authentication does not expect now: closed unanswered, or answered
        ILLEGAL_SASL_STATE first (sparkafka.broker.sasl, :func:`answered_out_of_order`)."""
        self.log_authentication_failure(
            f"unexpected request (api key {header.api_key}) during SASL authentication "
            f"({self.sasl_state.name.lower()})"
        )
        if not answered_out_of_order(self.sasl_state, header.api_key):
            return False
        version = header.api_version
        if header.api_key == protocol.ApiKey.API_VERSIONS:
            response = api_versions_response(ErrorCode.ILLEGAL_SASL_STATE)
            # An ApiVersions version this broker lacks is answered as v0, as KIP-511 answers it.
            version = version if protocol.is_supported(header.api_key, version) else 0
        elif protocol.is_supported(header.api_key, version):
            response = SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
        else:
            return False
        self.close_after_response = True
        return protocol.encode_response(response, version, header.correlation_id)

    async def _respond(self, frame: bytes | bytearray) -> bytes | list[Any] | Literal[False] | None:
        """The encoded response (bytes, or pieces from a fast handler), None when none is due (acks=0),
        False to close the connection."""
        try:
            header = protocol.peek_header(frame)
        except protocol.MalformedRequest as exc:
            self._log_bad_input_once(str(exc))
            return False
        unknown_api_versions = header.api_key == protocol.ApiKey.API_VERSIONS and not protocol.is_supported(
            header.api_key, header.api_version
        )
        if unknown_api_versions and header.api_version >= protocol.API_VERSIONS_FIRST_FLEXIBLE:
            # Answered below (KIP-511), but only once its header, a flexible one, could be read.
            try:
                protocol.check_header_tagged_fields(frame)
            except protocol.MalformedRequest as exc:
                self._log_bad_input_once(str(exc))
                return False
        if not self.sasl_state.accepts(header.api_key):
            return self._refuse_before_authentication(header)
        if unknown_api_versions:
            # KIP-511: answer an unknown ApiVersions version with v0 and UNSUPPORTED_VERSION so the
            # client can retry with a version we list.
            return protocol.encode_response(
                api_versions_response(ErrorCode.UNSUPPORTED_VERSION), 0, header.correlation_id
            )
        if not protocol.is_supported(header.api_key, header.api_version):
            self._log_bad_input_once(
                f"unsupported request api key {header.api_key} version {header.api_version} "
                f"from client {header.client_id!r}"
            )
            return False
        context = RequestContext(
            header.api_key,
            header.api_version,
            header.correlation_id,
            header.client_id or "",
            self.client_host,
            self,
        )
        fast_handler = FAST_HANDLERS.get(header.api_key)  # type: ignore[call-overload]
        if fast_handler is not None:
            fast_response = await fast_handler(self.broker, frame, context)
            if fast_response is not NOT_HANDLED:
                return cast("bytes | list[Any] | None", fast_response)
        try:
            request = protocol.decode_request(header, frame)
        except protocol.MalformedRequest as exc:
            self._log_bad_input_once(str(exc))
            return False
        response = await self.broker.handle(request, context)
        if response is None or response is False:
            return cast("Literal[False] | None", response)
        return protocol.encode_response(response, header.api_version, header.correlation_id)
