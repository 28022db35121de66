"""Busy processes beside the systems under test (``python -m benchmarks --background-load N``).

A machine that runs a pipeline rarely runs nothing else. Each process spins one core's worth of pure
Python at normal priority for the whole run, so the systems compete for the cores as they would beside
other work; none of them is a child of a runner, so no system's CPU or memory counts them.
"""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType
from typing import Self

# A loop that never sleeps and touches no memory or I/O: load on the CPU alone.
_SPIN = "while True:\n    pass\n"


class BackgroundLoad:
    """``count`` busy processes from ``__enter__`` to ``__exit__`` (none for 0)."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"a background load of {count} processes: give 0 or more")
        self.count = count
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Self:
        for _ in range(self.count):
            spinning = subprocess.Popen(
                [sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL, start_new_session=True
            )
            self._processes.append(spinning)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for process in self._processes:
            process.kill()
        for process in self._processes:
            process.wait()
        self._processes.clear()

    @property
    def running(self) -> int:
        """How many of the busy processes are alive (each should be, until ``__exit__``)."""
        return sum(1 for process in self._processes if process.poll() is None)
