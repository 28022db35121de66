"""CPU time and memory of a runner's whole process tree (the runner, a JVM it starts, Python workers
that JVM forks, …), sampled with psutil in a background thread.

CPU: the last user+system time seen of every process ever in the tree, so a child that exits between
samples still counts with what it had used at the previous sample (a child living less than one
interval is missed). Memory: the sum of RSS over the tree at each sample, maximum over the samples;
and the same for PSS (proportional set size), which counts a page shared by several processes of the
tree (forked Python workers, mapped jars and class archives) once in all instead of once per process:
the tree's fair share of the machine's memory, where RSS overcounts a tree of forks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import psutil

SAMPLE_INTERVAL_S = 0.25


class ProcessTreeSampler:
    def __init__(
        self,
        root_pid: int,
        interval_s: float = SAMPLE_INTERVAL_S,
        *,
        exclude_pids: frozenset[int] = frozenset(),
    ) -> None:
        self.root = psutil.Process(root_pid)
        # Subtrees left out, e.g. a broker that the measuring process started itself.
        self.exclude_pids = exclude_pids
        self.interval_s = interval_s
        self.peak_rss_bytes = 0
        # None where the system tells no PSS (no /proc/<pid>/smaps_rollup, or not allowed to read it)
        self.peak_pss_bytes: int | None = 0
        # (pid, create time) so that a reused pid is a new process.
        self._cpu_by_process: dict[tuple[int, float], float] = {}
        self._processes: dict[tuple[int, float], psutil.Process] = {}
        self._names: dict[tuple[int, float], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-tree-sampler", daemon=True)

    def start(self) -> ProcessTreeSampler:
        self.sample()
        self._thread.start()
        return self

    def _tree(self) -> list[psutil.Process]:
        try:
            excluded = set(self.exclude_pids)
            for pid in self.exclude_pids:
                with contextlib.suppress(psutil.Error):
                    excluded.update(child.pid for child in psutil.Process(pid).children(recursive=True))
            return [p for p in [self.root, *self.root.children(recursive=True)] if p.pid not in excluded]
        except psutil.Error:
            # The root has exited; its children (if any escaped) are still tracked by identity.
            return [p for p in self._processes.values() if p.is_running()]

    def sample(self) -> None:
        rss = 0
        pss: int | None = 0
        with self._lock:
            for process in self._tree():
                with contextlib.suppress(psutil.Error):
                    with process.oneshot():
                        identity = (process.pid, process.create_time())
                        times = process.cpu_times()
                        name = process.name()
                        rss += process.memory_info().rss
                    self._cpu_by_process[identity] = times.user + times.system
                    self._processes[identity] = process
                    self._names[identity] = name
                    pss = _add_pss(pss, process)
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            if pss is None or self.peak_pss_bytes is None:
                self.peak_pss_bytes = None
            else:
                self.peak_pss_bytes = max(self.peak_pss_bytes, pss)

    def cpu_seconds(self) -> float:
        """CPU seconds of the tree as of the last sample (call :meth:`sample` first for "now")."""
        with self._lock:
            return sum(self._cpu_by_process.values())

    def cpu_seconds_by(self, kind: Callable[[str], str]) -> dict[str, float]:
        """CPU seconds of the tree as of the last sample, summed per ``kind(process name)``."""
        totals: dict[str, float] = {}
        with self._lock:
            for identity, seconds in self._cpu_by_process.items():
                group = kind(self._names[identity])
                totals[group] = totals.get(group, 0.0) + seconds
        return totals

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def survivors(self) -> list[psutil.Process]:
        """Processes of the tree still running (e.g. ones that left the runner's process group)."""
        return [p for p in self._processes.values() if p.is_running()]


def _add_pss(total: int | None, process: psutil.Process) -> int | None:
    """``total`` plus the PSS of ``process``; None once any process of the tree tells none (a
    process that exited in between adds nothing)."""
    if total is None:
        return None
    try:
        return total + int(process.memory_full_info().pss)
    except psutil.NoSuchProcess:
        return total
    except (psutil.AccessDenied, AttributeError):
        return None
