"""``spark.readStream``: the micro-batch stream, planned on the driver from the checkpoint."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from sparkafka.connector.kafka_admin import (
    KafkaAdmin,
    PartitionOffsets,
    TopicPartitionKey,
)
from sparkafka.connector.source.epochs import LeaderEpochEnds
from sparkafka.connector.source.heartbeat import (
    HeartbeatPartition,
    heartbeat_batch,
    heartbeat_of,
    heartbeat_partition,
    next_heartbeat_ms,
)
from sparkafka.connector.source.offsets import (
    INITIAL_OFFSET_KEY,
    SPLIT_KEY,
    UNRESOLVED_START,
    UNRESOLVED_START_KEY,
    _marked_initial,
    decode_offsets,
    encode_offsets,
    first_batch_start,
    held_starts,
    leader_epochs,
    recorded_split,
    topic_ids,
    with_first_batch_start,
    with_held_starts,
    with_leader_epochs,
    with_split,
    with_topic_ids,
)
from sparkafka.connector.source.options import (
    LATEST,
    LATEST_SENTINEL,
    OffsetBoundary,
    SourceOptions,
    _format_partitions,
)
from sparkafka.connector.source.ranges import (
    LEGACY_CALCULATOR,
    count_new_offsets,
    offset_ranges,
    rate_limit,
    split_offset_ranges,
)
from sparkafka.connector.source.reader import read_offset_range
from sparkafka.connector.source.resolver import OffsetResolver, report_data_loss
from sparkafka.errors import KafkaUnavailableError, SparkafkaError

logger = logging.getLogger(__name__)

# -- streaming --------------------------------------------------------------------------------------


def _truncation(tp: TopicPartitionKey, at: int, position: int) -> str:
    return (
        f"topic '{tp[0]}' partition {tp[1]}: the log was truncated below the query's position: offsets "
        f"{at} to {position - 1}, which the query had planned or read, are gone, and records written since "
        "take those offsets (an unclean leader election: the partition's leader epoch changed and the "
        f"epoch the position was recorded in now ends at {at}). Reading on from {at} reads the records "
        "written since the election"
    )


def _recreated(tp: TopicPartitionKey, position: int) -> str:
    return (
        f"topic '{tp[0]}' partition {tp[1]}: the topic was deleted and created again (its id changed) "
        f"while the query was at offset {position}: what it had not read of the old topic is gone, and "
        "the new topic is read from its earliest offset"
    )


@dataclasses.dataclass
class _LogCheck:
    """What :meth:`KafkaStreamReader._check_positions` found, by partition."""

    truncated: dict[TopicPartitionKey, int] = dataclasses.field(default_factory=dict)
    recreated: set[TopicPartitionKey] = dataclasses.field(default_factory=set)
    unchecked: set[TopicPartitionKey] = dataclasses.field(default_factory=set)


@functools.cache
def _note_no_leader_epochs_once() -> None:
    logger.info(
        "the checkpoint's offsets carry no leader epochs (written by an earlier sparkafka, or Spark's "
        "kafka format): a log truncated below them is seen only when its end falls below them; the "
        "next micro-batch records them"
    )


def _resolves_the_same_later(boundary: OffsetBoundary) -> bool:
    """Whether ``boundary`` resolves to the same offsets whenever it is resolved: a partition's
    earliest offset moves only when retention deletes records, which no reader can read anyway."""
    if boundary.kind == "earliest":
        return True
    return boundary.kind == "offsets" and LATEST_SENTINEL not in boundary.offsets.values()


def _first_batch_planned_elsewhere(end: dict[str, dict[str, int]], starting: OffsetBoundary) -> str:
    """Why a first micro-batch that another source planned cannot be replayed (see partitions)."""
    return (
        f"the first micro-batch of this checkpoint, ending at {encode_offsets(decode_offsets(end))}, was "
        "planned by another source, most likely Spark's kafka format before the query switched to "
        "sparkafka, and was never committed; its start is not in the offsets log (Spark's source keeps "
        "it in <checkpoint>/sources/0/0, which a Python data source cannot read), and "
        f"{starting.option} cannot be resolved again to the same offsets, so sparkafka cannot tell "
        "which records the batch holds and refuses rather than read nothing. Either finish this batch "
        "with format('kafka') first (run the query with Spark's connector until a micro-batch is "
        "committed, then switch), or give sparkafka that start: option startingOffsets set to the "
        "JSON on the last line of <checkpoint>/sources/0/0"
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Lives in one Python process on the driver for the whole query; a copy
    without the admin client is pickled to the executors, where only :meth:`read` runs."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: KafkaAdmin | None = None
        # Spark asks for the initial offset more than once; resolving it twice could differ.
        self._initial: PartitionOffsets | None = None
        # Trigger.AvailableNow: latest offsets when the query started; never read past them.
        self._available_now_target: PartitionOffsets | None = None
        self._known_partitions: list[TopicPartitionKey] | None = None
        self._discovered_at = 0.0
        self._last_trigger_at: float | None = None
        self._latest: PartitionOffsets | None = None
        self._published: PartitionOffsets | None = None
        # Idle heartbeats (monotonic clock): when the input was last seen active, the latest offsets
        # seen then, when the last heartbeat was planned, and whether the idle period was logged.
        self._active_at: float | None = None
        self._latest_when_active: PartitionOffsets | None = None
        self._heartbeat_planned_at: float | None = None
        self._idle_reported = False
        # Partitions whose starting offsets open transactions hold back (logged once per hold).
        self._holding: frozenset[TopicPartitionKey] = frozenset()
        # Where leader epochs end now (KIP-320), asked only where a partition's epoch changed.
        self._epoch_ends: LeaderEpochEnds | None = None
        # The end offset this process planned last: partitions() checks any other one (a replay).
        self._planned_end: dict[str, dict[str, int]] | None = None
        # Positions found intact under (recorded, current) leader epochs: not asked again.
        self._intact: set[tuple[TopicPartitionKey, int, int, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None
        state["_epoch_ends"] = None
        return state

    @property
    def epoch_ends(self) -> LeaderEpochEnds:
        if self._epoch_ends is None:
            self._epoch_ends = LeaderEpochEnds(
                self.options.client_config, timeout_s=self.options.api_timeout_ms / 1000
            )
        return self._epoch_ends

    @property
    def resolver(self) -> OffsetResolver:
        if self._admin is None:
            self._admin = self.options.admin()
        return OffsetResolver(self.options, self._admin)

    # -- offsets --

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """The engine asks for this when it plans the first micro-batch and again when it replays
        that batch after a failure (see "Starting offsets" in the docstring of
        sparkafka.connector.source). Starting offsets that resolve the same both times
        (``earliest``, offsets given as numbers or -2) are returned resolved, so the first batch
        reads records as with Spark's source; the others (``latest``, -1, ``group``, timestamps,
        which fall back to latest) as :data:`UNRESOLVED_START`, which :meth:`latestOffset` resolves
        into the end of an empty, checkpointed first batch."""
        if not _resolves_the_same_later(self.options.starting or LATEST):
            return {key: dict(value) for key, value in UNRESOLVED_START.items()}
        return _marked_initial(encode_offsets(self._starting_offsets()))

    def _starting_offsets(self) -> PartitionOffsets:
        """``startingOffsets`` (default latest) resolved against the cluster, once per reader."""
        if self._initial is None:
            partitions = self._partitions(require_topics=True)
            boundary = self.options.starting or LATEST
            self._initial = self.resolver.resolve(
                boundary, partitions, starting=True, latest_snapshot=self._snapshot_for(partitions)
            )
            logger.info("starting offsets: %s", encode_offsets(self._initial))
        return self._initial

    def _snapshot_for(self, partitions: Sequence[TopicPartitionKey]) -> PartitionOffsets | None:
        """Under AvailableNow "latest" means the target recorded at prepare time, not a newer one."""
        target = self._available_now_target
        if target is not None and all(tp in target for tp in partitions):
            return {tp: target[tp] for tp in partitions}
        return None

    def getDefaultReadLimit(self) -> ReadLimit:
        # Python's ReadLimit cannot combine min and max; latestOffset applies both from the options
        # whenever the engine does not ask for everything (ReadAllAvailable).
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._partitions(require_topics=False, force=True)
        self._available_now_target = self.resolver.latest(partitions)
        logger.info("Trigger.AvailableNow reads up to %s", encode_offsets(self._available_now_target))

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """End offsets of the next micro-batch, or ``start`` itself when there is nothing to do.

        Steps:
        0. From :data:`UNRESOLVED_START` (a new query's first micro-batch): the resolved starting
           offsets, and nothing else; that batch reads no records and fixes the start in the checkpoint.
        1. Publish ``start`` to the consumer group (``commitOffsetsOnBatch``): the engine only asks
           for new offsets once the batch ending at ``start`` is complete.
        2. The partitions to consider: re-discovered every micro-batch (or every
           ``partitionDiscoveryIntervalMs``); under AvailableNow exactly those of the target
           recorded at prepare time.
        3. Latest offsets (the last stable offset with read_committed), capped by the AvailableNow
           target.
        4. Partitions of ``start`` that are gone, or whose latest offset went below the start (topic
           recreated), are data loss: fail, or drop / reset them to their earliest offset. With
           read_committed a start still within the high watermark is only held back by an open
           transaction: such a partition stays where it is.
        5. New partitions enter ``end`` at their earliest offset and are read from the next batch
           on, so that ``partitions(start, end)`` never has to ask the cluster where they begin.
        6. Unless the engine asks for everything: wait for ``minOffsetsPerTrigger`` (at most
           ``maxTriggerDelay``; never under AvailableNow) and cap at ``maxOffsetsPerTrigger``.
        7. Idle heartbeat (``idleHeartbeatIntervalMs``): carry ``start``'s heartbeat entry forward, or
           replace it by a new one when :meth:`_heartbeat_due` says so. Steps 1-6 never see it.
        """
        if start.get(UNRESOLVED_START_KEY) is not None:
            # The batch is empty, and stays empty when replayed whatever startingOffsets says then.
            resolved = self._starting_offsets()
            return with_first_batch_start(_marked_initial(encode_offsets(resolved)), resolved)
        start_offsets = decode_offsets(start)
        self._publish_progress(start_offsets)
        resolver = self.resolver
        target = self._available_now_target
        if target is not None:
            # A partition of start missing from the target appeared between prepare and the initial
            # offsets: it is not gone, it just has nothing to read under AvailableNow.
            partitions = sorted(set(target) | set(start_offsets))
        else:
            partitions = self._partitions(require_topics=False)
        epochs: dict[TopicPartitionKey, int] = {}
        latest = resolver.latest(partitions, epochs)
        self._latest = latest
        end: PartitionOffsets = {}
        recorded = leader_epochs(start)
        check = self._check_positions(
            start_offsets, recorded, epochs, topic_ids(start), note_missing=INITIAL_OFFSET_KEY not in start
        )
        truncated = check.truncated

        gone = sorted(tp for tp in start_offsets if tp not in latest)
        if gone:
            report_data_loss(
                self.options,
                f"partitions {_format_partitions(gone)} are gone (topic deleted or no longer selected by the "
                "subscription) with records possibly not yet read",
                resume_at=0,
            )
        reset: list[TopicPartitionKey] = []
        # Starting offsets may wait for an open transaction: all of them while the start is the
        # query's initial one, then those a batch carried forward still unread (held_starts).
        may_hold = (
            set(start_offsets)
            if INITIAL_OFFSET_KEY in start
            else {tp for tp, offset in held_starts(start).items() if start_offsets.get(tp) == offset}
        )
        held_back = self._held_back_by_open_transactions(start_offsets, latest, may_hold)
        for tp, begin in start_offsets.items():
            if tp not in latest:
                continue
            if tp in check.unchecked:
                # Not read past until its leader answers: the position keeps its recorded epoch.
                end[tp], epochs[tp] = begin, recorded[tp]
                continue
            if tp in truncated:
                # Empty range this batch (end < start); the next batch reads on from the truncation.
                message = _truncation(tp, truncated[tp], begin)
                end[tp] = report_data_loss(self.options, message, resume_at=truncated[tp])
                continue
            if tp in check.recreated:
                report_data_loss(self.options, _recreated(tp, begin), resume_at=0)
                reset.append(tp)
                continue
            if tp in held_back:
                end[tp] = begin
                continue
            if latest[tp] < begin:
                report_data_loss(
                    self.options,
                    f"topic '{tp[0]}' partition {tp[1]}: the latest offset went back from {begin} to "
                    f"{latest[tp]} (topic deleted and recreated, or the log was truncated)",
                    resume_at=0,
                )
                reset.append(tp)
                continue
            ceiling = target.get(tp, begin) if target is not None else latest[tp]
            end[tp] = max(begin, min(latest[tp], ceiling))

        discovered = [tp for tp in latest if tp not in start_offsets]
        restart_at = resolver.admin.earliest_offsets(discovered + reset) if discovered or reset else {}
        for tp in reset:
            # Empty range this batch (end < start); the next batch reads the new log from its start.
            end[tp] = restart_at.get(tp, 0)
        for tp in discovered:
            if tp not in restart_at:
                continue
            first = restart_at[tp]
            if first != 0:
                first = report_data_loss(
                    self.options,
                    f"added partition {tp[0]}-{tp[1]} starts from offset {first} instead of 0",
                    resume_at=first,
                )
            end[tp] = min(first, target[tp]) if target is not None else first
            logger.info("discovered partition %s-%d; reading it from offset %d", tp[0], tp[1], end[tp])

        if not isinstance(limit, ReadAllAvailable):
            # A changed set of partitions is never delayed: the warnings above would repeat every
            # trigger until the batch runs.
            partitions_changed = bool(gone or reset or discovered or truncated or check.unchecked)
            end = self._apply_read_limits(start_offsets, end, limit, may_wait=not partitions_changed)
        heartbeat_ms = heartbeat_of(start)
        if self._heartbeat_due(start_offsets, end, latest, partitions):
            heartbeat_ms = next_heartbeat_ms(heartbeat_ms, int(time.time() * 1000))
        encoded = encode_offsets(end, heartbeat_ms=heartbeat_ms)
        if decode_offsets(encoded) == start_offsets and heartbeat_ms == heartbeat_of(start):
            return start  # nothing new: the engine compares the JSON text, own entries included
        if INITIAL_OFFSET_KEY in start:
            encoded = with_first_batch_start(encoded, start_offsets)
        if held_back:
            encoded = with_held_starts(encoded, {tp: start_offsets[tp] for tp in held_back})
        encoded = with_leader_epochs(encoded, {tp: epoch for tp, epoch in epochs.items() if tp in end})
        encoded = with_topic_ids(encoded, resolver.admin.known_topic_ids)
        planned = with_split(encoded, self.options.split)
        self._planned_end = planned
        return planned

    def _check_positions(
        self,
        positions: PartitionOffsets,
        recorded: Mapping[TopicPartitionKey, int],
        current: Mapping[TopicPartitionKey, int],
        recorded_ids: Mapping[str, tuple[int, int]],
        *,
        note_missing: bool = True,
    ) -> _LogCheck:
        """Partitions whose log went back under their position since it was recorded.

        Steps (KIP-320, as Kafka's consumers validate a position):
        1. Only a partition whose leader epoch changed since the position was recorded can have
           been truncated under it (a leader change): the others cost no request, and neither does
           a position this process found intact already under the same epochs.
        2. Ask the current leaders where the recorded epoch ends now; a partition its leader does
           not answer in time stays unchecked (the caller holds it where it is).
        3. An end below the position: the records from that end to the position are gone and new
           ones take their offsets. Where the topic's id changed since (both known), the topic was
           deleted and created again instead. An epoch the log does not know (-1) is left to the
           check of the latest offset against the position."""
        found = _LogCheck()
        if not recorded:
            if positions and note_missing:
                _note_no_leader_epochs_once()
            return found
        asked = {
            tp: epoch
            for tp, epoch in recorded.items()
            if tp in positions
            and tp in current
            and current[tp] != epoch
            and (tp, positions[tp], epoch, current[tp]) not in self._intact
        }
        ends = self.epoch_ends.ends(asked) if asked else None
        if ends is None:
            return found
        below: dict[TopicPartitionKey, int] = {}
        for tp, epoch in asked.items():
            answer = ends.get(tp)
            if answer is None:
                found.unchecked.add(tp)
            elif 0 <= answer.end_offset < positions[tp]:
                below[tp] = answer.end_offset
            else:
                self._intact.add((tp, positions[tp], epoch, current[tp]))
        if below:
            described = self.resolver.admin
            described.topic_partitions(sorted({topic for topic, _ in below}))
            for tp, at in below.items():
                was, now = recorded_ids.get(tp[0]), described.known_topic_ids.get(tp[0])
                if was is not None and now is not None and was != now:
                    found.recreated.add(tp)
                else:
                    found.truncated[tp] = at
        return found

    def _held_back_by_open_transactions(
        self, start: PartitionOffsets, latest: PartitionOffsets, may_hold: set[TopicPartitionKey]
    ) -> set[TopicPartitionKey]:
        """Partitions of the query's starting offsets (``start`` is marked as such) past their last
        stable offset but not past their high watermark.

        With read_committed the latest offset is the last stable offset, which an open transaction
        holds below records already written. A starting offset there (a group's offsets committed by
        a read_uncommitted consumer, explicit offsets) is not data loss: those partitions wait until
        the transaction ends. Any later start was reached by this query reading read_committed, and
        the last stable offset never moves back: below it, the log went back (topic recreated, log
        truncated), even if a new open transaction has written past the start since."""
        below_start = [
            tp for tp, begin in start.items() if tp in may_hold and tp in latest and latest[tp] < begin
        ]
        if not below_start or not self.options.read_committed:
            self._holding = frozenset()
            return set()
        high_watermarks = self.resolver.high_watermarks(below_start)
        held = frozenset(tp for tp in below_start if high_watermarks.get(tp, -1) >= start[tp])
        if held and held != self._holding:
            logger.info(
                "open transactions hold the last stable offset of %s below the starting offsets; "
                "waiting for them to end",
                _format_partitions(sorted(held)),
            )
        self._holding = held
        return set(held)

    def _heartbeat_due(
        self,
        start: PartitionOffsets,
        end: PartitionOffsets,
        latest: PartitionOffsets,
        partitions: Sequence[TopicPartitionKey],
    ) -> bool:
        """Whether the micro-batch planned now should carry a new idle heartbeat.

        Steps:
        1. Only with ``idleHeartbeatIntervalMs``, and never under AvailableNow: such a run ends with
           its data, and a heartbeat would declare the data the next run reads late.
        2. The input is active when this batch reads anything (``end`` differs from ``start``: new
           offsets, or partitions added, reset or lost), when records wait unread (a backlog held
           back by ``minOffsetsPerTrigger``), or when a latest offset moved since last seen.
           Activity restarts the idle clock; so does the first call after a (re)start, since the
           reader cannot know for how long the input was idle before.
        3. A heartbeat is due once the last activity and the last heartbeat are both at least an
           interval old: heartbeats repeat every interval while the input stays idle, so the
           watermark keeps following the wall clock until the last window has closed.
        4. Not while an open transaction holds a partition's last stable offset below its high
           watermark (read_committed): its records are not visible yet, may carry older
           timestamps, and would be dropped as late once a heartbeat moved the watermark past them.
        """
        interval_ms = self.options.idle_heartbeat_interval_ms
        if interval_ms is None or self._available_now_target is not None:
            return False
        now = time.monotonic()
        reads_something = end != start
        backlog = count_new_offsets(start, latest) > 0
        if self._active_at is None or reads_something or backlog or latest != self._latest_when_active:
            self._active_at = now
            self._latest_when_active = dict(latest)
            self._idle_reported = False
            return False
        quiet_since = max(self._active_at, self._heartbeat_planned_at or self._active_at)
        if (now - quiet_since) * 1000 < interval_ms:
            return False
        if self.options.read_committed and partitions:
            high_watermarks = self.resolver.high_watermarks(partitions)
            held_back = sorted(tp for tp, high in high_watermarks.items() if high > latest.get(tp, high))
            if held_back:
                logger.debug(
                    "no idle heartbeat: open transactions on %s hold back records not yet visible",
                    _format_partitions(held_back),
                )
                return False
        self._heartbeat_planned_at = now
        if not self._idle_reported:
            self._idle_reported = True
            logger.info(
                "input idle for %d ms: planning idle heartbeats every %d ms until records arrive",
                int((now - self._active_at) * 1000),
                interval_ms,
            )
        return True

    def _apply_read_limits(
        self, start: PartitionOffsets, end: PartitionOffsets, limit: ReadLimit, *, may_wait: bool
    ) -> PartitionOffsets:
        """Spark's admission control: ``minOffsetsPerTrigger`` holds the batch back (returns
        ``start``) until enough new offsets exist or ``maxTriggerDelay`` has passed since the last
        batch; ``maxOffsetsPerTrigger`` then caps it. AvailableNow never waits: nothing new comes."""
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else self.options.min_offsets_per_trigger
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_offsets_per_trigger
        if min_rows is not None and self._available_now_target is None:
            now = time.monotonic()
            waited_ms = math.inf if self._last_trigger_at is None else (now - self._last_trigger_at) * 1000
            enough = count_new_offsets(start, end) >= min_rows
            if may_wait and not enough and waited_ms < self.options.max_trigger_delay_ms:
                return dict(start)
            self._last_trigger_at = now
        if max_rows is not None:
            end = rate_limit(max_rows, start, end)
        return end

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return encode_offsets(self._latest) if self._latest else None

    def _partitions(self, *, require_topics: bool, force: bool = False) -> list[TopicPartitionKey]:
        """Topic partitions to read, re-discovered on every call (no discovery interval, as Spark's
        source), when the discovery interval has passed, or only on first use (an interval <= 0)."""
        interval_ms = self.options.partition_discovery_interval_ms
        now = time.monotonic()
        stale = (
            self._known_partitions is None
            or interval_ms is None
            or (interval_ms > 0 and now - self._discovered_at >= interval_ms / 1000)
        )
        if force or require_topics or stale:
            self._known_partitions = self.resolver.partitions(require_topics=require_topics)
            self._discovered_at = now
        assert self._known_partitions is not None
        return self._known_partitions

    # -- planning and reading --

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> Sequence[InputPartition]:
        """The offset ranges between ``start`` and ``end`` and, when ``end`` carries a new idle
        heartbeat, one :class:`HeartbeatPartition`. Depends only on the two offsets (invariant 1):
        the split options the batch was planned with are recorded in ``end`` and win over the
        current ones, which apply from the next batch on."""
        # A first micro-batch replayed after a crash gets a start resolved anew, which may differ
        # (retention moved the earliest offset); its checkpointed end knows the start it had.
        begin = first_batch_start(end)
        if begin is None and UNRESOLVED_START_KEY in start and INITIAL_OFFSET_KEY not in end:
            raise SparkafkaError(_first_batch_planned_elsewhere(end, self.options.starting or LATEST))
        if begin is None and INITIAL_OFFSET_KEY in start and SPLIT_KEY not in end:
            logger.warning(
                "the first micro-batch, ending at %s, was planned by another source (Spark's kafka format?): "
                "it is read from the start sparkafka resolves now from startingOffsets (%s), which is where "
                "that source began it only if startingOffsets is unchanged",
                encode_offsets(decode_offsets(end)),
                encode_offsets(decode_offsets(start)),
            )
        # Offsets checkpointed before the split was recorded were split by the first calculator.
        split = recorded_split(end) or dataclasses.replace(self.options.split, calculator=LEGACY_CALCULATOR)
        if split != self.options.split:
            logger.info(
                "planning the micro-batch ending at %s with the split it was first planned with (%s); "
                "the current options (%s) apply from the next micro-batch",
                encode_offsets(decode_offsets(end)),
                split.encode(),
                self.options.split.encode(),
            )
        ends = decode_offsets(end)
        if end != self._planned_end:  # a replay: its input may have been truncated since
            ends = self._intact_part(ends, leader_epochs(end), topic_ids(end))
        ranges: list[InputPartition] = list(
            split_offset_ranges(
                offset_ranges(decode_offsets(start) if begin is None else begin, ends),
                min_partitions=split.min_partitions,
                max_records_per_partition=split.max_records_per_partition,
                calculator=split.calculator,
            )
        )
        heartbeat = heartbeat_partition(start, end)
        if heartbeat is not None:
            ranges.append(heartbeat)
        return ranges

    def _intact_part(
        self,
        ends: PartitionOffsets,
        recorded: Mapping[TopicPartitionKey, int],
        recorded_ids: Mapping[str, tuple[int, int]],
    ) -> PartitionOffsets:
        """``ends`` of a replayed micro-batch, each cut where its log was truncated since it was
        planned (:meth:`_truncated_below` against the latest leader epochs): failOnDataLoss fails the
        batch, otherwise it reads what is left and the next batch reads on from the truncation."""
        if not recorded:
            return ends
        current: dict[TopicPartitionKey, int] = {}
        self.resolver.latest(sorted(recorded), current)
        check = self._check_positions(ends, recorded, current, recorded_ids)
        if check.unchecked:
            raise KafkaUnavailableError(
                f"the leaders of {_format_partitions(sorted(check.unchecked))} did not say within "
                f"{self.options.api_timeout_ms} ms (kafka.default.api.timeout.ms) whether the log under "
                "this replayed micro-batch was truncated since it was planned; it is not read unchecked. "
                "The query stops; restart it once the cluster answers"
            )
        intact = dict(ends)
        for tp, at in check.truncated.items():
            intact[tp] = report_data_loss(self.options, _truncation(tp, at, ends[tp]), resume_at=at)
        for tp in check.recreated:
            report_data_loss(self.options, _recreated(tp, ends[tp]), resume_at=0)
            intact[tp] = 0  # nothing of the old topic is left to read
        return intact

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, HeartbeatPartition):
            return iter([heartbeat_batch(partition, self.options.include_headers)])
        return read_offset_range(partition, self.options)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        # decode_offsets leaves the heartbeat entry out: it is no partition of the consumer group.
        self._publish_progress(decode_offsets(end))

    def _publish_progress(self, offsets: PartitionOffsets) -> None:
        """Store processed offsets in ``kafka.group.id`` for lag monitoring. Never read back for
        recovery (the checkpoint is the truth), so a failure is logged, not raised."""
        group_id = self.options.group_id
        if (
            not self.options.commit_offsets_on_batch
            or not group_id
            or not offsets
            or offsets == self._published
        ):
            return
        # Remembered even if the commit fails: the engine asks for offsets many times a second when
        # idle, and a group with active members rejects commits until they leave.
        self._published = dict(offsets)
        try:
            self.resolver.admin.commit_offsets(group_id, offsets, retry=False)
        except Exception as error:
            logger.warning(
                "could not commit offsets to consumer group %r (monitoring only): %s", group_id, error
            )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
