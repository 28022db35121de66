"""Error paths of sparkafka.broker.runner's BrokerProcess: a broker child that exits before it is
ready (its log is in the error), and asking for a TLS listener it was not started with."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess


def test_a_broker_that_exits_at_start_up_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-cert.pem"
    process = BrokerProcess(
        tmp_path / "data",
        extra_args=["--ssl-listen", "127.0.0.1:0", "--ssl-certfile", str(missing)],
        startup_timeout_s=60,
    )
    with pytest.raises(
        RuntimeError, match=r"^sparkafka broker did not become ready; its log ends with:\n"
    ) as raised:
        process.start()
    # The log names what stopped the broker: the TLS file check.
    assert f"--ssl-certfile {missing}: no such file (the certificate chain, PEM)" in str(raised.value)


def test_a_broker_without_a_tls_listener_has_no_tls_address(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data")
    with pytest.raises(
        RuntimeError, match=r"^this broker has no SSL listener: pass --ssl-listen HOST:PORT in extra_args$"
    ):
        _ = process.ssl_bootstrap_servers
