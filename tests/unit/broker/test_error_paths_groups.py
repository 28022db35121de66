"""Error paths of sparkafka.broker.groups: GroupConfig values it refuses, consumer subscriptions it
cannot read, and journal entries that cannot be applied when the coordinator replays its journal."""

from __future__ import annotations

import base64
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker.group_metadata import GroupConfig, parse_subscription_topics
from sparkafka.broker.groups import GroupCoordinator
from sparkafka.broker.journal import Journal, JournalError


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"initial_rebalance_delay_ms": -1}, "GroupConfig.initial_rebalance_delay_ms must be >= 0, got -1"),
        ({"max_offset_metadata_bytes": -4}, "GroupConfig.max_offset_metadata_bytes must be >= 0, got -4"),
        ({"max_group_size": 0}, "GroupConfig.max_group_size must be >= 1, got 0"),
        (
            {"journal_compaction_min_entries": 0},
            "GroupConfig.journal_compaction_min_entries must be >= 1, got 0",
        ),
    ],
)
def test_a_group_config_out_of_range_is_refused_naming_the_setting(
    setting: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        GroupConfig(**setting)


# ---- consumer subscriptions (ConsumerProtocolSubscription: version, topic count, topic names)


def subscription(count: int, *names: bytes, length: int | None = None) -> bytes:
    data = struct.pack(">hi", 0, count)
    for name in names:
        data += struct.pack(">h", len(name) if length is None else length) + name
    return data


def test_a_subscription_with_a_negative_topic_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^negative topic count -1$"):
        parse_subscription_topics(subscription(-1))


def test_a_subscription_topic_name_running_past_the_metadata_is_refused() -> None:
    assert parse_subscription_topics(subscription(1, b"orders")) == ["orders"]
    with pytest.raises(ValueError, match=r"^topic name length 40 runs past the metadata$"):
        parse_subscription_topics(subscription(1, b"orders", length=40))


# ---- journal replay


def member_row(member_id: str) -> dict[str, Any]:
    return {
        "member_id": member_id,
        "group_instance_id": None,
        "client_id": "client",
        "client_host": "/127.0.0.1",
        "rebalance_timeout_ms": 30_000,
        "session_timeout_ms": 10_000,
        "subscription": base64.b64encode(subscription(1, b"orders")).decode(),
        "assignment": "",
    }


def group_metadata(**fields: Any) -> dict[str, Any]:
    entry = {
        "type": "group_metadata",
        "group": "g",
        "generation": 3,
        "protocol_type": "consumer",
        "protocol": "range",
        "empty_since_ms": None,
        "leader": "m-1",
        "members": [member_row("m-1")],
    }
    return entry | fields


def replay(tmp_path: Path, entry: dict[str, Any]) -> None:
    path = tmp_path / "groups.journal"
    with Journal(path) as journal:
        journal.append(entry)
    with Journal(path) as journal:
        GroupCoordinator(journal, GroupConfig())


def test_a_stored_group_is_restored_with_its_members(tmp_path: Path) -> None:
    path = tmp_path / "groups.journal"
    with Journal(path) as journal:
        journal.append(group_metadata())
    with Journal(path) as journal:
        coordinator = GroupCoordinator(journal, GroupConfig())
        assert [member.member_id for member in coordinator.describe_group("g").members] == ["m-1"]


@pytest.mark.parametrize(
    ("entry", "cause"),
    [
        (
            {"type": "offsets_expired", "group": 5, "partitions": []},
            "TypeError: group id must be a string, got 5",
        ),
        ({"type": "group_renamed", "group": "g"}, "ValueError: unknown entry type 'group_renamed'"),
        (group_metadata(protocol=None), "ValueError: members are stored without the group's protocol"),
        (group_metadata(leader="m-9"), "ValueError: leader 'm-9' is none of the members"),
    ],
)
def test_a_journal_entry_that_cannot_be_applied_stops_the_replay_naming_it(
    tmp_path: Path, entry: dict[str, Any], cause: str
) -> None:
    with pytest.raises(JournalError) as raised:
        replay(tmp_path, entry)
    path = tmp_path / "groups.journal"
    assert str(raised.value) == (
        f"journal {path}: entry #0 cannot be applied to group state ({cause}): {entry!r}"
    )
