"""Topic changes whose file work fails part way: nothing half made is left, in memory or on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker import server, topic_controller
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.partition import Partition


def _broker(tmp_path: Path) -> server.Broker:
    return server.Broker(BrokerConfig(port=0, data_dir=tmp_path / "data"))


def _directories(broker: server.Broker, topic: str) -> list[str]:
    return sorted(p.name for p in broker.config.data_dir.iterdir() if p.name.startswith(f"{topic}-"))


@pytest.fixture
def disk_full_at(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Opening partition ``index`` fails as on a full disk, once its directory exists."""

    def fail_at(index: int) -> None:
        def partition(topic: str, number: int, directory: Path, *args: Any, **kwargs: Any) -> Partition:
            if number == index:
                directory.mkdir()
                raise OSError(28, "No space left on device")
            return Partition(topic, number, directory, *args, **kwargs)

        monkeypatch.setattr(topic_controller, "Partition", partition)

    return fail_at


def test_a_creation_that_fails_part_way_leaves_no_topic(tmp_path: Path, disk_full_at: Any) -> None:
    broker = _broker(tmp_path)
    disk_full_at(37)
    with pytest.raises(BrokerError, match=r"could not be created.*No space left") as failed:
        asyncio.run(broker.topic_controller.create("t", 64, {}))
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "t" not in broker.topics.topics and not broker.topics.creating
    assert broker.topics.partitions_in_flight == 0
    assert not [key for key in broker.partitions if key[0] == "t"]
    assert _directories(broker, "t") == []
    broker.close_storage()
    assert "t" not in _broker(tmp_path).topics.topics


def test_partitions_whose_addition_fails_part_way_are_not_left(tmp_path: Path, disk_full_at: Any) -> None:
    broker = _broker(tmp_path)
    asyncio.run(broker.topic_controller.create("t", 2, {}))
    disk_full_at(20)
    with pytest.raises(BrokerError, match="could not be created") as failed:
        asyncio.run(broker.topic_controller.add_partitions("t", 40, validate_only=False))
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert broker.topics.topics["t"].partitions == 2 and not broker.topics.changing
    assert sorted(key for key in broker.partitions if key[0] == "t") == [("t", 0), ("t", 1)]
    assert _directories(broker, "t") == ["t-0", "t-1"]


def test_changes_of_one_name_wait_for_the_one_under_way(tmp_path: Path) -> None:
    """As Kafka's controller applies them in turn: a creation of a name being created is refused at
    once, a deletion and an addition of partitions wait for it, and see the topic whole."""
    broker = _broker(tmp_path)

    async def main() -> list[Any]:
        creation = asyncio.ensure_future(broker.topic_controller.create("t", 200, {}))
        await asyncio.sleep(0)  # the creation is under way: its files are being made
        assert "t" in broker.topics.creating and "t" not in broker.topics.topics
        with pytest.raises(BrokerError) as again:
            await broker.topic_controller.create("t", 1, {})
        assert again.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
        growth = asyncio.ensure_future(broker.topic_controller.add_partitions("t", 300, validate_only=False))
        await creation
        await growth
        partitions = broker.topics.topics["t"].partitions
        await broker.topics.settled(["t"])
        deleted = await broker.topic_controller.delete_topics(["t"])
        return [partitions, deleted]

    assert asyncio.run(main()) == [300, {"t": None}]
    assert "t" not in broker.topics.topics and not broker.partitions
    assert _directories(broker, "t") == []
