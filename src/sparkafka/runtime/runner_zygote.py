"""A forking server that starts Spark's Python processes with PySpark and sparkafka already imported.

Why: Spark starts a new Python process for every streaming query that reads a Python data source
(``pyspark.sql.streaming.python_streaming_source_runner``), and on the driver one worker daemon
(``pyspark.daemon``) per kind of planning request: looking up, creating and planning a data
source, creating a writer, committing a write, running a streaming sink. Each imports PySpark,
pyarrow and numpy: 0.3-0.4 s of CPU and of query start-up each time (docs/benchmarks.md), as much
as reading a third of a million records, and every worker a daemon forks imports pyarrow and the
connector again. sparkafka's local sessions start this zygote once (:func:`start`);
``sparkafka-python``, which Spark runs for those modules and for the executors' worker daemon,
asks it to fork a ready child instead of importing everything again (:func:`run_through`), as
Spark's own daemon does for executor workers.

Protocol, one Unix socket connection per process, JSON lines:

1. launcher -> zygote: one byte carrying the launcher's standard input, output and error
   (SCM_RIGHTS): a worker daemon talks to Spark through them. Then ``{"module", "argv", "env",
   "cwd", "path", "umask"}``: what ``python -m`` would run, with the launcher's environment,
   working directory, ``sys.path`` and file-creation mask;
2. zygote -> launcher: ``{"pid": n}`` once the child runs, or ``{"refused": reason}``: the module is
   not one the zygote imported, or the launcher's ``sys.path`` or ``PYTHONHASHSEED`` differs from
   the zygote's (the modules imported in advance would not be the ones the launcher would import);
   the launcher then runs the module itself. Once its request is sent, the launcher waits for
   this answer however long the zygote takes, and runs the module itself only on a refusal or on
   a connection closed without an answer. A child waits for a go byte the zygote writes only once
   its launcher was sent the pid, so a child that could not be reported (its launcher gone, or the
   zygote killed in between) never runs the module. So a module never runs twice for one launcher;
3. zygote -> launcher: ``{"exit": status}`` when the child ends; the launcher exits with it.
   Once it knows the pid, ``sparkafka-python`` (a whole interpreter, about 13 MiB) replaces itself
   by a shell that only reads that line from the connection and exits with the status (about
   1.5 MiB; :func:`_wait_in_shell`): same pid, same connection, same streams. It reads the answer
   to its request byte by byte, so that nothing of the exit line is left in a buffer of its own.

Invariants: the child runs with the launcher's argv, environment, working directory, umask and
standard streams, as ``python -m`` would have run it there. A child never outlives its launcher: when the
launcher's connection closes first (Spark destroyed it, or it was killed), the zygote kills the
child and the process group it leads (a worker daemon's forked workers); when the zygote itself is
killed (kill -9 of the pipeline's process group), the kernel sends each child a death signal: a
worker daemon a real-time signal on which it SIGKILLs the process group it leads (its workers and
whatever they started), any other child SIGTERM; and it kills every process forked from a main
thread below a child as its parent dies
(PR_SET_PDEATHSIG, asked for at each such fork). The zygote holds no
descriptor of a launcher's streams once the child has them, so Spark sees the child's end as it
would see a process of its own end. The zygote runs Python on one thread (so forking it is safe)
and exits once the process that started it is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkafka.runtime.python_exec import SERVED_MODULES, ZYGOTE_ENV, apply_path_rule

__all__ = ["SERVED_MODULES", "WAITER_NAME", "ZYGOTE_ENV", "run_through", "start"]
# What the runner and the workers unpickle (sparkafka's data source, its reader and writer, and the
# client they use), PySpark's worker, and the modules a driver-side daemon's workers run.
_ALSO_IMPORTED = (
    "sparkafka.connector.source",
    "sparkafka.connector.datasource",
    "sparkafka.connector.sink.writer",
    "pyspark.worker",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.python_streaming_sink_runner",
)
_STANDARD_STREAMS = (0, 1, 2)
_CONNECT_TIMEOUT_S = 2.0
# How long a launcher waits for the zygote's answer once it sent its request: Spark gives up on a
# worker that has not connected back long before.
_ANSWER_TIMEOUT_S = 60.0
# What the zygote sends a child once its launcher knows it runs.
_GO = b"g"
_PR_SET_PDEATHSIG = 1
_PARENT_CHECK_S = 0.5
_DIRECTORY_PREFIX = "sparkafka-zygote-"
_OWNER_FILE = "owner"  # the zygote's pid
_SHELL = "/bin/sh"
# The waiting shell's $0; its command line goes on with the module and arguments the launcher ran,
# so that ps (and the benchmarks' memory breakdown) still tells what it waits for.
WAITER_NAME = "sparkafka-python-waiter"
# The connection's descriptor in the shell that waits for the exit line (_wait_in_shell).
_EXIT_LINE_FD = 3
# The exit line is {"exit": N}, N what os.waitstatus_to_exitcode gave (-signal for a killed child):
# the shell exits with N modulo 256, as sys.exit(N) makes Python exit; with 1 when the connection
# closes without a line (the zygote was killed, and the child with it) or the line is not one.
_EXIT_LINE_WAITER = (
    'IFS= read -r line <&3 || [ -n "$line" ] || exit 1\n'
    "status=${line##*:}; status=${status%%\\}*}; status=${status# }\n"
    "case $status in ''|-|*[!0-9-]*|?*-*) exit 1 ;; esac\n"
    "exit $(( status & 255 ))\n"
)


def start(modules: Sequence[str] = SERVED_MODULES) -> str | None:
    """Start a zygote for ``modules``, a child of this process that ends with it, and return its
    socket path, or None when it could not be started. It imports in the background: until it
    listens, launchers run the module themselves."""
    remove_abandoned_directories()
    directory = tempfile.mkdtemp(prefix=_DIRECTORY_PREFIX)
    socket_path = os.path.join(directory, "zygote.sock")
    env = dict(os.environ)
    # One BLAS thread: numpy's import must not leave threads behind in a process that forks.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # The hash seed Spark gives the Python processes it starts (PySpark's default, unless set).
    env.setdefault("PYTHONHASHSEED", "0")
    zygote_module = "sparkafka.runtime.runner_zygote"
    command = [sys.executable, "-m", zygote_module, socket_path, str(os.getpid()), *modules]
    try:
        # In the caller's process group, so that a signal to the group reaches it too. Its children's
        # output goes where a runner's would: not to stdout, which sparkafka's commands print on.
        zygote = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno())
    except (OSError, ValueError):
        shutil.rmtree(directory, ignore_errors=True)
        return None
    Path(directory, _OWNER_FILE).write_text(str(zygote.pid))
    return socket_path


def remove_abandoned_directories() -> None:
    """Remove the socket directories of zygotes that were killed (SIGKILL skips their own cleanup,
    and `sparkafka verify` kills pipelines' process groups): each names its zygote's pid."""
    for directory in Path(tempfile.gettempdir()).glob(f"{_DIRECTORY_PREFIX}*"):
        try:
            pid = int((directory / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # another user's, or a zygote still starting
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def run_through(socket_path: str, module: str, argv: list[str], *, wait_in_shell: bool = False) -> int | None:
    """Run ``module`` as ``__main__`` in a child of the zygote at ``socket_path``: its exit status,
    or None when the zygote is not there or refuses (the caller runs the module itself).

    With ``wait_in_shell`` (a launcher, whose process has nothing else to do), once the child runs
    this process becomes a shell that exits with the child's status (:func:`_wait_in_shell`): the
    call then returns only where no shell could be started."""
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(_CONNECT_TIMEOUT_S)
        connection.connect(socket_path)
    except OSError:
        return None
    with connection, connection.makefile("wb") as stream:
        umask = os.umask(0o077)  # reading it sets it: put it back at once (one thread here)
        os.umask(umask)
        request = {
            "module": module,
            "argv": argv,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "path": sys.path,
            "umask": umask,
        }
        try:
            socket.send_fds(connection, [b"S"], list(_STANDARD_STREAMS))
            stream.write(json.dumps(request).encode() + b"\n")
            stream.flush()
        except OSError:
            return None  # the zygote forks nothing for a request it did not receive whole
        # From here on the zygote may fork a child for this request, however long it takes to answer
        # (a loaded machine): running the module here too would run it twice, so only an answer
        # saying no child runs lets the caller run it itself.
        connection.settimeout(_ANSWER_TIMEOUT_S)
        try:
            answer = json.loads(_read_line(connection) or b"{}")
        except ConnectionResetError:
            return None  # the zygote closed with the request unread: it forked nothing
        except (OSError, ValueError):
            return 1  # unknown whether a child runs: closing the connection makes the zygote kill it
        if not isinstance(answer, dict) or "pid" not in answer:
            return None  # refused, or closed before reporting a child, which then never runs
        connection.settimeout(None)
        # From here on the child runs: its end is the launcher's end, whatever happens.
        if wait_in_shell:
            _wait_in_shell(connection, [module, *argv])
        line = _read_line(connection)
    try:
        return int(json.loads(line)["exit"])
    except (ValueError, KeyError, TypeError):
        return 1  # the zygote went away without reporting: the child was killed with it (_die_with_parent)


def _read_line(connection: socket.socket) -> bytes:
    """One line from ``connection``, read a byte at a time: what follows it stays in the socket (a
    line is a few dozen bytes, read twice per process Spark starts)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            break
        line += byte
    return bytes(line)


def _wait_in_shell(connection: socket.socket, running: list[str]) -> None:
    """Replace this launcher by a shell that waits for the exit line on ``connection`` and exits
    with its status (:data:`_EXIT_LINE_WAITER`); its command line ends with ``running`` (the module
    and its arguments). Return only where that cannot be done (no shell): the launcher waits itself.

    Why: the launcher's only work left is that wait, for as long as its child runs, and a whole
    interpreter holds about 13 MiB of memory for it; Spark keeps several such processes per session.
    Invariants: the process keeps its pid, its standard streams and its connection, so Spark still
    sees the launcher's end as the child's, and a killed shell closes the connection, on which the
    zygote kills the child, as for a killed launcher. Nothing is read from the connection before the
    exec that the shell would need (:func:`_read_line`), and the connection's descriptor is the only
    one beside the standard streams the shell inherits (Python makes its others non-inheritable)."""
    if not os.access(_SHELL, os.X_OK):
        return
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        if connection.fileno() == _EXIT_LINE_FD:
            os.set_inheritable(_EXIT_LINE_FD, True)
        else:
            os.dup2(connection.fileno(), _EXIT_LINE_FD, inheritable=True)
        # An empty environment: the reader needs none, and a shell that reads its environment (bash
        # as /bin/sh: exported functions, SHELLOPTS) must not be steered by the user's.
        os.execve(_SHELL, [_SHELL, "-c", _EXIT_LINE_WAITER, WAITER_NAME, *running], {})
    except OSError:
        return


class _Zygote:
    def __init__(self, socket_path: str, parent_pid: int, modules: list[str]) -> None:
        self.socket_path = socket_path
        self.parent_pid = parent_pid
        self.modules = modules
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A child's end wakes the loop at once (SIGCHLD through Python's wakeup fd), so that its
        # launcher learns the exit status without waiting for the next parent check.
        self.wakeup_read, self.wakeup_write = os.pipe()

    def serve(self) -> None:
        # Ctrl-C in a terminal reaches the whole process group; the zygote ends with its parent.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for module in [*self.modules, *_ALSO_IMPORTED]:
            importlib.import_module(module)
        # The socket only this user may reach; the children get the launcher's umask back.
        os.umask(0o077)
        self.listener.bind(self.socket_path)
        self.listener.listen(16)
        self.selector.register(self.listener, selectors.EVENT_READ)
        os.set_blocking(self.wakeup_write, False)
        signal.set_wakeup_fd(self.wakeup_write)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self.selector.register(self.wakeup_read, selectors.EVENT_READ)
        try:
            while os.getppid() == self.parent_pid:
                for key, _ in self.selector.select(_PARENT_CHECK_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj == self.wakeup_read:
                        os.read(self.wakeup_read, 4096)
                    else:
                        self._launcher_gone(key.data)
                self._reap()
        finally:
            for pid in list(self.children):
                _kill_child(pid)
            shutil.rmtree(os.path.dirname(self.socket_path), ignore_errors=True)

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        connection.settimeout(_CONNECT_TIMEOUT_S)
        streams: list[int] = []
        try:
            _, streams, _, _ = socket.recv_fds(connection, 1, len(_STANDARD_STREAMS))
            request = json.loads(connection.makefile("rb").readline() or b"{}")
            refusal = self._refusal(request, streams)
            if refusal is not None:
                connection.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
                connection.close()
                return
            # The child waits for a go byte, written once its launcher was told its pid: a launcher
            # gone by then (or a zygote killed in between) leaves the module unrun.
            go_read, go_write = os.pipe()
            zygote_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(go_write)
                self._run_child(request, streams, connection, go_read, zygote_pid)  # never returns
            os.close(go_read)
            try:
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                os.write(go_write, _GO)
            except OSError:
                _kill_child(pid)  # its launcher is gone: no child runs without one
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                raise
            finally:
                os.close(go_write)
        except (OSError, ValueError):
            connection.close()
            return
        finally:
            # The child has its own copies: a stream Spark reads must end when the child ends.
            for descriptor in streams:
                os.close(descriptor)
        connection.settimeout(None)
        self.children[pid] = connection
        self.selector.register(connection, selectors.EVENT_READ, pid)

    def _refusal(self, request: dict[str, Any], streams: list[int]) -> str | None:
        if len(streams) != len(_STANDARD_STREAMS):
            return "the launcher's standard streams did not arrive"
        if not isinstance(request.get("umask"), int):
            return "the launcher sent no umask"
        if request.get("module") not in self.modules:
            return f"module {request.get('module')!r} is not one this zygote imported"
        if request.get("path") != sys.path:
            return "the launcher's sys.path differs from the zygote's"
        if (request.get("env") or {}).get("PYTHONHASHSEED") != os.environ.get("PYTHONHASHSEED"):
            return "the launcher's PYTHONHASHSEED differs from the zygote's"
        return None

    def _run_child(
        self,
        request: dict[str, Any],
        streams: list[int],
        own_connection: socket.socket,
        go: int,
        zygote_pid: int,
    ) -> None:
        # Not SIGKILL: PySpark's daemon leads a process group of its own with the workers it forks,
        # which no kill of the pipeline's group reaches, and what they started that no death signal
        # reaches (subprocesses they exec'd, forks from their threads) must end with it: a worker
        # left running after a kill -9 would finish its task, committing the transaction the kill
        # caught open. So a child that makes itself a group leader gets a signal PySpark never
        # handles, on which it kills its group (:func:`_lead_group_and_end_it_with_the_zygote`): on
        # SIGTERM PySpark's daemon would send its group SIGHUP, but its shutdown resets SIGTERM to
        # the default before it does, and a SIGTERM in between (the kernel may send the death
        # signal twice) would end the daemon alone. Until then, and for any other child, SIGTERM,
        # by which a module that handles none ends at once, as by SIGKILL.
        _die_with_parent(signal.SIGTERM)
        os.setpgid = _lead_group_and_end_it_with_the_zygote(os.setpgid, zygote_pid)
        if os.getppid() != zygote_pid:
            os._exit(1)  # the zygote ended before the death signal was asked for
        # And every process it forks from a main thread, and they fork, down the tree, at once.
        os.register_at_fork(
            before=_note_parent,
            after_in_parent=_forget_parent,
            after_in_child=_die_with_noted_parent,
        )
        if os.read(go, 1) != _GO:
            os._exit(1)  # the launcher never learnt of this child: it must not run the module
        os.close(go)
        status = 1
        try:
            for target, descriptor in zip(_STANDARD_STREAMS, streams, strict=True):
                os.dup2(descriptor, target)
                os.close(descriptor)
            self.selector.close()
            self.listener.close()
            for connection in [*self.children.values(), own_connection]:
                connection.close()
            signal.set_wakeup_fd(-1)
            os.close(self.wakeup_read)
            os.close(self.wakeup_write)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.chdir(request["cwd"])
            os.umask(int(request["umask"]))
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = [request["module"], *request["argv"]]
            # The zygote imported the module for its imports; ``python -m`` would not have it in
            # sys.modules, and runpy warns on stderr (for every query) when it finds it there.
            sys.modules.pop(request["module"], None)
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exit_request:
            code = exit_request.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            # As the process exits that python -m would be: the status modulo 256 (os._exit refuses
            # what does not fit a C int, and the child would then unwind into the zygote's loop).
            os._exit(status & 0xFF)

    def _launcher_gone(self, pid: int) -> None:
        """The launcher's connection is readable: it closed (it never sends more). Kill its child."""
        _kill_child(pid)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is None:
                continue
            self.selector.unregister(connection)
            with contextlib.suppress(OSError):
                connection.sendall(
                    json.dumps({"exit": os.waitstatus_to_exitcode(wait_status)}).encode() + b"\n"
                )
            connection.close()


# The death signal of a child leading a process group (PySpark's worker daemon): a real-time signal,
# which PySpark neither handles nor resets (no such signal where there is no PR_SET_PDEATHSIG).
_ZYGOTE_GONE = getattr(signal, "SIGRTMIN", signal.SIGTERM + 32) + 3


def _end_own_group(_signum: int, _frame: object) -> None:
    """The zygote is gone: SIGKILL the process group this child leads (a worker daemon's workers,
    and what they started that has no death signal of its own), whatever the child's own shutdown
    is doing, then end."""
    with contextlib.suppress(OSError):
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _lead_group_and_end_it_with_the_zygote(setpgid: Any, zygote_pid: int) -> Any:
    """``os.setpgid`` for a zygote's child: once the child leads a process group of its own, its
    death signal is :data:`_ZYGOTE_GONE`, handled by :func:`_end_own_group`."""

    def setpgid_and_arm(pid: int, pgrp: int) -> None:
        setpgid(pid, pgrp)
        if pid in (0, os.getpid()) and os.getpgid(0) == os.getpid():
            signal.signal(_ZYGOTE_GONE, _end_own_group)
            _die_with_parent(_ZYGOTE_GONE)
            if os.getppid() != zygote_pid:
                _end_own_group(_ZYGOTE_GONE, None)  # the zygote ended before the signal was asked for

    return setpgid_and_arm


def _die_with_parent(signal_number: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signal_number`` to this process when its parent ends however it ends
    (Linux's PR_SET_PDEATHSIG; elsewhere nothing): a zygote killed with SIGKILL cannot kill its
    children, and their launchers, told of the zygote's end, exit."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal_number)


# Thread id -> the pid of the process forking from that thread, or 0 for a thread other than the
# main one (see _die_with_noted_parent). By thread: two threads may fork at once, and a child's
# forking thread keeps its id in the child.
_forking_parents: dict[int, int] = {}


def _note_parent() -> None:
    main = threading.current_thread() is threading.main_thread()
    _forking_parents[threading.get_ident()] = os.getpid() if main else 0


def _forget_parent() -> None:
    _forking_parents.pop(threading.get_ident(), None)


def _die_with_noted_parent() -> None:
    """In a forked child: die with the parent, and at once if it ended before the death signal was
    asked for (the kernel sends none for a parent already gone). Only for a fork from the parent's
    main thread, as PySpark's daemon forks its workers: the kernel sends the signal when the forking
    thread ends, which for another thread (a user's pool) may be long before the parent does."""
    parent = _forking_parents.pop(threading.get_ident(), 0)
    _forking_parents.clear()  # the other threads' entries belong to the parent's forks
    if not parent:
        return
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


def _kill_child(pid: int) -> None:
    """Kill a child, and the process group it leads if it made one (PySpark's daemon does, for the
    workers it forks): a group id equal to the child's pid is the child's own group, never the
    zygote's."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    """``python -m sparkafka.runtime.runner_zygote SOCKET PARENT_PID [MODULE ...]`` (default: the modules
    ``sparkafka-python`` sends here)."""
    args = sys.argv[1:] if argv is None else argv
    socket_path, parent_pid, modules = args[0], int(args[1]), args[2:] or list(SERVED_MODULES)
    apply_path_rule()
    Path(socket_path).parent.mkdir(parents=True, exist_ok=True)
    _Zygote(socket_path, parent_pid, modules).serve()


if __name__ == "__main__":
    main()
