"""A group coordinator's answers to a member after its join, as Kafka's classic coordinator gives them:
SyncGroup (the leader's assignment, handed to every member of the generation), Heartbeat (a
member's session kept, a rebalance announced) and LeaveGroup (members leaving, by id or by their
static instance id, KIP-345).

:class:`GroupSync` is a part of :class:`~sparkafka.broker.groups.GroupCoordinator`, whose groups,
rebalances and journal it works on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.group_metadata import (
    NOT_JOURNALED,
    UNKNOWN_MEMBER_ID,
    GroupMetadata,
    GroupState,
    LeftMember,
    Member,
    SyncGroupResult,
    resolve,
    sync_error,
)

_LOG = logging.getLogger("sparkafka.broker.groups")


class GroupSync:
    """SyncGroup, Heartbeat and LeaveGroup (mixed into GroupCoordinator)."""

    if TYPE_CHECKING:  # what the coordinator this is a part of holds and does
        _now_ms: Callable[[], int]
        _groups: dict[str, GroupMetadata]
        _shut_down: bool

        def _set_heartbeat_deadline(self, member: Member, timeout_ms: int) -> None: ...
        def _try_complete_join(self, group: GroupMetadata) -> None: ...
        def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None: ...
        def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None: ...
        def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None: ...
        def _remove_member_and_update_group(
            self, group: GroupMetadata, member: Member, reason: str
        ) -> None: ...
        def _journal_group_metadata(self, group: GroupMetadata) -> bool: ...
        def _require_running(self, operation: str) -> None: ...
        @staticmethod
        def _new_sync_waiter() -> asyncio.Future[SyncGroupResult]: ...

    async def sync_group(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: list[tuple[str, bytes]],
    ) -> SyncGroupResult:
        """Handle SyncGroup; followers wait until the leader's SyncGroup delivers the assignment.

        Validation order (Kafka's validateSyncGroup): COORDINATOR_NOT_AVAILABLE (shut down),
        INVALID_GROUP_ID (empty id), UNKNOWN_MEMBER_ID (unknown group), FENCED_INSTANCE_ID /
        UNKNOWN_MEMBER_ID (membership), ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL (protocol type or
        name given, as by SyncGroup v5+, and different from the group's).  Then by state: Empty ->
        UNKNOWN_MEMBER_ID, PreparingRebalance -> REBALANCE_IN_PROGRESS, CompletingRebalance -> park; the
        leader's assignments (members it left out get b"") are handed to every parked member and the group
        becomes Stable; Stable -> the member's current assignment at once.
        """
        outcome = self._handle_sync(
            group_id=group_id,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignments=assignments,
        )
        if isinstance(outcome, SyncGroupResult):
            return outcome
        return await outcome

    def _handle_sync(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: list[tuple[str, bytes]],
    ) -> SyncGroupResult | asyncio.Future[SyncGroupResult]:
        if self._shut_down:
            return sync_error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return sync_error(ErrorCode.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return sync_error(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.DEAD:
            return sync_error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return sync_error(error)
        if generation_id != group.generation_id:
            return sync_error(ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return sync_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)

        member = group.members[member_id]
        if group.state is GroupState.EMPTY:
            return sync_error(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.PREPARING_REBALANCE:
            return sync_error(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state is GroupState.STABLE:
            self._mark_synced(group, member_id)
            self._set_heartbeat_deadline(member, member.session_timeout_ms)
            return SyncGroupResult(
                ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
            )

        # CompletingRebalance
        waiter = self._new_sync_waiter()
        # Kafka silently replaces the callback of a duplicate SyncGroup; answer the superseded one.
        resolve(member.sync_waiter, sync_error(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_waiter = waiter
        self._mark_synced(group, member_id)
        if group.is_leader(member_id):
            self._apply_leader_assignment(group, assignments)
        return waiter

    def _apply_leader_assignment(self, group: GroupMetadata, assignments: list[tuple[str, bytes]]) -> None:
        by_member = dict(assignments)
        unknown = sorted(set(by_member) - set(group.members))
        if unknown:
            _LOG.warning(
                "group %r generation %d: leader assigned to unknown members %s; ignoring those assignments",
                group.group_id,
                group.generation_id,
                unknown,
            )
        missing = sorted(set(group.members) - set(by_member))
        if missing:
            _LOG.warning(
                "group %r generation %d: leader sent no assignment for members %s; they get an empty one",
                group.group_id,
                group.generation_id,
                missing,
            )
        for member in group.members.values():
            member.assignment = by_member.get(member.member_id, b"")
        if not self._journal_group_metadata(group):
            # As Kafka when the group's record cannot be appended: nobody gets an assignment that a
            # restart would not restore; every member learns why, and the group rebalances.
            self._reset_and_propagate_assignment_error(group, NOT_JOURNALED)
            self._maybe_prepare_rebalance(group, "the assignment could not be journaled")
            return
        _LOG.info(
            "group %r: assignment received from leader %r for generation %d",
            group.group_id,
            group.leader_id,
            group.generation_id,
        )
        self._propagate_assignment(group, ErrorCode.NONE)
        group.transition_to(GroupState.STABLE, self._now_ms())

    def _mark_synced(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            group.sync_deadline_ms = None

    def heartbeat(
        self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        """Handle Heartbeat: restart the member's session timer and report the group's situation.

        Errors: COORDINATOR_NOT_AVAILABLE (shut down), INVALID_GROUP_ID, UNKNOWN_MEMBER_ID (unknown group
        or member, or Empty group), FENCED_INSTANCE_ID, ILLEGAL_GENERATION, and REBALANCE_IN_PROGRESS while
        the group is PreparingRebalance (the member must rejoin).  CompletingRebalance answers NONE, since
        members may heartbeat between their JoinGroup and SyncGroup.
        """
        if self._shut_down:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        self._set_heartbeat_deadline(member, member.session_timeout_ms)
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(
        self, *, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[LeftMember]]:
        """Handle LeaveGroup (v3+ batch form; wrap v0-v2's single member id as [(member_id, None)]).

        Returns (top-level error, per-member results).  Each member is identified by member id, or by
        group.instance.id alone (member id "") for administrative removal of a static member.  Removing a
        member of a settled group triggers a rebalance; during PreparingRebalance it may complete the join.
        """
        if self._shut_down:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [LeftMember(m, i, ErrorCode.UNKNOWN_MEMBER_ID) for m, i in members]
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        results: list[LeftMember] = []
        for member_id, group_instance_id in members:
            results.append(
                LeftMember(member_id, group_instance_id, self._leave_one(group, member_id, group_instance_id))
            )
        return ErrorCode.NONE, results

    def _leave_one(self, group: GroupMetadata, member_id: str, group_instance_id: str | None) -> ErrorCode:
        if member_id == UNKNOWN_MEMBER_ID:
            current = group.static_members.get(group_instance_id) if group_instance_id is not None else None
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            member_id = current
        elif member_id in group.pending_join_members:
            del group.pending_join_members[member_id]
            _LOG.info("group %r: pending member %r left", group.group_id, member_id)
            if group.state is GroupState.PREPARING_REBALANCE:
                self._try_complete_join(group)
            return ErrorCode.NONE
        else:
            error = group.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
        _LOG.info("group %r: member %r left through LeaveGroup", group.group_id, member_id)
        self._remove_member_and_update_group(group, group.members[member_id], f"member {member_id} left")
        return ErrorCode.NONE
