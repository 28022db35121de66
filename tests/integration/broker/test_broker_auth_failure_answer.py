"""A failed SASL/PLAIN authentication is answered only when connection.failed.authentication.delay.ms
has passed, as Kafka does (KafkaChannel.completeCloseOnAuthenticationFailure): a guesser that drops
the connection on the answer learns each result no sooner."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from sparkafka.broker.runner import BrokerProcess
from tests.conftest import FAST_BROKER_ARGS


def _request(conn: socket.socket, api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation, 1) + b"r"
    conn.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = conn.recv(1 << 16)
        assert chunk, "closed"
        data += chunk
    return data[4:]


def test_failed_authentication_answer_waits_the_delay(tmp_path: Path) -> None:
    args = [
        *FAST_BROKER_ARGS,
        "--sasl-plain-user",
        "admin:secret",
        "--connection-failed-authentication-delay-ms",
        "1000",
    ]
    with BrokerProcess(tmp_path / "data", extra_args=args) as broker:
        conn = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        _request(conn, 17, 1, 1, struct.pack(">h", 5) + b"PLAIN")  # SaslHandshake v1
        token = b"\0admin\0wrong"
        started = time.monotonic()
        answer = _request(conn, 36, 0, 2, struct.pack(">i", len(token)) + token)  # SaslAuthenticate v0
        elapsed = time.monotonic() - started
        assert struct.unpack(">h", answer[4:6])[0] == 58  # SASL_AUTHENTICATION_FAILED
        conn.close()
        assert elapsed >= 0.9, f"the failure was answered after {elapsed:.3f}s, not after the 1 s delay"
