"""One process per checkpoint: a lease the driver of the running query holds beside its checkpoint.

Why. Spark refuses a second active query on a checkpoint only within one session; two processes
started on one checkpoint would both plan its micro-batches and both write them. Kafka's fencing
keeps their transactions from both committing a batch, but they would fence each other in turn
and fail in ways that say nothing of the cause. The lease stops the second one before it writes,
naming the first.

What. ``sparkafka/lease.json`` in the checkpoint: the process holding it (host, process id and
start time of the Spark driver's JVM), when it was taken and renewed, and its timeout (option
``leaseTimeoutMs``).

Steps of this module (its own, not the protocol's), every time Spark creates the sink's writer on
the driver (every micro-batch):
(a) Read the lease. Held by this process: renew it once a third of its timeout has passed.
(b) Held by another process that is alive: refuse, naming it. On this host "alive" is checked
   (the process exists and started when the lease says); on another host the lease counts until
   it expires, ``leaseTimeoutMs`` after its last renewal.
(c) Otherwise (none, expired, or its holder on this host is gone): write this process's lease, wait
   :data:`SETTLE_S`, read it back; another process that wrote in between wins and this one refuses.
   Two processes starting together thus end with one lease, as a reader sees the last writer.

Invariant: a process writes output only in micro-batches whose writer found the lease its own.
Limit: renewals happen at micro-batches; a query idle for longer than the timeout holds no lease
until its next batch, when it finds out whether another process took the checkpoint meanwhile
(and refuses if so)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sparkafka.connector.sink.batch_plan import CheckpointFiles
from sparkafka.connector.sink.options import LEASE_TIMEOUT_OPTION
from sparkafka.errors import ReplayRefused
from sparkafka.runtime.python_exec import LAUNCHER_PARENT_ENV

log = logging.getLogger(__name__)

LEASE_FILE = "sparkafka/lease.json"
# How long a new holder waits before reading its lease back (step (c)).
SETTLE_S = 0.5


@dataclass(frozen=True)
class Holder:
    """A process, told apart from a later one that reuses its id by its start time. ``machine``
    tells whether two holders see the same process table: the host's boot id and the process id
    namespace ("" where they cannot be read), since containers can share a host name but not
    their processes."""

    host: str
    pid: int
    started_ms: int
    machine: str = ""

    def described(self) -> str:
        return f"process {self.pid} on host {self.host}, started {_when(self.started_ms)}"

    def same_process(self, other: Holder) -> bool:
        """The same process, whatever a wall-clock step since did to the start time read from it
        (Linux derives it from the boot time, which moves with the clock)."""
        return (
            self.host == other.host
            and self.machine == other.machine
            and self.pid == other.pid
            and (0 in (self.started_ms, other.started_ms) or abs(self.started_ms - other.started_ms) < 5000)
        )

    def sees_processes_of(self, other: Holder) -> bool:
        """Whether ``other``'s process id means the same process here (same host and process table)."""
        return self.host == other.host and self.machine == other.machine and bool(self.machine)


