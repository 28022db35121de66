"""The zygote that forks Spark's streaming source runner ready-made: what the child runs with, what
the launcher gets back, when it refuses, and that no child outlives its launcher or the zygote its
parent. A small module stands in for the runner, so the tests need no Spark."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.runtime import runner_zygote

# A module in a package, as Spark's runner is (pyspark.sql.streaming.python_streaming_source_runner).
TARGET_PACKAGE = "zygote_target"
TARGET = f"{TARGET_PACKAGE}.runner"
TARGET_SOURCE = """
import json, os, signal, subprocess, sys, threading, time
if __name__ == "__main__":
    helper = None
    if os.environ.get("TARGET_GROUP"):  # lead a process group with a child in it, as PySpark's daemon does
        os.setpgid(0, 0)
        helper = os.fork()
        if helper == 0:
            time.sleep(60)
            os._exit(0)
    if os.environ.get("TARGET_DAEMON"):  # as PySpark's daemon: a group, SIGHUP to it on SIGTERM
        os.setpgid(0, 0)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if os.environ["TARGET_DAEMON"] == "shutting-down":  # PySpark's shutdown, before its SIGHUP
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:
            signal.signal(signal.SIGTERM, lambda *_: (os.kill(0, signal.SIGHUP), os._exit(1)))
        helper = os.fork()
        if helper == 0:  # a worker, which starts a subprocess and forks from a thread of its own
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            spawned = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            forked = []
            def fork_and_sleep():
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                forked.append(pid)
            thread = threading.Thread(target=fork_and_sleep)
            thread.start()
            thread.join()
            with open(os.environ["TARGET_OUT"] + ".worker.tmp", "w") as out:
                json.dump({"subprocess": spawned.pid, "thread_fork": forked[0]}, out)
            os.replace(os.environ["TARGET_OUT"] + ".worker.tmp", os.environ["TARGET_OUT"] + ".worker")
            time.sleep(60)
            os._exit(0)
    if os.environ.get("TARGET_ECHO"):  # talk through the standard streams, as PySpark's daemon does
        sys.stdout.write(sys.stdin.readline().upper())
        sys.stdout.flush()
        sys.stderr.write("said on stderr\\n")
        sys.stderr.flush()
    if os.environ.get("TARGET_RUNS"):  # one line per run of the module
        with open(os.environ["TARGET_RUNS"], "a") as runs:
            runs.write("ran\\n")
    umask = os.umask(0)
    with open(os.environ["TARGET_OUT"] + ".tmp", "w") as out:  # whole once it exists: renamed into place
        json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                   "marker": os.environ.get("TARGET_MARK"), "helper": helper, "umask": umask}, out)
    os.replace(os.environ["TARGET_OUT"] + ".tmp", os.environ["TARGET_OUT"])
    time.sleep(float(os.environ.get("TARGET_SLEEP", "0")))
    sys.exit(int(os.environ.get("TARGET_EXIT", "0")))
"""
# A process that starts a zygote for the target module (its parent), waits until it listens, prints
# the socket path and then runs the commands it reads, one per line, as a launcher would.
DRIVER = """
import json, os, sys, time
from sparkafka.runtime.runner_zygote import run_through, start
start_dir = os.getcwd()
sys.path[0] = start_dir
socket_path = start([sys.argv[1]])
deadline = time.monotonic() + 30
while not os.path.exists(socket_path) and time.monotonic() < deadline:
    time.sleep(0.02)
