"""CPU time and memory of a runner's whole process tree (the runner, a JVM it starts, Python workers
that JVM forks, …), sampled with psutil in a background thread.

CPU: the last user+system time seen of every process ever in the tree, so a child that exits between
samples still counts with what it had used at the previous sample (a child living less than one
interval is missed). Memory: the sum of RSS over the tree at each sample, maximum over the samples;
and the same for PSS (proportional set size), which counts a page shared by several processes of the
tree (forked Python workers, mapped jars and class archives) once in all instead of once per process:
the tree's fair share of the machine's memory, where RSS overcounts a tree of forks. At the sample of
the highest RSS, each process's RSS and PSS are kept under a label of its role
(:func:`process_label`): where the memory goes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sparkafka.runtime.runner_zygote import WAITER_NAME

SAMPLE_INTERVAL_S = 0.25


@dataclass(frozen=True)
class ProcessMemory:
    """One process of the tree at the peak sample."""

    label: str
    rss_bytes: int
    pss_bytes: int | None


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
        # Every process of the tree at the sample whose RSS sum was the highest.
        self.peak_processes: list[ProcessMemory] = []
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
        processes: list[tuple[psutil.Process, int, int | None]] = []
        with self._lock:
            tree = self._tree()
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    with process.oneshot():
                        identity = (process.pid, process.create_time())
                        times = process.cpu_times()
                        name = process.name()
                        process_rss = process.memory_info().rss
                    self._cpu_by_process[identity] = times.user + times.system
                    self._processes[identity] = process
                    self._names[identity] = name
                    rss += process_rss
                    process_pss = _add_pss(0, process)
                    pss = None if pss is None or process_pss is None else pss + process_pss
                    processes.append((process, process_rss, process_pss))
            if rss > self.peak_rss_bytes:
                # Labelled now, not when first seen: a process may exec another program since (Spark's
                # launch script becomes the JVM).
                self.peak_processes = [
                    ProcessMemory(process_label(process, tree), process_rss, process_pss)
                    for process, process_rss, process_pss in processes
                ]
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            if pss is None or self.peak_pss_bytes is None:
                self.peak_pss_bytes = None
            else:
                self.peak_pss_bytes = max(self.peak_pss_bytes, pss)

    def peak_by_label(self) -> list[dict[str, Any]]:
        """The peak sample's processes summed per label, largest PSS (else RSS) first: what a results
        file keeps of where the memory goes."""
        with self._lock:
            groups: dict[str, list[ProcessMemory]] = {}
            for process in self.peak_processes:
                groups.setdefault(process.label, []).append(process)
        summary = []
        for label, members in groups.items():
            rss_mib = sum(m.rss_bytes for m in members) / 2**20
            known = [m.pss_bytes for m in members if m.pss_bytes is not None]
            pss_mib = sum(known) / 2**20 if len(known) == len(members) else None
            size = pss_mib if pss_mib is not None else rss_mib
            summary.append((size, label, len(members), rss_mib, pss_mib))
        return [
            {
                "process": label,
                "count": count,
                "rss_mib": round(rss_mib, 1),
                "pss_mib": None if pss_mib is None else round(pss_mib, 1),
            }
            for _, label, count, rss_mib, pss_mib in sorted(summary, key=lambda g: (-g[0], g[1]))
        ]

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


def process_label(process: psutil.Process, tree: Sequence[psutil.Process]) -> str:
    """What ``process`` is, from its command line: ``JVM <main class>``, ``python <module> [<its
    first module argument>]``; a fork of another process of the tree (the same command line as
    its parent) is ``fork of <the parent's label>``, but a child of sparkafka's zygote is labelled
    by the launcher it runs for (the process whose standard input it was handed)."""
    try:
        command = process.cmdline()
        parent = process.parent()
        parent_command = parent.cmdline() if parent is not None else []
    except psutil.Error:
        return "(gone)"
    if command and command == parent_command and parent is not None:
        if _is_zygote(command) and not _is_zygote(_parent_command(parent)):
            launcher = _launcher_of(process, tree)
            if launcher is not None:
                return f"{describe_command(_as_launched(launcher))} (zygote fork)"
        return f"fork of {process_label(parent, tree)}"
    return describe_command(command) if command else process.name()


def _parent_command(process: psutil.Process) -> list[str]:
    try:
        parent = process.parent()
        return parent.cmdline() if parent is not None else []
    except psutil.Error:
        return []


def _is_zygote(command: Sequence[str]) -> bool:
    return "sparkafka.runtime.runner_zygote" in command


def _launcher_of(process: psutil.Process, tree: Sequence[psutil.Process]) -> list[str] | None:
    """The command line of the launcher a zygote child runs for: the one other process of the tree
    that reads from the child's standard input (the launcher hands the zygote its streams; the JVM
    holds the other end). Not only as its own standard input: a launcher waiting as a shell holds it
    elsewhere while it reads."""
    stdin = _descriptor(process.pid, "0")
    if stdin is None:
        return None
    for other in tree:
        with contextlib.suppress(psutil.Error, OSError):
            if other.pid == process.pid or _is_zygote(other.cmdline()):
                continue
            for fd in os.listdir(f"/proc/{other.pid}/fd"):
                if _descriptor(other.pid, fd) == stdin and _read_only(other.pid, fd):
                    return other.cmdline()
    return None


def _descriptor(pid: int, fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _read_only(pid: int, fd: str) -> bool:
    """Whether descriptor ``fd`` of ``pid`` was opened for reading only (a pipe's read end)."""
    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & os.O_ACCMODE == os.O_RDONLY
    return False


def _as_launched(command: Sequence[str]) -> list[str]:
    """A launcher's command line as Spark started it, also once it waits as a shell (whose command
    line ends with the module and arguments it was started with)."""
    if WAITER_NAME in command:
        return ["python", "-m", *command[command.index(WAITER_NAME) + 1 :]]
    return list(command)


def describe_command(command: Sequence[str]) -> str:
    if WAITER_NAME in command:
        return f"{describe_command(_as_launched(command))}, waiting as sh"
    program = os.path.basename(command[0])
    arguments = list(command[1:])
    if program == "java":
        skip_next = False
        for argument in arguments:
            if skip_next:
                skip_next = False
            elif argument in ("-cp", "-classpath", "--class-path", "-jar"):
                skip_next = argument != "-jar"
            elif not argument.startswith("-"):
                return f"JVM {argument.rsplit('.', 1)[-1]}"
        return "JVM"
    if program.startswith("python"):
        if "-m" in arguments:
            at = arguments.index("-m")
            module = arguments[at + 1] if at + 1 < len(arguments) else "?"
            rest = [a for a in arguments[at + 2 : at + 3] if not a.startswith(("-", "/"))]
            return f"python -m {module}" + (f" [{rest[0].rsplit('.', 1)[-1]}]" if rest else "")
        scripts = [a for a in arguments if not a.startswith("-")]
        return f"python {os.path.basename(scripts[0])}" if scripts else "python"
    return program
