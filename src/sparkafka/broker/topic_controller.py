"""The topic controller: creates, grows, reconfigures and deletes topics, and owns what holds them:
the registry of topics (``topics.json``, :class:`~sparkafka.broker.topics.TopicRegistry`), the map of
open partitions, and the partition directories of the data directory (orphans named at start,
leftovers of deletions removed). The admin handlers call it; a change is checked in the order and
words of Kafka's ReplicationControlManager.

Opening thousands of partitions (directories, segment and index files) or closing and removing them
takes seconds; done on the event loop it would hold up every other client for as long. So each change
requested by a client is checked and reserved on the loop, its files are made or removed on a worker
thread, and the result is committed on the loop in one step, with no ``await`` in between:

- a topic being created is invisible (Metadata, Produce, Fetch... know nothing of it) until all its
  partitions are open, then appears whole; its name is taken meanwhile (TOPIC_ALREADY_EXISTS);
- partitions being added appear all at once, with the topic's new partition count;
- a topic being deleted disappears at once, as it does from Kafka's metadata when its controller
  accepts the deletion, and its files are removed after;
- a change of a name waits for the one under way (Kafka's controller applies them one by one);
- a failure on the way (a full disk, say) leaves the topic as it was: a creation leaves no topic and
  no directory, added partitions are closed and removed, a deletion puts the topic back.

Once begun, a change runs to its end even if the client that asked goes away, as Kafka's controller
completes a change it accepted. A topic auto-created by a Metadata request (one partition, on the
loop) takes :meth:`TopicController.create_topic` directly.
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
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.partition import Partition
from sparkafka.broker.topic_configs import inert_configs, validate_topic_configs
from sparkafka.broker.topics import Topic, TopicRegistry, validate_topic_name

log = logging.getLogger("sparkafka.broker")
_T = TypeVar("_T")
# Threads a change's file work is spread over.
_FILE_WORKERS = 4
_FAILED = object()
# Changes under way, referenced so that a change whose client went away is not collected mid-way.
_UNDER_WAY: set[asyncio.Task[Any]] = set()


def warn_if_inert(topic: str, configs: Mapping[str, str]) -> None:
    if inert := inert_configs(configs):
        log.warning(
            "topic %s: this broker stores and reports %s but does not act on %s",
            topic,
            ", ".join(inert),
            "it" if len(inert) == 1 else "them",
        )


# A deleted topic's partition directories are renamed {topic}-{n}.{uuid}-delete, then removed.
DELETED_SUFFIX = "-delete"
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
    suffix = f"-{index}.{uuid.uuid4().hex}{DELETED_SUFFIX}"
    return topic[: _MAX_FILE_NAME - len(suffix)] + suffix


class TopicController:
    """The topics of the broker and their partitions (see the module's docstring). ``config`` is the
    broker's own (its data directory and defaults); ``on_partitions_deleted`` is told the partitions
    of each deleted topic, for what the broker keeps of them beside their logs."""

    def __init__(
        self, config: BrokerConfig, *, on_partitions_deleted: Callable[[Sequence[tuple[str, int]]], None]
    ) -> None:
        self.config = config
        self.on_partitions_deleted = on_partitions_deleted
        for leftover in config.data_dir.glob(f"*{DELETED_SUFFIX}"):  # of topics deleted before a crash
            shutil.rmtree(leftover, ignore_errors=True)
        self.topics = TopicRegistry(config.data_dir)
        self.partitions: dict[tuple[str, int], Partition] = {}
        for topic in self.topics.topics.values():
            for index in range(topic.partitions):
                self._open_partition(topic, index)
        self._report_orphans()

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
        warn_if_inert(name, valid_configs)
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
        warn_if_inert(name, valid_configs)

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

    def check_new_partitions(
        self, name: str, count: int, *, assignments: Sequence[Sequence[int]] | None = None
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

    async def create(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None],
        *,
        replication_factor: int = -1,
        assignments: Sequence[tuple[int, Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> Topic:
        """CreateTopics: :meth:`create_topic`'s checks, then its partitions opened off the event loop."""
        registry = self.topics
        if name in registry.changing and name not in registry.topics:
            await registry.settled([name])  # its files are being removed: created anew after
        topic = self.create_topic(
            name,
            partitions,
            configs,
            replication_factor=replication_factor,
            assignments=assignments,
            validate_only=True,
        )
        if validate_only:
            return topic
        _check_file_descriptors(self, topic.partitions)
        registry.begin(name, creating=True)
        registry.partitions_in_flight += topic.partitions
        return await _carried_through(_create(self, topic))

    async def add_partitions(
        self,
        name: str,
        count: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool,
    ) -> None:
        """CreatePartitions: :meth:`check_new_partitions`, then the new partitions opened off the
        event loop."""
        registry = self.topics
        await registry.settled([name])
        self.check_new_partitions(name, count, assignments=assignments)
        if validate_only:
            return
        topic = registry.topics[name]
        added = count - topic.partitions
        _check_file_descriptors(self, added)
        registry.begin(name)
        registry.partitions_in_flight += added
        await _carried_through(_add(self, topic, count, added))

    async def delete_topics(self, names: Sequence[str]) -> dict[str, BrokerError | None]:
        """DeleteTopics for each of ``names`` (existing topics, none changing), with the
        files closed, renamed and removed off the event loop: the error of each topic not deleted, or
        None. The topics disappear together, at once."""
        registry = self.topics
        detached: list[tuple[Topic, list[Partition]]] = []
        for name in names:
            topic = registry.topics.pop(name)
            partitions = [self.partitions.pop((name, index)) for index in range(topic.partitions)]
            registry.begin(name)
            detached.append((topic, partitions))
        return await _carried_through(_delete(self, detached))


async def _carried_through(change: Coroutine[Any, Any, _T]) -> _T:
    task = asyncio.ensure_future(change)
    _UNDER_WAY.add(task)
    task.add_done_callback(_UNDER_WAY.discard)
    return await asyncio.shield(task)


def _off_loop(function: Any, *args: Any) -> Awaitable[Any]:
    return asyncio.get_running_loop().run_in_executor(None, function, *args)


def _check_file_descriptors(controller: TopicController, new_partitions: int) -> None:
    """The open file check (:func:`check_file_descriptors`) of :meth:`TopicController.create_topic`,
    counting the partitions other changes under way are opening (not open yet, so not counted by the
    check itself)."""
    if controller.topics.partitions_in_flight:
        check_file_descriptors(controller.topics.partitions_in_flight + new_partitions)


def _remove_directories(controller: TopicController, directories: Sequence[Path]) -> None:
    """Remove what a failed change made, renamed out of the way first as a deletion does (so that a
    crash meanwhile leaves a ``-delete`` directory, which the next start removes)."""
    for directory in directories:
        name, _, index = directory.name.rpartition("-")
        doomed = directory.with_name(deleted_dir_name(name, int(index)))
        try:
            directory.rename(doomed)
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("could not remove %s, left by a failed topic change: %s", directory, error)
            continue
        shutil.rmtree(doomed, ignore_errors=True)


def _in_parallel(function: Callable[[_T], Any], items: Sequence[_T]) -> list[Any]:
    """``function`` of each item, on a few threads: the work is mostly fsync and other system calls,
    which a disk does side by side. After a failure no further item is begun; once those begun are
    done, the failure is raised (:class:`_PartlyDone`, with the results of the items done)."""
    results: list[Any] = [_FAILED] * len(items)
    error: BaseException | None = None
    with concurrent.futures.ThreadPoolExecutor(min(_FILE_WORKERS, max(len(items), 1))) as pool:
        futures = {pool.submit(function, item): position for position, item in enumerate(items)}
        for future in concurrent.futures.as_completed(futures):
            if future.cancelled():
                continue
            try:
                results[futures[future]] = future.result()
            except BaseException as failure:
                if error is None:
                    error = failure
                    for waiting in futures:  # a full disk fails the rest alike
                        waiting.cancel()
    if error is not None:
        raise _PartlyDone(error, [r for r in results if r is not _FAILED])
    return results


class _PartlyDone(Exception):
    def __init__(self, error: BaseException, done: list[Any]) -> None:
        super().__init__(str(error))
        self.error = error
        self.done = done


def _open_partitions(
    controller: TopicController, topic: str, indexes: range, config: LogConfig
) -> list[Partition]:
    """Open new partitions ``indexes`` of ``topic`` (off the event loop): each replaces a directory an
    earlier topic of the name left (:meth:`TopicController._remove_stray`). On failure none is left open, and
    none of their directories is left."""

    def open_one(index: int) -> Partition:
        controller._remove_stray(topic, index)
        return controller.partition_files(topic, index, config)

    try:
        return _in_parallel(open_one, indexes)
    except _PartlyDone as failed:
        opened = {partition.index for partition in failed.done}
        _close_and_remove(
            controller,
            failed.done,
            extra=[controller._partition_dir(topic, index) for index in indexes if index not in opened],
        )
        raise failed.error from None


def _close_and_remove(
    controller: TopicController, partitions: Sequence[Partition], extra: Sequence[Path] = ()
) -> None:
    def close(partition: Partition) -> None:
        with contextlib.suppress(Exception):
            partition.close(keep_state=False)

    with contextlib.suppress(_PartlyDone):
        _in_parallel(close, partitions)
    _remove_directories(controller, [*(p.log.directory for p in partitions), *extra])


def _storage_error(what: str, error: BaseException) -> BrokerError:
    return BrokerError(ErrorCode.KAFKA_STORAGE_ERROR, f"{what}: {type(error).__name__}: {error}")


async def _create(controller: TopicController, topic: Topic) -> Topic:

    registry = controller.topics
    try:
        try:
            opened = await _off_loop(
                _open_partitions,
                controller,
                topic.name,
                range(topic.partitions),
                topic.log_config(controller.config),
            )
        except Exception as error:
            log.error("creating topic %s failed, nothing of it is left: %s", topic.name, error)
            raise _storage_error(f"topic {topic.name!r} could not be created", error) from None
        registry.topics[topic.name] = topic
        for partition in opened:
            controller.partitions[(topic.name, partition.index)] = partition
        try:
            registry.save()
        except Exception as error:
            del registry.topics[topic.name]
            for partition in opened:
                del controller.partitions[(topic.name, partition.index)]
            await _off_loop(_close_and_remove, controller, opened)
            raise _storage_error(f"topic {topic.name!r} could not be created", error) from None
    finally:
        registry.partitions_in_flight -= topic.partitions
        registry.end(topic.name)
    log.info("created topic %s with %d partition(s) %s", topic.name, topic.partitions, topic.configs or "")
    warn_if_inert(topic.name, topic.configs)
    return topic


async def _add(controller: TopicController, topic: Topic, count: int, added: int) -> None:
    registry = controller.topics
    try:
        try:
            opened = await _off_loop(
                _open_partitions,
                controller,
                topic.name,
                range(topic.partitions, count),
                topic.log_config(controller.config),
            )
        except Exception as error:
            log.error("adding partitions to topic %s failed, it is left as it was: %s", topic.name, error)
            raise _storage_error(f"partitions of topic {topic.name!r} could not be created", error) from None
        before = topic.partitions
        # A config altered while they were being opened applies to them too.
        config = topic.log_config(controller.config)
        for partition in opened:
            partition.log.config = config
            controller.partitions[(topic.name, partition.index)] = partition
        topic.partitions = count
        try:
            registry.save()
        except Exception as error:
            topic.partitions = before
            for partition in opened:
                del controller.partitions[(topic.name, partition.index)]
            await _off_loop(_close_and_remove, controller, opened)
            raise _storage_error(f"partitions of topic {topic.name!r} could not be created", error) from None
    finally:
        registry.partitions_in_flight -= added
        registry.end(topic.name)
    log.info("topic %s: %d partition(s) added, %d in all", topic.name, added, count)


def _close_and_rename(
    controller: TopicController, topic: Topic, partitions: Sequence[Partition]
) -> list[Path]:
    """Close the partitions and rename their directories out of the way (as Kafka's
    LogManager.asyncDelete: :func:`deleted_dir_name`); on failure, rename back what was renamed and
    raise."""

    def close(partition: Partition) -> None:
        partition.close(keep_state=False)

    try:
        _in_parallel(close, partitions)
    except _PartlyDone as failed:
        raise failed.error from None
    renamed: list[tuple[Path, Path]] = []
    try:
        for index in range(topic.partitions):
            directory = controller._partition_dir(topic.name, index)
            doomed = controller.config.data_dir / deleted_dir_name(topic.name, index)
            with contextlib.suppress(FileNotFoundError):
                directory.rename(doomed)
                renamed.append((directory, doomed))
    except OSError:
        for directory, doomed in reversed(renamed):
            doomed.rename(directory)
        raise
    return [doomed for _, doomed in renamed]


def _reopen(controller: TopicController, topic: Topic) -> list[Partition]:
    config = topic.log_config(controller.config)

    def reopen(index: int) -> Partition:
        return controller.partition_files(topic.name, index, config)

    try:
        return _in_parallel(reopen, range(topic.partitions))
    except _PartlyDone as failed:
        raise failed.error from None


async def _delete(
    controller: TopicController, detached: Sequence[tuple[Topic, list[Partition]]]
) -> dict[str, BrokerError | None]:
    registry = controller.topics
    outcome: dict[str, BrokerError | None] = {}
    removed: list[Path] = []
    try:
        for topic, partitions in detached:
            try:
                removed += await _off_loop(_close_and_rename, controller, topic, partitions)
            except OSError as error:
                outcome[topic.name] = BrokerError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"topic {topic.name!r} could not be deleted, and is left as it was: renaming its "
                    f"partition directories failed ({error})",
                )
                reopened = await _off_loop(_reopen, controller, topic)
                registry.topics[topic.name] = topic
                for partition in reopened:
                    controller.partitions[(topic.name, partition.index)] = partition
            else:
                outcome[topic.name] = None
        registry.save()
        for topic, _ in detached:
            if outcome[topic.name] is None:
                indexes = range(topic.partitions)
                controller.on_partitions_deleted([(topic.name, index) for index in indexes])
                log.info("deleted topic %s", topic.name)
    finally:
        for topic, _ in detached:
            registry.end(topic.name)
    await _off_loop(_remove_renamed, removed)
    return outcome


def _remove_renamed(directories: Sequence[Path]) -> None:
    _in_parallel(lambda directory: shutil.rmtree(directory, ignore_errors=True), directories)