print(json.dumps({"socket": socket_path, "zygote_ready": os.path.exists(socket_path)}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    os.environ.update(request.get("env", {}))
    os.chdir(request.get("cwd", start_dir))
    sys.path[0] = os.getcwd()  # where sparkafka-python puts it, as python -m does
    status = run_through(socket_path, request["module"], request.get("argv", []))
    print(json.dumps({"status": status}), flush=True)
"""


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    package = tmp_path / "modules" / TARGET_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runner.py").write_text(textwrap.dedent(TARGET_SOURCE))
    # The hash seed Spark gives the runners (the zygote's too).
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "modules"), "PYTHONHASHSEED": "0"}
    # The zygote's and its children's stderr, as Spark's console would show it.
    stderr = (tmp_path / "driver.stderr").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, TARGET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=tmp_path / "modules",
    )
    stderr.close()
    assert process.stdout is not None
    ready = json.loads(process.stdout.readline())
    assert ready["zygote_ready"], ready
    (tmp_path / "socket").write_text(ready["socket"])
    yield process
    process.kill()
    process.wait()


def ask(driver: subprocess.Popen[str], **request: object) -> int | None:
    assert driver.stdin is not None and driver.stdout is not None
    driver.stdin.write(json.dumps(request) + "\n")
    driver.stdin.flush()
    return json.loads(driver.stdout.readline())["status"]


def test_the_child_runs_as_python_m_would_and_its_exit_status_comes_back(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    env = {"TARGET_OUT": str(out), "TARGET_MARK": "from the launcher", "TARGET_EXIT": "3"}
    # Another working directory is another sys.path[0]: the zygote's imports might not be the ones
    # the launcher would make, so it refuses and the launcher runs the module itself.
    assert ask(driver, module=TARGET, argv=["a", "b"], env=env, cwd=str(tmp_path)) is None
    assert ask(driver, module=TARGET, argv=["a", "b"], env=env) == 3
    ran = json.loads(out.read_text())
    assert ran["argv"] == ["a", "b"]
    assert ran["marker"] == "from the launcher"
    assert ran["cwd"] == str(tmp_path / "modules")
    assert ran["pid"] != driver.pid


def test_a_child_runs_the_module_it_was_asked_for_without_warnings(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    assert ask(driver, module=TARGET, env={"TARGET_OUT": str(out)}) == 0
    assert out.exists()
    # runpy warns when the module it runs as __main__ is already imported, as the zygote has it.
    assert "Warning" not in (tmp_path / "driver.stderr").read_text()


def test_a_zygote_slow_to_answer_runs_the_module_once_and_the_launcher_waits_for_it(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """On a loaded machine the zygote may answer seconds late (here: stopped for 3 s). The launcher
    waits: had it given up and run the module itself, the zygote's child would run it as well (two
    source runners connecting back to Spark for one worker)."""
    socket_path = Path((tmp_path / "socket").read_text())
    zygote_pid = int((socket_path.parent / runner_zygote._OWNER_FILE).read_text())
    runs = tmp_path / "runs"
    env = {"TARGET_OUT": str(tmp_path / "out.json"), "TARGET_MARK": "slow"}
    os.kill(zygote_pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, os.kill, (zygote_pid, signal.SIGCONT))
    resume.start()
    try:
        started = time.monotonic()
        assert ask(driver, module=TARGET, env={**env, "TARGET_RUNS": str(runs)}) == 0
        assert time.monotonic() - started >= 2.5
    finally:
        resume.join()
        os.kill(zygote_pid, signal.SIGCONT)
    time.sleep(1)  # a second run, had there been one, has written by now
    assert runs.read_text().splitlines() == ["ran"]


def test_modules_it_did_not_import_and_other_hash_seeds_are_refused(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Refused: the launcher runs the module itself (run_through returns None)."""
    out = tmp_path / "out.json"
    assert ask(driver, module="json.tool", env={"TARGET_OUT": str(out)}) is None
    assert ask(driver, module=TARGET, env={"TARGET_OUT": str(out), "PYTHONHASHSEED": "7"}) is None
    assert not out.exists()


def test_a_child_does_not_outlive_its_launcher(driver: subprocess.Popen[str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert driver.stdin is not None
    driver.stdin.write(
        json.dumps({"module": TARGET, "env": {"TARGET_OUT": str(out), "TARGET_SLEEP": "60"}}) + "\n"
    )
    driver.stdin.flush()
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = json.loads(out.read_text())["pid"]
    os.kill(driver.pid, signal.SIGKILL)  # the launcher (and the zygote's parent) dies
    driver.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


# A launcher of its own process, as sparkafka-python is: exit status 99 when the zygote refused. It
# waits for its child's end in a shell, as sparkafka-python does, or ("python") in Python.
LAUNCHER = """
import os, sys
from sparkafka.runtime.runner_zygote import run_through
sys.path[0] = os.getcwd()
os.umask(0o027)
status = run_through(sys.argv[1], sys.argv[2], [], wait_in_shell=sys.argv[3] == "shell")
sys.exit(99 if status is None else status)
"""


def _launch(driver_dir: Path, waits_in: str = "shell", **env: str) -> subprocess.Popen[str]:
    modules = driver_dir / "modules"
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, (driver_dir / "socket").read_text(), TARGET, waits_in],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(modules), "PYTHONHASHSEED": "0", **env},
        cwd=modules,
    )


