"""The ports test brokers and clusters take: below the kernel's ephemeral range (tests/ports.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from tests import ports


def test_a_test_broker_asked_for_any_port_listens_below_the_ephemeral_range(broker: BrokerProcess) -> None:
    assert ports.LOWEST <= broker.port < ports.ephemeral_start()


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8
    assert all(ports.LOWEST <= port < ports.ephemeral_start() for port in chosen)
    for port in chosen:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_broker_whose_drawn_port_was_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_ports(1)[0]))
        taken.listen()
        occupied = taken.getsockname()[1]
        draws = iter([[occupied]])
        draw_for_real = ports.free_ports
        monkeypatch.setattr(ports, "free_ports", lambda count: next(draws, None) or draw_for_real(count))
        with BrokerProcess(tmp_path / "data") as process:
            assert process.port != occupied
            assert ports.LOWEST <= process.port < ports.ephemeral_start()
