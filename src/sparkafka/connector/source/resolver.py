"""Driver-side questions to the cluster, in the terms of the source's options: partitions,
starting and ending offsets, and data loss."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence

from sparkafka.connector.kafka_admin import (
    KafkaAdmin,
    PartitionOffsets,
    TopicPartitionKey,
)
from sparkafka.connector.source.data_loss import report_data_loss
from sparkafka.connector.source.options import (
    ASSIGN,
    EARLIEST_SENTINEL,
    LATEST_SENTINEL,
    STARTING_TIMESTAMP_STRATEGY,
    SUBSCRIBE,
    OffsetBoundary,
    SourceOptions,
    Subscribe,
    SubscribePattern,
    _format_partitions,
)
from sparkafka.errors import (
    SparkafkaOptionError,
    TopicNotFoundError,
)

logger = logging.getLogger(__name__)


class OffsetResolver:
    """Driver-side questions to the cluster, in the terms of the source's options."""

    def __init__(self, options: SourceOptions, admin: KafkaAdmin) -> None:
        self.options = options
        self.admin = admin

    def partitions(self, *, require_topics: bool) -> list[TopicPartitionKey]:
        """The topic partitions the strategy selects right now, sorted.

        With ``require_topics`` a topic named by ``subscribe`` or ``assign`` that does not exist is
        an error (a typo should not silently read nothing); otherwise its partitions are just absent
        and the caller treats them as gone."""
        strategy = self.options.strategy
        if isinstance(strategy, SubscribePattern):
            topics = self.admin.topic_partitions()
            pattern = re.compile(strategy.pattern)
            return sorted(
                (topic, partition)
                for topic, partitions in topics.items()
                if pattern.search(topic)
                for partition in partitions
            )
        # Named topics are asked for by name, as Spark's source does; only a pattern needs them all.
        if isinstance(strategy, Subscribe):
            wanted_topics: Sequence[str] = strategy.topics
            topics = self.admin.topic_partitions(wanted_topics)
            if require_topics:
                self._require_topics(wanted_topics, topics, SUBSCRIBE)
            return sorted(
                (topic, partition) for topic in wanted_topics for partition in topics.get(topic, ())
            )
        wanted = strategy.partitions
        topics = self.admin.topic_partitions({topic for topic, _ in wanted})
        if require_topics:
            self._require_topics(sorted({topic for topic, _ in wanted}), topics, ASSIGN)
            missing = [(t, p) for t, p in wanted if p not in topics[t]]
            if missing:
                raise TopicNotFoundError(
                    f"option 'assign' names partitions that do not exist: {_format_partitions(missing)} "
                    f"(topic '{missing[0][0]}' has {len(topics[missing[0][0]])} partitions)"
                )
        return sorted(tp for tp in wanted if tp[1] in topics.get(tp[0], ()))

    def _require_topics(self, wanted: Sequence[str], existing: Mapping[str, list[int]], option: str) -> None:
        missing = [topic for topic in wanted if topic not in existing]
        if missing:
            names = ", ".join(f"'{topic}'" for topic in missing)
            raise TopicNotFoundError(
                f"topic {names} named by option '{option}' does not exist on the Kafka cluster at "
                f"'{self.options.bootstrap_servers}'" + ("" if len(missing) == 1 else " (none of them do)")
            )

    def latest(
        self, partitions: Sequence[TopicPartitionKey], epochs: dict[TopicPartitionKey, int] | None = None
    ) -> PartitionOffsets:
        return self.admin.latest_offsets(
            partitions, read_committed=self.options.read_committed, epochs=epochs
        )

    def high_watermarks(self, partitions: Sequence[TopicPartitionKey]) -> PartitionOffsets:
        """End offsets past any open transaction, whatever the isolation level: what :meth:`latest`
        gives with read_committed falls short of them while a transaction is open."""
        return self.admin.latest_offsets(partitions, read_committed=False)

    def resolve(
        self,
        boundary: OffsetBoundary,
        partitions: Sequence[TopicPartitionKey],
        *,
        starting: bool,
        latest_snapshot: Mapping[TopicPartitionKey, int] | None = None,
    ) -> PartitionOffsets:
        """Concrete offsets for every partition in ``partitions``.

        Steps: ask the cluster for what the boundary refers to (log start, last stable offset,
        group commits, offsets of timestamps); fill sentinels (-2/-1) and fallbacks; check that
        explicitly requested offsets still exist and are not past the end (data loss otherwise)."""
        wanted = list(partitions)
        if boundary.kind in ("offsets", "timestamps"):
            named = set(boundary.offsets)
            if named != set(wanted):
                raise SparkafkaOptionError(
                    f"If {boundary.option} contains specific offsets, you must specify all TopicPartitions.\n"
                    "Use -1 for latest, -2 for earliest.\n"
                    f"Specified: {_format_partitions(list(named))} Assigned: {_format_partitions(wanted)}"
                )

        known = _LazyOffsets(self, wanted, latest_snapshot)
        if boundary.kind == "earliest":
            resolved = known.earliest()
        elif boundary.kind == "latest":
            resolved = known.latest()
        elif boundary.kind == "group":
            resolved = self._group_offsets(wanted, known.earliest, known.latest)
        elif boundary.kind == "offsets":
            resolved = self._explicit_offsets(boundary, known, starting)
        else:
            resolved = self._timestamp_offsets(boundary, wanted, known, starting)
        missing = [tp for tp in wanted if tp not in resolved]
        if missing:
            raise TopicNotFoundError(
                f"partitions {_format_partitions(missing)} disappeared while resolving {boundary.option}"
            )
        return {tp: resolved[tp] for tp in wanted}

    def _explicit_offsets(
        self, boundary: OffsetBoundary, known: _LazyOffsets, starting: bool
    ) -> PartitionOffsets:
        """Offsets given as numbers, -2 (earliest) or -1 (latest), each checked against the log."""
        resolved = {}
        for tp, offset in boundary.offsets.items():
            if offset == EARLIEST_SENTINEL:
                resolved[tp] = known.earliest()[tp]
            elif offset == LATEST_SENTINEL:
                resolved[tp] = known.latest()[tp]
            else:
                resolved[tp] = self._checked_offset(
                    boundary, tp, offset, known.earliest()[tp], known.latest()[tp], starting
                )
        return resolved

    def _timestamp_offsets(
        self,
        boundary: OffsetBoundary,
        wanted: Sequence[TopicPartitionKey],
        known: _LazyOffsets,
        starting: bool,
    ) -> PartitionOffsets:
        """The first offset at or after each timestamp; where no record is that late, the latest
        offset, or (a start with ``startingOffsetsByTimestampStrategy=error``) an error."""
        timestamps = (
            boundary.offsets
            if boundary.kind == "timestamps"
            else dict.fromkeys(wanted, boundary.timestamp or 0)
        )
        found = self.admin.offsets_for_timestamps(timestamps, read_committed=self.options.read_committed)
        resolved = {}
        for tp in wanted:
            match = found.get(tp)
            if match is not None:
                resolved[tp] = match
                continue
            if starting and self.options.timestamp_strategy == "error":
                raise SparkafkaOptionError(
                    "No offset matched from request of topic-partition "
                    f"{tp[0]}-{tp[1]} and timestamp {timestamps[tp]} ({boundary.option}): "
                    "no record has a timestamp at or after it. "
                    f"Set {STARTING_TIMESTAMP_STRATEGY}=latest to start at the latest offset instead."
                )
            resolved[tp] = known.latest()[tp]
        return resolved

    def _group_offsets(
        self,
        partitions: list[TopicPartitionKey],
        earliest: Callable[[], PartitionOffsets],
        latest: Callable[[], PartitionOffsets],
    ) -> PartitionOffsets:
        group_id = self.options.group_id
        assert group_id is not None, "validated by SourceOptions.parse"
        # As a read_committed Kafka consumer (KIP-447): offsets an open transaction is about to
        # commit are waited for, so the query does not start before them and read twice.
        committed = self.admin.committed_offsets(
            group_id, partitions, require_stable=self.options.read_committed
        )
        uncommitted = [tp for tp in partitions if tp not in committed]
        fallback = self.options.group_offsets_fallback
        if uncommitted and fallback == "none":
            raise SparkafkaOptionError(
                f"consumer group '{group_id}' has no committed offset for {_format_partitions(uncommitted)} "
                "and groupOffsetsFallback=none; set groupOffsetsFallback to earliest or latest to start "
                "those partitions there"
            )
        if uncommitted:
            logger.info(
                "consumer group %r has no committed offset for %s; starting them at %s",
                group_id,
                _format_partitions(uncommitted),
                fallback,
            )
        resolved = dict(committed)
        for tp in uncommitted:
            resolved[tp] = (earliest() if fallback == "earliest" else latest())[tp]
        log_start = earliest()
        for tp in committed:
            if committed[tp] < log_start[tp]:
                resolved[tp] = report_data_loss(
                    self.options,
                    f"consumer group '{group_id}' committed offset {committed[tp]} for topic '{tp[0]}' "
                    f"partition {tp[1]}, but the earliest available offset is {log_start[tp]}",
                    resume_at=log_start[tp],
                )
        return resolved

    def _checked_offset(
        self,
        boundary: OffsetBoundary,
        tp: TopicPartitionKey,
        offset: int,
        log_start: int,
        log_end: int,
        starting: bool,
    ) -> int:
        if offset > log_end:
            latest = "last stable offset" if self.options.read_committed else "latest offset"
            if not starting:
                raise SparkafkaOptionError(
                    f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} is {offset}, beyond the "
                    f"{latest} {log_end}"
                )
            # As Spark's source, a start past the end is data loss (the log went back), not a
            # mistake in the option; but with read_committed an open transaction can hold the last
            # stable offset below records that exist: the query waits for them there.
            if self.options.read_committed and offset <= self.high_watermarks([tp]).get(tp, -1):
                return offset
            return report_data_loss(
                self.options,
                f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} is {offset}, beyond the {latest} "
                f"{log_end}",
                resume_at=log_end,
            )
        if starting and offset < log_start:
            return report_data_loss(
                self.options,
                f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} was {offset} but the earliest "
                f"available offset is {log_start}",
                resume_at=log_start,
            )
        return offset


class _LazyOffsets:
    """The earliest and latest offsets of the wanted partitions, each asked at most once per
    resolution, and only when needed; latest from ``snapshot`` when one is given."""

    def __init__(
        self,
        resolver: OffsetResolver,
        wanted: Sequence[TopicPartitionKey],
        snapshot: Mapping[TopicPartitionKey, int] | None,
    ) -> None:
        self._resolver = resolver
        self._wanted = wanted
        self._snapshot = snapshot
        self._earliest: PartitionOffsets | None = None
        self._latest: PartitionOffsets | None = None

    def earliest(self) -> PartitionOffsets:
        if self._earliest is None:
            self._earliest = self._resolver.admin.earliest_offsets(self._wanted)
        return self._earliest

    def latest(self) -> PartitionOffsets:
        if self._latest is None:
            snapshot = self._snapshot
            self._latest = dict(snapshot) if snapshot is not None else self._resolver.latest(self._wanted)
        return self._latest
