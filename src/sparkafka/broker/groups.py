"""The classic consumer-group coordinator: group membership (JoinGroup/SyncGroup/Heartbeat/LeaveGroup)
and committed offsets (OffsetCommit/OffsetFetch, transactional offsets), with Apache Kafka's semantics.

The behaviour follows Kafka's classic group coordinator (``kafka.coordinator.group.GroupCoordinator``
and ``GroupMetadata`` in 3.x, ``org.apache.kafka.coordinator.group.classic`` in 4.x), including
KIP-345 static membership, KIP-394 (member id required on JoinGroup v4+), KIP-447 (fencing of
transactional offset commits and UNSTABLE_OFFSET_COMMIT) and KIP-98 transactional offsets.

Group state machine (same states and transitions as Kafka)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance --leader sync--> Stable
      ^                 ^    |                                        |                                 |
      |                 |    +--no members left--> Empty              +--join/leave/expiry--------------+
      |                 +-------------------------------------------------(back to PreparingRebalance)
    Dead: a deleted or expired group (removed from the coordinator right away)

Threading: every method runs on the broker's single asyncio event-loop thread, so no locks are used;
JoinGroup and SyncGroup park the request on an ``asyncio.Future`` until the rebalance step completes.

SyncGroup, Heartbeat and LeaveGroup: :mod:`.group_sync`. Timers (session and rebalance deadlines, one
wake-up for the earliest): :mod:`.group_sessions`.
Listing, describing and deleting groups: :mod:`.group_admin`. Offsets: :mod:`.group_offsets`. What is
journaled, and how a restart restores the groups: :mod:`.group_journal`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.group_admin import GroupAdmin
from sparkafka.broker.group_journal import GroupJournal
from sparkafka.broker.group_metadata import (
    NO_LEADER,
    NOT_JOURNALED,
    UNKNOWN_MEMBER_ID,
    GroupConfig,
    GroupMetadata,
    GroupState,
    JoinGroupResult,
    JoinRequest,
    Member,
    SyncGroupResult,
    join_error,
    resolve,
    sync_error,
    wall_clock_ms,
)
from sparkafka.broker.group_offsets import GroupOffsets
from sparkafka.broker.group_sessions import GroupSessions
from sparkafka.broker.group_sync import GroupSync
from sparkafka.broker.journal import Journal

_LOG = logging.getLogger(__name__)

# -- the coordinator ---------------------------------------------------------------------------------------


class GroupCoordinator(GroupOffsets, GroupJournal, GroupSessions, GroupAdmin, GroupSync):
    """Classic group coordinator of the embedded broker (see the module docstring for the model)."""

    def __init__(
        self,
        journal: Journal,
        config: GroupConfig,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._journal = journal
        self._config = config
        self._now_ms = now_ms
        self._groups: dict[str, GroupMetadata] = {}
        self._next_sequence = 0
        self._shut_down = False
        self._wakeup_handle: asyncio.TimerHandle | None = None
        self._wakeup_loop: asyncio.AbstractEventLoop | None = None
        self._wakeup_at_ms: int | None = None
        self._replay_journal()
        self._next_offset_expiry_check_ms = self._now_ms() + config.offsets_retention_check_interval_ms

    # ======================================================================================================
    # JoinGroup
    # ======================================================================================================

    async def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        supports_skip_assignment: bool = False,
    ) -> JoinGroupResult:
        """Handle JoinGroup; returns when the member's rebalance round completes (or at once on errors).

        Steps (Kafka's handleJoinGroup):
          1. Reject a shut-down coordinator, an empty group id and a session timeout outside
             [min_session_timeout_ms, max_session_timeout_ms].
          2. Unknown group: created (Empty) for a member without id; a member with an id gets
             UNKNOWN_MEMBER_ID.
          3. Enforce max_group_size (GROUP_MAX_SIZE_REACHED), then INCONSISTENT_GROUP_PROTOCOL unless
             the protocol type matches and one protocol is supported by every member.
          4. Member without id: a static member (group_instance_id) takes over its instance's place or is
             added; a dynamic member gets MEMBER_ID_REQUIRED and a fresh id "{client_id}-{uuid4}" if
             `require_known_member_id` (JoinGroup v4+, KIP-394), else it is added.
          5. Member with id: a pending id (from MEMBER_ID_REQUIRED) is added; others are validated
             (FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID) and, depending on the state, join a rebalance or get
             the current generation back at once (follower with unchanged metadata).
          6. A member that joins a rebalance parks until the join phase completes: when every known member
             has rejoined, or when the rebalance timeout expires (dynamic members that did not rejoin are
             removed).  A group's first rebalance from Empty waits initial_rebalance_delay_ms, extended
             while new members keep arriving, up to the rebalance timeout (Kafka's InitialDelayedJoin).
        `supports_skip_assignment` is True for JoinGroup v9+ (KIP-814: a restarted static leader of a
        Stable group is told it leads but must not reassign).
        """
        request = JoinRequest(
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocols=list(protocols),
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            client_id=client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
            supports_skip_assignment=supports_skip_assignment,
        )
        outcome = self._handle_join(group_id, member_id, request)
        if isinstance(outcome, JoinGroupResult):
            return outcome
        return await outcome

    def _handle_join(
        self, group_id: str, member_id: str, request: JoinRequest
    ) -> JoinGroupResult | asyncio.Future[JoinGroupResult]:
        if self._shut_down:
            return join_error(member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return join_error(member_id, ErrorCode.INVALID_GROUP_ID)
        config = self._config
        if not config.min_session_timeout_ms <= request.session_timeout_ms <= config.max_session_timeout_ms:
            return join_error(member_id, ErrorCode.INVALID_SESSION_TIMEOUT)

        is_unknown_member = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(group_id)
        if group is None:
            if not is_unknown_member:
                return join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
            group = self._create_group(group_id)
            # Kafka 4 records a group created by JoinGroup at once, empty, so that it exists after a
            # restart; if that fails, the group is dropped and the join refused.
            if not self._journal_group_metadata(group):
                del self._groups[group_id]
                return join_error(member_id, NOT_JOURNALED)

        result: JoinGroupResult | asyncio.Future[JoinGroupResult]
        if not self._accept_joining_member(group, member_id):
            # Kafka removes the member and answers, nothing more: the join phase completes on its
            # timer or with the next join or leave, not because this member is gone.
            self._remove_member_quietly(group, member_id)
            return join_error(UNKNOWN_MEMBER_ID, ErrorCode.GROUP_MAX_SIZE_REACHED)
        if group.state is GroupState.DEAD:
            result = join_error(member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        elif not group.supports_protocols(request.protocol_type, request.protocol_names()):
            result = join_error(member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        elif is_unknown_member:
            result = self._join_new_member(group, request)
        else:
            result = self._join_current_member(group, member_id, request)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)
        return result

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        """Kafka's acceptJoiningMember: members already parked in this rebalance, or members of a settled
        generation, are always accepted; anyone else only below max_group_size."""
        limit = self._config.max_group_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.state is GroupState.PREPARING_REBALANCE:
            member = group.members.get(member_id)
            already_parked = member is not None and member.join_waiter is not None
            return already_parked or group.num_awaiting_join() < limit
        return member_id in group.members or len(group.members) < limit

    def _join_new_member(
        self, group: GroupMetadata, request: JoinRequest
    ) -> JoinGroupResult | asyncio.Future[JoinGroupResult]:
        instance_id = request.group_instance_id
        new_member_id = f"{instance_id if instance_id is not None else request.client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            waiter = self._new_join_waiter()
            old_member_id = group.static_members.get(instance_id)
            if old_member_id is None:
                self._add_member_and_rebalance(group, new_member_id, request, waiter)
            else:
                _LOG.info(
                    "group %r: static member %r rejoins without member id in state %s; replacing %r with %r",
                    group.group_id,
                    instance_id,
                    group.state.value,
                    old_member_id,
                    new_member_id,
                )
                self._update_static_member_and_rebalance(group, old_member_id, new_member_id, request, waiter)
            return waiter
        if request.require_known_member_id:
            # KIP-394: the member must come back with this id, so that a client whose JoinGroup response
            # is lost cannot leave an orphan member behind; the id expires after one session timeout.
            deadline = self._now_ms() + request.session_timeout_ms
            group.pending_join_members[new_member_id] = deadline
            self._schedule_wakeup(deadline)
            return join_error(new_member_id, ErrorCode.MEMBER_ID_REQUIRED)
        waiter = self._new_join_waiter()
        self._add_member_and_rebalance(group, new_member_id, request, waiter)
        return waiter

    def _join_current_member(
        self, group: GroupMetadata, member_id: str, request: JoinRequest
    ) -> JoinGroupResult | asyncio.Future[JoinGroupResult]:
        if member_id in group.pending_join_members:
            if request.group_instance_id is not None:
                # Ids from MEMBER_ID_REQUIRED are only handed to dynamic members (Kafka throws here).
                _LOG.warning(
                    "group %r: JoinGroup with pending member id %r also carries group.instance.id %r",
                    group.group_id,
                    member_id,
                    request.group_instance_id,
                )
                return join_error(member_id, ErrorCode.UNKNOWN_SERVER_ERROR)
            waiter = self._new_join_waiter()
            self._add_member_and_rebalance(group, member_id, request, waiter)
            return waiter

        error = group.validate_member(member_id, request.group_instance_id)
        if error is not None:
            return join_error(member_id, error)
        member = group.members[member_id]
        unchanged = member.protocols == request.protocols
        if group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            # The member lost its JoinGroup response; hand the same generation back.
            return group.join_result(member_id)
        if group.state is GroupState.STABLE and unchanged and not group.is_leader(member_id):
            # A follower with unchanged metadata just learns the current generation and syncs again.
            return group.join_result(member_id)
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            _LOG.warning(
                "group %r: member %r rejoins in unexpected state %s",
                group.group_id,
                member_id,
                group.state.value,
            )
            return join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        # PreparingRebalance, changed metadata, or the leader rejoining a Stable group (the leader's way
        # to ask for a rebalance, e.g. after a topic metadata change): join the (next) rebalance.
        waiter = self._new_join_waiter()
        group.update_member(member, request, waiter)
        self._maybe_prepare_rebalance(group, f"member {member_id} joining in state {group.state.value}")
        return waiter

    def _add_member_and_rebalance(
        self,
        group: GroupMetadata,
        member_id: str,
        request: JoinRequest,
        waiter: asyncio.Future[JoinGroupResult],
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            is_new=True,
        )
        # A rebalance that started from Empty (the delayed initial join, at any generation) is
        # stretched by newly arriving members (Kafka 4: previousState() == EMPTY).
        if group.state is GroupState.PREPARING_REBALANCE and group.initial_join is not None:
            group.new_member_added = True
        group.add(member, waiter)
        # A parked new member cannot heartbeat and a disconnect goes unnoticed while it is parked, so it
        # gets a bounded wait instead of its session timeout; it is expected to retry if still alive.
        self._set_heartbeat_deadline(member, self._config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(
            group, f"adding new member {member_id} with group.instance.id {request.group_instance_id}"
        )

    def _update_static_member_and_rebalance(
        self,
        group: GroupMetadata,
        old_member_id: str,
        new_member_id: str,
        request: JoinRequest,
        waiter: asyncio.Future[JoinGroupResult],
    ) -> None:
        instance_id = request.group_instance_id
        assert instance_id is not None
        previous_leader = group.leader_id or NO_LEADER
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self._set_heartbeat_deadline(member, member.session_timeout_ms)
        previous = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(member, request, waiter)
        if group.state is GroupState.STABLE:
            if group.select_protocol() != group.protocol_name:
                self._maybe_prepare_rebalance(
                    group, f"static member {instance_id} rejoined with a protocol change"
                )
                return
            if not self._journal_group_metadata(group):
                # Kafka reverts to the old member id when the new one cannot be stored: a restart
                # must not bring back an id the group no longer knows.
                member.join_waiter = None
                member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms = previous
                restored = group.replace_static_member(instance_id, new_member_id, old_member_id)
                self._set_heartbeat_deadline(restored, restored.session_timeout_ms)
                resolve(
                    waiter,
                    JoinGroupResult(
                        NOT_JOURNALED,
                        group.generation_id,
                        group.protocol_type,
                        group.protocol_name,
                        previous_leader,
                        UNKNOWN_MEMBER_ID,
                    ),
                )
                return
            # KIP-345: a restarted static member takes its old place without a rebalance.
            is_leader = group.is_leader(new_member_id)
            if request.supports_skip_assignment:
                result = JoinGroupResult(
                    ErrorCode.NONE,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    group.leader_id or NO_LEADER,
                    new_member_id,
                    group.join_members_for(new_member_id),
                    skip_assignment=is_leader,
                )
            else:
                # Before JoinGroup v9, answering with the *old* leader id keeps a returning leader from
                # computing an assignment that a Stable group would never distribute.
                result = JoinGroupResult(
                    ErrorCode.NONE,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    previous_leader,
                    new_member_id,
                )
            member.join_waiter = None
            resolve(waiter, result)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id; start over so the new id gets one.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        elif group.state is not GroupState.PREPARING_REBALANCE:
            raise RuntimeError(
                f"group {group.group_id!r}: static member {instance_id!r} exists in state {group.state.value}"
            )

    # -- rebalance machinery -------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        """Enter PreparingRebalance: cancel a pending SyncGroup round and start the delayed join."""
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        group.pending_sync_members.clear()
        group.sync_deadline_ms = None
        now = self._now_ms()
        if group.state is GroupState.EMPTY:
            delay = self._config.initial_rebalance_delay_ms
            group.initial_join = (delay, max(group.rebalance_timeout_ms() - delay, 0))
            group.join_deadline_ms = now + delay
        else:
            group.initial_join = None
            group.join_deadline_ms = now + group.rebalance_timeout_ms()
        _LOG.info(
            "group %r: preparing to rebalance in state %s with old generation %d (reason: %s)",
            group.group_id,
            group.state.value,
            group.generation_id,
            reason,
        )
        group.transition_to(GroupState.PREPARING_REBALANCE, now)
        self._schedule_wakeup(group.join_deadline_ms)
        self._try_complete_join(group)

    def _try_complete_join(self, group: GroupMetadata) -> None:
        # The initial delayed join never completes early: it exists to collect more members.
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.join_deadline_ms is not None
            and group.initial_join is None
            and group.has_all_members_joined()
        ):
            self._complete_join_phase(group)

    def _on_join_deadline(self, group: GroupMetadata) -> None:
        group.join_deadline_ms = None
        if group.initial_join is not None:
            delay, remaining = group.initial_join
            if group.new_member_added and remaining != 0:
                # Kafka's InitialDelayedJoin: someone new arrived during the delay, so wait once more,
                # never beyond the rebalance timeout in total.
                group.new_member_added = False
                next_delay = min(self._config.initial_rebalance_delay_ms, remaining)
                group.initial_join = (next_delay, max(remaining - delay, 0))
                group.join_deadline_ms = self._now_ms() + next_delay
                self._schedule_wakeup(group.join_deadline_ms)
                return
        self._complete_join_phase(group)

    def _complete_join_phase(self, group: GroupMetadata) -> None:
        """Kafka's onCompleteJoin.

        Steps: drop dynamic members that did not rejoin; keep or re-elect a leader among those that did
        (if nobody rejoined but static members remain, wait another rebalance timeout); start the next
        generation (protocol chosen by vote); if members remain, answer every parked JoinGroup (the
        leader gets all members' metadata), restart their session timers and give them the rebalance
        timeout to send SyncGroup.
        """
        group.join_deadline_ms = None
        group.initial_join = None
        for member in group.not_yet_rejoined():
            if member.group_instance_id is None:
                _LOG.info(
                    "group %r: removing member %r, which did not rejoin", group.group_id, member.member_id
                )
                self._remove_member_quietly(group, member.member_id)
        if group.state is GroupState.DEAD:
            return
        now = self._now_ms()
        if not group.maybe_elect_new_joined_leader() and group.members:
            _LOG.error(
                "group %r: could not complete the rebalance because no member rejoined; waiting again",
                group.group_id,
            )
            # At least 1 ms so that a zero rebalance timeout cannot make expire_sessions loop forever.
            group.join_deadline_ms = now + max(group.rebalance_timeout_ms(), 1)
            self._schedule_wakeup(group.join_deadline_ms)
            return
        group.init_next_generation(now)
        if group.state is GroupState.EMPTY:
            _LOG.info("group %r: generation %d is empty", group.group_id, group.generation_id)
            # A generation with members is journaled with its assignment, at the leader's SyncGroup.
            # This write only keeps the generation and the Empty time; Kafka likewise only warns when
            # it fails, since a restart would restore an older generation that has no live members.
            self._journal_group_metadata(group)
            return
        _LOG.info(
            "group %r: generation %d formed with %d members, protocol %r, leader %r",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )
        for member in group.members.values():
            waiter, member.join_waiter = member.join_waiter, None
            resolve(waiter, group.join_result(member.member_id))
            self._set_heartbeat_deadline(member, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        group.sync_deadline_ms = now + group.rebalance_timeout_ms()
        self._schedule_wakeup(group.sync_deadline_ms)

    def _on_sync_deadline(self, group: GroupMetadata) -> None:
        """Remove members that got a JoinGroup response but never sent SyncGroup (Kafka's DelayedSync)."""
        group.sync_deadline_ms = None
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if not group.pending_sync_members:
            return
        missing = sorted(group.pending_sync_members)
        for member_id in missing:
            self._remove_member_quietly(group, member_id)
        self._prepare_rebalance(
            group, f"members {missing} did not send SyncGroup within the rebalance timeout"
        )

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            if error is ErrorCode.NONE:
                result = SyncGroupResult(error, group.protocol_type, group.protocol_name, member.assignment)
            else:
                result = sync_error(error)
            waiter, member.sync_waiter = member.sync_waiter, None
            if resolve(waiter, result):
                # The member could not heartbeat while parked, so its session starts over now.
                self._set_heartbeat_deadline(member, member.session_timeout_ms)

    def _remove_member_and_update_group(self, group: GroupMetadata, member: Member, reason: str) -> None:
        resolve(member.join_waiter, join_error(UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID))
        member.join_waiter = None
        # Kafka leaves a removed member's parked SyncGroup unanswered; answer it instead of hanging.
        resolve(member.sync_waiter, sync_error(ErrorCode.UNKNOWN_MEMBER_ID))
        member.sync_waiter = None
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _remove_member_quietly(self, group: GroupMetadata, member_id: str) -> None:
        """Remove without triggering a rebalance (the caller is already driving one)."""
        member = group.remove(member_id)
        if member is not None:
            # Nothing should be parked here, but never leave a request hanging.
            resolve(member.join_waiter, join_error(UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID))
            resolve(member.sync_waiter, sync_error(ErrorCode.UNKNOWN_MEMBER_ID))
            member.join_waiter = member.sync_waiter = None

    def shutdown(self) -> None:
        """Stop: answer every parked JoinGroup/SyncGroup with NOT_COORDINATOR (what Kafka answers when it
        unloads a group, making clients look the coordinator up again), refuse further requests with
        COORDINATOR_NOT_AVAILABLE, and close the journal.  Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._wakeup_handle is not None:
            self._wakeup_handle.cancel()
            self._wakeup_handle = None
        for group in self._groups.values():
            for member in group.members.values():
                resolve(member.join_waiter, join_error(member.member_id, ErrorCode.NOT_COORDINATOR))
                resolve(member.sync_waiter, sync_error(ErrorCode.NOT_COORDINATOR))
                member.join_waiter = member.sync_waiter = None
        self._journal.close()

    # ======================================================================================================
    # Journal
    # ======================================================================================================

    def _create_group(self, group_id: str) -> GroupMetadata:
        group = GroupMetadata(group_id, self._now_ms())
        self._groups[group_id] = group
        return group

    def _require_running(self, operation: str) -> None:
        if self._shut_down:
            raise BrokerError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{operation}: the group coordinator is shut down"
            )

    @staticmethod
    def _new_join_waiter() -> asyncio.Future[JoinGroupResult]:
        return asyncio.get_running_loop().create_future()

    @staticmethod
    def _new_sync_waiter() -> asyncio.Future[SyncGroupResult]:
        return asyncio.get_running_loop().create_future()
