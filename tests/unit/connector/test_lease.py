"""The driver's lease on its checkpoint: renewed by its holder, refused to a live other process,
taken over from a dead or expired one, and settled between two processes starting together."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sparkafka.connector.sink import lease as lease_module
from sparkafka.connector.sink.batch_plan import CheckpointFiles
from sparkafka.connector.sink.lease import LEASE_FILE, Holder, Lease, hold_checkpoint_lease, this_driver
from sparkafka.errors import ReplayRefused
from sparkafka.runtime.python_exec import LAUNCHER_PARENT_ENV

HOST = socket.gethostname()
MACHINE = lease_module._machine()


def _here(pid: int, started_ms: int) -> Holder:
    """A holder on this host, in this process table."""
    return Holder(HOST, pid, started_ms, MACHINE)


def _read(checkpoint: Path) -> Lease:
    text = CheckpointFiles(str(checkpoint)).text(LEASE_FILE)
    assert text is not None
    return Lease.decode(text)


def _write(checkpoint: Path, lease: Lease) -> None:
    CheckpointFiles(str(checkpoint)).write(LEASE_FILE, lease.encode())


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture(autouse=True)
def _quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_module, "SETTLE_S", 0.05)


def test_the_holder_renews_its_lease_only_once_a_third_of_the_timeout_passed(tmp_path: Path) -> None:
    me = _here(os.getpid(), 1)
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    first = _read(tmp_path)
    assert first.holder == me and first.timeout_ms == 60_000
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    assert _read(tmp_path) == first, "renewed too early"
    _write(tmp_path, Lease(me, first.acquired_ms, first.renewed_ms - 30_000, 60_000))
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    renewed = _read(tmp_path)
    assert renewed.renewed_ms >= first.renewed_ms and renewed.acquired_ms == first.acquired_ms


def test_a_live_process_on_this_host_keeps_its_lease_and_is_named(tmp_path: Path) -> None:
    alive = this_driver()  # this test's own parent: alive, its start time read from /proc
    _write(tmp_path, Lease(alive, 1_000, 2_000, 1_000))  # long expired: on this host only life counts
    with pytest.raises(ReplayRefused) as refused:
        hold_checkpoint_lease(str(tmp_path), 60_000, me=_here(os.getpid(), 1))
    message = str(refused.value)
    assert f"process {alive.pid} on host {HOST}" in message
    assert "is in use by another process" in message and "stop it first" in message
    assert "if no such process runs" in message and "sparkafka/lease.json" in message


def test_a_dead_process_on_this_host_loses_its_lease_at_once(tmp_path: Path) -> None:
    _write(tmp_path, Lease(_here(_dead_pid(), 1_000), 1_000, 2**41, 60_000))
    me = _here(os.getpid(), 5)
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    assert _read(tmp_path).holder == me


def test_a_process_on_another_host_holds_until_its_lease_expires(tmp_path: Path) -> None:
    other = Holder("elsewhere.example", 4242, 1_000)
    now_ms = lease_module._now_ms()
    _write(tmp_path, Lease(other, now_ms - 5_000, now_ms, 120_000))
    me = Holder(HOST, os.getpid(), 5)
    with pytest.raises(
        ReplayRefused, match=r"start again after .* when its lease expires \(option leaseTimeoutMs=120000"
    ):
        hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    _write(tmp_path, Lease(other, now_ms - 200_000, now_ms - 130_000, 120_000))
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    assert _read(tmp_path).holder == me


def test_of_two_processes_taking_the_lease_together_the_last_writer_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other process writes its lease while this one waits to read its own back."""
    monkeypatch.setattr(lease_module, "SETTLE_S", 2.0)
    other = Holder("elsewhere.example", 4242, 1_000)
    me = Holder(HOST, os.getpid(), 5)
    now_ms = lease_module._now_ms()
    overwritten = threading.Event()

    def write_once_this_one_has() -> None:
        # After this process's write, never before: the other is then the last writer.
        while not (tmp_path / LEASE_FILE).exists() or _read(tmp_path).holder != me:
            threading.Event().wait(0.005)
        _write(tmp_path, Lease(other, now_ms, now_ms, 120_000))
        overwritten.set()

    writer = threading.Thread(target=write_once_this_one_has, daemon=True)
    writer.start()
    with pytest.raises(ReplayRefused, match=r"process 4242 on host elsewhere\.example"):
        hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    assert overwritten.is_set()


