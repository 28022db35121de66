"""A consumer group's metadata, as Kafka's GroupMetadata keeps it: its state machine (Empty,
PreparingRebalance, CompletingRebalance, Stable, Dead), its members with their protocols, sessions and
join or sync waiters, the protocol chosen by vote, the generation, and the committed offsets with
their expiry; the results the coordinator answers requests with; and the journal rows a group is
kept in. :class:`~sparkafka.broker.groups.GroupCoordinator` drives it; nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.settings import default_int

_LOG = logging.getLogger("sparkafka.broker.groups")

TopicPartition = tuple[str, int]
# (offset, leader_epoch, metadata) as carried by OffsetCommit / TxnOffsetCommit; -1 epoch = unknown.
OffsetToCommit = tuple[int, int, str | None]

NO_GENERATION = -1
UNKNOWN_MEMBER_ID = ""
NO_LEADER = ""
NO_OFFSET = -1
NO_LEADER_EPOCH = -1
CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.DEAD: frozenset(GroupState),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}


@dataclass
class GroupConfig:
    """Broker settings of the classic group coordinator (Kafka config names in the comments)."""

    initial_rebalance_delay_ms: int = default_int("group_initial_rebalance_delay_ms")
    min_session_timeout_ms: int = default_int("group_min_session_timeout_ms")
    max_session_timeout_ms: int = default_int("group_max_session_timeout_ms")
    max_group_size: int = default_int("group_max_size")
    offsets_retention_ms: int = default_int("offsets_retention_minutes") * 60_000
    offsets_retention_check_interval_ms: int = default_int("offsets_retention_check_interval_ms")
    max_offset_metadata_bytes: int = default_int("offset_metadata_max_bytes")
    # How long a brand-new member may wait in JoinGroup before it is dropped (Kafka's internal
    # NewMemberJoinTimeoutMs / group.classic.new.member.join.timeout.ms).
    new_member_join_timeout_ms: int = 300_000
    # Compact the journal once this many entries were appended and they outnumber twice the live state.
    journal_compaction_min_entries: int = 1000

    def __post_init__(self) -> None:
        for name in (
            "initial_rebalance_delay_ms",
            "min_session_timeout_ms",
            "max_session_timeout_ms",
            "offsets_retention_ms",
            "max_offset_metadata_bytes",
            "new_member_join_timeout_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"GroupConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "max_group_size",
            "offsets_retention_check_interval_ms",
            "journal_compaction_min_entries",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"GroupConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_session_timeout_ms > self.max_session_timeout_ms:
            raise ValueError(
                f"GroupConfig.min_session_timeout_ms ({self.min_session_timeout_ms}) exceeds "
                f"max_session_timeout_ms ({self.max_session_timeout_ms})"
            )


# -- results returned to the request handlers ------------------------------------------------------------


class JoinGroupMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResult:
    """JoinGroup response fields.  `protocol_type`/`protocol_name` are None on errors (JoinGroup v7+
    sends them as null; older versions want "" for the name).  `members` is filled for the leader only."""

    error: ErrorCode
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: list[JoinGroupMember] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes


class LeftMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    state: str


class DescribedMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """DescribeGroups fields.  An unknown group is reported as state "Dead" with error NONE, as Kafka does
    for DescribeGroups v0-v5; v6+ handlers should turn that into GROUP_ID_NOT_FOUND."""

    error: ErrorCode
    state: str
    protocol_type: str
    protocol: str
    members: list[DescribedMember]


class FetchedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str | None
    error: ErrorCode


NO_COMMITTED_OFFSET = FetchedOffset(NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.NONE)


# What Kafka's group coordinator answers when a record cannot be appended because of a storage error
# (KAFKA_STORAGE_ERROR becomes NOT_COORDINATOR: appendGroupMetadataErrorToResponseError for group
# records, CoordinatorOperationExceptionHelper for offset commits and deletions); the journal's disk
# is this broker's storage.
NOT_JOURNALED = ErrorCode.NOT_COORDINATOR


def join_error(member_id: str, error: ErrorCode) -> JoinGroupResult:
    return JoinGroupResult(error, NO_GENERATION, None, None, NO_LEADER, member_id)


def sync_error(error: ErrorCode) -> SyncGroupResult:
    return SyncGroupResult(error, None, None, b"")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# -- internal state ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinRequest:
    """The JoinGroup request fields a member is (re)registered with."""

    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # in the member's order of preference
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool
    supports_skip_assignment: bool

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}


@dataclass
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    sequence: int
    # OffsetCommit v2-v4's retention_time_ms, as Kafka's expireTimestampMs: when set, the offset
    # expires at this time instead of offsets.retention.ms after its base timestamp.
    expire_timestamp_ms: int | None = None


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # A parked JoinGroup / SyncGroup; "awaiting join/sync" in Kafka's terms is "has a waiter".
    join_waiter: asyncio.Future[JoinGroupResult] | None = None
    sync_waiter: asyncio.Future[SyncGroupResult] | None = None
    # A member added by this rebalance; it can expire while awaiting join (its deadline is the
    # new-member join timeout rather than the session timeout).
    is_new: bool = False
    heartbeat_deadline_ms: int = 0

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def metadata_for(self, protocol_name: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol_name!r}")

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among `candidates` (protocols are in preference order)."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(
            f"member {self.member_id} supports none of the candidate protocols {sorted(candidates)}"
        )

    def has_satisfied_heartbeat(self) -> bool:
        # Existing members parked in JoinGroup/SyncGroup cannot heartbeat, so the rebalance itself counts
        # as liveness; new members can still expire while awaiting join (Kafka's hasSatisfiedHeartbeat).
        if self.is_new:
            return False
        return self.join_waiter is not None or self.sync_waiter is not None


def resolve(waiter: asyncio.Future[Any] | None, result: object) -> bool:
    """Answer a parked request; a waiter whose request was cancelled (client gone) is skipped."""
    if waiter is None:
        return False
    if not waiter.done():
        waiter.set_result(result)
    return True


class GroupMetadata:
    """One group's membership, generation and offsets (Kafka's GroupMetadata / ClassicGroup)."""

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group_instance_id -> member_id
        # Member ids handed out with MEMBER_ID_REQUIRED that have not rejoined yet -> expiry deadline.
        self.pending_join_members: dict[str, int] = {}
        self.pending_sync_members: set[str] = set()
        self.sync_deadline_ms: int | None = None
        self.join_deadline_ms: int | None = None
        # (delay_ms, remaining_ms) of Kafka's InitialDelayedJoin while the first rebalance from Empty is
        # being delayed; None while a plain DelayedJoin (completes early once everyone joined) is active.
        self.initial_join: tuple[int, int] | None = None
        self.new_member_added = False
        self.subscribed_topics: set[str] | None = None
        self.offsets: dict[TopicPartition, CommittedOffset] = {}
        self.pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = {}
        self.journaled = False  # whether any journal entry names this group (so deletion must be journaled)
        # The last group_metadata entry journaled (or replayed): what a restart restores, so journal
        # compaction keeps it as it is, as Kafka's log compaction keeps a group's last record.
        self.metadata_entry: dict[str, Any] | None = None

    # -- membership ------------------------------------------------------------------------------------

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS_STATES[target]:
            raise RuntimeError(
                f"group {self.group_id!r}: illegal state transition {self.state.value} -> {target.value}"
            )
        self.state = target
        self.state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member, waiter: asyncio.Future[JoinGroupResult] | None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(
                    f"group {self.group_id!r}: static member {member.group_instance_id!r} is already mapped"
                )
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        member.join_waiter = waiter
        self.members[member.member_id] = member
        self.pending_join_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        instance_id = member.group_instance_id if member is not None else None
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.pop(member_id, None)
        self.pending_sync_members.discard(member_id)
        return member

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """Give a static member a new member id, fencing whatever request the old id has parked."""
        old = self.members.pop(old_member_id)
        resolve(old.join_waiter, join_error(old_member_id, ErrorCode.FENCED_INSTANCE_ID))
        resolve(old.sync_waiter, sync_error(ErrorCode.FENCED_INSTANCE_ID))
        replacement = Member(
            member_id=new_member_id,
            group_instance_id=old.group_instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms,
            protocol_type=old.protocol_type,
            protocols=old.protocols,
            assignment=old.assignment,
        )
        self.members[new_member_id] = replacement
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return replacement

    def update_member(
        self, member: Member, request: JoinRequest, waiter: asyncio.Future[JoinGroupResult]
    ) -> None:
        if member.join_waiter is not None:
            # Kafka silently replaces the callback of a duplicate JoinGroup; answering the superseded
            # request keeps its handler from waiting forever.
            resolve(member.join_waiter, join_error(member.member_id, ErrorCode.REBALANCE_IN_PROGRESS))
        member.protocols = request.protocols
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_timeout_ms = request.session_timeout_ms
        member.join_waiter = waiter

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """KIP-345 fencing, then membership: FENCED_INSTANCE_ID / UNKNOWN_MEMBER_ID / None if valid."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                _LOG.info(
                    "group %r: member %r with group.instance.id %r is fenced by current member %r",
                    self.group_id,
                    member_id,
                    group_instance_id,
                    current,
                )
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def num_awaiting_join(self) -> int:
        return sum(1 for member in self.members.values() if member.join_waiter is not None)

    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join() == len(self.members) and not self.pending_join_members

    def not_yet_rejoined(self) -> list[Member]:
        return [member for member in self.members.values() if member.join_waiter is None]

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if no member rejoined."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].join_waiter is not None:
            return True
        for member in self.members.values():
            if member.join_waiter is not None:
                _LOG.info(
                    "group %r: leader %r did not rejoin in time; %r is the new leader",
                    self.group_id,
                    self.leader_id,
                    member.member_id,
                )
                self.leader_id = member.member_id
                return True
        return False

    def rebalance_timeout_ms(self) -> int:
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def _support_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for member in self.members.values():
            for name in member.protocol_names():
                counts[name] = counts.get(name, 0) + 1
        return counts

    def supports_protocols(self, protocol_type: str, protocol_names: set[str]) -> bool:
        """Whether a member with these protocols may join: an Empty group takes any non-empty protocol
        set; otherwise the type must match and one protocol must be supported by every current member."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocol_names)
        counts = self._support_counts()
        return self.protocol_type == protocol_type and any(
            counts.get(name, 0) == len(self.members) for name in protocol_names
        )

    def select_protocol(self) -> str:
        """The protocol every member supports that gets the most first-preference votes (ties: first seen)."""
        counts = self._support_counts()
        candidates = {name for name, count in counts.items() if count == len(self.members)}
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def _compute_subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, read from the consumer protocol's Subscription (v0 prefix,
        shared by every version); None when unknown, which disables subscription-based offset expiry."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics.update(parse_subscription_topics(member.metadata_for(self.protocol_name)))
            except (struct.error, UnicodeDecodeError, ValueError) as exc:
                _LOG.warning(
                    "group %r: cannot parse the consumer subscription of member %r (%s); "
                    "offset expiry will not consider subscribed topics",
                    self.group_id,
                    member.member_id,
                    exc,
                )
                return None
        return topics

    def join_members_for(self, member_id: str) -> list[JoinGroupMember]:
        """The member list of a JoinGroup response: the leader gets everyone's metadata, others nothing."""
        if not self.is_leader(member_id) or self.protocol_name is None:
            return []
        return [
            JoinGroupMember(
                member.member_id, member.group_instance_id, member.metadata_for(self.protocol_name)
            )
            for member in self.members.values()
        ]

    def join_result(self, member_id: str) -> JoinGroupResult:
        return JoinGroupResult(
            ErrorCode.NONE,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            self.leader_id or NO_LEADER,
            member_id,
            self.join_members_for(member_id),
        )

    # -- offsets ---------------------------------------------------------------------------------------

    def has_pending_txn_offset(self, partition: TopicPartition) -> bool:
        return any(partition in pending for pending in self.pending_txn_offsets.values())

    def has_offsets(self) -> bool:
        return bool(self.offsets) or bool(self.pending_txn_offsets)

    def expirable_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Kafka's offset expiration condition (KIP-211):

        * consumer-managed group (protocol type set) that is Empty: all offsets, once the group has
          been Empty for the retention period;
        * Stable "consumer" group with known subscriptions: offsets of unsubscribed topics, by commit time;
        * group used only for offset storage (no protocol type): each offset by its commit time;
        * otherwise none.
        """
        subscribed: set[str] = set()
        if self.protocol_type is not None:
            if self.state is GroupState.EMPTY:
                return [
                    tp
                    for tp, committed in self.offsets.items()
                    if offset_expired(committed, self.state_timestamp_ms, now_ms, retention_ms)
                ]
            if not (
                self.protocol_type == CONSUMER_PROTOCOL_TYPE
                and self.subscribed_topics is not None
                and self.state is GroupState.STABLE
            ):
                return []
            subscribed = self.subscribed_topics
        return [
            tp
            for tp, committed in self.offsets.items()
            if tp[0] not in subscribed
            and offset_expired(committed, committed.commit_timestamp_ms, now_ms, retention_ms)
        ]

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """:meth:`expirable_offsets` whose partition has no transactional offset pending
        (OffsetMetadataManager.cleanupExpiredOffsets keeps those until the transaction ends)."""
        return [
            tp for tp in self.expirable_offsets(now_ms, retention_ms) if not self.has_pending_txn_offset(tp)
        ]


def offset_expired(
    committed: CommittedOffset, base_timestamp_ms: int, now_ms: int, retention_ms: int
) -> bool:
    """Kafka's OffsetExpirationConditionImpl: an explicit expire timestamp (older commits) decides
    alone; otherwise the offset is retention_ms past the base timestamp."""
    if committed.expire_timestamp_ms is not None:
        return now_ms >= committed.expire_timestamp_ms
    return now_ms - base_timestamp_ms >= retention_ms


def parse_subscription_topics(metadata: bytes) -> list[str]:
    # ConsumerProtocolSubscription: int16 version, then (every version) an array of topic names:
    # int32 count, each an int16 length + UTF-8 bytes.
    (count,) = struct.unpack_from(">i", metadata, 2)
    if count < 0:
        raise ValueError(f"negative topic count {count}")
    position = 6
    topics = []
    for _ in range(count):
        (length,) = struct.unpack_from(">h", metadata, position)
        position += 2
        if length < 0 or position + length > len(metadata):
            raise ValueError(f"topic name length {length} runs past the metadata")
        topics.append(metadata[position : position + length].decode())
        position += length
    return topics


def offset_rows(offsets: dict[TopicPartition, CommittedOffset]) -> list[list[Any]]:
    return [
        [tp[0], tp[1], o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms, o.sequence]
        + ([] if o.expire_timestamp_ms is None else [o.expire_timestamp_ms])
        for tp, o in offsets.items()
    ]


def offsets_from_rows(rows: list[list[Any]]) -> dict[TopicPartition, CommittedOffset]:
    result: dict[TopicPartition, CommittedOffset] = {}
    for row in rows:
        topic, partition, offset, leader_epoch, metadata, timestamp, sequence, *expiry = row
        result[(str(topic), int(partition))] = CommittedOffset(
            int(offset),
            int(leader_epoch),
            str(metadata),
            int(timestamp),
            int(sequence),
            int(expiry[0]) if expiry else None,
        )
    return result


def member_rows(group: GroupMetadata) -> list[dict[str, Any]]:
    """The members of a group that has a protocol, as Kafka's GroupMetadataValue keeps them: only the
    subscription of the group's protocol, and each member's current assignment."""
    protocol_name = group.protocol_name
    if protocol_name is None:
        if group.members:
            raise RuntimeError(f"group {group.group_id!r}: members without a chosen protocol cannot be kept")
        return []
    return [
        {
            "member_id": member.member_id,
            "group_instance_id": member.group_instance_id,
            "client_id": member.client_id,
            "client_host": member.client_host,
            "rebalance_timeout_ms": member.rebalance_timeout_ms,
            "session_timeout_ms": member.session_timeout_ms,
            "subscription": base64.b64encode(member.metadata_for(protocol_name)).decode("ascii"),
            "assignment": base64.b64encode(member.assignment).decode("ascii"),
        }
        for member in group.members.values()
    ]


def members_from_rows(
    rows: list[dict[str, Any]], protocol_type: str | None, protocol_name: str | None
) -> list[Member]:
    if rows and protocol_name is None:
        raise ValueError("members are stored without the group's protocol")
    return [
        Member(
            member_id=str(row["member_id"]),
            group_instance_id=None if row["group_instance_id"] is None else str(row["group_instance_id"]),
            client_id=str(row["client_id"]),
            client_host=str(row["client_host"]),
            rebalance_timeout_ms=int(row["rebalance_timeout_ms"]),
            session_timeout_ms=int(row["session_timeout_ms"]),
            protocol_type=protocol_type or "",
            # What Kafka's replay gives a loaded member: the group's protocol with its subscription.
            protocols=[(str(protocol_name), base64.b64decode(row["subscription"], validate=True))],
            assignment=base64.b64decode(row["assignment"], validate=True),
        )
        for row in rows
    ]
