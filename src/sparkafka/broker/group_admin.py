"""A group coordinator's administration, as Kafka's classic coordinator answers it: ListGroups (with
KIP-518's state filter), DescribeGroups, and DeleteGroups (only an Empty group, its offsets with it).

:class:`GroupAdmin` is a part of :class:`~sparkafka.broker.groups.GroupCoordinator`, whose groups and
journal it works on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.group_metadata import (
    NOT_JOURNALED,
    DescribedMember,
    GroupDescription,
    GroupMetadata,
    GroupState,
    ListedGroup,
)

_LOG = logging.getLogger("sparkafka.broker.groups")


class GroupAdmin:
    """Listing, describing and deleting groups (mixed into GroupCoordinator)."""

    if TYPE_CHECKING:  # what the coordinator this is a part of holds and does
        _now_ms: Callable[[], int]
        _groups: dict[str, GroupMetadata]
        _shut_down: bool

        def _append(self, entry: dict[str, Any]) -> bool: ...
        def _require_running(self, operation: str) -> None: ...

    def list_groups(self, states_filter: list[str] | None = None) -> list[ListedGroup]:
        """Handle ListGroups: (group_id, protocol_type, state) per group; `states_filter` matches state
        names case-insensitively, and None or [] means every state.  Raises BrokerError
        (COORDINATOR_NOT_AVAILABLE) after shutdown."""
        self._require_running("ListGroups")
        wanted = {state.strip().lower() for state in states_filter} if states_filter else None
        return [
            ListedGroup(group.group_id, group.protocol_type or "", group.state.value)
            for group in self._groups.values()
            if wanted is None or group.state.value.lower() in wanted
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        """Handle DescribeGroups for one group.  Member metadata is only filled in while Stable, and the
        protocol is "" outside Stable, as in Kafka.  The empty group id is valid here."""
        if self._shut_down:
            return GroupDescription(ErrorCode.COORDINATOR_NOT_AVAILABLE, "", "", "", [])
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(ErrorCode.NONE, GroupState.DEAD.value, "", "", [])
        stable = group.state is GroupState.STABLE and group.protocol_name is not None
        members = [
            DescribedMember(
                member.member_id,
                member.group_instance_id,
                member.client_id,
                member.client_host,
                member.metadata_for(group.protocol_name)
                if stable and group.protocol_name is not None
                else b"",
                member.assignment,
            )
            for member in group.members.values()
        ]
        return GroupDescription(
            ErrorCode.NONE,
            group.state.value,
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            members,
        )

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """Handle DeleteGroups: only Empty groups can be deleted (NON_EMPTY_GROUP otherwise); unknown ones
        give GROUP_ID_NOT_FOUND.  The deletion and the group's offsets are removed durably."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            if self._shut_down:
                results[group_id] = ErrorCode.COORDINATOR_NOT_AVAILABLE
                continue
            group = self._groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state is not GroupState.EMPTY:
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            else:
                results[group_id] = self._delete_group(group, "DeleteGroups request")
        return results

    def _delete_group(self, group: GroupMetadata, reason: str) -> ErrorCode:
        if group.journaled and not self._append({"type": "group_deleted", "group": group.group_id}):
            return NOT_JOURNALED
        if group.pending_txn_offsets:
            _LOG.info(
                "group %r: deleting with pending transactional offsets of producers %s",
                group.group_id,
                sorted(group.pending_txn_offsets),
            )
        _LOG.info(
            "group %r: deleted (%s); %d committed offsets removed", group.group_id, reason, len(group.offsets)
        )
        group.transition_to(GroupState.DEAD, self._now_ms())
        del self._groups[group.group_id]
        return ErrorCode.NONE
