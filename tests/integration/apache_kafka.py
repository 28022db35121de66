"""Apache Kafka's own broker for the tests: a KRaft node (broker and controller in one JVM) on
127.0.0.1, from the server jars ``scripts/install --test`` fetches with Maven
(``tests/apache_kafka/pom.xml``) into ``.venv/share/sparkafka-test/kafka-<version>/libs``.

Without the jars or Java the tests that need it skip, saying why — except under CI (``CI=true``),
where they fail: CI must run them.

Each version's nodes map a class archive of its jars where ``scripts/install --test`` built one
(``python -m tests.integration.apache_kafka build-class-archives``): a node then starts with about a
quarter less CPU. Without it, nodes start as before."""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.runtime import class_archive
from tests.ports import free_ports

REPOSITORY = Path(__file__).resolve().parents[2]
# The pinned versions scripts/install fetches, newest first: the newest 4.x, and the newest 3.9.x.
KAFKA_VERSIONS = tuple((REPOSITORY / "tests" / "apache_kafka" / "versions").read_text().split())
NEWEST = KAFKA_VERSIONS[0]


def kafka_libs(version: str) -> Path:
    return REPOSITORY / ".venv" / "share" / "sparkafka-test" / f"kafka-{version}" / "libs"


def class_archive_of(libs: Path) -> Path | None:
    """Where the class archive of the jars in ``libs`` for the java on PATH lives (None: no java)."""
    java = shutil.which("java")
    if java is None or not libs.is_dir():
        return None
    return libs.parent / "class-archives" / f"kafka-{class_archive.classpath_key(Path(java), libs)}.jsa"


def build_class_archive(version: str) -> Path:
    """A node of ``version`` started with ``-XX:ArchiveClassesAtExit``, given a topic and a record,
    and stopped by SIGTERM (Kafka's clean shutdown: the JVM writes the archive as it exits)."""
    libs = require_apache_kafka(version)
    archive = class_archive_of(libs)
    assert archive is not None
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=archive.parent) as work:
        written = Path(work) / archive.name
        kafka = ApacheKafka(Path(work) / "node", version, dump_classes_to=written)
        with kafka:
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
            admin.create_topics([NewTopic("class-archive", 1, 1)])["class-archive"].result(60)
            producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
            producer.produce("class-archive", b"record")
            assert producer.flush(60) == 0
            del producer, admin
            process = kafka.processes.pop(kafka.node_ids[0])
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        return class_archive.keep(written, archive)


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