def test_an_unreadable_lease_is_taken_as_absent(tmp_path: Path) -> None:
    CheckpointFiles(str(tmp_path)).write(LEASE_FILE, "{not json")
    me = Holder(HOST, os.getpid(), 5)
    hold_checkpoint_lease(str(tmp_path), 60_000, me=me)
    assert _read(tmp_path).holder == me


def test_the_holder_keeps_its_lease_when_its_start_time_reads_seconds_off(tmp_path: Path) -> None:
    """Linux derives a process's start time from the boot time, which a wall-clock step moves: the
    same driver reads a start some seconds off between two micro-batches, and is still the holder."""
    started = lease_module._started_ms(os.getpid())
    assert started is not None
    hold_checkpoint_lease(str(tmp_path), 60_000, me=_here(os.getpid(), started))
    hold_checkpoint_lease(str(tmp_path), 60_000, me=_here(os.getpid(), started + 3000))
    assert _read(tmp_path).holder.pid == os.getpid()


def test_a_holder_in_another_process_table_counts_until_its_lease_expires(tmp_path: Path) -> None:
    """A container sharing the host's name but not its processes: its process id means nothing
    here, so its lease holds until it expires, even if no process here has that id."""
    elsewhere = Holder(HOST, _dead_pid(), 1_000, "another-boot/pid:[1]")
    now_ms = lease_module._now_ms()
    _write(tmp_path, Lease(elsewhere, now_ms, now_ms, 120_000))
    with pytest.raises(ReplayRefused, match="when its lease expires"):
        hold_checkpoint_lease(str(tmp_path), 60_000, me=_here(os.getpid(), 5))


def test_a_lease_that_cannot_be_read_back_refuses_with_a_way_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store another starter's delete and move leave no file for a moment."""
    monkeypatch.setattr(lease_module, "_read", lambda files: None)
    with pytest.raises(ReplayRefused, match=r"another process is taking it at this moment.*start again"):
        hold_checkpoint_lease(str(tmp_path), 60_000, me=_here(os.getpid(), 5))


def test_a_process_the_zygote_forked_finds_the_driver_through_its_launcher_only(tmp_path: Path) -> None:
    """A daemon sparkafka's zygote forked descends from the zygote, not from Spark's JVM: the launcher
    names its own parent, and the driver is looked for from there only — never among the daemon's
    own ancestors, where a JVM that started the user's process (a build tool, a CI agent) would
    pass for every pipeline's driver — and is that process where no JVM is found."""
    (tmp_path / "jvm").mkdir()
    (tmp_path / "jvm" / "java").symlink_to("/bin/sleep")  # a process named java, as Spark's driver is
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "java").symlink_to(os.path.realpath(sys.executable))  # a JVM above the user's
    jvm = subprocess.Popen([str(tmp_path / "jvm" / "java"), "60"])
    not_a_jvm = subprocess.Popen(["sleep", "60"])
    plain = {key: value for key, value in os.environ.items() if key != LAUNCHER_PARENT_ENV}
    ask = "from sparkafka.connector.sink.lease import this_driver; print(this_driver().pid)"
    # What the "agent" runs: the asking process, as its child.
    through_agent = (
        "import subprocess, sys; "
        "print(subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True).stdout, end='')"
    )

    def driver_pid(*, under_agent: bool = False, **env: str) -> tuple[int, int]:
        """The driver the asking process names, and the pid of its parent."""
        command = [sys.executable, "-c", f"import os; print(os.getppid()); {ask}"]
        if under_agent:
            command = [str(tmp_path / "agent" / "java"), "-c", through_agent, *command]
        ran = subprocess.run(command, env={**plain, **env}, capture_output=True, text=True, check=True)
        parent, driver = ran.stdout.split()
        return int(driver), int(parent)

    try:
        assert driver_pid(**{LAUNCHER_PARENT_ENV: str(jvm.pid)})[0] == jvm.pid
        assert driver_pid(under_agent=True, **{LAUNCHER_PARENT_ENV: str(jvm.pid)})[0] == jvm.pid
        assert driver_pid(under_agent=True, **{LAUNCHER_PARENT_ENV: str(not_a_jvm.pid)})[0] == not_a_jvm.pid
        # Without it: the JVM among the process's ancestors (Spark's, where it started the daemon
        # itself), else the process's parent, as before.
        driver, parent = driver_pid(under_agent=True)
        assert driver == parent  # the agent named java is the parent here
        assert driver_pid() == (os.getpid(), os.getpid())
    finally:
        for process in (jvm, not_a_jvm):
            process.kill()
            process.wait()
