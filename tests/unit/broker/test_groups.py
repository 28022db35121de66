"""Tests of the classic group coordinator against Kafka's documented semantics.

Time is a fake clock: tests advance it and call ``expire_sessions()`` to fire the deadlines that passed,
so nothing sleeps.  Each test runs its own event loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import struct
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.group_metadata import FetchedOffset, GroupConfig, JoinGroupResult, SyncGroupResult
from sparkafka.broker.groups import GroupCoordinator
from sparkafka.broker.journal import Journal

GROUP = "g1"
PROTOCOLS = [("range", b"range-metadata")]
SESSION_TIMEOUT_MS = 10_000
REBALANCE_TIMEOUT_MS = 5_000
NO_OFFSET = FetchedOffset(-1, -1, "", ErrorCode.NONE)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class FailingJournal(Journal):
    """A journal whose disk can be made to fail: appends raise what a failed write raises."""

    failing = False

    def append(self, entry: dict[str, Any]) -> None:
        if self.failing:
            raise OSError(errno.EIO, "Input/output error (injected)")
        super().append(entry)


class Harness:
    """A coordinator over a journal in `directory`, with helpers that play the client side."""

    def __init__(self, directory: Path, clock: FakeClock | None = None, **config: Any) -> None:
        self.directory = directory
        self.clock = clock or FakeClock()
        settings: dict[str, Any] = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 1000}
        settings.update(config)
        self.config = GroupConfig(**settings)
        self.restart(first=True)

    def restart(self, *, first: bool = False) -> None:
        if not first:
            self.coordinator.shutdown()
        self.journal = FailingJournal(self.directory / "groups.journal")
        self.coordinator = GroupCoordinator(self.journal, self.config, now_ms=self.clock)

    def join(
        self,
        member_id: str = "",
        *,
        group_id: str = GROUP,
        client_id: str = "client",
        group_instance_id: str | None = None,
        protocols: list[tuple[str, bytes]] = PROTOCOLS,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS,
        require_known_member_id: bool = False,
        protocol_type: str = "consumer",
    ) -> asyncio.Task[JoinGroupResult]:
        return asyncio.ensure_future(
            self.coordinator.join_group(
                group_id=group_id,
                member_id=member_id,
                group_instance_id=group_instance_id,
                protocol_type=protocol_type,
                protocols=protocols,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                client_id=client_id,
                client_host="/127.0.0.1",
                require_known_member_id=require_known_member_id,
            )
        )

    def sync(
        self,
        joined: JoinGroupResult,
        assignments: dict[str, bytes] | None = None,
        *,
        generation_id: int | None = None,
        protocol_name: str | None = None,
        group_instance_id: str | None = None,
        protocol_type: str = "consumer",
    ) -> asyncio.Task[SyncGroupResult]:
        return asyncio.ensure_future(
            self.coordinator.sync_group(
                group_id=GROUP,
                generation_id=joined.generation_id if generation_id is None else generation_id,
                member_id=joined.member_id,
                group_instance_id=group_instance_id,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                assignments=list((assignments or {}).items()),
            )
        )

    def heartbeat(self, joined: JoinGroupResult, *, generation_id: int | None = None) -> ErrorCode:
        return self.coordinator.heartbeat(
            group_id=GROUP,
            generation_id=joined.generation_id if generation_id is None else generation_id,
            member_id=joined.member_id,
            group_instance_id=None,
        )

    def commit(
        self,
        offsets: dict[tuple[str, int], tuple[int, int, str | None]],
        *,
        generation_id: int = -1,
        member_id: str = "",
        retention_time_ms: int = -1,
    ) -> dict[tuple[str, int], ErrorCode]:
        return self.coordinator.commit_offsets(
            group_id=GROUP,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=None,
            offsets=offsets,
            retention_time_ms=retention_time_ms,
        )

    def fetch(
        self, partitions: list[tuple[str, int]] | None, *, require_stable: bool = False
    ) -> dict[tuple[str, int], FetchedOffset]:
        return self.coordinator.fetch_offsets(GROUP, partitions, require_stable=require_stable)

    def state(self, group_id: str = GROUP) -> str:
        return self.coordinator.describe_group(group_id).state

    async def leave(self, joined: JoinGroupResult) -> None:
        """The member leaves (LeaveGroup by member id), and the rebalance that follows runs."""
        self.coordinator.leave_group(group_id=GROUP, members=[(joined.member_id, None)])
        await self.settle()

    async def settle(self) -> None:
        """Let parked requests run, then fire every deadline that has passed."""
        for _ in range(5):
            await asyncio.sleep(0)
        self.coordinator.expire_sessions()
        for _ in range(5):
            await asyncio.sleep(0)

    async def form_group(self, size: int) -> list[JoinGroupResult]:
        """Join `size` fresh members into one generation and complete its SyncGroup round."""
        joins = [self.join(client_id=f"client-{index}") for index in range(size)]
        await self.settle()
        assert all(task.done() for task in joins)
        results = [task.result() for task in joins]
        assert {r.error for r in results} == {ErrorCode.NONE}
        leader = next(r for r in results if r.member_id == r.leader)
        syncs = [self.sync(r, _assignments(results) if r is leader else None) for r in results]
        await self.settle()
        assert all(task.result().error is ErrorCode.NONE for task in syncs)
        assert self.state() == "Stable"
        return results


def _assignments(members: list[JoinGroupResult]) -> dict[str, bytes]:
    return {member.member_id: f"assignment-of-{member.member_id}".encode() for member in members}


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def _rejoin_all(harness: Harness, members: list[JoinGroupResult]) -> list[JoinGroupResult]:
    tasks = [harness.join(member.member_id) for member in members]
    await harness.settle()
    return [task.result() for task in tasks]


# -- JoinGroup / SyncGroup ---------------------------------------------------------------------------------


def test_two_members_join_one_generation_and_followers_wait_for_the_leaders_assignment(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, initial_rebalance_delay_ms=100)
        first, second = harness.join(client_id="c1"), harness.join(client_id="c2")
        await harness.settle()
        # Kafka's initial delayed join: still waiting for more members.
        assert not first.done() and not second.done()
        assert harness.state() == "PreparingRebalance"
        harness.clock.advance(100)
        await harness.settle()
        # A second member arrived during the first delay, so the delay was extended once more.
        assert not first.done()
        harness.clock.advance(100)
        await harness.settle()

        one, two = first.result(), second.result()
        assert one.error is two.error is ErrorCode.NONE
        assert one.generation_id == two.generation_id == 1
        assert one.leader == two.leader == one.member_id
        assert one.member_id.startswith("c1-") and two.member_id.startswith("c2-")
        assert (one.protocol_type, one.protocol_name) == ("consumer", "range")
        assert {(m.member_id, m.metadata) for m in one.members} == {
            (one.member_id, b"range-metadata"),
            (two.member_id, b"range-metadata"),
        }
        assert two.members == []
        assert harness.state() == "CompletingRebalance"

        follower_sync = harness.sync(two)
        await harness.settle()
        assert not follower_sync.done()
        leader_sync = harness.sync(one, {one.member_id: b"p0", two.member_id: b"p1"})
        await harness.settle()
        assert leader_sync.result() == SyncGroupResult(ErrorCode.NONE, "consumer", "range", b"p0")
        assert follower_sync.result() == SyncGroupResult(ErrorCode.NONE, "consumer", "range", b"p1")
        assert harness.state() == "Stable"
        # A Stable group answers SyncGroup at once with the stored assignment.
        assert (await harness.sync(two)).assignment == b"p1"

    run(scenario)


def test_leader_omitting_a_member_gives_it_an_empty_assignment(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        joins = [harness.join(client_id="a"), harness.join(client_id="b")]
        await harness.settle()
        one, two = (task.result() for task in joins)
        leader, follower = (one, two) if one.member_id == one.leader else (two, one)
        syncs = [harness.sync(follower), harness.sync(leader, {leader.member_id: b"all", "ghost": b"x"})]
        await harness.settle()
        assert syncs[0].result().assignment == b""
        assert syncs[1].result().assignment == b"all"

    run(scenario)


def test_member_id_required_flow(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        first = await harness.join(client_id="rdkafka", require_known_member_id=True)
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        assert first.member_id.startswith("rdkafka-") and len(first.member_id) == len("rdkafka-") + 36
        assert first.generation_id == -1 and first.leader == ""

        rejoin = harness.join(first.member_id, client_id="rdkafka", require_known_member_id=True)
        await harness.settle()
        joined = rejoin.result()
        assert joined.error is ErrorCode.NONE
        assert joined.member_id == joined.leader == first.member_id
        assert joined.generation_id == 1

        # An id the coordinator never handed out is refused.
        unknown = await harness.join("made-up-id", require_known_member_id=True)
        assert unknown.error is ErrorCode.UNKNOWN_MEMBER_ID
        assert unknown.member_id == "made-up-id"

    run(scenario)


def test_pending_member_id_expires_after_the_session_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        stable = await harness.form_group(1)
        pending = await harness.join(require_known_member_id=True)
        assert pending.error is ErrorCode.MEMBER_ID_REQUIRED
        harness.clock.advance(SESSION_TIMEOUT_MS - 1)
        assert harness.heartbeat(stable[0]) is ErrorCode.NONE
        harness.clock.advance(1)
        await harness.settle()
        late = await harness.join(pending.member_id, require_known_member_id=True)
        assert late.error is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_third_member_triggers_a_rebalance_that_existing_members_learn_from_heartbeats(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        third = harness.join(client_id="late")
        await harness.settle()
        assert harness.state() == "PreparingRebalance"
        assert not third.done()
        assert harness.heartbeat(one) is ErrorCode.REBALANCE_IN_PROGRESS
        assert harness.heartbeat(two) is ErrorCode.REBALANCE_IN_PROGRESS
        # Commits from the old generation are still accepted while preparing the rebalance.
        assert harness.commit({("t", 0): (5, -1, None)}, generation_id=1, member_id=one.member_id) == {
            ("t", 0): ErrorCode.NONE
        }
        # SyncGroup of the old generation is refused.
        assert (await harness.sync(one)).error is ErrorCode.REBALANCE_IN_PROGRESS

        rejoined = await _rejoin_all(harness, [one, two])
        new_member = third.result()
        assert {r.generation_id for r in [*rejoined, new_member]} == {2}
        assert {r.leader for r in [*rejoined, new_member]} == {one.member_id}
        leader_view = next(r for r in rejoined if r.member_id == one.member_id)
        assert {m.member_id for m in leader_view.members} == {
            one.member_id,
            two.member_id,
            new_member.member_id,
        }
        assert harness.heartbeat(one) is ErrorCode.ILLEGAL_GENERATION
        assert harness.heartbeat(leader_view) is ErrorCode.NONE  # CompletingRebalance: heartbeats are fine

    run(scenario)


def test_leave_group_triggers_a_rebalance(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        error, results = harness.coordinator.leave_group(
            group_id=GROUP, members=[(two.member_id, None), ("nobody", None)]
        )
        assert error is ErrorCode.NONE
        assert [(r.member_id, r.error) for r in results] == [
            (two.member_id, ErrorCode.NONE),
            ("nobody", ErrorCode.UNKNOWN_MEMBER_ID),
        ]
        assert harness.state() == "PreparingRebalance"
        assert harness.heartbeat(one) is ErrorCode.REBALANCE_IN_PROGRESS
        assert harness.heartbeat(two) is ErrorCode.UNKNOWN_MEMBER_ID

        # Everyone left has rejoined, so the join phase completes at once.
        (alone,) = await _rejoin_all(harness, [one])
        assert alone.generation_id == 2 and alone.leader == one.member_id
        assert [m.member_id for m in alone.members] == [one.member_id]

        assert harness.coordinator.leave_group(group_id="unknown", members=[("m", None)]) == (
            ErrorCode.NONE,
            [("m", None, ErrorCode.UNKNOWN_MEMBER_ID)],
        )
        assert harness.coordinator.leave_group(group_id="", members=[("m", None)]) == (
            ErrorCode.INVALID_GROUP_ID,
            [],
        )

    run(scenario)


def test_last_member_leaving_empties_the_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        (only,) = await harness.form_group(1)
        await harness.leave(only)
        assert harness.state() == "Empty"
        description = harness.coordinator.describe_group(GROUP)
        assert description.members == [] and description.protocol_type == "consumer"

    run(scenario)


def test_session_expiry_removes_the_member_and_triggers_a_rebalance(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        harness.clock.advance(SESSION_TIMEOUT_MS - 1000)
        assert harness.heartbeat(one) is ErrorCode.NONE
        harness.clock.advance(1000)
        await harness.settle()
        assert harness.state() == "PreparingRebalance"
        assert harness.heartbeat(two) is ErrorCode.UNKNOWN_MEMBER_ID
        assert harness.heartbeat(one) is ErrorCode.REBALANCE_IN_PROGRESS
        (alone,) = await _rejoin_all(harness, [one])
        assert alone.generation_id == 2

    run(scenario)


def test_rebalance_timeout_removes_members_that_did_not_rejoin(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        leader = one if one.member_id == one.leader else two
        follower = two if leader is one else one
        # The leader rejoining a Stable group asks for a rebalance.
        rejoin = harness.join(leader.member_id)
        await harness.settle()
        assert not rejoin.done()
        harness.clock.advance(REBALANCE_TIMEOUT_MS)
        await harness.settle()
        result = rejoin.result()
        assert result.generation_id == 2
        assert [m.member_id for m in result.members] == [leader.member_id]
        assert harness.heartbeat(follower) is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        joins = [harness.join(client_id="a"), harness.join(client_id="b")]
        await harness.settle()
        one, two = (task.result() for task in joins)
        leader, follower = (one, two) if one.member_id == one.leader else (two, one)
        leader_sync = await harness.sync(leader, _assignments([one, two]))
        assert leader_sync.error is ErrorCode.NONE
        harness.clock.advance(REBALANCE_TIMEOUT_MS)
        await harness.settle()
        assert harness.state() == "PreparingRebalance"
        assert harness.heartbeat(follower) is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_protocol_is_chosen_by_vote_among_protocols_every_member_supports(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        tasks = [
            harness.join(protocols=[("range", b"r1"), ("roundrobin", b"rr1"), ("sticky", b"s1")]),
            harness.join(protocols=[("roundrobin", b"rr2"), ("range", b"r2")]),
            harness.join(protocols=[("roundrobin", b"rr3"), ("range", b"r3")]),
        ]
        await harness.settle()
        results = [task.result() for task in tasks]
        assert {r.protocol_name for r in results} == {"roundrobin"}
        leader = next(r for r in results if r.member_id == r.leader)
        assert sorted(m.metadata for m in leader.members) == [b"rr1", b"rr2", b"rr3"]

        incompatible = await harness.join(protocols=[("cooperative-sticky", b"c")])
        assert incompatible.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        empty_protocols = await harness.join(group_id="other", protocols=[])
        assert empty_protocols.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    run(scenario)


def test_join_validation_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, max_session_timeout_ms=60_000)
        assert (await harness.join(session_timeout_ms=999)).error is ErrorCode.INVALID_SESSION_TIMEOUT
        assert (await harness.join(session_timeout_ms=60_001)).error is ErrorCode.INVALID_SESSION_TIMEOUT
        assert (await harness.join(group_id="")).error is ErrorCode.INVALID_GROUP_ID
        unknown_group = await harness.join("some-member", group_id="nonexistent")
        assert unknown_group.error is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_a_rebalance_from_empty_waits_for_arrivals_at_any_generation(tmp_path: Path) -> None:
    """Kafka 4's addMemberThenRebalanceOrCompleteJoin: while a rebalance that started from Empty is
    delayed (group.initial.rebalance.delay.ms), each new member extends the delay, whatever the
    generation: every member of a restarted application lands in one generation."""

    async def scenario() -> None:
        harness = Harness(tmp_path, initial_rebalance_delay_ms=100)
        first = harness.join(client_id="old")
        await harness.settle()
        harness.clock.advance(100)
        await harness.settle()
        old = first.result()
        await harness.settle()
        harness.sync(old, {old.member_id: b"p"})
        await harness.settle()
        await harness.leave(old)
        assert harness.state() == "Empty"

        joins = [harness.join(client_id="a")]
        await harness.settle()
        for client in ("b", "c"):
            harness.clock.advance(60)
            await harness.settle()
            joins.append(harness.join(client_id=client))
            await harness.settle()
            harness.clock.advance(40)
            await harness.settle()
            assert not any(join.done() for join in joins), f"the join completed before {client} arrived"
        harness.clock.advance(100)
        await harness.settle()
        results = [join.result() for join in joins]
        assert {r.error for r in results} == {ErrorCode.NONE}
        assert len({r.generation_id for r in results}) == 1 and results[0].generation_id > 1
        leader = next(r for r in results if r.member_id == r.leader)
        assert len(leader.members) == 3

    run(scenario)


def test_a_member_refused_for_the_group_size_does_not_complete_the_join(tmp_path: Path) -> None:
    """classicGroupJoinToClassicGroup: GROUP_MAX_SIZE_REACHED removes the member and answers; the
    join phase then completes on its own timer, even though everyone left has joined."""

    async def scenario() -> None:
        harness = Harness(tmp_path, max_group_size=2)
        one, two = await harness.form_group(2)
        rejoin = harness.join(one.member_id)  # a rebalance, waiting for `two`
        third = harness.join(client_id="third")  # accepted: one member awaits its join so far
        await harness.settle()
        assert harness.state() == "PreparingRebalance"
        # Two members await their join: the group is full for anyone else, `two` included.
        refused = await harness.join(two.member_id)
        assert refused.error is ErrorCode.GROUP_MAX_SIZE_REACHED
        await harness.settle()
        assert not rejoin.done() and not third.done()
        harness.clock.advance(REBALANCE_TIMEOUT_MS)
        await harness.settle()
        members = {m.member_id for m in (rejoin.result().members or third.result().members)}
        assert members == {one.member_id, third.result().member_id}

    run(scenario)


def test_group_max_size(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, max_group_size=1)
        await harness.form_group(1)
        refused = await harness.join(client_id="extra")
        assert refused.error is ErrorCode.GROUP_MAX_SIZE_REACHED
        assert refused.member_id == ""

    run(scenario)


def test_follower_rejoining_stable_group_with_same_metadata_gets_current_generation(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        follower = two if one.member_id == one.leader else one
        again = await harness.join(follower.member_id)
        assert again.error is ErrorCode.NONE
        assert again.generation_id == 1 and again.members == []
        assert harness.state() == "Stable"

    run(scenario)


def test_sync_group_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, _ = await harness.form_group(2)
        assert (await harness.sync(one, generation_id=7)).error is ErrorCode.ILLEGAL_GENERATION
        stranger = JoinGroupResult(ErrorCode.NONE, 1, "consumer", "range", one.leader, "stranger")
        assert (await harness.sync(stranger)).error is ErrorCode.UNKNOWN_MEMBER_ID
        mismatch = await harness.sync(one, protocol_name="roundrobin")
        assert mismatch.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        unknown_group = await harness.coordinator.sync_group(
            group_id="nope",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            protocol_type=None,
            protocol_name=None,
            assignments=[],
        )
        assert unknown_group.error is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_heartbeat_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, _ = await harness.form_group(2)
        assert harness.heartbeat(one) is ErrorCode.NONE
        assert harness.heartbeat(one, generation_id=0) is ErrorCode.ILLEGAL_GENERATION
        stranger = JoinGroupResult(ErrorCode.NONE, 1, "consumer", "range", one.leader, "stranger")
        assert harness.heartbeat(stranger) is ErrorCode.UNKNOWN_MEMBER_ID
        hb = harness.coordinator.heartbeat
        assert hb(group_id="nope", generation_id=1, member_id="m", group_instance_id=None) is (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        assert (
            hb(group_id="", generation_id=1, member_id="m", group_instance_id=None)
            is ErrorCode.INVALID_GROUP_ID
        )

    run(scenario)


def test_static_member_restart_keeps_its_place_and_fences_the_old_instance(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        joins = [harness.join(group_instance_id="instance-a"), harness.join(group_instance_id="instance-b")]
        await harness.settle()
        one, two = (task.result() for task in joins)
        assert one.member_id.startswith("instance-a-")
        leader = one if one.member_id == one.leader else two
        syncs = [
            harness.sync(r, _assignments([one, two]) if r is leader else None, group_instance_id=i)
            for r, i in ((one, "instance-a"), (two, "instance-b"))
        ]
        await harness.settle()
        assert all(task.result().error is ErrorCode.NONE for task in syncs)

        # instance-b restarts and joins without its member id: no rebalance, same generation.
        restarted = await harness.join(group_instance_id="instance-b")
        assert restarted.error is ErrorCode.NONE
        assert restarted.generation_id == 1
        assert restarted.member_id != two.member_id
        assert harness.state() == "Stable"
        synced = await harness.sync(restarted, group_instance_id="instance-b")
        assert synced.assignment == f"assignment-of-{two.member_id}".encode()

        fenced = harness.coordinator.heartbeat(
            group_id=GROUP, generation_id=1, member_id=two.member_id, group_instance_id="instance-b"
        )
        assert fenced is ErrorCode.FENCED_INSTANCE_ID
        _, left = harness.coordinator.leave_group(group_id=GROUP, members=[("", "instance-b")])
        assert left[0].error is ErrorCode.NONE
        assert harness.state() == "PreparingRebalance"

    run(scenario)


# -- offsets -----------------------------------------------------------------------------------------------


def test_commit_and_fetch_offsets_of_a_stable_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, _ = await harness.form_group(2)
        offsets = {("orders", 0): (42, 3, "meta"), ("orders", 1): (7, -1, None)}
        assert harness.commit(offsets, generation_id=1, member_id=one.member_id) == dict.fromkeys(
            offsets, ErrorCode.NONE
        )
        assert harness.fetch([("orders", 0), ("orders", 1), ("orders", 2)]) == {
            ("orders", 0): FetchedOffset(42, 3, "meta", ErrorCode.NONE),
            ("orders", 1): FetchedOffset(7, -1, "", ErrorCode.NONE),
            ("orders", 2): NO_OFFSET,
        }
        assert set(harness.fetch(None)) == {("orders", 0), ("orders", 1)}
        assert harness.coordinator.fetch_offsets("unknown", [("t", 0)], require_stable=True) == {
            ("t", 0): NO_OFFSET
        }
        assert harness.coordinator.fetch_offsets("unknown", None, require_stable=False) == {}

    run(scenario)


def test_commit_rejections_from_non_members_and_stale_generations(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        tp = ("orders", 0)
        assert harness.commit({tp: (1, -1, "")}, generation_id=0, member_id=one.member_id) == {
            tp: ErrorCode.ILLEGAL_GENERATION
        }
        assert harness.commit({tp: (1, -1, "")}, generation_id=1, member_id="stranger") == {
            tp: ErrorCode.UNKNOWN_MEMBER_ID
        }
        # A "simple" commit (generation -1, no member) is refused while the group has members.
        assert harness.commit({tp: (1, -1, "")}) == {tp: ErrorCode.UNKNOWN_MEMBER_ID}

        # During CompletingRebalance members must finish the rebalance first.
        tasks = [harness.join(one.member_id), harness.join(two.member_id)]
        await harness.settle()
        rejoined = tasks[0].result()
        assert harness.state() == "CompletingRebalance"
        assert harness.commit(
            {tp: (1, -1, "")}, generation_id=rejoined.generation_id, member_id=one.member_id
        ) == {tp: ErrorCode.REBALANCE_IN_PROGRESS}
        assert harness.fetch([tp]) == {tp: NO_OFFSET}

    run(scenario)


def test_simple_commits_without_group_management(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        tp = ("t", 0)
        # Unknown group and a positive generation: a stale member of a vanished group.
        assert harness.commit({tp: (1, -1, "")}, generation_id=3, member_id="m") == {
            tp: ErrorCode.ILLEGAL_GENERATION
        }
        assert harness.coordinator.list_groups() == []
        # assign()-style consumers commit with generation -1 and create an Empty group.
        assert harness.commit({tp: (10, -1, "")}) == {tp: ErrorCode.NONE}
        assert harness.coordinator.list_groups() == [(GROUP, "", "Empty")]
        assert harness.commit({tp: (11, -1, "")}, member_id="anything") == {tp: ErrorCode.NONE}
        assert harness.fetch([tp])[tp].offset == 11
        # The empty group id is legal for OffsetCommit/OffsetFetch, as in Kafka.
        result = harness.coordinator.commit_offsets(
            group_id="", generation_id=-1, member_id="", group_instance_id=None, offsets={tp: (5, -1, "")}
        )
        assert result == {tp: ErrorCode.NONE}
        assert harness.coordinator.fetch_offsets("", [tp], require_stable=False)[tp].offset == 5

    run(scenario)


def test_oversized_metadata_is_refused_per_partition(tmp_path: Path) -> None:
    harness = Harness(tmp_path, max_offset_metadata_bytes=8)
    result = harness.commit({("t", 0): (1, -1, "12345678"), ("t", 1): (1, -1, "123456789")})
    assert result == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    assert harness.fetch([("t", 1)]) == {("t", 1): NO_OFFSET}


def test_a_stable_group_survives_a_restart_with_its_members_and_their_assignments(tmp_path: Path) -> None:
    """As Kafka's coordinator loads a group from its last GroupMetadataValue: Stable, the same members,
    generation, leader and assignments; members heartbeat and commit on without a rebalance."""

    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        harness.commit({("t", 0): (100, 5, "m")}, generation_id=1, member_id=one.member_id)
        harness.commit(
            {("t", 0): (200, 6, "n"), ("t", 1): (50, -1, "")}, generation_id=1, member_id=one.member_id
        )
        before = harness.coordinator.describe_group(GROUP)
        harness.restart()
        assert harness.fetch(None) == {
            ("t", 0): FetchedOffset(200, 6, "n", ErrorCode.NONE),
            ("t", 1): FetchedOffset(50, -1, "", ErrorCode.NONE),
        }
        assert harness.coordinator.list_groups() == [(GROUP, "consumer", "Stable")]
        assert harness.coordinator.describe_group(GROUP) == before
        assert {m.assignment for m in before.members} == {
            f"assignment-of-{r.member_id}".encode() for r in (one, two)
        }
        assert harness.heartbeat(one) is ErrorCode.NONE
        assert harness.heartbeat(two) is ErrorCode.NONE
        assert harness.commit({("t", 0): (300, -1, "")}, generation_id=1, member_id=two.member_id) == {
            ("t", 0): ErrorCode.NONE
        }
        # A member that asks for its assignment again gets the one it had.
        synced = await harness.sync(two)
        assert synced.assignment == f"assignment-of-{two.member_id}".encode()
        assert harness.state() == "Stable"

    run(scenario)


def test_restored_members_sessions_start_over_and_expire_if_nobody_heartbeats(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        harness.clock.advance(SESSION_TIMEOUT_MS - 1)
        harness.restart()
        # Sessions restart at load (Kafka's onLoaded), so the time before the restart does not count.
        harness.clock.advance(SESSION_TIMEOUT_MS - 1)
        assert harness.heartbeat(one) is ErrorCode.NONE
        await harness.settle()
        assert harness.state() == "Stable"
        harness.clock.advance(2)
        await harness.settle()
        # `two` never heartbeat after the restart: its session expired and the group rebalances.
        assert harness.state() == "PreparingRebalance"
        assert harness.heartbeat(one) is ErrorCode.REBALANCE_IN_PROGRESS
        assert harness.heartbeat(two) is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_a_restart_during_a_rebalance_restores_the_last_generation_with_an_assignment(tmp_path: Path) -> None:
    """Kafka writes a generation with members only with its assignment (the leader's SyncGroup): a
    rebalance cut short by a restart leaves the previous generation, whose members must rejoin."""

    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        rejoins = [harness.join(one.member_id), harness.join(two.member_id)]
        await harness.settle()
        second = [task.result() for task in rejoins]
        assert {r.generation_id for r in second} == {2}
        assert harness.state() == "CompletingRebalance"
        harness.restart()
        assert harness.state() == "Stable"
        assert harness.coordinator.describe_group(GROUP).members[0].assignment.startswith(b"assignment-of-")
        assert harness.heartbeat(second[0]) is ErrorCode.ILLEGAL_GENERATION
        assert (await harness.sync(second[0])).error is ErrorCode.ILLEGAL_GENERATION
        third = await _rejoin_all(harness, [one, two])
        assert {r.generation_id for r in third} == {2}

    run(scenario)


def test_an_empty_group_survives_a_restart_empty_with_its_generation(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        (one,) = await harness.form_group(1)
        await harness.leave(one)
        assert harness.state() == "Empty"
        harness.restart()
        assert harness.coordinator.list_groups() == [(GROUP, "consumer", "Empty")]
        assert harness.heartbeat(one) is ErrorCode.UNKNOWN_MEMBER_ID
        (rejoined,) = await harness.form_group(1)
        assert rejoined.generation_id == 3  # 1 with the member, 2 empty, 3 now

    run(scenario)


def test_a_journal_written_before_members_were_kept_restores_its_groups_empty(tmp_path: Path) -> None:
    with Journal(tmp_path / "groups.journal") as journal:
        journal.append(
            {
                "type": "group_metadata",
                "group": GROUP,
                "generation": 4,
                "protocol_type": "consumer",
                "protocol": "range",
                "empty_since_ms": None,
            }
        )

    async def scenario() -> None:
        harness = Harness(tmp_path)
        assert harness.coordinator.list_groups() == [(GROUP, "consumer", "Empty")]
        assert harness.coordinator.describe_group(GROUP).members == []
        (joined,) = await harness.form_group(1)
        assert joined.generation_id == 5

    run(scenario)


def test_static_member_replacement_survives_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        joining = harness.join(group_instance_id="instance-a")
        await harness.settle()
        first = joining.result()
        await harness.sync(first, {first.member_id: b"partitions"}, group_instance_id="instance-a")
        replaced = await harness.join(group_instance_id="instance-a")
        assert replaced.error is ErrorCode.NONE and replaced.member_id != first.member_id
        harness.restart()
        (member,) = harness.coordinator.describe_group(GROUP).members
        assert (member.member_id, member.group_instance_id, member.assignment) == (
            replaced.member_id,
            "instance-a",
            b"partitions",
        )
        fenced = harness.coordinator.heartbeat(
            group_id=GROUP, generation_id=1, member_id=first.member_id, group_instance_id="instance-a"
        )
        assert fenced is ErrorCode.FENCED_INSTANCE_ID

    run(scenario)


def test_an_assignment_that_cannot_be_journaled_is_handed_to_nobody_and_the_group_rebalances(
    tmp_path: Path,
) -> None:
    """Kafka's SyncGroup when the group's record cannot be appended (a storage error): every member
    gets NOT_COORDINATOR instead of an assignment a restart would not restore, and the group goes
    back to PreparingRebalance."""

    async def scenario() -> None:
        harness = Harness(tmp_path)
        joins = [harness.join(client_id="c1"), harness.join(client_id="c2")]
        await harness.settle()
        one, two = (task.result() for task in joins)
        leader, follower = (one, two) if one.member_id == one.leader else (two, one)
        waiting = harness.sync(follower)
        await harness.settle()
        harness.journal.failing = True
        answered = await harness.sync(leader, _assignments([one, two]))
        assert answered.error is ErrorCode.NOT_COORDINATOR
        assert (await waiting).error is ErrorCode.NOT_COORDINATOR
        assert harness.state() == "PreparingRebalance"
        assert {m.assignment for m in harness.coordinator.describe_group(GROUP).members} == {b""}
        harness.journal.failing = False
        third = await _rejoin_all(harness, [one, two])
        assert {r.generation_id for r in third} == {2}

    run(scenario)


def test_a_static_member_replacement_that_cannot_be_journaled_keeps_the_old_member_id(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        joining = harness.join(group_instance_id="instance-a")
        await harness.settle()
        first = joining.result()
        await harness.sync(first, {first.member_id: b"partitions"}, group_instance_id="instance-a")
        harness.journal.failing = True
        refused = await harness.join(group_instance_id="instance-a", session_timeout_ms=20_000)
        assert (refused.error, refused.member_id) == (ErrorCode.NOT_COORDINATOR, "")
        assert refused.generation_id == 1
        harness.journal.failing = False
        (member,) = harness.coordinator.describe_group(GROUP).members
        assert member.member_id == first.member_id
        assert harness.state() == "Stable"
        kept = harness.coordinator.heartbeat(
            group_id=GROUP, generation_id=1, member_id=first.member_id, group_instance_id="instance-a"
        )
        assert kept is ErrorCode.NONE
        # The old session timeout is back: the member expires after 10 s without heartbeats, not 20 s.
        harness.clock.advance(SESSION_TIMEOUT_MS + 1)
        await harness.settle()
        assert harness.state() != "Stable"

    run(scenario)


def test_offset_operations_that_cannot_be_journaled_answer_not_coordinator(tmp_path: Path) -> None:
    """Kafka's CoordinatorOperationExceptionHelper: a storage error becomes NOT_COORDINATOR, and
    nothing changes."""
    harness = Harness(tmp_path)
    harness.commit({("t", 0): (5, -1, "")})
    harness.journal.failing = True
    assert harness.commit({("t", 0): (9, -1, "")}) == {("t", 0): ErrorCode.NOT_COORDINATOR}
    assert harness.coordinator.delete_offsets(GROUP, [("t", [0])]) == (ErrorCode.NOT_COORDINATOR, [])
    assert harness.coordinator.delete_groups([GROUP]) == {GROUP: ErrorCode.NOT_COORDINATOR}
    harness.journal.failing = False
    assert harness.fetch([("t", 0)])[("t", 0)].offset == 5
    harness.restart()
    assert harness.fetch([("t", 0)])[("t", 0)].offset == 5


def test_an_empty_generation_that_cannot_be_journaled_still_leaves_the_group_empty(tmp_path: Path) -> None:
    """Kafka only warns when the empty group's record fails: a restart brings back the last generation
    written, whose members then time out."""

    async def scenario() -> None:
        harness = Harness(tmp_path)
        (one,) = await harness.form_group(1)
        harness.journal.failing = True
        await harness.leave(one)
        assert harness.state() == "Empty"
        harness.journal.failing = False
        harness.restart()
        assert harness.state() == "Stable"
        harness.clock.advance(SESSION_TIMEOUT_MS + 1)
        await harness.settle()
        assert harness.state() == "Empty"

    run(scenario)


def test_a_generation_whose_assignment_was_not_journaled_is_not_restored(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        rejoins = [harness.join(one.member_id), harness.join(two.member_id)]
        await harness.settle()
        second = [task.result() for task in rejoins]
        leader = next(r for r in second if r.member_id == r.leader)
        harness.journal.failing = True
        assert (await harness.sync(leader, _assignments(second))).error is ErrorCode.NOT_COORDINATOR
        harness.journal.failing = False
        harness.restart()
        assert harness.coordinator.describe_group(GROUP).state == "Stable"
        assert harness.heartbeat(one) is ErrorCode.NONE  # generation 1, the last one journaled
        assert harness.heartbeat(second[0]) is ErrorCode.ILLEGAL_GENERATION

    run(scenario)


def test_a_group_restored_above_group_max_size_rebalances(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, _ = await harness.form_group(2)
        harness.config = dataclasses.replace(harness.config, max_group_size=1)
        harness.restart()
        assert harness.state() == "PreparingRebalance"
        assert harness.heartbeat(one) is ErrorCode.REBALANCE_IN_PROGRESS

    run(scenario)


def test_journal_compaction_during_a_rebalance_keeps_the_last_journaled_generation(tmp_path: Path) -> None:
    """Compaction keeps the group's last metadata entry as it was written, as Kafka's log compaction
    keeps a group's last record: not the state of a rebalance that has written nothing yet."""

    async def scenario() -> None:
        harness = Harness(tmp_path, journal_compaction_min_entries=10)
        one, two = await harness.form_group(2)
        rejoins = [harness.join(one.member_id), harness.join(two.member_id)]
        await harness.settle()
        assert harness.state() == "CompletingRebalance"
        for offset in range(50):  # a simple group's commits, accepted while this group rebalances
            harness.coordinator.commit_offsets(
                group_id="other",
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                offsets={("t", 0): (offset, -1, "")},
            )
        assert harness.journal.appended_since_rewrite < 50, "the journal should have been compacted"
        harness.restart()
        assert harness.state() == "Stable"
        assert harness.heartbeat(one) is ErrorCode.NONE
        assert harness.heartbeat(rejoins[0].result()) is ErrorCode.ILLEGAL_GENERATION

    run(scenario)


def test_a_group_created_by_joingroup_exists_after_a_restart_even_before_its_first_rebalance(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, initial_rebalance_delay_ms=10_000)
        parked = harness.join()
        await harness.settle()
        assert not parked.done()
        harness.restart()
        assert (await parked).error is ErrorCode.NOT_COORDINATOR
        assert harness.coordinator.list_groups() == [(GROUP, "", "Empty")]

        harness.journal.failing = True
        refused = await harness.join(group_id="new-group")
        assert refused.error is ErrorCode.NOT_COORDINATOR
        assert [g.group_id for g in harness.coordinator.list_groups()] == [GROUP]

    run(scenario)


def test_journal_compaction_keeps_the_members(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, journal_compaction_min_entries=10)
        one, two = await harness.form_group(2)
        for offset in range(50):
            harness.commit({("t", 0): (offset, -1, "")}, generation_id=1, member_id=one.member_id)
        assert harness.journal.appended_since_rewrite < 50, "the journal should have been compacted"
        before = harness.coordinator.describe_group(GROUP)
        harness.restart()
        assert harness.coordinator.describe_group(GROUP) == before
        assert harness.heartbeat(two) is ErrorCode.NONE

    run(scenario)


# -- transactional offsets ---------------------------------------------------------------------------------


def test_transactional_offsets_are_invisible_until_committed(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    coordinator = harness.coordinator
    tp = ("t", 0)
    harness.commit({tp: (10, -1, "")})
    staged = coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=7, offsets={tp: (20, 1, "txn")}
    )
    assert staged == {tp: ErrorCode.NONE}
    assert harness.fetch([tp]) == {tp: FetchedOffset(10, -1, "", ErrorCode.NONE)}
    assert harness.fetch([tp], require_stable=True) == {
        tp: FetchedOffset(-1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
    }
    assert harness.fetch([("t", 1)], require_stable=True) == {("t", 1): NO_OFFSET}
    assert coordinator.pending_transaction_groups(7) == [GROUP]

    coordinator.complete_transaction(group_id=GROUP, producer_id=7, commit=True)
    assert harness.fetch([tp], require_stable=True) == {tp: FetchedOffset(20, 1, "txn", ErrorCode.NONE)}
    assert coordinator.pending_transaction_groups(7) == []

    coordinator.stage_transactional_offsets(group_id=GROUP, producer_id=7, offsets={tp: (30, 1, "")})
    coordinator.complete_transaction(group_id=GROUP, producer_id=7, commit=False)
    assert harness.fetch([tp], require_stable=True) == {tp: FetchedOffset(20, 1, "txn", ErrorCode.NONE)}
    # Completing again (e.g. a retried marker) is a no-op.
    coordinator.complete_transaction(group_id=GROUP, producer_id=7, commit=True)
    assert harness.fetch([tp])[tp].offset == 20


def test_plain_commit_made_after_staging_wins_over_the_committed_transaction(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    tp = ("t", 0)
    harness.coordinator.stage_transactional_offsets(group_id=GROUP, producer_id=1, offsets={tp: (20, -1, "")})
    harness.commit({tp: (25, -1, "")})
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=1, commit=True)
    assert harness.fetch([tp])[tp].offset == 25


def test_pending_transactional_offsets_survive_restart_and_so_does_the_outcome(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    committed_tp, aborted_tp = ("t", 0), ("t", 1)
    harness.coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=1, offsets={committed_tp: (5, -1, "a")}
    )
    harness.coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=2, offsets={aborted_tp: (9, -1, "")}
    )
    harness.restart()
    assert harness.fetch([committed_tp, aborted_tp], require_stable=True) == {
        committed_tp: FetchedOffset(-1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
        aborted_tp: FetchedOffset(-1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
    }
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=1, commit=True)
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=2, commit=False)
    harness.restart()
    assert harness.fetch([committed_tp, aborted_tp], require_stable=True) == {
        committed_tp: FetchedOffset(5, -1, "a", ErrorCode.NONE),
        aborted_tp: NO_OFFSET,
    }


def test_offsets_of_deleted_partitions_are_forgotten_for_good(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    deleted, kept = ("gone", 0), ("t", 0)
    harness.commit({deleted: (5, -1, ""), kept: (7, -1, "")})
    harness.coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=3, offsets={deleted: (6, -1, "")}
    )
    harness.coordinator.commit_offsets(
        group_id="only-gone",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets={("gone", 1): (2, -1, "")},
    )

    harness.coordinator.on_partitions_deleted([deleted, ("gone", 1)])
    assert harness.fetch([deleted, kept], require_stable=True) == {
        deleted: NO_OFFSET,  # neither the committed nor the pending transactional offset
        kept: FetchedOffset(7, -1, "", ErrorCode.NONE),
    }
    # An Empty group left without offsets stays until the next expiry round, as in Kafka 4
    # (OffsetMetadataManager.onTopicsDeleted writes offset tombstones only), then goes.
    assert [listed.group_id for listed in harness.coordinator.list_groups()] == [GROUP, "only-gone"]
    harness.clock.advance(600_000)
    harness.coordinator.expire_sessions()
    assert [listed.group_id for listed in harness.coordinator.list_groups()] == [GROUP]
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=3, commit=True)
    assert harness.fetch([deleted]) == {deleted: NO_OFFSET}

    harness.restart()
    assert harness.fetch([deleted, kept]) == {
        deleted: NO_OFFSET,
        kept: FetchedOffset(7, -1, "", ErrorCode.NONE),
    }
    assert [listed.group_id for listed in harness.coordinator.list_groups()] == [GROUP]


