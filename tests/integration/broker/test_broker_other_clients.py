"""Clients other than confluent-kafka and kafka-python: kcat (Debian's, on its own librdkafka) and the
Apache Kafka Java client 3.9. Each test skips, saying why, when its client is not installed;
`scripts/install --test` installs both where it can."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.harness import wait_until
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import create_topic, end_offsets, transactional_producer


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's broker: the embedded broker, then Apache Kafka (``kafka`` in conftest): the same
    assertions hold for both, or the embedded broker is wrong."""
    return kafka


JAVA_SOURCE = Path(__file__).parent / "java" / "TxnProbe.java"
# Where `scripts/install --test` puts the Kafka 3.9 client jar (taken from a PyPI wheel that ships it).
DEFAULT_KAFKA_CLIENTS_JAR = Path(sys.prefix) / "share" / "sparkafka-test" / "kafka-clients.jar"

requires_kcat = pytest.mark.skipif(
    shutil.which("kcat") is None,
    reason="kcat is not installed (Debian: apt-get install kcat; `scripts/install --test` does it as root)",
)


def _kcat(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kcat", *args], input=stdin, capture_output=True, text=True, timeout=60)


@requires_kcat
def test_kcat_transactional_produce_and_read_committed(broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    # kcat commits a transactional.id's single transaction when its input ends.
    produced = _kcat(
        "-P", "-b", bootstrap, "-t", topic_name, "-p", "0", "-K", ":",
        "-X", f"transactional.id=kcat-{topic_name}",
        stdin="k1:kcat-committed-1\nk2:kcat-committed-2\n",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert "Transaction successfully committed" in produced.stderr
    # An aborted transaction (kcat cannot abort one on purpose: Ctrl-C kills it before it produces).
    aborter = transactional_producer(bootstrap, f"abort-{topic_name}")
    aborter.init_transactions(30)
    aborter.begin_transaction()
    aborter.produce(topic_name, key=b"k3", value=b"aborted", partition=0)
    assert aborter.flush(30) == 0
    aborter.abort_transaction(30)
    # EndTxn answers once the coordinator logged the abort; it writes the ABORT marker after that
    # (Apache Kafka does so asynchronously), so the next record waits for the marker at offset 4.
    assert wait_until(lambda: end_offsets(bootstrap, topic_name, 1) == [5], timeout_s=30)
    # And a plain idempotent kcat produce after it.
    plain = _kcat(
        "-P", "-b", bootstrap, "-t", topic_name, "-p", "0", "-K", ":", "-X", "enable.idempotence=true",
        stdin="k4:kcat-plain\n",
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr

    def consume(isolation: str) -> list[str]:
        result = _kcat(
            "-C", "-b", bootstrap, "-t", topic_name, "-o", "beginning", "-e",
            "-X", f"isolation.level={isolation}", "-f", "%k=%s@%o\\n",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    # Offsets: 0-1 committed data, 2 COMMIT marker, 3 aborted data, 4 ABORT marker, 5 plain.
    assert consume("read_committed") == ["k1=kcat-committed-1@0", "k2=kcat-committed-2@1", "k4=kcat-plain@5"]
    assert consume("read_uncommitted") == [
        "k1=kcat-committed-1@0",
        "k2=kcat-committed-2@1",
        "k3=aborted@3",
        "k4=kcat-plain@5",
    ]

    listed = _kcat("-L", "-J", "-b", bootstrap, "-t", topic_name)
    assert listed.returncode == 0, listed.stderr
    metadata = json.loads(listed.stdout)
    assert metadata["brokers"] == [{"id": 1, "name": bootstrap}]
    [topic] = metadata["topics"]
    assert topic["topic"] == topic_name
    assert [(p["partition"], p["leader"]) for p in topic["partitions"]] == [(0, 1)]


def _java_classpath() -> tuple[Path, str]:
    """(kafka-clients jar, classpath) or a skip naming what is missing."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not found: the Java client test needs a JDK 11+ on PATH")
    jar = Path(os.environ.get("SPARKAFKA_KAFKA_CLIENTS_JAR", DEFAULT_KAFKA_CLIENTS_JAR))
    if not jar.is_file():
        pytest.skip(
            f"Kafka Java client jar not found at {jar}: run `scripts/install --test`, "
            "or set SPARKAFKA_KAFKA_CLIENTS_JAR to a kafka-clients 3.x jar"
        )
    import pyspark

    slf4j = sorted((Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))
    if not slf4j:
        pytest.skip("slf4j-api (which kafka-clients needs) not found among PySpark's jars")
    return jar, os.pathsep.join([str(jar), str(slf4j[-1])])


def test_java_client_transactions_and_read_committed(
    broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    _jar, classpath = _java_classpath()
    classes = tmp_path / "classes"
    compiled = subprocess.run(
        ["javac", "-cp", classpath, "-d", str(classes), str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(
        [
            "java",
            "-cp",
            os.pathsep.join([str(classes), classpath]),
            "TxnProbe",
            broker.bootstrap_servers,
            topic_name,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert run.stdout.splitlines() == [
        f"created {topic_name}",
        "committed 0",
        "committed 1",
        "committed 2",
        "aborted",
        "read_committed committed-0 committed-1 committed-2",
        # 3 committed records, COMMIT marker, aborted record, ABORT marker.
        "end_offset 6",
        # The Java consumer's position steps over the control records to the end.
        "group_offset 6",
        "read_uncommitted committed-0 committed-1 committed-2 aborted-0",
    ]
