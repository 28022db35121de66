"""Each connection is told its own listener's address: a plaintext connection admitted (after
waiting under --max-connections) when a TLS connection ends is told the plaintext port, not the TLS
one it could inherit from the ending connection's task."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from pathlib import Path

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from sparkafka.broker.runner import BrokerProcess
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.broker.test_broker_tls import Certificates, _ssl_args, certs  # noqa: F401


def _read_frame(conn: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = conn.recv(1 << 16)
        assert chunk, "closed"
        data += chunk
    return data[4:]


def _metadata_ports(conn: socket.socket) -> list[int]:
    request = MetadataRequest[0](topics=[])
    header = struct.pack(">hhih", 3, 0, 42, 6) + b"client"
    body = header + request.encode()
    conn.sendall(struct.pack(">i", len(body)) + body)
    frame = _read_frame(conn)
    response = MetadataResponse[0].decode(frame[4:])
    return [broker[2] for broker in response.brokers]


def _api_versions(conn: socket.socket) -> None:
    conn.sendall(struct.pack(">ihhih", 10, 18, 0, 7, -1))
    _read_frame(conn)


def test_plaintext_connection_admitted_by_tls_leave_advertises_plaintext_port(
    tmp_path: Path,
    certs: Certificates,  # noqa: F811
) -> None:
    args = [*FAST_BROKER_ARGS, *_ssl_args(certs), "--max-connections", "1"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as broker:
        assert broker.ssl_port is not None
        context = ssl.create_default_context(cafile=str(certs.ca))
        tls = context.wrap_socket(
            socket.create_connection(("127.0.0.1", broker.ssl_port), timeout=5), server_hostname="localhost"
        )
        _api_versions(tls)
        assert _metadata_ports(tls) == [broker.ssl_port]
        plain = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        time.sleep(0.3)  # waits for a slot
        tls.close()  # its _serve's finally admits `plain` from within the TLS connection's task
        plain.settimeout(5)
        assert _metadata_ports(plain) == [broker.port], (broker.port, broker.ssl_port)
        plain.close()
