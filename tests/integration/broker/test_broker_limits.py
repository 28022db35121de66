"""What clients may make the broker hold: socket.request.max.bytes, queued.max.request.bytes,
max.connections, max.connections.per.ip and connections.max.idle.ms, on a real broker process with
raw sockets and confluent-kafka clients."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.producer import ProduceResponse
from typer.testing import CliRunner

from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from sparkafka.broker.runner import BrokerProcess
from sparkafka.cli.app import app
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.kafka_clients import create_topic, read_all, values
from tests.integration.raw_kafka import produce_request

MIB = 1024 * 1024


@contextlib.contextmanager
def _broker(tmp_path: Path, *args: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "data", extra_args=[*FAST_BROKER_ARGS, *args]) as process:
        yield process


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _api_versions(conn: socket.socket, *, timeout_s: float = 5.0) -> bytes | None:
    """The ApiVersions v0 answer; b"" when the broker closed the connection; None when it did not
    answer within ``timeout_s``."""
    conn.sendall(struct.pack(">ihhih", 10, 18, 0, 7, -1))
    conn.settimeout(timeout_s)
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = conn.recv(1 << 16)
            if not chunk:
                return b""
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return b""
    return data


def _closed(conn: socket.socket, timeout_s: float = 5.0) -> bool:
    conn.settimeout(timeout_s)
    try:
        return conn.recv(1 << 16) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _served(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker.bootstrap_servers, topic)
    writer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    writer.produce(topic, value=b"served")
    assert writer.flush(10) == 0
    assert values(read_all(broker.bootstrap_servers, topic, expect=1)) == [b"served"]


def test_huge_declared_frames_cost_no_memory(tmp_path: Path, topic_name: str) -> None:
    """10 connections each announcing a 100 MiB request in a 14-byte header: the broker reserves
    nothing for bodies that never come, and serves a client meanwhile."""
    with _broker(tmp_path) as broker:
        assert broker.process is not None
        before = _rss_bytes(broker.process.pid)
        attackers = [_connect(broker.port) for _ in range(10)]
        try:
            for attacker in attackers:
                attacker.sendall(struct.pack(">ihhih", 100 * MIB, 0, 9, 1, 0))
            time.sleep(0.5)
            grown = _rss_bytes(broker.process.pid) - before
            assert grown < 20 * MIB, f"the broker grew by {grown} bytes"
            _served(broker, topic_name)
        finally:
            for attacker in attackers:
                attacker.close()


def test_frame_over_socket_request_max_bytes_closes_only_its_connection(tmp_path: Path) -> None:
    with _broker(tmp_path, "--socket-request-max-bytes", str(MIB)) as broker:
        healthy = _connect(broker.port)
        assert _api_versions(healthy)
        with _connect(broker.port) as oversized:
            oversized.sendall(struct.pack(">ihhih", MIB + 1, 0, 9, 1, 0))
            assert _closed(oversized)
        with _connect(broker.port) as at_limit:  # exactly the limit is a request: it waits for its body
            at_limit.sendall(struct.pack(">ihhih", MIB, 0, 9, 1, 0))
            assert not _closed(at_limit, timeout_s=0.3)
        assert _api_versions(healthy)
        healthy.close()
        assert "socket.request.max.bytes=1048576" in broker.log_path.read_text()


def test_concurrent_large_produce_requests_complete_under_a_small_budget(
    tmp_path: Path, topic_name: str
) -> None:
    """Four producers each send requests of several MiB at once while the broker may hold 4 MiB of
    unhandled requests: reading pauses and resumes, and every record arrives."""
    budget = 4 * MIB
    with _broker(
        tmp_path, "--socket-request-max-bytes", str(budget), "--queued-max-request-bytes", str(budget)
    ) as broker:
        create_topic(broker.bootstrap_servers, topic_name, partitions=4)
        value = b"v" * 200_000
        per_producer = 40
        failures: list[str] = []

        def produce(index: int) -> None:
            writer = Producer(
                {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "linger.ms": 100,
                    "batch.size": 1_000_000,
                    "message.max.bytes": 1_000_000,
                    "enable.idempotence": True,
                }
            )
            for sequence in range(per_producer):
                writer.produce(
                    topic_name, value=value, key=b"%d-%d" % (index, sequence), partition=sequence % 4
                )
            if writer.flush(60) != 0:
                failures.append(f"producer {index} did not deliver everything")

        threads = [threading.Thread(target=produce, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not failures
        received = read_all(broker.bootstrap_servers, topic_name, expect=4 * per_producer, partitions=4)
        assert len(received) == 4 * per_producer


def _produce_frame(topic: str, partition: int, value: bytes, correlation_id: int) -> bytes:
    batch = encode_batch([Record(0, int(time.time() * 1000), None, value)], base_offset=0)
    request = produce_request(topic, partition, batch)
    request.with_header(correlation_id=correlation_id, client_id="limits-test")
    return bytes(request.encode(version=8, header=True, framed=True))


def test_unfinished_requests_over_the_budget_all_complete(tmp_path: Path, topic_name: str) -> None:
    """Four connections each send most of a 900 KiB produce request while the broker may hold 1 MiB:
    the budget is spent by unfinished requests alone, and still every request completes (the oldest
    may always finish), each answered without error."""
    with _broker(
        tmp_path,
        "--socket-request-max-bytes",
        str(MIB),
        "--queued-max-request-bytes",
        str(MIB),
    ) as broker:
        create_topic(broker.bootstrap_servers, topic_name, partitions=4)
        frames = [_produce_frame(topic_name, index, bytes(900 * 1024), index + 1) for index in range(4)]
        connections = [_connect(broker.port) for _ in frames]
        senders = []
        for conn, frame in zip(connections, frames, strict=True):
            conn.sendall(frame[:-1000])
        time.sleep(0.3)
        for conn, frame in zip(connections, frames, strict=True):
            # The broker may not read all of it yet: send from threads, each on its own.
            sender = threading.Thread(target=conn.sendall, args=(frame[-1000:],))
            sender.start()
            senders.append(sender)
        for index, conn in enumerate(connections):
            conn.settimeout(10)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                chunk = conn.recv(1 << 16)
                assert chunk, f"connection {index} closed before its answer"
                data += chunk
            response = ProduceResponse.decode(data, version=8, header=True, framed=True)
            assert response.responses[0].partition_responses[0].error_code == 0
            conn.close()
        for sender in senders:
            sender.join(10)
        assert "reading pauses (queued.max.request.bytes=1048576)" in broker.log_path.read_text()


def test_max_connections_per_ip_closes_new_connections(tmp_path: Path) -> None:
    with _broker(tmp_path, "--max-connections-per-ip", "2") as broker:
        first, second = _connect(broker.port), _connect(broker.port)
        assert _api_versions(first) and _api_versions(second)
        with _connect(broker.port) as third:
            assert _closed(third)
        assert _api_versions(first) and _api_versions(second)
        first.close()
        time.sleep(0.2)
        with _connect(broker.port) as fourth:
            assert _api_versions(fourth)
        second.close()
        assert "Rejected connection from 127.0.0.1, address already has the configured maximum of 2" in (
            broker.log_path.read_text()
        )


def test_max_connections_makes_new_connections_wait(tmp_path: Path) -> None:
    """As Kafka stops accepting at max.connections: the next client waits unanswered, and is served
    once a connection ends."""
    with _broker(tmp_path, "--max-connections", "2") as broker:
        first, second = _connect(broker.port), _connect(broker.port)
        assert _api_versions(first) and _api_versions(second)
        third = _connect(broker.port)
        assert _api_versions(third, timeout_s=0.5) is None
        assert _api_versions(second)
        first.close()
        answer = b""
        third.settimeout(5)
        while len(answer) < 4 or len(answer) < 4 + struct.unpack(">i", answer[:4])[0]:
            chunk = third.recv(1 << 16)
            assert chunk, "the waiting connection was closed"
            answer += chunk
        assert struct.unpack(">i", answer[4:8])[0] == 7  # its correlation id
        second.close()
        third.close()


def test_a_broker_started_under_a_desktops_open_file_limit_serves_more_than_a_thousand_clients(
    tmp_path: Path,
) -> None:
    """A desktop's soft open-file limit is often 1024. As the JVM does for Kafka, the broker raises
    its soft limit to the hard limit at start, and serves connections up to half of it by default
    (Kafka: unbounded): a session whose Python workers hold pooled clients for many queries reached
    1,000 connections, and a broker capped there left the next ones waiting, unanswered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients = 1100
    needed = 2 * clients + 512  # the broker serves half its limit; this process holds the clients
    assert hard >= needed, f"the hard open-file limit ({hard}) is too low for this test"
    with contextlib.ExitStack() as stack:
        stack.callback(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # inherited by the broker process
        try:
            broker = stack.enter_context(_broker(tmp_path))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
        assert broker.process is not None
        limits = Path(f"/proc/{broker.process.pid}/limits").read_text()
        open_files = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert open_files.split()[3:5] == [str(hard), str(hard)]
        connections = [_connect(broker.port) for _ in range(clients)]
        for conn in connections:
            stack.callback(conn.close)
        unanswered = [n for n, conn in enumerate(connections) if not _api_versions(conn, timeout_s=10)]
        assert unanswered == []


def test_partitions_made_beyond_a_desktops_open_file_limit_are_opened_again_on_restart(
    tmp_path: Path,
) -> None:
    """The broker raises its open-file limit before it opens its partitions: started again from a
    shell whose soft limit is lower than its partitions, it opens every one of them (and does not fail
    with "too many open files")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    partitions = 900
    assert hard >= 4 * partitions, f"the hard open-file limit ({hard}) is too low for this test"
    with contextlib.ExitStack() as stack:
        stack.callback(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))  # inherited by the broker processes
        with _broker(tmp_path) as broker:
            create_topic(broker.bootstrap_servers, "many", partitions=partitions)
        with _broker(tmp_path) as broker:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            sender = Producer({"bootstrap.servers": broker.bootstrap_servers})
            sender.produce("many", value=b"last", partition=partitions - 1)
            assert sender.flush(30) == 0
            reader = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "limits"})
            try:
                last = TopicPartition("many", partitions - 1)
                assert reader.get_watermark_offsets(last, timeout=30, cached=False) == (0, 1)
            finally:
                reader.close()


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    with _broker(tmp_path, "--connections-max-idle-ms", "300") as broker:
        idle = _connect(broker.port)
        assert _api_versions(idle)
        started = time.monotonic()
        assert _closed(idle, timeout_s=30)
        assert time.monotonic() - started > 0.2  # not at once: after the 300 ms of idleness
        idle.close()
        with _connect(broker.port) as active:  # a client that keeps talking stays
            for _ in range(6):
                assert _api_versions(active)
                time.sleep(0.1)


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--socket-request-max-bytes", "0", "socket.request.max.bytes (--socket-request-max-bytes) must be"),
        ("--queued-max-request-bytes", "1000", "raise it or lower socket.request.max.bytes"),
        ("--queued-max-request-bytes", "0", "or -1 for no bound"),
        ("--max-connections", "0", "max.connections (--max-connections) must be at least 1"),
        (
            "--max-connections-per-ip",
            "0",
            "max.connections.per.ip (--max-connections-per-ip) must be at least 1",
        ),
        ("--connections-max-idle-ms", "0", "or -1 to never close an idle connection"),
        ("--connections-max-idle-ms", "-5", "connections.max.idle.ms (--connections-max-idle-ms)"),
    ],
)
def test_bad_limits_are_refused_naming_the_option(
    tmp_path: Path, option: str, value: str, expected: str
) -> None:
    result = CliRunner().invoke(
        app, ["broker", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"), option, value]
    )
    assert result.exit_code == 2
    assert expected in " ".join(result.output.split()), result.output
    assert not (tmp_path / "data").exists()
