"""A client that stops reading a large Fetch answer does not keep the broker from stopping: a
graceful close would wait for the write buffer to drain, and a sendfile for the socket, for ever."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time
from pathlib import Path

from confluent_kafka import Producer

from sparkafka.broker.runner import BrokerProcess
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.kafka_clients import create_topic


def _fetch_request(topic: str) -> bytes:
    header = struct.pack(">hhih", 1, 4, 9, 1) + b"r"
    name = topic.encode()
    body = struct.pack(">iiiib", -1, 100, 1, 256 << 20, 0)
    body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">iiqi", 1, 0, 0, 256 << 20)
    return struct.pack(">i", len(header) + len(body)) + header + body


def test_stop_with_a_client_that_does_not_read(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=list(FAST_BROKER_ARGS)).start()
    try:
        create_topic(broker.bootstrap_servers, "big")
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
        for _ in range(60):
            producer.produce("big", value=os.urandom(900_000))
        assert producer.flush(20) == 0
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect(("127.0.0.1", broker.port))
        conn.sendall(_fetch_request("big"))
        time.sleep(1.0)  # the answer fills the socket and the transport's buffer; nothing reads it
        process = broker.process
        assert process is not None
        started = time.monotonic()
        os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            process.wait(timeout=10)
        exited = process.poll() is not None
        conn.close()
        assert exited, f"broker still running {time.monotonic() - started:.1f}s after SIGTERM"
    finally:
        broker.kill()
