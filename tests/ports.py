"""Ports for the brokers and clusters tests start: below the kernel's ephemeral range.

Why: a client a test leaves alive (a consumer pooled by the connector in the test process or in a
Python worker of a session shared by a module, a producer a helper did not close) keeps reconnecting
to its stopped broker's port for a while. Were brokers on ephemeral ports, that number could come
back as a port Spark listens on for a moment, such as the one a new Python worker connects back to
with its secret, and a Kafka request arriving there first fails that worker's handshake
("Authentication failed"). Below the ephemeral range only the ports tests choose themselves are
handed out, so a leaked client can only ever reach another test broker, which answers as Kafka.

Steps of :func:`free_ports`: draw ports at random from ``[LOWEST, ephemeral start)``; keep each one
a probe socket could bind, holding the probe until all are chosen (so one call never returns a port
twice); release the probes. Two processes may still draw the same port between release and use;
:func:`start_broker_on_a_low_port` retries on that."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable
from pathlib import Path

from sparkafka.broker.runner import BrokerProcess

LOWEST = 20_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_START_ATTEMPTS = 5


def ephemeral_start() -> int:
    """The kernel's first ephemeral port (Linux's default where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports below the ephemeral range that were free a moment ago (see the
    module's steps); ephemeral ones where that range leaves too little room below it."""
    highest = ephemeral_start()
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        if highest - LOWEST < 1_000:
            for _ in range(count):
                probe = stack.enter_context(socket.socket())
                probe.bind(("127.0.0.1", 0))
                chosen.append(int(probe.getsockname()[1]))
            return chosen
        for port in random.sample(range(LOWEST, highest), min(highest - LOWEST, 50 * count + 100)):
            probe = stack.enter_context(socket.socket())
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"found only {len(chosen)} of {count} free ports in {LOWEST}-{highest - 1}")


def start_broker_on_a_low_port(
    process: BrokerProcess, start: Callable[[BrokerProcess], BrokerProcess]
) -> BrokerProcess:
    """``start(process)`` with ``process.port`` drawn by :func:`free_ports` when it asked for any
    port (0); drawn again when another process took that port first."""
    if process.port != 0:
        return start(process)
    for attempt in range(_START_ATTEMPTS):
        (process.port,) = free_ports(1)
        try:
            return start(process)
        except RuntimeError as failed:
            if "address already in use" not in str(failed) or attempt == _START_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
