"""The broker's log cleaner loop (server.Broker._clean_logs): which logs it cleans, in which order,
what a failed pass does, and that stopping the broker waits for a pass under way."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkafka.broker import server
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.log_cleaner import CleanableRange
from sparkafka.broker.partition import Partition

BACKOFF_MS = 50


def _broker(data_dir: Path) -> server.Broker:
    config = BrokerConfig(
        port=0, data_dir=data_dir, auto_create_topics=False, log_cleaner_backoff_ms=BACKOFF_MS
    )
    broker = server.Broker(config)
    for name in ("dirty", "dirtier", "clean", "broken", "unweighable"):
        broker.topic_controller.create_topic(name, 1, {"cleanup.policy": "compact"})
    return broker


def _dirtiness(ratios: dict[str, float]) -> Callable[[Partition, int], CleanableRange | None]:
    """Each topic's log as dirty as ``ratios`` says, until a pass cleans it."""

    def cleanable_range(partition: Partition, now_ms: int) -> CleanableRange | None:
        if partition.topic == "unweighable":
            raise OSError("segment unreadable")
        ratio = ratios.get(partition.topic, 0.0)
        return CleanableRange(0, 100, int(1000 * (1 - ratio)), int(1000 * ratio), overdue=False)

    return cleanable_range


def test_the_dirtiest_due_log_is_cleaned_first_and_a_failed_one_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ratios = {"dirty": 0.6, "dirtier": 0.9, "clean": 0.3, "broken": 0.95}
    passes: list[str] = []

    def compaction(partition: Partition, now_ms: int, weighed: CleanableRange | None) -> Callable[[], int]:
        assert weighed is not None and weighed.cleanable_ratio == pytest.approx(
            ratios[partition.topic], abs=0.01
        )

        def clean() -> int:
            passes.append(partition.topic)
            assert threading.current_thread() is not threading.main_thread()
            if partition.topic == "broken":
                raise OSError("disk on fire")
            ratios[partition.topic] = 0.0
            return 1

        return clean

    monkeypatch.setattr(Partition, "cleanable_range", _dirtiness(ratios))
    monkeypatch.setattr(Partition, "compaction", compaction)

    async def run() -> None:
        broker = _broker(tmp_path / "data")
        await broker.start()
        try:
            deadline = time.monotonic() + 10
            while len(passes) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(BACKOFF_MS * 4 / 1000)  # more rounds: nothing else is cleaned
        finally:
            await broker.stop()

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    # Dirtiest first; "clean" is under the default min.cleanable.dirty.ratio (0.5) and never due;
    # "broken" failed once and is not tried again, nor is "unweighable", whose dirtiness could not
    # be read.
    assert passes == ["broken", "dirtier", "dirty"]
    assert caplog.text.count("cleaning broken-0 failed") == 1
    assert "disk on fire" in caplog.text
    assert caplog.text.count("weighing unweighable-0 for cleaning failed") == 1
    assert "segment unreadable" in caplog.text


def test_stopping_the_broker_waits_for_the_pass_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    started = threading.Event()

    def compaction(partition: Partition, now_ms: int, weighed: CleanableRange | None) -> Callable[[], int]:
        def clean() -> int:
            started.set()
            time.sleep(0.3)
            events.append(f"cleaned {partition.topic}")
            return 0

        return clean

    closing = Partition.close

    def close(partition: Partition, *, keep_state: bool = True) -> None:
        events.append(f"closed {partition.topic}")
        closing(partition, keep_state=keep_state)

    monkeypatch.setattr(Partition, "cleanable_range", _dirtiness({"dirty": 1.0}))
    monkeypatch.setattr(Partition, "compaction", compaction)
    monkeypatch.setattr(Partition, "close", close)

    async def run() -> None:
        broker = _broker(tmp_path / "data")
        await broker.start()
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        await broker.stop()

    asyncio.run(run())
    assert events[0] == "cleaned dirty"
    assert "closed dirty" in events[1:]


def test_stopping_the_broker_drops_a_pass_that_had_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner thread is busy: the pass waits in its queue, and stop() cancels it (instead of
    failing with the cancellation and leaving the storage open)."""
    passes: list[str] = []
    closed: list[str] = []
    chosen = threading.Event()

    def compaction(partition: Partition, now_ms: int, weighed: CleanableRange | None) -> Callable[[], int]:
        chosen.set()
        return lambda: passes.append(partition.topic) or 0

    closing = Partition.close

    def close(partition: Partition, *, keep_state: bool = True) -> None:
        closed.append(partition.topic)
        closing(partition, keep_state=keep_state)

    monkeypatch.setattr(Partition, "cleanable_range", _dirtiness({"dirty": 1.0}))
    monkeypatch.setattr(Partition, "compaction", compaction)
    monkeypatch.setattr(Partition, "close", close)
    busy = threading.Event()

    async def run() -> None:
        broker = _broker(tmp_path / "data")
        broker._cleaner.submit(busy.wait, 10)  # the one cleaner thread is taken
        await broker.start()
        assert await asyncio.get_running_loop().run_in_executor(None, chosen.wait, 10), "no pass was chosen"
        threading.Timer(0.3, busy.set).start()
        await broker.stop()

    asyncio.run(run())
    assert passes == []
    assert "dirty" in closed
