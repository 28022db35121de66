"""A group coordinator's timers, as Kafka's classic coordinator keeps them in its purgatories: members'
sessions, pending members' deadlines, a rebalance's delayed join and its SyncGroup deadline, and the
periodic offset-retention check.

Timers: each member's session deadline, each pending (MEMBER_ID_REQUIRED) member's deadline, the
delayed join of a rebalance (including Kafka's InitialDelayedJoin for a group's first rebalance),
the deadline for members to send SyncGroup after a join, and the periodic offset-retention check are
plain deadlines in ``now_ms`` milliseconds.  :meth:`GroupSessions.expire_sessions` fires every
deadline that has passed, oldest first.  The coordinator arms a single ``loop.call_later`` wake-up for
the earliest deadline whenever it has a running event loop, so the server does not *need* to call
``expire_sessions``; calling it periodically anyway is harmless, and tests with a fake clock call it
after advancing the clock.

:class:`GroupSessions` is a part of :class:`~sparkafka.broker.groups.GroupCoordinator`, whose groups
it works on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkafka.broker.group_metadata import GroupConfig, GroupMetadata, GroupState, Member

_LOG = logging.getLogger("sparkafka.broker.groups")


class GroupSessions:
    """The timers of the group coordinator (mixed into GroupCoordinator)."""

    if TYPE_CHECKING:  # what the coordinator this is a part of holds and does
        _config: GroupConfig
        _now_ms: Callable[[], int]
        _groups: dict[str, GroupMetadata]
        _shut_down: bool
        _next_offset_expiry_check_ms: int
        _wakeup_handle: asyncio.TimerHandle | None
        _wakeup_loop: asyncio.AbstractEventLoop | None
        _wakeup_at_ms: int | None

        def _expire_offsets(self, now: int) -> None: ...
        def _try_complete_join(self, group: GroupMetadata) -> None: ...
        def _on_join_deadline(self, group: GroupMetadata) -> None: ...
        def _on_sync_deadline(self, group: GroupMetadata) -> None: ...
        def _remove_member_and_update_group(
            self, group: GroupMetadata, member: Member, reason: str
        ) -> None: ...

    def expire_sessions(self) -> None:
        """Fire every deadline that has passed, oldest first: expired pending member ids, members whose
        session timed out (removed, triggering a rebalance), delayed joins, SyncGroup deadlines, and the
        periodic offset-retention check.  Safe to call at any time and as often as wanted."""
        if self._shut_down:
            return
        now = self._now_ms()
        while (due := self._earliest_due_event(now)) is not None:
            due()
        if now >= self._next_offset_expiry_check_ms:
            self._next_offset_expiry_check_ms = now + self._config.offsets_retention_check_interval_ms
            self._expire_offsets(now)
        self._rearm_wakeup()

    def _earliest_due_event(self, now: int) -> Callable[[], None] | None:
        best_deadline: int | None = None
        best: Callable[[], None] | None = None

        def consider(deadline: int | None, action: Callable[[], None]) -> None:
            nonlocal best_deadline, best
            if (
                deadline is not None
                and deadline <= now
                and (best_deadline is None or deadline < best_deadline)
            ):
                best_deadline, best = deadline, action

        for group in self._groups.values():
            for member_id, deadline in group.pending_join_members.items():
                consider(deadline, functools.partial(self._expire_pending_member, group, member_id))
            for member in group.members.values():
                if not member.has_satisfied_heartbeat():
                    consider(
                        member.heartbeat_deadline_ms, functools.partial(self._expire_member, group, member)
                    )
            consider(group.join_deadline_ms, functools.partial(self._on_join_deadline, group))
            consider(group.sync_deadline_ms, functools.partial(self._on_sync_deadline, group))
        return best

    def _expire_pending_member(self, group: GroupMetadata, member_id: str) -> None:
        _LOG.info("group %r: pending member %r expired before rejoining", group.group_id, member_id)
        del group.pending_join_members[member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _expire_member(self, group: GroupMetadata, member: Member) -> None:
        _LOG.info("group %r: member %r session expired; removing it", group.group_id, member.member_id)
        self._remove_member_and_update_group(
            group, member, f"removing member {member.member_id} on heartbeat expiration"
        )

    def _set_heartbeat_deadline(self, member: Member, timeout_ms: int) -> None:
        member.heartbeat_deadline_ms = self._now_ms() + timeout_ms
        self._schedule_wakeup(member.heartbeat_deadline_ms)

    def _next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for group in self._groups.values():
            deadlines.extend(group.pending_join_members.values())
            deadlines.extend(
                member.heartbeat_deadline_ms
                for member in group.members.values()
                if not member.has_satisfied_heartbeat()
            )
            deadlines.extend(d for d in (group.join_deadline_ms, group.sync_deadline_ms) if d is not None)
        if self._groups:
            deadlines.append(self._next_offset_expiry_check_ms)
        return min(deadlines, default=None)

    def _schedule_wakeup(self, deadline_ms: int) -> None:
        """Make sure expire_sessions runs at `deadline_ms` (one timer for the earliest deadline)."""
        if self._shut_down:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (tests with a fake clock): whoever drives the clock calls expire_sessions
        if (
            self._wakeup_handle is not None
            and self._wakeup_loop is loop
            and self._wakeup_at_ms is not None
            and self._wakeup_at_ms <= deadline_ms
        ):
            return
        if self._wakeup_handle is not None:
            self._wakeup_handle.cancel()
        delay_s = max(deadline_ms - self._now_ms(), 0) / 1000
        self._wakeup_handle = loop.call_later(delay_s, self._on_wakeup)
        self._wakeup_loop = loop
        self._wakeup_at_ms = deadline_ms

    def _on_wakeup(self) -> None:
        self._wakeup_handle = None
        self._wakeup_at_ms = None
        try:
            self.expire_sessions()
        except Exception:
            _LOG.exception("group coordinator: timer processing failed")
            self._rearm_wakeup()

    def _rearm_wakeup(self) -> None:
        deadline = self._next_deadline()
        if deadline is not None:
            self._schedule_wakeup(deadline)
