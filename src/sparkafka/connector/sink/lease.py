"""One process per checkpoint: a lease the driver of the running query holds beside its checkpoint.

Why. Spark refuses a second active query on a checkpoint only within one session; two processes
started on one checkpoint would both plan its micro-batches and both write them. Kafka's fencing
keeps their transactions from both committing a batch, but they would fence each other in turn
and fail in ways that say nothing of the cause. The lease stops the second one before it writes,
naming the first.

What. ``sparkafka/lease.json`` in the checkpoint: the process holding it (host, process id and
start time of the Spark driver's JVM), when it was taken and renewed, and its timeout (option
``leaseTimeoutMs``).

Steps, every time Spark creates the sink's writer on the driver (every micro-batch):
1. Read the lease. Held by this process: renew it once a third of its timeout has passed.
2. Held by another process that is alive: refuse, naming it. On this host "alive" is checked
   (the process exists and started when the lease says); on another host the lease counts until
   it expires, ``leaseTimeoutMs`` after its last renewal.
3. Otherwise (none, expired, or its holder on this host is gone): write this process's lease, wait
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

from sparkafka.connector.replay import ReplayRefused
from sparkafka.connector.sink.batch_plan import CheckpointFiles
from sparkafka.connector.sink.options import LEASE_TIMEOUT_OPTION

log = logging.getLogger(__name__)

LEASE_FILE = "sparkafka/lease.json"
# How long a new holder waits before reading its lease back (step 3).
SETTLE_S = 0.5


@dataclass(frozen=True)
class Holder:
    """A process, told apart from a later one that reuses its id by its start time."""

    host: str
    pid: int
    started_ms: int

    def described(self) -> str:
        return f"process {self.pid} on host {self.host}, started {_when(self.started_ms)}"


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
            Holder(str(holder["host"]), int(holder["pid"]), int(holder["started_ms"])),
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
    if lease is not None and lease.holder == me:
        if now - lease.renewed_ms >= lease.timeout_ms // 3 or lease.timeout_ms != timeout_ms:
            _write(files, dataclasses.replace(lease, renewed_ms=now, timeout_ms=timeout_ms))
        return
    if lease is not None and _in_force(lease, now):
        raise ReplayRefused(_held_by_another(checkpoint_location, lease))
    if lease is not None:
        log.warning(
            "taking over the lease of checkpoint %s from %s (%s)",
            checkpoint_location,
            lease.holder.described(),
            "gone" if lease.holder.host == me.host else f"expired {_when(lease.expires_ms)}",
        )
    _write(files, Lease(me, now, now, timeout_ms))
    time.sleep(SETTLE_S)
    settled = _read(files)
    if settled is None or settled.holder != me:
        winner = settled or lease
        assert winner is not None
        raise ReplayRefused(_held_by_another(checkpoint_location, winner))


def this_driver() -> Holder:
    """The Spark driver this Python process works for: the JVM among its ancestors (Spark forks the
    driver's Python workers from daemons of its own, one per kind of worker); where the process
    table cannot be read, this process's parent."""
    driver = _java_ancestor() or os.getppid()
    return Holder(socket.gethostname(), driver, _started_ms(driver) or 0)


def _java_ancestor() -> int | None:
    pid = os.getppid()
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


def _in_force(lease: Lease, now_ms: int) -> bool:
    if lease.holder.host == socket.gethostname():
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
    # A process id reused by a later process is not the holder (start times to the second).
    return started is None or holder.started_ms == 0 or abs(started - holder.started_ms) < 2000


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


def _read(files: CheckpointFiles) -> Lease | None:
    try:
        text = files.text(LEASE_FILE)
        return None if text is None else Lease.decode(text)
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("the checkpoint's lease %s cannot be read (%s): taken as absent", LEASE_FILE, error)
        return None


def _write(files: CheckpointFiles, lease: Lease) -> None:
    files.write(LEASE_FILE, lease.encode())


def _held_by_another(checkpoint_location: str, lease: Lease) -> str:
    same_host = lease.holder.host == socket.gethostname()
    until = (
        "stop it first"
        if same_host
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