def test_txn_offset_commit_member_fencing(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, _ = await harness.form_group(2)
        validate = harness.coordinator.validate_txn_offset_commit_member
        assert validate(group_id=GROUP, generation_id=1, member_id=one.member_id, group_instance_id=None) is (
            ErrorCode.NONE
        )
        assert (
            validate(group_id=GROUP, generation_id=-1, member_id="", group_instance_id=None) is ErrorCode.NONE
        )
        assert validate(group_id=GROUP, generation_id=0, member_id=one.member_id, group_instance_id=None) is (
            ErrorCode.ILLEGAL_GENERATION
        )
        assert validate(group_id=GROUP, generation_id=1, member_id="zombie", group_instance_id=None) is (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        assert (
            validate(group_id="fresh", generation_id=-1, member_id="", group_instance_id=None)
            is ErrorCode.NONE
        )
        assert validate(group_id="fresh", generation_id=4, member_id="m", group_instance_id=None) is (
            ErrorCode.UNKNOWN_MEMBER_ID
        )

    run(scenario)


# -- administration, compaction, retention, shutdown -------------------------------------------------------


def test_list_and_describe_groups(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        one, two = await harness.form_group(2)
        harness.coordinator.commit_offsets(
            group_id="offsets-only",
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets={("t", 0): (1, -1, "")},
        )
        listed = harness.coordinator.list_groups()
        assert sorted(listed) == [(GROUP, "consumer", "Stable"), ("offsets-only", "", "Empty")]
        assert harness.coordinator.list_groups(["stable"]) == [(GROUP, "consumer", "Stable")]
        assert harness.coordinator.list_groups(["Empty", "Dead"]) == [("offsets-only", "", "Empty")]
        assert harness.coordinator.list_groups([]) == listed

        description = harness.coordinator.describe_group(GROUP)
        assert (description.error, description.state, description.protocol_type, description.protocol) == (
            ErrorCode.NONE,
            "Stable",
            "consumer",
            "range",
        )
        by_id = {m.member_id: m for m in description.members}
        assert set(by_id) == {one.member_id, two.member_id}
        member = by_id[one.member_id]
        assert (member.client_id, member.client_host, member.metadata) == (
            "client-0",
            "/127.0.0.1",
            b"range-metadata",
        )
        assert member.assignment == f"assignment-of-{one.member_id}".encode()

        missing = harness.coordinator.describe_group("missing")
        assert (missing.error, missing.state, missing.members) == (ErrorCode.NONE, "Dead", [])

        # Outside Stable the protocol and member metadata are not reported.
        harness.join(one.member_id)
        await harness.settle()
        preparing = harness.coordinator.describe_group(GROUP)
        assert preparing.state == "PreparingRebalance" and preparing.protocol == ""
        assert {m.metadata for m in preparing.members} == {b""}

    run(scenario)


def test_delete_groups(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path)
        await harness.form_group(1)
        harness.coordinator.commit_offsets(
            group_id="idle",
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets={("t", 0): (3, -1, "")},
        )
        results = harness.coordinator.delete_groups([GROUP, "idle", "missing"])
        assert results == {
            GROUP: ErrorCode.NON_EMPTY_GROUP,
            "idle": ErrorCode.NONE,
            "missing": ErrorCode.GROUP_ID_NOT_FOUND,
        }
        assert harness.coordinator.fetch_offsets("idle", [("t", 0)], require_stable=False) == {
            ("t", 0): NO_OFFSET
        }
        assert harness.coordinator.describe_group("idle").state == "Dead"
        harness.restart()
        assert harness.coordinator.fetch_offsets("idle", None, require_stable=False) == {}
        assert [g.group_id for g in harness.coordinator.list_groups()] == [GROUP]

    run(scenario)


def test_journal_is_compacted_and_keeps_latest_offsets_and_pending_transactions(tmp_path: Path) -> None:
    harness = Harness(tmp_path, journal_compaction_min_entries=10)
    harness.coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=3, offsets={("t", 1): (77, -1, "")}
    )
    for offset in range(100):
        harness.commit({("t", 0): (offset, -1, f"v{offset}")})
    journal_size = (tmp_path / "groups.journal").stat().st_size
    assert journal_size < 2000, "100 commits should have been compacted away"
    harness.restart()
    assert harness.fetch([("t", 0)]) == {("t", 0): FetchedOffset(99, -1, "v99", ErrorCode.NONE)}
    assert harness.fetch([("t", 1)], require_stable=True)[("t", 1)].error is ErrorCode.UNSTABLE_OFFSET_COMMIT
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=3, commit=True)
    assert harness.fetch([("t", 1)])[("t", 1)].offset == 77


def test_offsets_of_a_simple_group_expire_after_retention_and_the_group_goes_away(tmp_path: Path) -> None:
    harness = Harness(tmp_path, offsets_retention_ms=60_000, offsets_retention_check_interval_ms=1_000)
    harness.commit({("t", 0): (1, -1, "")})
    harness.clock.advance(30_000)
    harness.commit({("t", 1): (1, -1, "")})
    harness.clock.advance(30_000)
    harness.coordinator.expire_sessions()
    assert set(harness.fetch(None)) == {("t", 1)}
    harness.clock.advance(30_000)
    harness.coordinator.expire_sessions()
    assert harness.coordinator.list_groups() == []
    harness.restart()
    assert harness.coordinator.list_groups() == []


def test_an_offset_committed_with_a_retention_time_expires_then_whatever_the_broker_retention(
    tmp_path: Path,
) -> None:
    """OffsetCommit v2-v4's retention_time_ms (Kafka's expireTimestampMs and
    OffsetExpirationConditionImpl): such an offset expires that long after its commit, sooner or
    later than offsets.retention.ms; -1 keeps the broker's retention. It survives a restart."""
    harness = Harness(tmp_path, offsets_retention_ms=60_000, offsets_retention_check_interval_ms=1_000)
    harness.commit({("t", 0): (1, -1, "")}, retention_time_ms=10_000)
    harness.commit({("t", 1): (2, -1, "")}, retention_time_ms=120_000)
    harness.commit({("t", 2): (3, -1, "")})
    harness.restart()
    harness.clock.advance(10_000)
    harness.coordinator.expire_sessions()
    assert set(harness.fetch(None)) == {("t", 1), ("t", 2)}
    harness.clock.advance(50_000)
    harness.coordinator.expire_sessions()
    assert set(harness.fetch(None)) == {("t", 1)}
    harness.clock.advance(60_000)
    harness.coordinator.expire_sessions()
    assert harness.coordinator.list_groups() == []


def test_an_offset_with_a_pending_transactional_offset_outlives_its_retention(tmp_path: Path) -> None:
    """OffsetMetadataManager.cleanupExpiredOffsets: an expired offset whose partition has a pending
    transactional offset stays until the transaction ends."""
    harness = Harness(tmp_path, offsets_retention_ms=60_000, offsets_retention_check_interval_ms=1_000)
    harness.commit({("t", 0): (5, -1, ""), ("t", 1): (6, -1, "")})
    harness.coordinator.stage_transactional_offsets(
        group_id=GROUP, producer_id=3, offsets={("t", 0): (9, -1, "")}
    )
    harness.clock.advance(61_000)
    harness.coordinator.expire_sessions()
    assert harness.fetch([("t", 0), ("t", 1)]) == {
        ("t", 0): FetchedOffset(5, -1, "", ErrorCode.NONE),
        ("t", 1): NO_OFFSET,
    }
    harness.coordinator.complete_transaction(group_id=GROUP, producer_id=3, commit=True)
    assert harness.fetch([("t", 0)])[("t", 0)].offset == 9


def test_shutdown_answers_parked_requests_and_refuses_new_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, initial_rebalance_delay_ms=10_000)
        parked = harness.join()
        await harness.settle()
        assert not parked.done()
        harness.coordinator.shutdown()
        assert (await parked).error is ErrorCode.NOT_COORDINATOR
        assert (await harness.join()).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert harness.commit({("t", 0): (1, -1, "")}) == {("t", 0): ErrorCode.COORDINATOR_NOT_AVAILABLE}
        with pytest.raises(BrokerError) as caught:
            harness.fetch(None)
        assert caught.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        with pytest.raises(BrokerError):
            harness.coordinator.list_groups()

    run(scenario)


