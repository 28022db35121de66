"""The group coordinator's journal, as Kafka's __consumer_offsets log keeps a coordinator's state:
each change (offsets committed, staged, completed, deleted or expired; a group's members and
assignment; a group deleted) appended before it is answered, a snapshot written when the journal has
grown, and the coordinator's groups restored from it at start (their members' sessions started anew).

:class:`GroupJournal` is a part of :class:`~sparkafka.broker.groups.GroupCoordinator`.

Durability: offset commits, transactional offset staging and completion, group deletions, offset
expirations and the group's metadata are appended to a :class:`~sparkafka.broker.journal.Journal`
before the request is answered.  The metadata entry is Kafka 4's GroupMetadataValue, written when
Kafka writes it: when JoinGroup creates the group, when a rebalance leaves it Empty, when the
leader's SyncGroup brings the assignment (the entry holds every member with its subscription and
assignment; the group becomes Stable only once it is written), and when a static member takes its
old place under a new member id.  A restart restores each group from its last metadata entry, as
Kafka's coordinator loads it: Stable with those members, their sessions starting over, or Empty.
Members therefore keep heartbeating and committing across a broker restart without a rebalance; a
group whose rebalance was under way falls back to the last generation that was written, and its
members rejoin.  Journal entries (JSON objects)::

    {"type": "offsets_committed", "group": g, "offsets": [ROW, ...]}
    {"type": "txn_offsets_staged", "group": g, "producer_id": pid, "offsets": [ROW, ...]}
    {"type": "txn_offsets_completed", "group": g, "producer_id": pid, "committed": bool}
    {"type": "offsets_expired", "group": g, "partitions": [[topic, partition], ...]}
    {"type": "offsets_deleted", "group": g, "partitions": [[topic, partition], ...]}
    {"type": "group_metadata", "group": g, "generation": int, "protocol_type": str | null,
     "protocol": str | null, "empty_since_ms": int | null, "leader": str | null, "members": [MEMBER, ...]}
    {"type": "group_deleted", "group": g}
    ROW = [topic, partition, offset, leader_epoch, metadata, commit_timestamp_ms, sequence]
          + [expire_timestamp_ms] when the commit set one (OffsetCommit v2-v4 retention_time_ms)
    MEMBER = {"member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
              "session_timeout_ms", "subscription": base64, "assignment": base64}

An entry without "leader" and "members" (written before members were kept) restores an Empty group.

``sequence`` orders commits the way Kafka's log offsets do: a committed transaction's offset replaces
the current one only if it was staged after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sparkafka.broker.group_metadata import (
    CommittedOffset,
    GroupConfig,
    GroupMetadata,
    GroupState,
    Member,
    TopicPartition,
    member_rows,
    members_from_rows,
    offset_rows,
    offsets_from_rows,
)
from sparkafka.broker.journal import Journal, JournalError

_LOG = logging.getLogger("sparkafka.broker.groups")


class GroupJournal:
    """The journal half of the group coordinator (mixed into GroupCoordinator)."""

    if TYPE_CHECKING:  # what the coordinator this is a part of holds and does
        _journal: Journal
        _config: GroupConfig
        _now_ms: Callable[[], int]
        _groups: dict[str, GroupMetadata]
        _next_sequence: int

        def _set_heartbeat_deadline(self, member: Member, timeout_ms: int) -> None: ...
        def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None: ...
        @staticmethod
        def _drop_offsets(group: GroupMetadata, partitions: Iterable[TopicPartition]) -> None: ...
        @staticmethod
        def _apply_txn_completion(group: GroupMetadata, producer_id: int, commit: bool) -> None: ...

    def _append(self, entry: dict[str, Any]) -> bool:
        """Journal one entry; False (with the cause logged) if it could not be written."""
        try:
            self._journal.append(entry)
        except (JournalError, OSError) as exc:
            _LOG.error(
                "group coordinator: could not journal %s entry for group %r: %s",
                entry["type"],
                entry.get("group"),
                exc,
            )
            return False
        return True

    def _journal_group_metadata(self, group: GroupMetadata) -> bool:
        """Journal the group as Kafka's GroupMetadataValue holds it (generation, protocol, leader, and
        each member with its subscription and current assignment); False, with the cause logged, if it
        could not be written."""
        entry = {
            "type": "group_metadata",
            "group": group.group_id,
            "generation": group.generation_id,
            "protocol_type": group.protocol_type,
            "protocol": group.protocol_name,
            "empty_since_ms": group.state_timestamp_ms if group.state is GroupState.EMPTY else None,
            "leader": group.leader_id,
            "members": member_rows(group),
        }
        if not self._append(entry):
            return False
        group.journaled = True
        group.metadata_entry = entry
        self._maybe_compact()
        return True

    def _snapshot_entries(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for group in self._groups.values():
            if group.metadata_entry is not None:
                entries.append(group.metadata_entry)
            if group.offsets:
                entries.append(
                    {
                        "type": "offsets_committed",
                        "group": group.group_id,
                        "offsets": offset_rows(group.offsets),
                    }
                )
            for producer_id, pending in group.pending_txn_offsets.items():
                entries.append(
                    {
                        "type": "txn_offsets_staged",
                        "group": group.group_id,
                        "producer_id": producer_id,
                        "offsets": offset_rows(pending),
                    }
                )
        return entries

    def _maybe_compact(self) -> None:
        live_entries = sum(2 + len(group.pending_txn_offsets) for group in self._groups.values())
        threshold = max(self._config.journal_compaction_min_entries, 2 * live_entries)
        if self._journal.appended_since_rewrite < threshold:
            return
        try:
            self._journal.rewrite(self._snapshot_entries())
        except (JournalError, OSError) as exc:
            # Compaction only saves space and replay time; the uncompacted journal is still complete.
            _LOG.error("group coordinator: journal compaction failed: %s", exc)

    def _replay_journal(self) -> None:
        now = self._now_ms()
        for index, entry in enumerate(self._journal.replay()):
            try:
                self._apply_journal_entry(entry, now)
            except (KeyError, TypeError, ValueError) as exc:
                raise JournalError(
                    f"journal {self._journal.path}: entry #{index} cannot be applied to group state "
                    f"({type(exc).__name__}: {exc}): {entry!r}"
                ) from exc
        self._start_restored_sessions()
        _LOG.info(
            "group coordinator: restored %d groups (%d members) from %s",
            len(self._groups),
            sum(len(group.members) for group in self._groups.values()),
            self._journal.path,
        )

    def _apply_journal_entry(self, entry: dict[str, Any], now: int) -> None:
        kind = entry["type"]
        group_id = entry["group"]
        if not isinstance(group_id, str):
            raise TypeError(f"group id must be a string, got {group_id!r}")
        if kind == "group_deleted":
            self._groups.pop(group_id, None)
            return
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = GroupMetadata(group_id, now)
        group.journaled = True
        if kind == "offsets_committed":
            offsets = offsets_from_rows(entry["offsets"])
            group.offsets.update(offsets)
            self._advance_sequence(offsets)
        elif kind == "txn_offsets_staged":
            offsets = offsets_from_rows(entry["offsets"])
            group.pending_txn_offsets.setdefault(int(entry["producer_id"]), {}).update(offsets)
            self._advance_sequence(offsets)
        elif kind == "txn_offsets_completed":
            self._apply_txn_completion(group, int(entry["producer_id"]), bool(entry["committed"]))
        elif kind == "offsets_expired":
            for topic, partition in entry["partitions"]:
                group.offsets.pop((str(topic), int(partition)), None)
        elif kind == "offsets_deleted":
            self._drop_offsets(
                group, [(str(topic), int(partition)) for topic, partition in entry["partitions"]]
            )
        elif kind == "group_metadata":
            self._restore_group_metadata(group, entry, now)
        else:
            raise ValueError(f"unknown entry type {kind!r}")

    @staticmethod
    def _restore_group_metadata(group: GroupMetadata, entry: dict[str, Any], now: int) -> None:
        """Kafka's replay of a GroupMetadataValue: the group as the entry describes it, Stable with its
        members or Empty; the members' sessions start when the whole journal is replayed."""
        protocol_type, protocol_name = entry["protocol_type"], entry["protocol"]
        members = members_from_rows(entry.get("members") or [], protocol_type, protocol_name)
        group.generation_id = int(entry["generation"])
        group.protocol_type = protocol_type
        group.protocol_name = protocol_name
        group.members = {member.member_id: member for member in members}
        group.static_members = {
            member.group_instance_id: member.member_id
            for member in members
            if member.group_instance_id is not None
        }
        group.leader_id = entry.get("leader") if members else None
        if members and group.leader_id not in group.members:
            raise ValueError(f"leader {group.leader_id!r} is none of the members")
        group.state = GroupState.STABLE if members else GroupState.EMPTY
        # An Empty group's offset-retention clock runs from the time it became Empty.
        empty_since = entry["empty_since_ms"]
        group.state_timestamp_ms = int(empty_since) if empty_since is not None and not members else now
        group.subscribed_topics = group._compute_subscribed_topics()
        group.metadata_entry = entry

    def _start_restored_sessions(self) -> None:
        """Kafka's onLoaded: every restored member's session timer starts now, and a group larger than
        group.max.size (lowered since) rebalances so that its members can commit before some leave."""
        for group in self._groups.values():
            for member in group.members.values():
                self._set_heartbeat_deadline(member, member.session_timeout_ms)
            if len(group.members) > self._config.max_group_size:
                self._prepare_rebalance(
                    group,
                    f"restored with {len(group.members)} members, more than group.max.size "
                    f"{self._config.max_group_size}",
                )

    def _advance_sequence(self, offsets: dict[TopicPartition, CommittedOffset]) -> None:
        for committed in offsets.values():
            self._next_sequence = max(self._next_sequence, committed.sequence + 1)

    # ======================================================================================================
    # helpers
    # ======================================================================================================
