"""The TLS listener (`sparkafka broker --ssl-listen HOST:PORT --ssl-certfile ... --ssl-keyfile ...`), as a
Kafka SSL listener behaves: librdkafka and the Java client connect with security.protocol=SSL (and
SASL_SSL with SASL users), and each listener advertises its own address, as Kafka's
advertised.listeners does per listener."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sparkafka.broker.runner import BrokerProcess
from sparkafka.broker.tls import SSL_KEY_PASSWORD_ENV
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.broker.test_broker_other_clients import JAVA_SOURCE, _java_classpath


@dataclass(frozen=True)
class Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # The server key, encrypted with "keypass", and a key that belongs to no certificate here.
    encrypted_server_key: Path
    stray_key: Path


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption() if password is None else serialization.BestAvailableEncryption(password)
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("certs")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("sparkafka test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        "localhost",
        server_key,
        ca.subject,
        ca_key,
        names=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("client", client_key, ca.subject, ca_key)
    files = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "server_cert": server.public_bytes(serialization.Encoding.PEM),
        "server_key": _pem_key(server_key),
        "client_cert": client.public_bytes(serialization.Encoding.PEM),
        "client_key": _pem_key(client_key),
        "encrypted_server_key": _pem_key(server_key, b"keypass"),
        "stray_key": _pem_key(ec.generate_private_key(ec.SECP256R1())),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = directory / f"{name}.pem"
        paths[name].write_bytes(data)
    return Certificates(**paths)


def _ssl_args(certs: Certificates) -> list[str]:
    return [
        "--ssl-listen",
        "127.0.0.1:0",
        "--ssl-certfile",
        str(certs.server_cert),
        "--ssl-keyfile",
        str(certs.server_key),
    ]


@dataclass(frozen=True)
class TlsListener:
    broker: BrokerProcess
    plaintext_port: int
    ssl_port: int


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[TlsListener]:
    """The embedded broker with --ssl-listen beside its plaintext listener."""
    directory = tmp_path_factory.mktemp("tls")
    with BrokerProcess(directory / "data", extra_args=FAST_BROKER_ARGS + _ssl_args(certs)) as process:
        assert process.ssl_port is not None
        yield TlsListener(process, process.port, process.ssl_port)


def _ssl(port: int, certs: Certificates, **extra: Any) -> dict[str, Any]:
    # librdkafka checks the broker's name against the certificate (ssl.endpoint.identification.algorithm
    # defaults to https): the advertised 127.0.0.1 must be in it.
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
        **extra,
    }


def _broker_addresses(config: dict[str, Any]) -> list[tuple[str, int]]:
    brokers = AdminClient(config).list_topics(timeout=15).brokers.values()
    return [(broker.host, broker.port) for broker in brokers]


def _round_trip(config: dict[str, Any], topic: str) -> tuple[list[bytes | None], int]:
    """Create ``topic``, produce a record, consume it in a group, commit: (values read, committed)."""
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=10)[topic].result(timeout=30)
    producer = Producer({**config, "enable.idempotence": True})
    producer.produce(topic, value=b"over tls")
    assert producer.flush(30) == 0
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            received.append(message.value())
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    consumer.close()
    return received, committed


def test_ssl_listener_serves_and_advertises_its_own_address(
    tls_broker: TlsListener, certs: Certificates
) -> None:
    tls = _ssl(tls_broker.ssl_port, certs)
    assert _broker_addresses(tls) == [("127.0.0.1", tls_broker.ssl_port)]
    plaintext = {"bootstrap.servers": f"127.0.0.1:{tls_broker.plaintext_port}"}
    assert _broker_addresses(plaintext) == [("127.0.0.1", tls_broker.plaintext_port)]
    # The group coordinator is found (FindCoordinator) and reached over TLS too.
    assert _round_trip(tls, f"tls-{uuid.uuid4().hex[:8]}") == ([b"over tls"], 1)


def test_ssl_listener_refuses_an_untrusted_certificate(tls_broker: TlsListener, certs: Certificates) -> None:
    # Without the CA, the client rejects the broker's certificate: nothing is served.
    config = _ssl(tls_broker.ssl_port, certs, **{"ssl.ca.location": str(certs.client_cert)})
    with pytest.raises(KafkaException):
        AdminClient(config).list_topics(timeout=3)


def test_sasl_ssl_with_users(tmp_path: Path, certs: Certificates) -> None:
    args = FAST_BROKER_ARGS + _ssl_args(certs) + ["--sasl-plain-user", "alice:secret"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as broker:
        assert broker.ssl_port is not None
        sasl = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "alice"}
        good = _ssl(broker.ssl_port, certs, **sasl, **{"sasl.password": "secret"})
        assert _broker_addresses(good) == [("127.0.0.1", broker.ssl_port)]
        assert _round_trip(good, f"sasl-ssl-{uuid.uuid4().hex[:8]}") == ([b"over tls"], 1)
        for refused in (
            _ssl(broker.ssl_port, certs, **sasl, **{"sasl.password": "wrong"}),
            _ssl(broker.ssl_port, certs),  # TLS without SASL
        ):
            with pytest.raises(KafkaException):
                AdminClient(refused).list_topics(timeout=3)


def test_required_client_certificate(tmp_path: Path, certs: Certificates) -> None:
    args = FAST_BROKER_ARGS + _ssl_args(certs)
    args += ["--ssl-cafile", str(certs.ca), "--ssl-client-auth", "required"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as broker:
        assert broker.ssl_port is not None
        with pytest.raises(KafkaException):
            AdminClient(_ssl(broker.ssl_port, certs)).list_topics(timeout=3)
        mutual = _ssl(
            broker.ssl_port,
            certs,
            **{"ssl.certificate.location": str(certs.client_cert), "ssl.key.location": str(certs.client_key)},
        )
        assert _broker_addresses(mutual) == [("127.0.0.1", broker.ssl_port)]


def test_java_client_transactions_over_ssl(tmp_path: Path, certs: Certificates, topic_name: str) -> None:
    _jar, classpath = _java_classpath()
    classes = tmp_path / "classes"
    compiled = subprocess.run(
        ["javac", "-cp", classpath, "-d", str(classes), str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, compiled.stderr
    # A PEM truststore (KIP-651): no keytool needed.
    properties = tmp_path / "client.properties"
    properties.write_text(
        f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={certs.ca}\n"
    )
    with BrokerProcess(tmp_path / "data", extra_args=FAST_BROKER_ARGS + _ssl_args(certs)) as broker:
        run = subprocess.run(
            [
                *("java", "-cp", f"{classes}:{classpath}", "TxnProbe"),
                *(broker.ssl_bootstrap_servers, topic_name, str(properties)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert run.stdout.splitlines()[:5] == [
        f"created {topic_name}",
        "committed 0",
        "committed 1",
        "committed 2",
        "aborted",
    ]
    assert "read_committed committed-0 committed-1 committed-2" in run.stdout


def test_unusable_tls_files_are_named_at_start(tmp_path: Path, certs: Certificates) -> None:
    """Each broker exits at once with status 2 and a message naming the option and the problem."""
    missing = tmp_path / "missing.pem"
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--ssl-certfile", str(missing)], {}, f"--ssl-certfile {missing}: no such file"),
        (["--ssl-certfile", str(tmp_path)], {}, "not a file"),
        (["--ssl-certfile", str(certs.server_key)], {}, "holds no PEM certificate"),
        (
            ["--ssl-certfile", str(certs.server_cert), "--ssl-keyfile", str(certs.stray_key)],
            {},
            "the private key does not belong to the certificate",
        ),
        (
            ["--ssl-certfile", str(certs.server_cert), "--ssl-keyfile", str(certs.encrypted_server_key)],
            {},
            f"the key is encrypted: put its password in ${SSL_KEY_PASSWORD_ENV}",
        ),
        (
            ["--ssl-certfile", str(certs.server_cert), "--ssl-keyfile", str(certs.encrypted_server_key)],
            {SSL_KEY_PASSWORD_ENV: "keypass", "CHECK_STARTS": "1"},
            "",
        ),
        (
            [
                *("--ssl-certfile", str(certs.server_cert), "--ssl-keyfile", str(certs.server_key)),
                *("--ssl-client-auth", "required"),
            ],
            {},
            "--ssl-client-auth required needs --ssl-cafile",
        ),
    ]
    processes = []
    for index, (args, env, _expected) in enumerate(cases):
        command = [sys.executable, "-m", "sparkafka", "broker", "--listen", "127.0.0.1:0"]
        command += ["--data-dir", str(tmp_path / f"data-{index}"), "--ssl-listen", "127.0.0.1:0", *args]
        environment = {**os.environ, **env}
        processes.append(
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
            )
        )
    for process, (_args, env, expected) in zip(processes, cases, strict=True):
        if env.get("CHECK_STARTS"):
            # The right password: the broker starts.
            assert process.stdout is not None
            assert "SSL listener ready" in process.stdout.readline()
            process.terminate()
            process.communicate(timeout=30)
            continue
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 2, err
        assert expected in err, err
        assert "Traceback" not in err