class ApacheKafka:
    """``with ApacheKafka(directory, version) as kafka:`` — ``kafka.bootstrap_servers``.

    One KRaft node (broker and controller in one JVM) by default; ``nodes=3`` makes a cluster of
    three such nodes, all of them controller voters, with replication factor 3 and
    ``min.insync.replicas=2`` for every topic, the consumer offsets and the transaction state log.
    Sized for a test: small heap (``heap``), one partition by default, no delay before a consumer group's
    first rebalance. Nodes are numbered from 1."""

    def __init__(
        self,
        directory: Path,
        version: str = NEWEST,
        *,
        nodes: int = 1,
        settings: dict[str, str] | None = None,
        heap: str = "512m",
        dump_classes_to: Path | None = None,
    ):
        self.directory = directory
        self.version = version
        self.libs = require_apache_kafka(version)
        self.node_ids = list(range(1, nodes + 1))
        self._choose_ports()
        self.settings = settings or {}
        self.heap = heap
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.dumping = dump_classes_to is not None
        self.class_archive_options = self._class_archive_options(dump_classes_to)

    def _class_archive_options(self, dump_classes_to: Path | None) -> list[str]:
        """Map the version's class archive where it was built, or write one (``dump_classes_to``)."""
        if dump_classes_to is not None:
            return [f"-XX:ArchiveClassesAtExit={dump_classes_to}", *class_archive.QUIET.split()]
        archive = class_archive_of(self.libs)
        if archive is None or not class_archive.is_whole(archive):
            return []
        return shlex.split(class_archive.mapping_options(archive))

    def _choose_ports(self) -> None:
        ports = free_ports(2 * len(self.node_ids))
        self.ports = dict(zip(self.node_ids, ports[: len(self.node_ids)], strict=True))
        self.controller_ports = dict(zip(self.node_ids, ports[len(self.node_ids) :], strict=True))

    @property
    def port(self) -> int:
        """The first node's port."""
        return self.ports[self.node_ids[0]]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[node]}" for node in self.node_ids)

    def node_directory(self, node: int) -> Path:
        return self.directory if len(self.node_ids) == 1 else self.directory / f"node-{node}"

    @property
    def log_path(self) -> Path:
        """The first node's log."""
        return self._log_path(self.node_ids[0])

    def _log_path(self, node: int) -> Path:
        return self.node_directory(node) / "kafka.log"

    def _properties(self, node: int) -> Path:
        replicas = str(min(3, len(self.node_ids)))
        in_sync = str(min(2, len(self.node_ids)))
        voters = ",".join(f"{n}@127.0.0.1:{self.controller_ports[n]}" for n in self.node_ids)
        port, controller_port = self.ports[node], self.controller_ports[node]
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.node_directory(node) / "data"),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "group.initial.rebalance.delay.ms": "0",
            **self.settings,
        }
        path = self.node_directory(node) / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _java(self, main_class: str, *args: str) -> list[str]:
        # Every tool of the version maps the archive; only a node writes one.
        options = self.class_archive_options if main_class == "kafka.Kafka" or not self.dumping else []
        return ["java", "-Xms128m", f"-Xmx{self.heap}", *options, "-cp", f"{self.libs}/*", main_class, *args]

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
                for node in self.node_ids:
                    shutil.rmtree(self.node_directory(node) / "data", ignore_errors=True)
                self._choose_ports()
        raise AssertionError("unreachable")

    def _format(self) -> None:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        for node in self.node_ids:
            self.node_directory(node).mkdir(parents=True, exist_ok=True)
            properties = self._properties(node)
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if formatted.returncode != 0:
                output = formatted.stdout + formatted.stderr
                raise RuntimeError(f"formatting Apache Kafka's storage failed:\n{output}")

    def start(self, node: int | None = None) -> None:
        """Start (or restart, on the same storage) one node, or every node, and wait until the
        cluster answers with all of them and every replica on a running node is in sync again:
        tests kill one node at a time, and a second kill while a restarted node still catches up
        would leave partitions below min.insync.replicas, a double failure no test means."""
        for started in self.node_ids if node is None else [node]:
            with open(self._log_path(started), "ab") as log:
                self.processes[started] = subprocess.Popen(
                    self._java("kafka.Kafka", str(self.node_directory(started) / "server.properties")),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        deadline = time.monotonic() + 120
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            for running, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"Apache Kafka node {running} exited ({process.returncode}):\n{self._tail(running)}"
                    )
            with contextlib.suppress(Exception):
                metadata = admin.list_topics(timeout=2)
                running = set(self.processes)
                in_sync = all(
                    set(partition.replicas) & running <= set(partition.isrs)
                    for topic in metadata.topics.values()
                    for partition in topic.partitions.values()
                )
                if len(metadata.brokers) == len(self.node_ids) and in_sync:
                    return
            time.sleep(0.3)
        tails = "\n".join(self._tail(n) for n in self.node_ids)
        raise RuntimeError(
            f"Apache Kafka did not answer with every node, all replicas in sync, within 120 s:\n{tails}"
        )

    def leader(self, topic: str, partition: int) -> int:
        """The node leading ``topic``'s ``partition`` now."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id`` now (FindCoordinator, key type transaction),
        asked of every live node until one answers without error."""
        from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

        from .raw_kafka import RawConnection

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for node in list(self.processes):
                with contextlib.suppress(OSError):
                    found = RawConnection(self.ports[node]).roundtrip(
                        FindCoordinatorRequest(key=transactional_id, key_type=1), FindCoordinatorResponse, 3
                    )
                    if found.error_code == 0:
                        return int(found.node_id)
            time.sleep(0.5)
        raise AssertionError(f"no coordinator found for transactional id {transactional_id} in 60 s")

    def dump_log(self, topic: str) -> str:
        """``kafka-dump-log`` of every segment of ``topic`` (records and COMMIT/ABORT markers)."""
        data = self.node_directory(self.node_ids[0]) / "data"
        segments = sorted(str(path) for path in data.glob(f"{topic}-*/*.log"))
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

    def kill(self, node: int | None = None) -> None:
        """SIGKILL one node, or every node: nothing flushed or closed."""
        for killed in self.node_ids if node is None else [node]:
            process = self.processes.pop(killed, None)
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)

    def _tail(self, node: int) -> str:
        path = self._log_path(node)
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.kill()


if __name__ == "__main__":
    if sys.argv[1:] != ["build-class-archives"]:
        sys.exit("usage: python -m tests.integration.apache_kafka build-class-archives")
    for pinned in KAFKA_VERSIONS:
        existing = class_archive_of(kafka_libs(pinned))
        if existing is not None and not class_archive.is_whole(existing):
            print(f"Apache Kafka {pinned}: class archive {build_class_archive(pinned)}", file=sys.stderr)
