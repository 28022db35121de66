"""The examples in examples/ run by one command each and print what read_committed readers see.

Each example starts its own embedded broker and Spark; the three run at the same time (most of their
time is Spark starting and waiting for Kafka), each test then checks its example's output."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from examples import keyed_running_sum, seed001_map, windowed_count

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ("seed001_map", "keyed_running_sum", "windowed_count")
TIMEOUT_S = 400
# Short-lived JVMs start markedly faster with the C1 compiler only.
FAST_JVM_START = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}


class ExampleRun:
    """One example as a child process in its own process group; stdout and stderr go to files."""

    def __init__(self, name: str, logs: Path) -> None:
        self.name = name
        self.stdout_path = logs / f"{name}.stdout"
        self.stderr_path = logs / f"{name}.stderr"
        with open(self.stdout_path, "wb") as stdout, open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(REPO_ROOT / "examples" / f"{name}.py")],
                stdout=stdout,
                stderr=stderr,
                cwd=REPO_ROOT,
                env={**os.environ, **FAST_JVM_START},
                start_new_session=True,
            )

    def finished_output(self) -> str:
        """Its stdout once it exited 0; a failure shows the end of its stderr."""
        code = self.process.wait(timeout=TIMEOUT_S)
        stderr = self.stderr_path.read_text(errors="replace")
        assert code == 0, f"examples/{self.name}.py exited {code}:\n{stderr[-4000:]}"
        return self.stdout_path.read_text()

    def stop(self) -> None:
        """Ctrl-C if still running, so the example stops its broker in its `finally`; then SIGKILL."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExampleRun]]:
    logs = tmp_path_factory.mktemp("examples")
    runs = {name: ExampleRun(name, logs) for name in EXAMPLES}
    try:
        yield runs
    finally:
        for run in runs.values():
            run.stop()


def indented_lines(output: str, heading: str) -> list[str]:
    """The indented lines that follow the line starting with ``heading``."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(heading))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return block


def test_seed001_map(example_runs: dict[str, ExampleRun]) -> None:
    output = example_runs["seed001_map"].finished_output()
    expected = [f"EVENT({line})" for line in seed001_map.INPUT_LINES]
    assert f"out ({len(expected)} records, read_committed):" in output
    assert indented_lines(output, "out (") == expected


def test_keyed_running_sum(example_runs: dict[str, ExampleRun]) -> None:
    output = example_runs["keyed_running_sum"].finished_output()
    sums: Counter[str] = Counter()
    per_run = []
    for lines in (keyed_running_sum.FIRST_INPUT, keyed_running_sum.SECOND_INPUT):
        for line in lines:
            key, amount = line.split(",")
            sums[key] += int(amount)
        # A run writes one update per key it changed: that key's sum so far.
        per_run.append({line.split(",")[0]: str(sums[line.split(",")[0]]) for line in lines})

    updates = [tuple(line.split(" -> ")) for line in indented_lines(output, "sums (")]
    first, second = updates[: len(per_run[0])], updates[len(per_run[0]) :]
    assert dict(first) == per_run[0] and len(first) == len(set(first))
    assert dict(second) == per_run[1] and len(second) == len(set(second))
    assert "final sums: " + ", ".join(f"{key}={sums[key]}" for key in sorted(sums)) in output


def test_windowed_count_closes_the_last_window_with_a_heartbeat(example_runs: dict[str, ExampleRun]) -> None:
    output = example_runs["windowed_count"].finished_output()
    windows = [
        re.fullmatch(r"window (\S+)  count=(\d+)  \(closed by (.+)\)", line)
        for line in indented_lines(output, "clicks-per-10s (")
    ]
    assert all(windows), output
    starts = [datetime.fromisoformat(match.group(1)) for match in windows if match]
    counts = [int(match.group(2)) for match in windows if match]
    # 3, 2 and 4 clicks in three consecutive windows.
    offsets = windowed_count.CLICK_OFFSETS_S
    size = windowed_count.WINDOW_SECONDS
    assert counts == [sum(1 for offset in offsets if offset // size == n) for n in range(3)] == [3, 2, 4]
    assert [later - earlier for earlier, later in itertools.pairwise(starts)] == [timedelta(seconds=size)] * 2
    assert windows[-1] is not None and windows[-1].group(3) == "an idle heartbeat"
