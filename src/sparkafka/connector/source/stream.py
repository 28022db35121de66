"""``spark.readStream``: the micro-batch stream, planned on the driver from the checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

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
from sparkafka.connector.source.data_loss import report_data_loss
from sparkafka.connector.source.heartbeat import (
    HeartbeatPartition,
    heartbeat_batch,
    heartbeat_partition,
    next_heartbeat_ms,
)
from sparkafka.connector.source.offsets import (
    SourceOffset,
    decode_offsets,
    encode_offsets,
)
from sparkafka.connector.source.options import (
    LATEST,
    LATEST_SENTINEL,
    OffsetBoundary,
    SourceOptions,
    _format_partitions,
)
from sparkafka.connector.source.planning import (
    AdmissionControl,
    IdleClock,
    LogCheck,
    PartitionDiscovery,
    TransactionHolds,
    place_new_partitions,
    reconcile,
    recreated,
    report_gone,
    truncation,
)
from sparkafka.connector.source.ranges import (
    LEGACY_CALCULATOR,
    offset_ranges,
    split_offset_ranges,
)
from sparkafka.connector.source.reader import read_offset_range
from sparkafka.connector.source.resolver import OffsetResolver
from sparkafka.errors import KafkaUnavailableError, SparkafkaError

logger = logging.getLogger(__name__)


def _resolves_the_same_later(boundary: OffsetBoundary) -> bool:
    """Whether ``boundary`` resolves to the same offsets whenever it is resolved: a partition's
    earliest offset moves only when retention deletes records, which no reader can read anyway."""
    if boundary.kind == "earliest":
        return True
    return boundary.kind == "offsets" and LATEST_SENTINEL not in boundary.offsets.values()


def _first_batch_planned_elsewhere(end: SourceOffset, starting: OffsetBoundary) -> str:
    """Why a first micro-batch that another source planned cannot be replayed (see partitions)."""
    return (
        f"the first micro-batch of this checkpoint, ending at {encode_offsets(end.positions)}, was "
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
        self.options: Final = options
        self._admin: KafkaAdmin | None = None
        # Spark asks for the initial offset more than once; resolving it twice could differ.
        self._initial: PartitionOffsets | None = None
        # Trigger.AvailableNow: latest offsets when the query started; never read past them.
        self._available_now_target: PartitionOffsets | None = None
        self._latest: PartitionOffsets | None = None
        self._published: PartitionOffsets | None = None
        # The end offset this process planned last: partitions() checks any other one (a replay).
        self._planned_end: dict[str, dict[str, int]] | None = None
        # What the planning steps keep between triggers (sparkafka.connector.source.planning).
        # Each object is the step's own and keeps its state; the reader never replaces one.
        self.discovery: Final = PartitionDiscovery(options.partition_discovery_interval_ms)
        self.log_check: Final = LogCheck(options)
        self.holds: Final = TransactionHolds()
        self.admission: Final = AdmissionControl(options)
        self.idle: Final = IdleClock(options)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None
        return state

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
            return SourceOffset({}, unresolved_start=True).encode()
        return SourceOffset(self._starting_offsets(), initial=True).encode()

    def _starting_offsets(self) -> PartitionOffsets:
        """``startingOffsets`` (default latest) resolved against the cluster, once per reader."""
        if self._initial is None:
            partitions = self.discovery.partitions(self.resolver, require_topics=True)
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
        partitions = self.discovery.partitions(self.resolver, require_topics=False, force=True)
        self._available_now_target = self.resolver.latest(partitions)
        logger.info("Trigger.AvailableNow reads up to %s", encode_offsets(self._available_now_target))

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """End offsets of the next micro-batch, or ``start`` itself when there is nothing to do.

        Steps (each one of :mod:`sparkafka.connector.source.planning`):
        0. From :data:`UNRESOLVED_START` (a new query's first micro-batch): the resolved starting
           offsets only, an empty batch that fixes the start in the checkpoint. Otherwise publish
           ``start`` to the consumer group (``commitOffsetsOnBatch``): its batch is complete.
        1. The partitions to consider: re-discovered every micro-batch (or every
           ``partitionDiscoveryIntervalMs``); under AvailableNow exactly those of the target
           recorded at prepare time.
        2. Latest offsets (the last stable offset with read_committed), with their leader epochs.
        3. Positions whose log went back under them (leader epochs, KIP-320), and starting offsets
           an open transaction holds back (read_committed: not data loss, they wait).
        4. Each known partition's end: its latest offset, capped by the AvailableNow target; gone,
           truncated or recreated partitions are data loss (fail, or go on where records are left).
        5. New partitions enter ``end`` at their earliest offset and are read from the next batch
           on, so that ``partitions(start, end)`` never has to ask the cluster where they begin.
        6. Unless the engine asks for everything: wait for ``minOffsetsPerTrigger`` (at most
           ``maxTriggerDelay``; never under AvailableNow) and cap at ``maxOffsetsPerTrigger``.
        7. Idle heartbeat (``idleHeartbeatIntervalMs``): carry ``start``'s heartbeat entry forward, or
           replace it by a new one when the idle clock says so. Steps 1-6 never see it.
        8. The end with the entries a replay plans from (:class:`SourceOffset`); ``start`` if unchanged.
        """
        begin = SourceOffset.decode(start)
        if begin.unresolved_start:
            # The batch is empty, and stays empty when replayed whatever startingOffsets says then.
            resolved = self._starting_offsets()
            return SourceOffset(resolved, initial=True, first_batch_start=resolved).encode()
        self._publish_progress(begin.positions)
        resolver = self.resolver
        target = self._available_now_target
        partitions = self._partitions_to_plan(begin)
        epochs: dict[TopicPartitionKey, int] = {}
        latest = resolver.latest(partitions, epochs)
        self._latest = latest
        end, held_back, changed = self._ends(begin, latest, epochs)
        if not isinstance(limit, ReadAllAvailable):
            # A changed set of partitions is never delayed: the warnings would repeat every trigger
            # until the batch runs.
            end = self.admission.apply(
                begin.positions, end, limit, may_wait=not changed, available_now=target is not None
            )
        heartbeat_ms = begin.heartbeat_ms
        if self.idle.heartbeat_due(
            resolver, begin.positions, end, latest, partitions, available_now=target is not None
        ):
            heartbeat_ms = next_heartbeat_ms(heartbeat_ms, int(time.time() * 1000))
        if end == begin.positions and heartbeat_ms == begin.heartbeat_ms:
            return start  # nothing new: the engine compares the JSON text, own entries included
        planned = SourceOffset(
            end,
            heartbeat_ms=heartbeat_ms,
            first_batch_start=begin.positions if begin.initial else None,
            held_starts={tp: begin.positions[tp] for tp in held_back},
            leader_epochs={tp: epoch for tp, epoch in epochs.items() if tp in end},
            topic_ids=resolver.admin.known_topic_ids,
            split=self.options.split,
        ).encode()
        self._planned_end = planned
        return planned

    def _ends(
        self, begin: SourceOffset, latest: PartitionOffsets, epochs: dict[TopicPartitionKey, int]
    ) -> tuple[PartitionOffsets, set[TopicPartitionKey], bool]:
        """Steps 3-5 of :meth:`latestOffset`: every partition's end, the starting offsets held back
        by open transactions, and whether the set of partitions changed (gone, reset, discovered,
        or a log found gone back or unchecked)."""
        resolver, target = self.resolver, self._available_now_target
        findings = self.log_check.check(
            resolver,
            begin.positions,
            begin.leader_epochs,
            epochs,
            begin.topic_ids,
            note_missing=not begin.initial,
        )
        gone = report_gone(self.options, begin, latest)
        held_back = self.holds.held_back(resolver, begin.positions, latest, TransactionHolds.may_hold(begin))
        reconciled = reconcile(self.options, begin, latest, epochs, findings, held_back, target)
        discovered = [tp for tp in latest if tp not in begin.positions]
        wanted = discovered + reconciled.reset
        earliest = resolver.admin.earliest_offsets(wanted) if wanted else {}
        place_new_partitions(self.options, reconciled, discovered, earliest, target)
        changed = bool(gone or reconciled.reset or discovered or findings.any)
        return reconciled.end, held_back, changed

    def _partitions_to_plan(self, start: SourceOffset) -> list[TopicPartitionKey]:
        """Step 1 of :meth:`latestOffset`."""
        target = self._available_now_target
        if target is None:
            return self.discovery.partitions(self.resolver, require_topics=False)
        # A partition of start missing from the target appeared between prepare and the initial
        # offsets: it is not gone, it just has nothing to read under AvailableNow.
        return sorted(set(target) | set(start.positions))

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return encode_offsets(self._latest) if self._latest else None

    # -- planning and reading --

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> Sequence[InputPartition]:
        """The offset ranges between ``start`` and ``end`` and, when ``end`` carries a new idle
        heartbeat, one :class:`HeartbeatPartition`. Depends only on the two offsets (invariant 1):
        the split options the batch was planned with are recorded in ``end`` and win over the
        current ones, which apply from the next batch on."""
        # Decoded once, up front: an entry that does not parse fails here, naming the offset.
        begin, finish = SourceOffset.decode(start), SourceOffset.decode(end)
        # A first micro-batch replayed after a crash gets a start resolved anew, which may differ
        # (retention moved the earliest offset); its checkpointed end knows the start it had.
        if finish.first_batch_start is None and begin.unresolved_start and not finish.initial:
            raise SparkafkaError(_first_batch_planned_elsewhere(finish, self.options.starting or LATEST))
        if finish.first_batch_start is None and begin.initial and finish.split is None:
            logger.warning(
                "the first micro-batch, ending at %s, was planned by another source (Spark's kafka format?): "
                "it is read from the start sparkafka resolves now from startingOffsets (%s), which is where "
                "that source began it only if startingOffsets is unchanged",
                encode_offsets(finish.positions),
                encode_offsets(begin.positions),
            )
        # Offsets checkpointed before the split was recorded were split by the first calculator.
        split = finish.split or dataclasses.replace(self.options.split, calculator=LEGACY_CALCULATOR)
        if split != self.options.split:
            logger.info(
                "planning the micro-batch ending at %s with the split it was first planned with (%s); "
                "the current options (%s) apply from the next micro-batch",
                encode_offsets(finish.positions),
                split.encode(),
                self.options.split.encode(),
            )
        ends = finish.positions
        if end != self._planned_end:  # a replay: its input may have been truncated since
            ends = self._intact_part(ends, finish.leader_epochs, finish.topic_ids)
        ranges: list[InputPartition] = list(
            split_offset_ranges(
                offset_ranges(
                    begin.positions if finish.first_batch_start is None else finish.first_batch_start, ends
                ),
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
        planned (:meth:`LogCheck.check` against the latest leader epochs): failOnDataLoss fails the
        batch, otherwise it reads what is left and the next batch reads on from the truncation."""
        if not recorded:
            return ends
        current: dict[TopicPartitionKey, int] = {}
        self.resolver.latest(sorted(recorded), current)
        check = self.log_check.check(self.resolver, ends, recorded, current, recorded_ids)
        if check.unchecked:
            raise KafkaUnavailableError(
                f"the leaders of {_format_partitions(sorted(check.unchecked))} did not say within "
                f"{self.options.api_timeout_ms} ms (kafka.default.api.timeout.ms) whether the log under "
                "this replayed micro-batch was truncated since it was planned; it is not read unchecked. "
                "The query stops; restart it once the cluster answers"
            )
        intact = dict(ends)
        for tp, at in check.truncated.items():
            intact[tp] = report_data_loss(self.options, truncation(tp, at, ends[tp]), resume_at=at)
        for tp in check.recreated:
            report_data_loss(self.options, recreated(tp, ends[tp]), resume_at=0)
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