def test_a_launcher_gone_before_the_zygote_answered_has_its_module_run_by_no_one(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Launchers killed while the zygote (stopped here) had not answered them yet: when it resumes, it
    forks for their requests, cannot tell them the pids, and the children must not run the module
    (they wait for a go byte that only a launcher told of its child releases)."""
    socket_path = Path((tmp_path / "socket").read_text())
    zygote_pid = int((socket_path.parent / runner_zygote._OWNER_FILE).read_text())
    runs = tmp_path / "runs"
    os.kill(zygote_pid, signal.SIGSTOP)
    try:
        launchers = [
            _launch(tmp_path, TARGET_OUT=str(tmp_path / f"out-{n}.json"), TARGET_RUNS=str(runs))
            for n in range(24)
        ]
        time.sleep(1.0)  # their requests are sent, unanswered
        for launcher in launchers:
            launcher.kill()
            launcher.wait()
    finally:
        os.kill(zygote_pid, signal.SIGCONT)
    time.sleep(2.0)  # the zygote has forked for every request by now, and any run has written
    assert not runs.exists()
    assert ask(driver, module=TARGET, env={"TARGET_OUT": str(tmp_path / "out.json")}) == 0


def test_the_child_talks_through_the_launchers_standard_streams(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """PySpark's daemon tells Spark its port on standard output and ends when its standard input
    closes: the child has the launcher's streams, not the zygote's."""
    out = tmp_path / "out.json"
    launcher = _launch(tmp_path, TARGET_OUT=str(out), TARGET_ECHO="1")
    said, complained = launcher.communicate("hello\n", timeout=30)
    assert launcher.returncode == 0, complained
    assert said == "HELLO\n"
    assert "said on stderr" in complained
    ran = json.loads(out.read_text())
    assert ran["pid"] != launcher.pid  # it ran in the zygote's child
    assert ran["umask"] == 0o027, "the launcher's umask, not the zygote's own (0o077, for its socket)"
    assert "said on stderr" not in (tmp_path / "driver.stderr").read_text()


def _started(out: Path) -> dict[str, object]:
    """What the zygote's child wrote once it ran."""
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return json.loads(out.read_text())


@pytest.mark.parametrize("waits_in", ["shell", "python"])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_child_and_the_group_it_leads_do_not_outlive_the_launcher(
    driver: subprocess.Popen[str], tmp_path: Path, stop: signal.Signals, waits_in: str
) -> None:
    """Spark destroys a daemon's process (SIGTERM, then SIGKILL when it lingers): here, the launcher,
    waiting for its child as a shell or in Python."""
    out = tmp_path / "out.json"
    launcher = _launch(tmp_path, waits_in, TARGET_OUT=str(out), TARGET_GROUP="1", TARGET_SLEEP="60")
    ran = _started(out)
    assert _alive(ran["pid"]) and _alive(ran["helper"])
    launcher.send_signal(stop)
    assert launcher.wait(timeout=10) == -stop
    deadline = time.monotonic() + 10
    while (_alive(ran["pid"]) or _alive(ran["helper"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(ran["pid"])
    assert not _alive(ran["helper"])


@pytest.mark.parametrize("waits_in", ["shell", "python"])
def test_the_launcher_exits_with_its_childs_status_wherever_it_waits(
    driver: subprocess.Popen[str], tmp_path: Path, waits_in: str
) -> None:
    """The status a launcher exits with, as ``python -m`` would have exited: the module's own, a
    killed child's as sys.exit(-signal) makes it (modulo 256), and 1 when the zygote was killed and
    the child with it."""
    exits = _launch(tmp_path, waits_in, TARGET_OUT=str(tmp_path / "a.json"), TARGET_EXIT="3")
    assert exits.wait(timeout=30) == 3
    large = _launch(tmp_path, waits_in, TARGET_OUT=str(tmp_path / "b.json"), TARGET_EXIT="300")
    assert large.wait(timeout=30) == 300 % 256
    # Beyond a C int: python -m exits with it modulo 256, and the zygote's child must too (not
    # unwind into the zygote's loop, which would kill the other children and remove the socket).
    huge = _launch(tmp_path, waits_in, TARGET_OUT=str(tmp_path / "h.json"), TARGET_EXIT=str(2**40 + 3))
    assert huge.wait(timeout=30) == 3
    assert Path((tmp_path / "socket").read_text()).exists()

    out = tmp_path / "c.json"
    killed = _launch(tmp_path, waits_in, TARGET_OUT=str(out), TARGET_SLEEP="60")
    os.kill(int(_started(out)["pid"]), signal.SIGKILL)
    assert killed.wait(timeout=30) == -signal.SIGKILL % 256

    out = tmp_path / "d.json"
    orphaned = _launch(tmp_path, waits_in, TARGET_OUT=str(out), TARGET_SLEEP="60")
    _started(out)
    socket_path = Path((tmp_path / "socket").read_text())
    os.kill(int((socket_path.parent / runner_zygote._OWNER_FILE).read_text()), signal.SIGKILL)
    assert orphaned.wait(timeout=30) == 1


def test_a_launcher_waits_for_its_child_as_a_shell_of_the_same_pid(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Once its child runs, the launcher's process is a shell (a few MiB instead of an interpreter's
    13), with the launcher's pid, standard streams and connection."""
    out = tmp_path / "out.json"
    launcher = _launch(tmp_path, TARGET_OUT=str(out), TARGET_ECHO="1", TARGET_SLEEP="60")
    assert launcher.stdin is not None and launcher.stdout is not None
    launcher.stdin.write("still the launcher's streams\n")
    launcher.stdin.flush()
    assert launcher.stdout.readline() == "STILL THE LAUNCHER'S STREAMS\n"
    _started(out)
    try:
        assert os.path.realpath(f"/proc/{launcher.pid}/exe") == os.path.realpath(runner_zygote._SHELL)
        command = Path(f"/proc/{launcher.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        # ps still tells what it waits for: the module and arguments it was started with.
        assert command[-2:] == [runner_zygote.WAITER_NAME, TARGET]
        # What the shell has open: the launcher's three pipes and its connection to the zygote, nothing
        # else (while it reads, the shell holds them under other numbers than 0-3).
        opened = {
            os.readlink(f"/proc/{launcher.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{launcher.pid}/fd")
        }
        streams = {
            os.readlink(f"/proc/self/fd/{pipe.fileno()}") for pipe in (launcher.stdin, launcher.stdout)
        }
        assert launcher.stderr is not None
        streams.add(os.readlink(f"/proc/self/fd/{launcher.stderr.fileno()}"))
        connection = os.readlink(f"/proc/{launcher.pid}/fd/{runner_zygote._EXIT_LINE_FD}")
        assert connection.startswith("socket:")
        assert opened == {*streams, connection}
        # Nothing of the launcher's environment steers the shell (bash as /bin/sh would read it).
        assert Path(f"/proc/{launcher.pid}/environ").read_bytes() == b""
    finally:
        launcher.kill()
        launcher.wait()


def test_a_zygote_killed_takes_its_children_and_the_processes_they_forked_with_it(
    driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """kill -9 of a pipeline's process group reaches the zygote but not the group a child leads
    (PySpark's daemon leads one with the workers it forks). Nothing may run on: a write task's worker
    left running would commit the transaction the kill caught open."""
    out = tmp_path / "out.json"
    launcher = _launch(tmp_path, TARGET_OUT=str(out), TARGET_GROUP="1", TARGET_SLEEP="60")
    try:
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ran = json.loads(out.read_text())
        assert _alive(ran["pid"]) and _alive(ran["helper"])
        socket_path = Path((tmp_path / "socket").read_text())
        os.kill(int((socket_path.parent / runner_zygote._OWNER_FILE).read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (_alive(ran["pid"]) or _alive(ran["helper"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(ran["pid"])
        assert not _alive(ran["helper"]), "the process the zygote's child forked outlived the zygote"
    finally:
        launcher.kill()
        launcher.wait()


@pytest.mark.parametrize("daemon", ["running", "shutting-down"])
def test_a_zygote_killed_ends_a_daemons_group_as_spark_stopping_the_daemon_would(
    driver: subprocess.Popen[str], tmp_path: Path, daemon: str
) -> None:
    """What a worker of PySpark's daemon starts otherwise than by forking from its main thread (a
    subprocess, a fork from a thread of its own) gets no death signal of its own; it ends with the
    daemon's group when the zygote is killed with SIGKILL, also when the daemon is shutting down
    (PySpark's shutdown resets SIGTERM to the default before it sends its group SIGHUP: a SIGTERM
    then would end the daemon alone)."""
    out = tmp_path / "out.json"
    launcher = _launch(tmp_path, TARGET_OUT=str(out), TARGET_DAEMON=daemon, TARGET_SLEEP="60")
    try:
        worker_out = Path(f"{out}.worker")
        deadline = time.monotonic() + 20
        while not (out.exists() and worker_out.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        ran, started = json.loads(out.read_text()), json.loads(worker_out.read_text())
        processes = {"daemon": ran["pid"], "worker": ran["helper"], **started}
        assert all(_alive(pid) for pid in processes.values()), processes
        socket_path = Path((tmp_path / "socket").read_text())
        os.kill(int((socket_path.parent / runner_zygote._OWNER_FILE).read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in processes.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [name for name, pid in processes.items() if _alive(pid)], "outlived the zygote"
    finally:
        launcher.kill()
        launcher.wait()


# A zygote's child that forks from its main thread and another thread at once, and reports what
# death signal each child was given: "<thread> <signal>" per line.
CONCURRENT_FORKS = """
import ctypes, os, signal, sys, threading
from sparkafka.runtime import runner_zygote

os.register_at_fork(
    before=runner_zygote._note_parent,
    after_in_parent=runner_zygote._forget_parent,
    after_in_child=runner_zygote._die_with_noted_parent,
)
libc = ctypes.CDLL(None, use_errno=True)
read_end, write_end = os.pipe()

def fork_many(name):
    for _ in range(int(sys.argv[1])):
        pid = os.fork()
        if pid == 0:
            given = ctypes.c_int(-1)
            libc.prctl(2, ctypes.byref(given))  # PR_GET_PDEATHSIG
            os.write(write_end, f"{name} {given.value}\\n".encode())
            os._exit(0)
        os.waitpid(pid, 0)

other = threading.Thread(target=fork_many, args=("thread",))
other.start()
fork_many("main")
other.join()
os.close(write_end)
with os.fdopen(read_end) as lines:
    sys.stdout.write(lines.read())
"""


def test_forks_from_two_threads_at_once_each_get_their_own_threads_rule() -> None:
    """Only a fork from a main thread is given the death signal (the kernel sends it when the
    forking thread ends); a fork from another thread at the same moment must neither take it nor
    take it away."""
    forks = 500
    finished = subprocess.run(
        [sys.executable, "-c", CONCURRENT_FORKS, str(forks)], capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stderr
    seen = Counter(finished.stdout.splitlines())
    assert seen == {f"main {int(signal.SIGKILL)}": forks, "thread 0": forks}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its reaper counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_directories_of_killed_zygotes_are_removed_by_the_next_start(tmp_path: Path) -> None:
    """SIGKILL skips a zygote's own cleanup; the next start removes what it left."""
    from sparkafka.runtime import runner_zygote

    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(finished.stdout)
    made = {}
    for name, owner in (("dead", str(dead_pid)), ("alive", str(os.getpid())), ("starting", None)):
        directory = Path(tempfile.mkdtemp(prefix="sparkafka-zygote-"))
        (directory / "zygote.sock").write_text("")
        if owner is not None:
            (directory / "owner").write_text(owner)
        made[name] = directory
    try:
        runner_zygote.remove_abandoned_directories()
        assert not made["dead"].exists()
        assert made["alive"].exists() and made["starting"].exists()
    finally:
        for directory in made.values():
            shutil.rmtree(directory, ignore_errors=True)
