"""Apache Kafka's own broker for the tests: a KRaft node (broker and controller in one JVM) on
127.0.0.1, from the server jars ``scripts/install --test`` fetches with Maven
(``tests/apache_kafka/pom.xml``) into ``.venv/share/sparkafka-test/kafka-<version>/libs``.

Without the jars or Java the tests that need it skip, saying why — except under CI (``CI=true``),
where they fail: CI must run them."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

import pytest
from confluent_kafka.admin import AdminClient

REPOSITORY = Path(__file__).resolve().parents[2]
# The pinned versions scripts/install fetches, newest first: the newest 4.x, and the newest 3.9.x.
KAFKA_VERSIONS = tuple((REPOSITORY / "tests" / "apache_kafka" / "versions").read_text().split())
NEWEST = KAFKA_VERSIONS[0]


def kafka_libs(version: str) -> Path:
    return REPOSITORY / ".venv" / "share" / "sparkafka-test" / f"kafka-{version}" / "libs"


def require_apache_kafka(version: str) -> Path:
    """The jar directory of ``version``, or skip (fail under CI) saying what is missing."""
    libs = kafka_libs(version)
    missing = None
    if shutil.which("java") is None:
        missing = "Java is not installed"
    elif not any(libs.glob("kafka_2.13-*.jar")):
        missing = f"Apache Kafka {version}'s jars are not in {libs}: scripts/install --test fetches them"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Apache Kafka tests: {missing}")
        pytest.skip(missing)
    return libs


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: the probes stay bound until all are chosen, so the system cannot
    hand out one port twice."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


class ApacheKafka:
    """``with ApacheKafka(directory, version) as kafka:`` — one KRaft node; ``kafka.bootstrap_servers``.

    Sized for a test: small heap, one partition and replica by default, no delay before a consumer
    group's first rebalance."""

    def __init__(self, directory: Path, version: str = NEWEST, *, settings: dict[str, str] | None = None):
        self.directory = directory
        self.version = version
        self.libs = require_apache_kafka(version)
        self.port, self.controller_port = free_ports(2)
        self.settings = settings or {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    def _properties(self) -> Path:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            **self.settings,
        }
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _java(self, main_class: str, *args: str) -> list[str]:
        return ["java", "-Xms128m", "-Xmx512m", "-cp", f"{self.libs}/*", main_class, *args]

    def __enter__(self) -> ApacheKafka:
        # Another process may take a chosen port before the broker binds it: then new ports, anew.
        for attempt in range(3):
            try:
                self._format()
                self.start()
                return self
            except RuntimeError:
                self.kill()
                if attempt == 2:
                    raise
                shutil.rmtree(self.directory / "data", ignore_errors=True)
                self.port, self.controller_port = free_ports(2)
        raise AssertionError("unreachable")

    def _format(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self._properties()
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if formatted.returncode != 0:
            output = formatted.stdout + formatted.stderr
            raise RuntimeError(f"formatting Apache Kafka's storage failed:\n{output}")

    def start(self) -> None:
        """Start (or restart, on the same storage) the broker and wait until it answers."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.directory / "server.properties")),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Apache Kafka exited ({self.process.returncode}):\n{self._tail()}")
            with contextlib.suppress(Exception):
                if admin.list_topics(timeout=2).brokers:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"Apache Kafka did not answer within 120 s:\n{self._tail()}")

    def dump_log(self, topic: str) -> str:
        """``kafka-dump-log`` of every segment of ``topic`` (records and COMMIT/ABORT markers)."""
        segments = sorted(str(path) for path in (self.directory / "data").glob(f"{topic}-*/*.log"))
        # Kafka 4 moved the tool from the server jar (kafka.tools) to kafka-tools.
        tool = ("kafka" if self.version.startswith("3.") else "org.apache.kafka") + ".tools.DumpLogSegments"
        dumped = subprocess.run(
            self._java(tool, "--deep-iteration", "--print-data-log", "--files", ",".join(segments)),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return dumped.stdout

    def kill(self) -> None:
        """SIGKILL the broker: nothing flushed or closed."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None

    def _tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.kill()

