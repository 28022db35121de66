"""The steps that :meth:`sparkafka.connector.source.stream.KafkaStreamReader.latestOffset` plans a
micro-batch's end offsets with, on the driver, each with the little state it keeps between triggers:

1. :class:`PartitionDiscovery` - which partitions to consider;
2. the latest offsets (:meth:`OffsetResolver.latest`), with each partition's leader epoch;
3. :class:`LogCheck` - positions whose log went back under them (KIP-320), and
   :class:`TransactionHolds` - starting offsets an open transaction still holds back;
4. :func:`report_gone` and :func:`reconcile` - each known partition's end: read on, hold, or report data loss;
5. :func:`place_new_partitions` - new and reset partitions start at their earliest offset;
6. :class:`AdmissionControl` - ``minOffsetsPerTrigger`` / ``maxTriggerDelay`` / ``maxOffsetsPerTrigger``;
7. :class:`IdleClock` - whether the batch carries a new idle heartbeat.

Only the executors' reads run elsewhere; none of this is imported there."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, ReadMinRows

from sparkafka.connector.kafka_admin import PartitionOffsets, TopicPartitionKey
from sparkafka.connector.source.data_loss import report_data_loss
from sparkafka.connector.source.epochs import LeaderEpochEnds
from sparkafka.connector.source.offsets import SourceOffset
from sparkafka.connector.source.options import SourceOptions, _format_partitions
from sparkafka.connector.source.ranges import count_new_offsets, rate_limit
from sparkafka.connector.source.resolver import OffsetResolver

logger = logging.getLogger(__name__)


# -- step 1: partitions ------------------------------------------------------------------------------


class PartitionDiscovery:
    """The partitions to read, looked for again on every call (no ``partitionDiscoveryIntervalMs``,
    as Spark's source), once the interval has passed, or only on first use (an interval <= 0)."""

    def __init__(self, interval_ms: int | None) -> None:
        self._interval_ms = interval_ms
        self._known: list[TopicPartitionKey] | None = None
        self._discovered_at = 0.0

    def partitions(
        self, resolver: OffsetResolver, *, require_topics: bool, force: bool = False
    ) -> list[TopicPartitionKey]:
        interval_ms = self._interval_ms
        now = time.monotonic()
        known = self._known
        stale = interval_ms is None or (interval_ms > 0 and now - self._discovered_at >= interval_ms / 1000)
        if known is None or force or require_topics or stale:
            known = self._known = resolver.partitions(require_topics=require_topics)
            self._discovered_at = now
        return known


# -- step 3: the log under the positions -------------------------------------------------------------


@dataclasses.dataclass
class LogFindings:
    """What :meth:`LogCheck.check` found, by partition."""

    truncated: dict[TopicPartitionKey, int] = dataclasses.field(default_factory=dict)
    recreated: set[TopicPartitionKey] = dataclasses.field(default_factory=set)
    unchecked: set[TopicPartitionKey] = dataclasses.field(default_factory=set)

    @property
    def any(self) -> bool:
        return bool(self.truncated or self.recreated or self.unchecked)


@functools.cache
def _note_no_leader_epochs_once() -> None:
    logger.info(
        "the checkpoint's offsets carry no leader epochs (written by an earlier sparkafka, or Spark's "
        "kafka format): a log truncated below them is seen only when its end falls below them; the "
        "next micro-batch records them"
    )


class LogCheck:
    """Finds positions whose log went back under them since they were recorded, as Kafka's
    consumers validate a position (KIP-320). Remembers positions found intact, so that asking
    again under the same epochs costs nothing."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        # Where leader epochs end now, asked only where a partition's epoch changed.
        self.epoch_ends: LeaderEpochEnds | None = None
        self._intact: set[tuple[TopicPartitionKey, int, int, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "epoch_ends": None}

    def _epoch_ends(self) -> LeaderEpochEnds:
        if self.epoch_ends is None:
            self.epoch_ends = LeaderEpochEnds(
                self._options.client_config, timeout_s=self._options.api_timeout_ms / 1000
            )
        return self.epoch_ends

    def check(
        self,
        resolver: OffsetResolver,
        positions: PartitionOffsets,
        recorded: Mapping[TopicPartitionKey, int],
        current: Mapping[TopicPartitionKey, int],
        recorded_ids: Mapping[str, tuple[int, int]],
        *,
        note_missing: bool = True,
    ) -> LogFindings:
        """Partitions whose log went back under their position since it was recorded.

        Steps:
        1. Only a partition whose leader epoch changed since the position was recorded can have
           been truncated under it (a leader change): the others cost no request, and neither does
           a position found intact already under the same epochs.
        2. Ask the current leaders where the recorded epoch ends now; a partition its leader does
           not answer in time stays unchecked (the caller holds it where it is).
        3. An end below the position: the records from that end to the position are gone and new
           ones take their offsets. Where the topic's id changed since (both known), the topic was
           deleted and created again instead. An epoch the log does not know (-1) is left to the
           check of the latest offset against the position."""
        found = LogFindings()
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
        ends = self._epoch_ends().ends(asked) if asked else None
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
            described = resolver.admin
            described.topic_partitions(sorted({topic for topic, _ in below}))
            for tp, at in below.items():
                was, now = recorded_ids.get(tp[0]), described.known_topic_ids.get(tp[0])
                if was is not None and now is not None and was != now:
                    found.recreated.add(tp)
                else:
                    found.truncated[tp] = at
        return found


def truncation(tp: TopicPartitionKey, at: int, position: int) -> str:
    return (
        f"topic '{tp[0]}' partition {tp[1]}: the log was truncated below the query's position: offsets "
        f"{at} to {position - 1}, which the query had planned or read, are gone, and records written since "
        "take those offsets (an unclean leader election: the partition's leader epoch changed and the "
        f"epoch the position was recorded in now ends at {at}). Reading on from {at} reads the records "
        "written since the election"
    )


def recreated(tp: TopicPartitionKey, position: int) -> str:
    return (
        f"topic '{tp[0]}' partition {tp[1]}: the topic was deleted and created again (its id changed) "
        f"while the query was at offset {position}: what it had not read of the old topic is gone, and "
        "the new topic is read from its earliest offset"
    )


class TransactionHolds:
    """Starting offsets an open transaction holds back (read_committed), logged once per hold."""

    def __init__(self) -> None:
        self._holding: frozenset[TopicPartitionKey] = frozenset()

    @staticmethod
    def may_hold(start: SourceOffset) -> set[TopicPartitionKey]:
        """Starting offsets may wait for an open transaction: all of them while the start is the
        query's initial one, then those a batch carried forward still unread (its held starts)."""
        if start.initial:
            return set(start.positions)
        return {tp for tp, offset in start.held_starts.items() if start.positions.get(tp) == offset}

    def held_back(
        self,
        resolver: OffsetResolver,
        start: PartitionOffsets,
        latest: PartitionOffsets,
        may_hold: set[TopicPartitionKey],
    ) -> set[TopicPartitionKey]:
        """Partitions of the query's starting offsets past their last stable offset but not past
        their high watermark.

        With read_committed the latest offset is the last stable offset, which an open transaction
        holds below records already written. A starting offset there (a group's offsets committed by
        a read_uncommitted consumer, explicit offsets) is not data loss: those partitions wait until
        the transaction ends. Any later start was reached by this query reading read_committed, and
        the last stable offset never moves back: below it, the log went back (topic recreated, log
        truncated), even if a new open transaction has written past the start since."""
        below_start = [
            tp for tp, begin in start.items() if tp in may_hold and tp in latest and latest[tp] < begin
        ]
        if not below_start or not resolver.options.read_committed:
            self._holding = frozenset()
            return set()
        high_watermarks = resolver.high_watermarks(below_start)
        held = frozenset(tp for tp in below_start if high_watermarks.get(tp, -1) >= start[tp])
        if held and held != self._holding:
            logger.info(
                "open transactions hold the last stable offset of %s below the starting offsets; "
                "waiting for them to end",
                _format_partitions(sorted(held)),
            )
        self._holding = held
        return set(held)


# -- steps 4 and 5: the end of each partition --------------------------------------------------------


@dataclasses.dataclass
class Reconciled:
    """Each known partition's end (:func:`reconcile`), and the partitions whose log starts anew."""

    end: PartitionOffsets
    # Partitions whose log went back (topic recreated): read again from their earliest offset.
    reset: list[TopicPartitionKey]


def report_gone(
    options: SourceOptions, start: SourceOffset, latest: PartitionOffsets
) -> list[TopicPartitionKey]:
    """Step 4's first check: partitions of ``start`` the cluster no longer has are data loss (fail,
    or go on without them). Returns them."""
    gone = sorted(tp for tp in start.positions if tp not in latest)
    if gone:
        report_data_loss(
            options,
            f"partitions {_format_partitions(gone)} are gone (topic deleted or no longer selected by the "
            "subscription) with records possibly not yet read",
            resume_at=0,
        )
    return gone


def reconcile(
    options: SourceOptions,
    start: SourceOffset,
    latest: PartitionOffsets,
    epochs: dict[TopicPartitionKey, int],
    findings: LogFindings,
    held_back: set[TopicPartitionKey],
    target: PartitionOffsets | None,
) -> Reconciled:
    """Step 4: the end of every partition of ``start`` the cluster still has (:func:`report_gone`
    reported the others), from its latest offset, capped by the AvailableNow ``target``.
    Partitions truncated or recreated are data loss: fail (``failOnDataLoss``), or go on where the
    log now has records. A partition held back (by an open transaction, or an unanswered epoch
    check) stays where it is; an unchecked one keeps its recorded epoch in ``epochs``. Asks the
    cluster nothing."""
    positions = start.positions
    end: PartitionOffsets = {}
    reset: list[TopicPartitionKey] = []
    for tp, begin in positions.items():
        if tp not in latest:
            continue
        if tp in findings.unchecked:
            # Not read past until its leader answers: the position keeps its recorded epoch.
            end[tp], epochs[tp] = begin, start.leader_epochs[tp]
        elif tp in findings.truncated:
            # Empty range this batch (end < start); the next batch reads on from the truncation.
            at = findings.truncated[tp]
            end[tp] = report_data_loss(options, truncation(tp, at, begin), resume_at=at)
        elif tp in findings.recreated:
            report_data_loss(options, recreated(tp, begin), resume_at=0)
            reset.append(tp)
        elif tp in held_back:
            end[tp] = begin
        elif latest[tp] < begin:
            report_data_loss(
                options,
                f"topic '{tp[0]}' partition {tp[1]}: the latest offset went back from {begin} to "
                f"{latest[tp]} (topic deleted and recreated, or the log was truncated)",
                resume_at=0,
            )
            reset.append(tp)
        else:
            ceiling = target.get(tp, begin) if target is not None else latest[tp]
            end[tp] = max(begin, min(latest[tp], ceiling))
    return Reconciled(end, reset)


def place_new_partitions(
    options: SourceOptions,
    reconciled: Reconciled,
    discovered: Sequence[TopicPartitionKey],
    earliest: PartitionOffsets,
    target: PartitionOffsets | None,
) -> None:
    """Step 5, into ``reconciled.end``: reset partitions start again at their earliest offset
    (an empty range this batch, end < start; the next batch reads the new log from its start), and
    partitions discovered since ``start`` enter at their earliest offset, read from the next batch
    on, so that planning the batch never has to ask the cluster where they begin. A new partition
    starting above 0 has lost records: data loss."""
    end = reconciled.end
    for tp in reconciled.reset:
        end[tp] = earliest.get(tp, 0)
    for tp in discovered:
        if tp not in earliest:
            continue
        first = earliest[tp]
        if first != 0:
            first = report_data_loss(
                options,
                f"added partition {tp[0]}-{tp[1]} starts from offset {first} instead of 0",
                resume_at=first,
            )
        end[tp] = min(first, target[tp]) if target is not None else first
        logger.info("discovered partition %s-%d; reading it from offset %d", tp[0], tp[1], end[tp])


# -- step 6: read limits -----------------------------------------------------------------------------


class AdmissionControl:
    """Spark's admission control: ``minOffsetsPerTrigger`` holds a batch back until enough new
    offsets exist or ``maxTriggerDelay`` has passed since the last batch; ``maxOffsetsPerTrigger``
    then caps it."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._last_trigger_at: float | None = None

    def apply(
        self,
        start: PartitionOffsets,
        end: PartitionOffsets,
        limit: ReadLimit,
        *,
        may_wait: bool,
        available_now: bool,
    ) -> PartitionOffsets:
        """``end`` capped, or ``start`` while the batch waits. AvailableNow never waits: nothing new
        comes."""
        options = self._options
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else options.min_offsets_per_trigger
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else options.max_offsets_per_trigger
        if min_rows is not None and not available_now:
            now = time.monotonic()
            waited_ms = math.inf if self._last_trigger_at is None else (now - self._last_trigger_at) * 1000
            enough = count_new_offsets(start, end) >= min_rows
            if may_wait and not enough and waited_ms < options.max_trigger_delay_ms:
                return dict(start)
            self._last_trigger_at = now
        if max_rows is not None:
            end = rate_limit(max_rows, start, end)
        return end


# -- step 7: idle heartbeats -------------------------------------------------------------------------


class IdleClock:
    """When the input was last seen active, the latest offsets seen then, when the last heartbeat
    was planned, and whether the idle period was logged (monotonic clock)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._active_at: float | None = None
        self._latest_when_active: PartitionOffsets | None = None
        self._heartbeat_planned_at: float | None = None
        self._idle_reported = False

    def heartbeat_due(
        self,
        resolver: OffsetResolver,
        start: PartitionOffsets,
        end: PartitionOffsets,
        latest: PartitionOffsets,
        partitions: Sequence[TopicPartitionKey],
        *,
        available_now: bool,
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
        interval_ms = self._options.idle_heartbeat_interval_ms
        if interval_ms is None or available_now:
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
        if self._options.read_committed and partitions:
            high_watermarks = resolver.high_watermarks(partitions)
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
