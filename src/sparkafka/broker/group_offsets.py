"""A group coordinator's committed offsets, as Kafka's GroupMetadataManager keeps them: OffsetCommit
checked against the member and generation and journaled before it is answered, OffsetFetch,
OffsetDelete (refused while the group subscribes to the topic), transactional offsets staged by
TxnOffsetCommit and made current or dropped by the transaction's outcome, offsets of deleted
partitions forgotten, and retention.

:class:`GroupOffsets` is a part of :class:`~sparkafka.broker.groups.GroupCoordinator`, whose groups
and journal it works on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.group_metadata import (
    CONSUMER_PROTOCOL_TYPE,
    NO_COMMITTED_OFFSET,
    NO_LEADER_EPOCH,
    NO_OFFSET,
    NOT_JOURNALED,
    UNKNOWN_MEMBER_ID,
    CommittedOffset,
    FetchedOffset,
    GroupConfig,
    GroupMetadata,
    GroupState,
    Member,
    OffsetToCommit,
    TopicPartition,
    offset_rows,
)

_LOG = logging.getLogger("sparkafka.broker.groups")


class GroupOffsets:
    """The committed-offsets half of the group coordinator (mixed into GroupCoordinator)."""

    if TYPE_CHECKING:  # what the coordinator this is a part of holds and does
        _config: GroupConfig
        _now_ms: Callable[[], int]
        _groups: dict[str, GroupMetadata]
        _next_sequence: int
        _shut_down: bool

        def _append(self, entry: dict[str, Any]) -> bool: ...
        def _maybe_compact(self) -> None: ...
        def _require_running(self, operation: str) -> None: ...
        def _create_group(self, group_id: str) -> GroupMetadata: ...
        def _delete_group(self, group: GroupMetadata, reason: str) -> ErrorCode: ...
        def _set_heartbeat_deadline(self, member: Member, timeout_ms: int) -> None: ...

    def on_partitions_deleted(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget every group's committed and pending transactional offsets of deleted partitions, as
        Kafka's GroupCoordinator.onPartitionsDeleted does: a topic created again under the same name
        starts empty, and a group reading it must not resume at an offset of the old topic (it would
        skip the new records below it). A group left Empty without offsets is deleted by the next
        expiry round, as in Kafka 4. A group whose removal cannot be journaled keeps the offsets
        (logged)."""
        deleted = set(partitions)
        for group in list(self._groups.values()):
            affected = sorted(
                {tp for tp in group.offsets if tp in deleted}
                | {tp for pending in group.pending_txn_offsets.values() for tp in pending if tp in deleted}
            )
            if not affected or not self._forget_offsets(group, affected):
                continue
            _LOG.info(
                "group %r: removed the offsets of %d deleted partition(s)", group.group_id, len(affected)
            )
            # An Empty group left without offsets goes with the next expiry round, as in Kafka 4
            # (onTopicsDeleted writes only the offsets' tombstones).
        self._maybe_compact()

    def delete_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]]
    ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, ErrorCode]]]]]:
        """Handle OffsetDelete as Kafka 4's OffsetMetadataManager.deleteOffsets.

        1. An empty group id is INVALID_GROUP_ID; an unknown or dead group GROUP_ID_NOT_FOUND; a
           group with members that does not use the consumer protocol NON_EMPTY_GROUP (top level).
        2. Each partition of a topic the group subscribes to is GROUP_SUBSCRIBED_TO_TOPIC (a
           consumer group whose subscriptions cannot be read counts as subscribed to every topic).
        3. The committed and pending transactional offsets of every other partition named are
           removed, journaled first (``offsets_deleted``); a partition without any is answered
           without error too. The group stays, even with no offsets left."""
        if self._shut_down:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, []
        consumer_protocol = group.protocol_type == CONSUMER_PROTOCOL_TYPE
        if group.state is not GroupState.EMPTY and not consumer_protocol:
            return ErrorCode.NON_EMPTY_GROUP, []
        answers: list[tuple[str, list[tuple[int, ErrorCode]]]] = []
        doomed: list[TopicPartition] = []
        for topic, partitions in topics:
            subscribed = (
                topic in group.subscribed_topics if group.subscribed_topics is not None else consumer_protocol
            )
            error = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if subscribed else ErrorCode.NONE
            answers.append((topic, [(partition, error) for partition in partitions]))
            if not subscribed:
                doomed += [
                    (topic, p)
                    for p in partitions
                    if (topic, p) in group.offsets or group.has_pending_txn_offset((topic, p))
                ]
        if doomed:
            if not self._forget_offsets(group, doomed):
                return NOT_JOURNALED, []
            _LOG.info("group %r: deleted the offsets of %d partition(s) on request", group_id, len(doomed))
            self._maybe_compact()
        return ErrorCode.NONE, answers

    def _forget_offsets(self, group: GroupMetadata, partitions: list[TopicPartition]) -> bool:
        """Journal (``offsets_deleted``), then drop, the group's committed and pending transactional
        offsets of ``partitions``; False, with nothing dropped, if the journal refused the entry."""
        entry = {
            "type": "offsets_deleted",
            "group": group.group_id,
            "partitions": [list(tp) for tp in partitions],
        }
        if not self._append(entry):
            return False
        self._drop_offsets(group, partitions)
        return True

    @staticmethod
    def _drop_offsets(group: GroupMetadata, partitions: Iterable[TopicPartition]) -> None:
        for partition in partitions:
            group.offsets.pop(partition, None)
            for pending in group.pending_txn_offsets.values():
                pending.pop(partition, None)

    # ======================================================================================================
    # Offsets
    # ======================================================================================================

    def commit_offsets(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: dict[TopicPartition, OffsetToCommit],
        retention_time_ms: int = -1,
    ) -> dict[TopicPartition, ErrorCode]:
        """Handle OffsetCommit; returns an error per partition (the same error for all on a group-level
        failure).  The offsets are journaled before this returns.  `retention_time_ms` other than -1
        (OffsetCommit v2-v4) makes them expire that long after now, as Kafka's expireTimestampMs.

        Rules (Kafka's validateOffsetCommit): an unknown group is created for generation < 0 (a "simple"
        commit by a consumer using assign() or by an admin tool) and refused with ILLEGAL_GENERATION
        otherwise.  Generation < 0 is accepted while the group is Empty; once it has members, commits must
        come from a member (UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID) of the current generation
        (ILLEGAL_GENERATION), and are refused with REBALANCE_IN_PROGRESS during CompletingRebalance.
        Metadata longer than max_offset_metadata_bytes gets OFFSET_METADATA_TOO_LARGE for that partition.
        The handler must already have answered UNKNOWN_TOPIC_OR_PARTITION for partitions that do not exist.
        The empty group id is valid for OffsetCommit, as in Kafka.
        """
        if self._shut_down:
            return dict.fromkeys(offsets, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return dict.fromkeys(offsets, ErrorCode.ILLEGAL_GENERATION)
            _LOG.info("group %r: created by an offset commit without group management", group_id)
            group = self._create_group(group_id)
        error = self._validate_offset_commit(
            group, generation_id, member_id, group_instance_id, transactional=False
        )
        if error is not None:
            return dict.fromkeys(offsets, error)
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            # A commit proves the member is alive (during PreparingRebalance it learns of the rebalance
            # from its next heartbeat).
            member = group.members[member_id]
            self._set_heartbeat_deadline(member, member.session_timeout_ms)
        expire_timestamp_ms = None if retention_time_ms == -1 else self._now_ms() + retention_time_ms
        return self._store_offsets(group, offsets, producer_id=None, expire_timestamp_ms=expire_timestamp_ms)

    def _validate_offset_commit(
        self,
        group: GroupMetadata,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        transactional: bool,
    ) -> ErrorCode | None:
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return None
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif not transactional:
            # Anonymous commits are only allowed while nobody owns the group's partitions.  TxnOffsetCommit
            # before v3 carries no member information, so it is exempt.
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not transactional and group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return None

    def _store_offsets(
        self,
        group: GroupMetadata,
        offsets: dict[TopicPartition, OffsetToCommit],
        *,
        producer_id: int | None,
        expire_timestamp_ms: int | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        now = self._now_ms()
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        sequence = self._next_sequence
        for partition, (offset, leader_epoch, metadata) in offsets.items():
            text = metadata if metadata is not None else ""
            if len(text) > self._config.max_offset_metadata_bytes:
                results[partition] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[partition] = CommittedOffset(
                    offset, leader_epoch, text, now, sequence, expire_timestamp_ms
                )
                results[partition] = ErrorCode.NONE
        if not accepted:
            return results
        entry: dict[str, Any]
        if producer_id is None:
            entry = {"type": "offsets_committed", "group": group.group_id, "offsets": offset_rows(accepted)}
        else:
            entry = {
                "type": "txn_offsets_staged",
                "group": group.group_id,
                "producer_id": producer_id,
                "offsets": offset_rows(accepted),
            }
        if not self._append(entry):
            for partition in accepted:
                results[partition] = NOT_JOURNALED
            return results
        self._next_sequence += 1
        group.journaled = True
        if producer_id is None:
            group.offsets.update(accepted)
        else:
            group.pending_txn_offsets.setdefault(producer_id, {}).update(accepted)
        self._maybe_compact()
        return results

    def fetch_offsets(
        self,
        group_id: str,
        partitions: list[TopicPartition] | None,
        *,
        require_stable: bool,
    ) -> dict[TopicPartition, FetchedOffset]:
        """Handle OffsetFetch for one group: (offset, leader_epoch, metadata, error) per partition.

        `partitions` None means every partition with a committed offset.  A partition without one gets
        (-1, -1, "", NONE).  With `require_stable` (KIP-447, OffsetFetch v7+) a partition with a pending
        transactional offset gets (-1, -1, "", UNSTABLE_OFFSET_COMMIT) so the consumer retries after the
        transaction completes.  Offsets are returned whatever the group's state, since groups may use
        Kafka only to store offsets.  Raises BrokerError(COORDINATOR_NOT_AVAILABLE) after shutdown (a
        group-level error in the response).
        """
        self._require_running("OffsetFetch")
        group = self._groups.get(group_id)
        if group is None:
            return dict.fromkeys(partitions or [], NO_COMMITTED_OFFSET)
        wanted = list(group.offsets) if partitions is None else partitions
        results: dict[TopicPartition, FetchedOffset] = {}
        for partition in wanted:
            if require_stable and group.has_pending_txn_offset(partition):
                results[partition] = FetchedOffset(
                    NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.UNSTABLE_OFFSET_COMMIT
                )
                continue
            committed = group.offsets.get(partition)
            if committed is None:
                results[partition] = NO_COMMITTED_OFFSET
            else:
                results[partition] = FetchedOffset(
                    committed.offset, committed.leader_epoch, committed.metadata, ErrorCode.NONE
                )
        return results

    # -- transactional offsets ----------------------------------------------------------------------------

    def validate_txn_offset_commit_member(
        self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        """KIP-447 fencing of TxnOffsetCommit v3+ (Kafka's validateOffsetCommit for transactions).

        NONE when generation < 0 and the group is Empty or unknown, or when no member information is
        given at all (generation -1, member id "", no instance id: pre-v3 requests); otherwise the member
        must belong to the group (UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID) at the same generation
        (ILLEGAL_GENERATION).  Call it and stage_transactional_offsets without awaiting in between, so that
        no rebalance can slip in.
        """
        if self._shut_down:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            # Kafka creates an Empty group here; an Empty group only accepts generation < 0.
            return ErrorCode.NONE if generation_id < 0 else ErrorCode.UNKNOWN_MEMBER_ID
        error = self._validate_offset_commit(
            group, generation_id, member_id, group_instance_id, transactional=True
        )
        return error if error is not None else ErrorCode.NONE

    def stage_transactional_offsets(
        self,
        *,
        group_id: str,
        producer_id: int,
        offsets: dict[TopicPartition, OffsetToCommit],
    ) -> dict[TopicPartition, ErrorCode]:
        """Record TxnOffsetCommit offsets as pending for `producer_id`: journaled, invisible to
        fetch_offsets (and reported as UNSTABLE_OFFSET_COMMIT to require_stable fetches) until
        complete_transaction.  The caller (transaction coordinator) has validated the producer and, for
        v3+, called validate_txn_offset_commit_member.  Creates the group if needed, as Kafka does.
        Returns an error per partition: NONE, OFFSET_METADATA_TOO_LARGE, INVALID_GROUP_ID (empty group
        id), COORDINATOR_NOT_AVAILABLE (shut down) or NOT_COORDINATOR (journal failure)."""
        if self._shut_down:
            return dict.fromkeys(offsets, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return dict.fromkeys(offsets, ErrorCode.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            group = self._create_group(group_id)
        return self._store_offsets(group, offsets, producer_id=producer_id)

    def complete_transaction(self, *, group_id: str, producer_id: int, commit: bool) -> None:
        """Apply a transaction's outcome to `producer_id`'s pending offsets in `group_id`.

        Commit: each pending offset becomes the committed one unless a newer plain commit for that
        partition was made after it was staged (as Kafka compares log positions).  Abort: they are
        discarded.  The outcome is journaled first, so a restart after this returns sees the same
        result; a restart before it finds the offsets still pending.  No pending offsets: no-op.
        Raises BrokerError(COORDINATOR_NOT_AVAILABLE) if shut down or the journal write fails (state
        unchanged; retry).
        """
        self._require_running("transaction completion")
        group = self._groups.get(group_id)
        if group is None or producer_id not in group.pending_txn_offsets:
            _LOG.debug("group %r: no pending offsets of producer %d to complete", group_id, producer_id)
            return
        entry = {
            "type": "txn_offsets_completed",
            "group": group_id,
            "producer_id": producer_id,
            "committed": commit,
        }
        if not self._append(entry):
            raise BrokerError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"could not journal the {'commit' if commit else 'abort'} of producer {producer_id}'s "
                f"offsets in group {group_id!r}",
            )
        self._apply_txn_completion(group, producer_id, commit)
        self._maybe_compact()

    def pending_transaction_groups(self, producer_id: int) -> list[str]:
        """Groups holding pending transactional offsets of `producer_id` (e.g. for recovery after restart)."""
        return [g.group_id for g in self._groups.values() if producer_id in g.pending_txn_offsets]

    @staticmethod
    def _apply_txn_completion(group: GroupMetadata, producer_id: int, commit: bool) -> None:
        pending = group.pending_txn_offsets.pop(producer_id, {})
        if not commit:
            return
        for partition, staged in pending.items():
            current = group.offsets.get(partition)
            if current is None or current.sequence < staged.sequence:
                group.offsets[partition] = staged

    # ======================================================================================================
    # Timers, expiry, shutdown
    # ======================================================================================================

    def _expire_offsets(self, now: int) -> None:
        for group in list(self._groups.values()):
            expired = group.expired_offsets(now, self._config.offsets_retention_ms)
            if expired:
                entry = {
                    "type": "offsets_expired",
                    "group": group.group_id,
                    "partitions": [list(tp) for tp in expired],
                }
                if not self._append(entry):
                    continue  # try again at the next check
                for partition in expired:
                    del group.offsets[partition]
                _LOG.info("group %r: expired %d committed offsets", group.group_id, len(expired))
            if group.state is GroupState.EMPTY and not group.has_offsets():
                self._delete_group(group, "empty group without offsets")
        self._maybe_compact()