def _subscription(*topics: str) -> bytes:
    """A consumer protocol Subscription v0 of ``topics``, as a member's join metadata."""
    body = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        body += struct.pack(">h", len(topic)) + topic.encode()
    return body + struct.pack(">i", -1)  # null user data


def test_consumer_subscription_parsing_limits_expiry_of_a_stable_group_to_unsubscribed_topics(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        harness = Harness(tmp_path, offsets_retention_ms=60_000, offsets_retention_check_interval_ms=1_000)
        join = harness.join(protocols=[("range", _subscription("orders"))], session_timeout_ms=600_000)
        await harness.settle()
        member = join.result()
        await harness.sync(member, {member.member_id: b""})
        harness.commit(
            {("orders", 0): (1, -1, ""), ("old-topic", 0): (1, -1, "")},
            generation_id=1,
            member_id=member.member_id,
        )
        harness.clock.advance(60_000)
        harness.coordinator.expire_sessions()
        assert set(harness.fetch(None)) == {("orders", 0)}

    run(scenario)


def test_offset_delete_spares_subscribed_topics_and_refuses_busy_groups(tmp_path: Path) -> None:
    """OffsetDelete as Kafka 4's OffsetMetadataManager.deleteOffsets: partitions of subscribed topics
    are GROUP_SUBSCRIBED_TO_TOPIC, the rest lose their committed and pending transactional offsets,
    durably; a busy group of another protocol is NON_EMPTY_GROUP; the group itself stays."""

    async def scenario() -> None:
        harness = Harness(tmp_path)
        join = harness.join(protocols=[("range", _subscription("orders"))], session_timeout_ms=600_000)
        await harness.settle()
        member = join.result()
        await harness.sync(member, {member.member_id: b""})
        harness.commit(
            {("orders", 0): (5, -1, ""), ("old", 0): (7, -1, ""), ("old", 1): (8, -1, "")},
            generation_id=1,
            member_id=member.member_id,
        )
        harness.coordinator.stage_transactional_offsets(
            group_id=GROUP, producer_id=4, offsets={("staged", 0): (9, -1, "")}
        )
        error, answers = harness.coordinator.delete_offsets(
            GROUP, [("orders", [0]), ("old", [0, 3]), ("staged", [0])]
        )
        assert error is ErrorCode.NONE
        assert answers == [
            ("orders", [(0, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)]),
            ("old", [(0, ErrorCode.NONE), (3, ErrorCode.NONE)]),  # 3 had no offset: no error either
            ("staged", [(0, ErrorCode.NONE)]),
        ]
        harness.coordinator.complete_transaction(group_id=GROUP, producer_id=4, commit=True)
        assert set(harness.fetch(None)) == {("orders", 0), ("old", 1)}
        harness.restart()
        assert set(harness.fetch(None)) == {("orders", 0), ("old", 1)}
        # Restored with its member, the group still subscribes to what the member's subscription names.
        assert harness.coordinator.delete_offsets(GROUP, [("orders", [0])]) == (
            ErrorCode.NONE,
            [("orders", [(0, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)])],
        )
        await harness.leave(member)
        assert harness.coordinator.delete_offsets(GROUP, [("orders", [0])]) == (
            ErrorCode.NONE,
            [("orders", [(0, ErrorCode.NONE)])],
        )
        assert set(harness.fetch(None)) == {("old", 1)}
        assert harness.coordinator.delete_offsets("", [("old", [1])])[0] is ErrorCode.INVALID_GROUP_ID
        assert harness.coordinator.delete_offsets("nobody", [("old", [1])])[0] is ErrorCode.GROUP_ID_NOT_FOUND

        (tmp_path / "other").mkdir()
        other = Harness(tmp_path / "other")
        busy = other.join(protocol_type="connect", protocols=[("default", b"")], session_timeout_ms=600_000)
        await other.settle()
        await other.sync(busy.result(), {busy.result().member_id: b""}, protocol_type="connect")
        assert other.coordinator.delete_offsets(GROUP, [("old", [0])]) == (ErrorCode.NON_EMPTY_GROUP, [])

    run(scenario)


def test_group_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="min_session_timeout_ms"):
        GroupConfig(min_session_timeout_ms=10, max_session_timeout_ms=5)
    with pytest.raises(ValueError, match="max_group_size"):
        GroupConfig(max_group_size=0)


