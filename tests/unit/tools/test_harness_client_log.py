"""The proofs' Kafka clients log to a quiet logger that keeps their last connection failure."""

from __future__ import annotations

import logging

import pytest

from sparkafka.tools import harness


def test_client_log_is_kept_off_stderr_and_its_last_failure_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    harness.CLIENT_FAILURES.last = None
    assert harness.last_connection_failure() == ""
    harness.CLIENT_LOGGER.log(
        logging.ERROR,
        "FAIL [rdkafka#consumer-2] [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to "
        "ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)",
    )
    captured = capsys.readouterr()
    assert captured.err == captured.out == ""
    assert harness.last_connection_failure().startswith(
        "; the last connection failure of its Kafka clients: 127.0.0.1:9/bootstrap: Connect to"
    )
    assert "Connection refused" in harness.last_connection_failure()
    harness.CLIENT_FAILURES.last = None
