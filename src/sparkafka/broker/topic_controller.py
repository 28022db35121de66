"""CreateTopics, CreatePartitions and DeleteTopics with their file work off the event loop.

Opening thousands of partitions (directories, segment and index files) or closing and removing them
takes seconds; done on the event loop it would hold up every other client for as long. So each change
is checked and reserved on the loop, its files are made or removed on a worker thread, and the result
is committed on the loop in one step, with no ``await`` in between:

- a topic being created is invisible (Metadata, Produce, Fetch... know nothing of it) until all its
  partitions are open, then appears whole; its name is taken meanwhile (TOPIC_ALREADY_EXISTS);
- partitions being added appear all at once, with the topic's new partition count;
- a topic being deleted disappears at once, as it does from Kafka's metadata when its controller
  accepts the deletion, and its files are removed after;
- a change of a name waits for the one under way (Kafka's controller applies them one by one);
- a failure on the way (a full disk, say) leaves the topic as it was: a creation leaves no topic and
  no directory, added partitions are closed and removed, a deletion puts the topic back.

Once begun, a change runs to its end even if the client that asked goes away, as Kafka's controller
completes a change it accepted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log import LogConfig
from sparkafka.broker.partition import Partition
from sparkafka.broker.topics import Topic

if TYPE_CHECKING:
    from sparkafka.broker.server import Broker

log = logging.getLogger("sparkafka.broker")
_T = TypeVar("_T")
# Threads a change's file work is spread over.
_FILE_WORKERS = 4
_FAILED = object()
# Changes under way, referenced so that a change whose client went away is not collected mid-way.
_UNDER_WAY: set[asyncio.Task[Any]] = set()


async def _carried_through(change: Coroutine[Any, Any, _T]) -> _T:
    task = asyncio.ensure_future(change)
    _UNDER_WAY.add(task)
    task.add_done_callback(_UNDER_WAY.discard)
    return await asyncio.shield(task)


def _off_loop(function: Any, *args: Any) -> Awaitable[Any]:
    return asyncio.get_running_loop().run_in_executor(None, function, *args)


def _check_file_descriptors(broker: Broker, new_partitions: int) -> None:
    """The open file check of :meth:`Broker.create_topic`, counting the partitions other changes
    under way are opening (not open yet, so not counted by the check itself)."""
    from sparkafka.broker.server import check_file_descriptors

    if broker.topics.partitions_in_flight:
        check_file_descriptors(broker.topics.partitions_in_flight + new_partitions)


def _remove_directories(broker: Broker, directories: Sequence[Path]) -> None:
    """Remove what a failed change made, renamed out of the way first as a deletion does (so that a
    crash meanwhile leaves a ``-delete`` directory, which the next start removes)."""
    from sparkafka.broker.server import deleted_dir_name

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


def _open_partitions(broker: Broker, topic: str, indexes: range, config: LogConfig) -> list[Partition]:
    """Open new partitions ``indexes`` of ``topic`` (off the event loop): each replaces a directory an
    earlier topic of the name left (:meth:`Broker._remove_stray`). On failure none is left open, and
    none of their directories is left."""

    def open_one(index: int) -> Partition:
        broker._remove_stray(topic, index)
        return broker.partition_files(topic, index, config)

    try:
        return _in_parallel(open_one, indexes)
    except _PartlyDone as failed:
        opened = {partition.index for partition in failed.done}
        _close_and_remove(
            broker,
            failed.done,
            extra=[broker._partition_dir(topic, index) for index in indexes if index not in opened],
        )
        raise failed.error from None


def _close_and_remove(broker: Broker, partitions: Sequence[Partition], extra: Sequence[Path] = ()) -> None:
    def close(partition: Partition) -> None:
        with contextlib.suppress(Exception):
            partition.close(keep_state=False)

    with contextlib.suppress(_PartlyDone):
        _in_parallel(close, partitions)
    _remove_directories(broker, [*(p.log.directory for p in partitions), *extra])


def _storage_error(what: str, error: BaseException) -> BrokerError:
    return BrokerError(ErrorCode.KAFKA_STORAGE_ERROR, f"{what}: {type(error).__name__}: {error}")


async def create_topic(
    broker: Broker,
    name: str,
    partitions: int,
    configs: Mapping[str, str | None],
    *,
    replication_factor: int = -1,
    assignments: Sequence[tuple[int, Sequence[int]]] | None = None,
    validate_only: bool = False,
) -> Topic:
    """:meth:`Broker.create_topic`, with its partitions opened off the event loop."""
    registry = broker.topics
    if name in registry.changing and name not in registry.topics:
        await registry.settled([name])  # its files are being removed: created anew after
    topic = broker.create_topic(
        name,
        partitions,
        configs,
        replication_factor=replication_factor,
        assignments=assignments,
        validate_only=True,
    )
    if validate_only:
        return topic
    _check_file_descriptors(broker, topic.partitions)
    registry.begin(name, creating=True)
    registry.partitions_in_flight += topic.partitions
    return await _carried_through(_create(broker, topic))


async def _create(broker: Broker, topic: Topic) -> Topic:
    from sparkafka.broker.server import _warn_if_inert

    registry = broker.topics
    try:
        try:
            opened = await _off_loop(
                _open_partitions,
                broker,
                topic.name,
                range(topic.partitions),
                topic.log_config(broker.config),
            )
        except Exception as error:
            log.error("creating topic %s failed, nothing of it is left: %s", topic.name, error)
            raise _storage_error(f"topic {topic.name!r} could not be created", error) from None
        registry.topics[topic.name] = topic
        for partition in opened:
            broker.partitions[(topic.name, partition.index)] = partition
        try:
            registry.save()
        except Exception as error:
            del registry.topics[topic.name]
            for partition in opened:
                del broker.partitions[(topic.name, partition.index)]
            await _off_loop(_close_and_remove, broker, opened)
            raise _storage_error(f"topic {topic.name!r} could not be created", error) from None
    finally:
        registry.partitions_in_flight -= topic.partitions
        registry.end(topic.name)
    log.info("created topic %s with %d partition(s) %s", topic.name, topic.partitions, topic.configs or "")
    _warn_if_inert(topic.name, topic.configs)
    return topic


async def add_partitions(
    broker: Broker,
    name: str,
    count: int,
    *,
    assignments: Sequence[Sequence[int]] | None = None,
    validate_only: bool,
) -> None:
    """:meth:`Broker.add_partitions`, with the new partitions opened off the event loop."""
    registry = broker.topics
    await registry.settled([name])
    broker.add_partitions(name, count, assignments=assignments, validate_only=True)
    if validate_only:
        return
    topic = registry.topics[name]
    added = count - topic.partitions
    _check_file_descriptors(broker, added)
    registry.begin(name)
    registry.partitions_in_flight += added
    await _carried_through(_add(broker, topic, count, added))


async def _add(broker: Broker, topic: Topic, count: int, added: int) -> None:
    registry = broker.topics
    try:
        try:
            opened = await _off_loop(
                _open_partitions,
                broker,
                topic.name,
                range(topic.partitions, count),
                topic.log_config(broker.config),
            )
        except Exception as error:
            log.error("adding partitions to topic %s failed, it is left as it was: %s", topic.name, error)
            raise _storage_error(f"partitions of topic {topic.name!r} could not be created", error) from None
        before = topic.partitions
        # A config altered while they were being opened applies to them too.
        config = topic.log_config(broker.config)
        for partition in opened:
            partition.log.config = config
            broker.partitions[(topic.name, partition.index)] = partition
        topic.partitions = count
        try:
            registry.save()
        except Exception as error:
            topic.partitions = before
            for partition in opened:
                del broker.partitions[(topic.name, partition.index)]
            await _off_loop(_close_and_remove, broker, opened)
            raise _storage_error(f"partitions of topic {topic.name!r} could not be created", error) from None
    finally:
        registry.partitions_in_flight -= added
        registry.end(topic.name)
    log.info("topic %s: %d partition(s) added, %d in all", topic.name, added, count)


async def delete_topics(broker: Broker, names: Sequence[str]) -> dict[str, BrokerError | None]:
    """:meth:`Broker.delete_topic` for each of ``names`` (existing topics, none changing), with the
    files closed, renamed and removed off the event loop: the error of each topic not deleted, or
    None. The topics disappear together, at once."""
    registry = broker.topics
    detached: list[tuple[Topic, list[Partition]]] = []
    for name in names:
        topic = registry.topics.pop(name)
        partitions = [broker.partitions.pop((name, index)) for index in range(topic.partitions)]
        registry.begin(name)
        detached.append((topic, partitions))
    return await _carried_through(_delete(broker, detached))


def _close_and_rename(broker: Broker, topic: Topic, partitions: Sequence[Partition]) -> list[Path]:
    """Close the partitions and rename their directories out of the way (as
    :meth:`Broker.delete_topic`); on failure, rename back what was renamed and raise."""
    from sparkafka.broker.server import deleted_dir_name

    def close(partition: Partition) -> None:
        partition.close(keep_state=False)

    try:
        _in_parallel(close, partitions)
    except _PartlyDone as failed:
        raise failed.error from None
    renamed: list[tuple[Path, Path]] = []
    try:
        for index in range(topic.partitions):
            directory = broker._partition_dir(topic.name, index)
            doomed = broker.config.data_dir / deleted_dir_name(topic.name, index)
            with contextlib.suppress(FileNotFoundError):
                directory.rename(doomed)
                renamed.append((directory, doomed))
    except OSError:
        for directory, doomed in reversed(renamed):
            doomed.rename(directory)
        raise
    return [doomed for _, doomed in renamed]


def _reopen(broker: Broker, topic: Topic) -> list[Partition]:
    config = topic.log_config(broker.config)

    def reopen(index: int) -> Partition:
        return broker.partition_files(topic.name, index, config)

    try:
        return _in_parallel(reopen, range(topic.partitions))
    except _PartlyDone as failed:
        raise failed.error from None


async def _delete(
    broker: Broker, detached: Sequence[tuple[Topic, list[Partition]]]
) -> dict[str, BrokerError | None]:
    registry = broker.topics
    outcome: dict[str, BrokerError | None] = {}
    removed: list[Path] = []
    try:
        for topic, partitions in detached:
            try:
                removed += await _off_loop(_close_and_rename, broker, topic, partitions)
            except OSError as error:
                outcome[topic.name] = BrokerError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"topic {topic.name!r} could not be deleted, and is left as it was: renaming its "
                    f"partition directories failed ({error})",
                )
                reopened = await _off_loop(_reopen, broker, topic)
                registry.topics[topic.name] = topic
                for partition in reopened:
                    broker.partitions[(topic.name, partition.index)] = partition
            else:
                outcome[topic.name] = None
        registry.save()
        for topic, _ in detached:
            if outcome[topic.name] is None:
                indexes = range(topic.partitions)
                broker._uncleanable.difference_update((topic.name, index) for index in indexes)
                broker.groups.on_partitions_deleted((topic.name, index) for index in indexes)
                log.info("deleted topic %s", topic.name)
    finally:
        for topic, _ in detached:
            registry.end(topic.name)
    await _off_loop(_remove_renamed, removed)
    return outcome


def _remove_renamed(directories: Sequence[Path]) -> None:
    _in_parallel(lambda directory: shutil.rmtree(directory, ignore_errors=True), directories)