def test_timers_fire_on_their_own_with_the_real_clock(tmp_path: Path) -> None:
    """Nobody calls expire_sessions here: the coordinator's own event-loop timer drives the deadlines."""

    async def scenario() -> None:
        config = GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=100)
        coordinator = GroupCoordinator(Journal(tmp_path / "groups.journal"), config)

        async def join(member_id: str = "") -> JoinGroupResult:
            return await coordinator.join_group(
                group_id=GROUP,
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=PROTOCOLS,
                session_timeout_ms=150,
                rebalance_timeout_ms=1_000,
                client_id="c",
                client_host="/127.0.0.1",
                require_known_member_id=False,
            )

        loop = asyncio.get_running_loop()
        started = loop.time()
        one, two = await asyncio.wait_for(asyncio.gather(join(), join()), timeout=2)
        assert loop.time() - started >= 0.05  # the initial rebalance delay was honoured
        assert one.generation_id == two.generation_id == 1
        leader = one if one.member_id == one.leader else two
        syncs = [
            coordinator.sync_group(
                group_id=GROUP,
                generation_id=1,
                member_id=member.member_id,
                group_instance_id=None,
                protocol_type=None,
                protocol_name=None,
                assignments=[(one.member_id, b"a"), (two.member_id, b"b")] if member is leader else [],
            )
            for member in (one, two)
        ]
        await asyncio.wait_for(asyncio.gather(*syncs), timeout=2)
        # Neither member heartbeats: both sessions expire and the group empties by itself.
        deadline = loop.time() + 2
        while coordinator.describe_group(GROUP).state != "Empty":
            assert loop.time() < deadline, coordinator.describe_group(GROUP)
            await asyncio.sleep(0.02)
        coordinator.shutdown()

    run(scenario)
