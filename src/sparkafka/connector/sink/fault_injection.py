"""Fault injection for the project's own chaos tests and demo: hold a write still at a named point of
the exactly-once protocol so that a kill lands there, or fail a task's first attempt after it wrote.

Internal. The ``debug.*`` sink options that set it are hidden from every option list shown to
users, and nothing here runs unless one of them is given."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkafka.errors import SparkafkaOptionError

PAUSE_POINTS = ("beforeproduce", "beforecommit", "drivercommit")
FAIL_POINTS = ("beforecommit",)


@dataclass(frozen=True)
class FaultInjection:
    """What the ``debug.*`` options asked for; the default injects nothing."""

    pause_at: str | None = None
    pause_s: float = 0.0
    pause_partitions: frozenset[int] | None = None
    pause_from_batch: int = 0
    fail_first_attempt_at: str | None = None

    @classmethod
    def parse(
        cls,
        choice: Callable[[str, tuple[str, ...]], str | None],
        duration_s: Callable[[str, str], float],
        string: Callable[[str], str | None],
        integer: Callable[[str], int],
    ) -> FaultInjection:
        return cls(
            pause_at=choice("debug.pauseAt", PAUSE_POINTS),
            pause_s=duration_s("debug.pauseMs", "30s"),
            pause_partitions=_partitions(string("debug.pausePartitions")),
            pause_from_batch=integer("debug.pauseFromBatch"),
            fail_first_attempt_at=choice("debug.failFirstAttemptAt", FAIL_POINTS),
        )

    @property
    def holds_before_commit(self) -> bool:
        """Whether the write must make its open transaction visible before the commit point."""
        return self.pause_at == "beforecommit" or self.fail_first_attempt_at is not None

    def pause(self, point: str, *, partition: int | None, batch_id: int | None) -> None:
        """Hold still at ``point``, announced on stderr, which Spark forwards from its Python workers
        to the pipeline's output."""
        if self.pause_at != point.lower() or (batch_id is not None and batch_id < self.pause_from_batch):
            return
        if (
            partition is not None
            and self.pause_partitions is not None
            and partition not in self.pause_partitions
        ):
            return
        print(
            f"sparkafka debug pause: {point} partition={partition} batch={batch_id} for {self.pause_s:.1f} s "
            f"(pid {os.getpid()})",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(self.pause_s)

    def fail_first_attempt(self, point: str) -> None:
        """Fail the task's first attempt at ``point``, after it wrote its rows."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if (
            self.fail_first_attempt_at == point.lower()
            and context is not None
            and context.attemptNumber() == 0
        ):
            raise RuntimeError(f"injected failure of the first attempt (debug.failFirstAttemptAt={point})")


def _partitions(value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        return frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise SparkafkaOptionError(
            f"option 'debug.pausePartitions' must be comma-separated partition numbers, got '{value}'"
        ) from None