@dataclass(frozen=True)
class Lease:
    holder: Holder
    acquired_ms: int
    renewed_ms: int
    timeout_ms: int

    @property
    def expires_ms(self) -> int:
        return self.renewed_ms + self.timeout_ms

    def encode(self) -> str:
        return json.dumps({"version": 1, **dataclasses.asdict(self)}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Lease:
        fields = json.loads(text)
        if fields.get("version") != 1:
            raise ValueError(f"lease version {fields.get('version')!r}, this sparkafka reads 1")
        holder = fields["holder"]
        return cls(
            Holder(
                str(holder["host"]),
                int(holder["pid"]),
                int(holder["started_ms"]),
                str(holder.get("machine", "")),
            ),
            int(fields["acquired_ms"]),
            int(fields["renewed_ms"]),
            int(fields["timeout_ms"]),
        )


def hold_checkpoint_lease(checkpoint_location: str, timeout_ms: int, *, me: Holder | None = None) -> None:
    """The steps of the module docstring for the writer being created in this process."""
    me = me or this_driver()
    files = CheckpointFiles(checkpoint_location)
    now = _now_ms()
    lease = _read(files)
    if lease is not None and lease.holder.same_process(me):
        if now - lease.renewed_ms >= lease.timeout_ms // 3 or lease.timeout_ms != timeout_ms:
            _write(files, dataclasses.replace(lease, renewed_ms=now, timeout_ms=timeout_ms))
        return
    if lease is not None and _in_force(lease, me, now):
        raise ReplayRefused(_held_by_another(checkpoint_location, lease, me))
    if lease is not None:
        log.warning(
            "taking over the lease of checkpoint %s from %s (%s)",
            checkpoint_location,
            lease.holder.described(),
            "gone" if me.sees_processes_of(lease.holder) else f"expired {_when(lease.expires_ms)}",
        )
    _write(files, Lease(me, now, now, timeout_ms))
    time.sleep(SETTLE_S)
    settled = _read_back(files)
    if settled is None:
        raise ReplayRefused(
            f"the lease of checkpoint {checkpoint_location} could not be read back after this process "
            f"wrote it ({LEASE_FILE}): another process is taking it at this moment. Nothing was written; "
            "start again, and the one of the two that holds the lease goes on"
        )
    if not settled.holder.same_process(me):
        raise ReplayRefused(_held_by_another(checkpoint_location, settled, me))


def this_driver() -> Holder:
    """The Spark driver this Python process works for: the JVM among its ancestors (Spark forks the
    driver's Python workers from daemons of its own, one per kind of worker); where the process
    table cannot be read, this process's parent.

    A daemon that sparkafka's zygote forked for the launcher Spark started
    (:mod:`sparkafka.runtime.python_exec`) descends from the zygote, whose ancestors are the user's
    process and whatever started it — a JVM among them (a build tool, a CI agent) is not the
    driver. There the launcher named the process that started it, Spark's JVM: the driver is looked
    for from that one only, and is that one where no JVM is found, so every daemon of a session
    names the same driver, also one orphaned by a zygote that died."""
    launcher_parent = os.environ.get(LAUNCHER_PARENT_ENV, "")
    if launcher_parent.isdigit():
        driver = _java_ancestor(int(launcher_parent)) or int(launcher_parent)
    else:
        driver = _java_ancestor(os.getppid()) or os.getppid()
    return Holder(socket.gethostname(), driver, _started_ms(driver) or 0, _machine())


def _machine() -> str:
    """This host's boot id and process id namespace ("" where Linux's /proc does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot_id}/{namespace}"


def _java_ancestor(pid: int) -> int | None:
    """The first process named ``java`` from ``pid`` up, within 8 generations."""
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
                name = comm.read().strip()
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None
        if name == "java":
            return pid
        if parent <= 1:
            return None
        pid = parent
    return None


def _in_force(lease: Lease, me: Holder, now_ms: int) -> bool:
    """Where this process sees the holder's process table, while the holder lives; elsewhere, until
    the lease expires."""
    if me.sees_processes_of(lease.holder):
        return _alive(lease.holder)
    return now_ms < lease.expires_ms


def _alive(holder: Holder) -> bool:
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    started = _started_ms(holder.pid)
    # A process id reused by a later process is not the holder (start times within seconds).
    return started is None or holder.started_ms == 0 or abs(started - holder.started_ms) < 5000


def _started_ms(pid: int) -> int | None:
    """When process ``pid`` started (Linux's /proc; None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as system:
            boot_s = next(int(line.split()[1]) for line in system if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return int((boot_s + int(fields[19]) / ticks) * 1000)


def _read_back(files: CheckpointFiles) -> Lease | None:
    """The lease just written, read again a few times: on an object store another writer's delete
    and move leave no file for a moment."""
    for _ in range(5):
        found = _read(files)
        if found is not None:
            return found
        time.sleep(SETTLE_S / 5)
    return None


def _read(files: CheckpointFiles) -> Lease | None:
    try:
        text = files.text(LEASE_FILE)
        return None if text is None else Lease.decode(text)
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("the checkpoint's lease %s cannot be read (%s): taken as absent", LEASE_FILE, error)
        return None


def _write(files: CheckpointFiles, lease: Lease) -> None:
    files.write(LEASE_FILE, lease.encode())


def _held_by_another(checkpoint_location: str, lease: Lease, me: Holder) -> str:
    until = (
        f"stop it first (if no such process runs, its id taken by another program, delete "
        f"{checkpoint_location}/{LEASE_FILE}: nothing else is lost with it)"
        if me.sees_processes_of(lease.holder)
        else f"stop it first; if it is gone, start again after {_when(lease.expires_ms)}, when its lease "
        f"expires (option {LEASE_TIMEOUT_OPTION}={lease.timeout_ms} after its last renewal, "
        f"{_when(lease.renewed_ms)})"
    )
    return (
        f"the checkpoint {checkpoint_location} is in use by another process: {lease.holder.described()}, "
        f"holding it since {_when(lease.acquired_ms)}. Two processes on one checkpoint would both plan and "
        f"write its micro-batches, so this one writes nothing and stops. To run the query here, {until}. "
        "To run a second copy of the query, give it a checkpoint of its own"
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
