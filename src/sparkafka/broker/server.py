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
import os
import resource
import shutil
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkafka.broker import protocol
from sparkafka.broker.clock import now_ms
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.connection import Connection, Listener, RequestContext, current_listener
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.fetch_sessions import FetchSessionCache
from sparkafka.broker.groups import GroupConfig, GroupCoordinator
from sparkafka.broker.handlers import HANDLERS
from sparkafka.broker.journal import Journal
from sparkafka.broker.limits import (
    ConnectionQuotas,
    RequestMemory,
    default_max_connections,
    raise_open_file_limit,
)
from sparkafka.broker.log import CleanableRange, LogConfig
from sparkafka.broker.partition import Partition
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


_STOP_GRACE_S = 1.0


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
