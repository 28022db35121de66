"""SASL/PLAIN authentication (`sparkafka broker --sasl-plain-user USER:PASSWORD`), as a Kafka
SASL_PLAINTEXT listener behaves: SaslHandshake v1 + SaslAuthenticate (what librdkafka, kafka-python and
the Java client send), raw tokens after a SaslHandshake v0, and nothing served before authentication.
Every test runs against the embedded broker and against Apache Kafka with such a listener."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from sparkafka.broker.config import SaslUser
from sparkafka.broker.runner import BrokerProcess
from sparkafka.broker.sasl import SASL_USERS_ENV, credentials_match
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.conftest import APACHE_KAFKA, EMBEDDED
from tests.integration.raw_kafka import RawConnection, fetch_request, idempotent_batch, produce_batch
from tests.ports import free_ports

USER, PASSWORD = "alice", "secret"
USERS = {USER: PASSWORD, "bob": "hunter2"}


class _SaslApacheKafka(ApacheKafka):
    """Apache Kafka with a SASL_PLAINTEXT listener (PLAIN, the module's users) beside the PLAINTEXT one
    the harness talks to."""

    sasl_port: int

    def _choose_ports(self) -> None:
        super()._choose_ports()
        (self.sasl_port,) = free_ports(1)

    def _properties(self, node: int) -> Path:
        plain, sasl, controller = self.ports[node], self.sasl_port, self.controller_ports[node]
        users = " ".join(f'user_{name}="{password}"' for name, password in USERS.items())
        self.settings = {
            "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl},"
            f"CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
        }
        return super()._properties(node)


@dataclass(frozen=True)
class SaslListener:
    """A SASL_PLAINTEXT listener (``port``) of ``broker``, and a PLAINTEXT one of the same kind."""

    broker: BrokerProcess | ApacheKafka
    port: int
    plaintext_port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module", params=[EMBEDDED, APACHE_KAFKA])
def sasl_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SaslListener]:
    """The embedded broker with --sasl-plain-user, then Apache Kafka with a SASL_PLAINTEXT listener:
    the same assertions hold for both, or the embedded broker is wrong."""
    directory = tmp_path_factory.mktemp(f"sasl-{request.param}")
    if request.param == EMBEDDED:
        args = ["--group-initial-rebalance-delay-ms", "0"]
        for name, password in USERS.items():
            args += ["--sasl-plain-user", f"{name}:{password}"]
        plaintext: BrokerProcess = request.getfixturevalue("broker")
        with BrokerProcess(directory / "data", extra_args=args) as process:
            yield SaslListener(process, process.port, plaintext.port)
    else:
        with _SaslApacheKafka(directory, APACHE_KAFKA.removeprefix("apache-kafka-")) as kafka:
            yield SaslListener(kafka, kafka.sasl_port, kafka.port)


def _sasl(bootstrap: str, username: str = USER, password: str = PASSWORD, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
        **extra,
    }


def _create_topic(config: dict[str, Any], name: str) -> None:
    admin = AdminClient(config)  # kept referenced until the result is in: destroying it fails the future
    futures = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=10)
    futures[name].result(timeout=30)


def _end_offset(config: dict[str, Any], topic: str) -> int:
    consumer = Consumer({**config, "group.id": f"end-{topic}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_right_password_produces_and_consumes_transactionally(sasl_broker: SaslListener) -> None:
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    config = _sasl(sasl_broker.bootstrap_servers)
    _create_topic(config, topic)
    producer = Producer({**config, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"authenticated")
    producer.commit_transaction(30)

    consumer = Consumer(
        {
            **config,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + 20
    while not received and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            received.append(message.value())
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    consumer.close()
    assert received == [b"authenticated"]
    assert committed[0].offset == 1  # librdkafka commits the last consumed offset + 1


def test_second_user_is_accepted_too(sasl_broker: SaslListener) -> None:
    metadata = AdminClient(_sasl(sasl_broker.bootstrap_servers, "bob", "hunter2")).list_topics(timeout=10)
    assert metadata.brokers


def test_wrong_password_fails_with_an_authentication_error(sasl_broker: SaslListener) -> None:
    errors: list[KafkaError] = []
    config = _sasl(sasl_broker.bootstrap_servers, password="wrong", error_cb=errors.append)
    producer = Producer(config)
    producer.produce("never-written", value=b"x")
    deadline = time.monotonic() + 10
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    authentication = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert authentication, errors
    assert "Invalid username or password" in authentication[0].str()
    assert producer.flush(0) == 1  # nothing was delivered
    with pytest.raises(KafkaException):
        AdminClient(_sasl(sasl_broker.bootstrap_servers, "nobody", PASSWORD)).list_topics(timeout=1)
    listed = AdminClient(_sasl(sasl_broker.bootstrap_servers)).list_topics(timeout=10).topics
    assert "never-written" not in listed  # no metadata asked, no topic auto-created


def test_client_without_sasl_is_disconnected_before_any_data(sasl_broker: SaslListener) -> None:
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    _create_topic(_sasl(sasl_broker.bootstrap_servers), topic)
    producer = Producer({**_sasl(sasl_broker.bootstrap_servers), "enable.idempotence": True})
    producer.produce(topic, value=b"secret-data")
    assert producer.flush(30) == 0
    assert _end_offset(_sasl(sasl_broker.bootstrap_servers), topic) == 1

    # A PLAINTEXT client gets nothing, not even metadata: the broker closes the connection, which
    # fails the request at once. The timeout only leaves a loaded machine room to connect first (with
    # 3 s, the request once timed out before the close was seen).
    with pytest.raises(KafkaException) as raised:
        AdminClient({"bootstrap.servers": sasl_broker.bootstrap_servers}).list_topics(timeout=20)
    assert raised.value.args[0].code() == KafkaError._TRANSPORT

    # On the wire: ApiVersions is answered (clients need it to authenticate), everything else closes
    # the connection without an answer.
    with RawConnection(sasl_broker.port) as connection:
        request = ApiVersionsRequest(client_software_name="sparkafka-tests", client_software_version="1.0")
        versions = connection.roundtrip(request, ApiVersionsResponse, version=3)
        assert versions.error_code == 0
        connection.send_frame(_encoded(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12))
        assert connection.closed_by_peer()
    fetch = fetch_request(topic)
    with RawConnection(sasl_broker.port) as connection, pytest.raises(ConnectionError):
        connection.roundtrip(fetch, FetchResponse, version=11)
    with RawConnection(sasl_broker.port) as connection, pytest.raises(ConnectionError):
        produce_batch(
            connection,
            topic,
            0,
            idempotent_batch([b"intruder"], producer_id=-1, epoch=-1, base_sequence=-1),
        )
    assert _end_offset(_sasl(sasl_broker.bootstrap_servers), topic) == 1  # nothing appended


def _encoded(request: Any, version: int) -> bytes:
    """A request's bytes without the size prefix (RawConnection.send_frame adds it)."""
    request.with_header(correlation_id=99, client_id="raw")
    return bytes(request.encode(version=version, header=True, framed=False))


def test_handshake_v1_then_sasl_authenticate_on_the_wire(sasl_broker: SaslListener) -> None:
    with RawConnection(sasl_broker.port) as connection:
        handshake = connection.roundtrip(
            SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1
        )
        assert (handshake.error_code, handshake.mechanisms) == (0, ["PLAIN"])
        token = f"\0{USER}\0{PASSWORD}".encode()
        answer = connection.roundtrip(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 2)
        assert (answer.error_code, answer.session_lifetime_ms) == (0, 0)
        metadata = connection.roundtrip(
            MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, version=12
        )
        assert metadata.brokers[0].port == sasl_broker.port
        # Authenticated connections are told a new handshake or authenticate is out of place.
        again = connection.roundtrip(
            SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1
        )
        assert again.error_code == 34  # ILLEGAL_SASL_STATE
        repeat = connection.roundtrip(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 2)
        assert repeat.error_code == 34
        assert repeat.error_message == "SaslAuthenticate request received after successful authentication"

    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
        wrong = connection.roundtrip(
            SaslAuthenticateRequest(auth_bytes=f"\0{USER}\0nope".encode()), SaslAuthenticateResponse, 2
        )
        assert wrong.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert wrong.error_message == "Authentication failed: Invalid username or password"
        assert connection.closed_by_peer()  # as Kafka, the failure ends the connection

    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
        two_tokens = connection.roundtrip(
            SaslAuthenticateRequest(auth_bytes=f"{USER}\0{PASSWORD}".encode()), SaslAuthenticateResponse, 2
        )
        assert two_tokens.error_code == 58
        assert two_tokens.error_message == "Invalid SASL/PLAIN response: expected 3 tokens, got 2"

    with RawConnection(sasl_broker.port) as connection:
        # Before authentication a request may be 512 KiB at most (Kafka's sasl.server.max.receive.size):
        # a larger one closes the connection unanswered.
        connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
        connection.send_frame(_encoded(SaslAuthenticateRequest(auth_bytes=b"\0" * 600_000), 2))
        assert connection.closed_by_peer()

    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
        other_identity = f"bob\0{USER}\0{PASSWORD}".encode()  # authorization id differs from the user
        answer = connection.roundtrip(
            SaslAuthenticateRequest(auth_bytes=other_identity), SaslAuthenticateResponse, 2
        )
        assert answer.error_code == 58
        assert "authorization id that is different from username" in answer.error_message

    with RawConnection(sasl_broker.port) as connection:
        # SaslAuthenticate before any SaslHandshake: closed without an answer, as Kafka does.
        token = f"\0{USER}\0{PASSWORD}".encode()
        connection.send_frame(_encoded(SaslAuthenticateRequest(auth_bytes=token), 2))
        assert connection.closed_by_peer()

    with RawConnection(sasl_broker.port) as connection:
        scram = connection.roundtrip(
            SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), SaslHandshakeResponse, version=1
        )
        assert (scram.error_code, scram.mechanisms) == (33, ["PLAIN"])  # UNSUPPORTED_SASL_MECHANISM
        assert connection.closed_by_peer()


def _api_versions_error(connection: RawConnection, name: str = "sparkafka-tests") -> tuple[int, int]:
    """Send ApiVersions v3; (error code, API keys listed) of an answer kafka-python cannot decode
    (it reads any ApiVersions error answer as v0)."""
    request = ApiVersionsRequest(client_software_name=name, client_software_version="1.0")
    connection.send_frame(_encoded(request, 3))
    _size, _correlation_id, error, compact_key_count = struct.unpack(">iihB", connection.read_frame()[:11])
    return error, compact_key_count - 1


def test_requests_out_of_the_sasl_order_close_the_connection(sasl_broker: SaslListener) -> None:
    """Kafka's SaslServerAuthenticator: ApiVersions once, then SaslHandshake, then SaslAuthenticate.
    While a SaslAuthenticate is due, ApiVersions and SaslHandshake are answered ILLEGAL_SASL_STATE
    before the connection closes (Kafka answers any other request so too, the embedded broker closes
    unanswered); anything else out of order closes it unanswered."""
    versions = ApiVersionsRequest(client_software_name="sparkafka-tests", client_software_version="1.0")
    handshake = SaslHandshakeRequest(mechanism="PLAIN")

    with RawConnection(sasl_broker.port) as connection:
        # A refused ApiVersions (invalid software name) may be followed by another, then the login.
        assert _api_versions_error(connection, name="bad name") == (42, 0)  # INVALID_REQUEST
        assert connection.roundtrip(versions, ApiVersionsResponse, 3).error_code == 0
        connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        token = f"\0{USER}\0{PASSWORD}".encode()
        answer = connection.roundtrip(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 2)
        assert answer.error_code == 0

    with RawConnection(sasl_broker.port) as connection:  # a second ApiVersions
        connection.roundtrip(versions, ApiVersionsResponse, 3)
        connection.send_frame(_encoded(versions, 3))
        assert connection.closed_by_peer()

    with RawConnection(sasl_broker.port) as connection:  # while a SaslAuthenticate is due:
        connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        assert _api_versions_error(connection) == (34, 0)  # ILLEGAL_SASL_STATE
        assert connection.closed_by_peer()
    with RawConnection(sasl_broker.port) as connection:  # a version the broker lacks: answered as v0
        connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        request = struct.pack(">hhih", 18, 99, 5, 0) + b"\x00"  # a flexible header: no tagged fields
        connection.send_frame(request)
        _size, correlation_id, error, key_count = struct.unpack(">iihi", connection.read_frame()[:14])
        assert (correlation_id, error, key_count) == (5, 34, 0)
        assert connection.closed_by_peer()
    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        again = connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        assert (again.error_code, again.mechanisms) == (34, [])
        assert connection.closed_by_peer()
    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(handshake, SaslHandshakeResponse, version=1)
        connection.send_frame(_encoded(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12))
        if not isinstance(sasl_broker.broker, BrokerProcess):
            # Kafka first answers any other request with its own error answer (ILLEGAL_SASL_STATE,
            # here a Metadata answer without brokers); the embedded broker does not (docs/architecture.md).
            refused = MetadataResponse.decode(connection.read_frame(), version=12, header=True, framed=True)
            assert (refused.brokers, refused.topics) == ([], [])
        assert connection.closed_by_peer()


def test_handshake_v0_then_raw_token(sasl_broker: SaslListener) -> None:
    with RawConnection(sasl_broker.port) as connection:
        handshake = connection.roundtrip(
            SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=0
        )
        assert handshake.error_code == 0
        connection.send_frame(f"\0{USER}\0{PASSWORD}".encode())
        assert connection.read_frame() == b"\x00\x00\x00\x00"  # PLAIN's empty server challenge
        metadata = connection.roundtrip(
            MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, version=12
        )
        assert metadata.brokers[0].node_id == 1

    with RawConnection(sasl_broker.port) as connection:
        connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=0)
        connection.send_frame(f"\0{USER}\0wrong".encode())
        assert connection.closed_by_peer()


def test_kafka_python_client_authenticates(sasl_broker: SaslListener) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"sasl-kp-{uuid.uuid4().hex[:8]}"
    _create_topic(_sasl(sasl_broker.bootstrap_servers), topic)
    common = {
        "bootstrap_servers": sasl_broker.bootstrap_servers,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": USER,
        "sasl_plain_password": PASSWORD,
    }
    sender = KafkaProducer(**common)
    sender.send(topic, b"from kafka-python").get(timeout=30)
    sender.close()
    reader = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000, **common)
    assert next(iter(reader)).value == b"from kafka-python"
    reader.close()


def test_handshake_on_a_listener_without_sasl_is_illegal(sasl_broker: SaslListener) -> None:
    # Kafka's KafkaApis answers SaslHandshake outside SASL authentication with ILLEGAL_SASL_STATE.
    port = sasl_broker.plaintext_port
    with RawConnection(port) as connection:
        answer = connection.roundtrip(
            SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1
        )
        assert (answer.error_code, answer.mechanisms) == (34, [])
        metadata = connection.roundtrip(
            MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, version=12
        )
        assert metadata.brokers[0].port == port  # the connection carries on


# -- where the users come from, the failed authentication delay, open listeners --------------------

FILE_USERS = {"carol": "pa:ss word", "dave": "hunter3"}  # a password may hold ':' and spaces
ENV_USER = ("erin", "from-the-environment")
SLOW_DELAY_S = 2.5


def _users_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Users from a file and from the environment, none on the command line; a failed authentication
    delay long enough to measure; listening on every interface, which needs no warning with SASL."""
    directory = tmp_path_factory.mktemp("secured")
    lines = ["# SASL/PLAIN users", "", *(f"{name}:{password}" for name, password in FILE_USERS.items())]
    users = _users_file(directory / "users", "\n".join(lines) + "\n")
    args = [
        "--sasl-users-file",
        str(users),
        "--connection-failed-authentication-delay-ms",
        str(int(SLOW_DELAY_S * 1000)),
        "--listen",
        "0.0.0.0:0",  # the last --listen counts
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SASL_USERS_ENV, ":".join(ENV_USER))
        process = BrokerProcess(directory / "data", extra_args=args).start()
    try:
        yield process
    finally:
        process.terminate()


def test_users_from_a_file_and_the_environment_stay_out_of_the_process_list(
    secured_broker: BrokerProcess,
) -> None:
    for name, password in [*FILE_USERS.items(), ENV_USER]:
        metadata = AdminClient(_sasl(secured_broker.bootstrap_servers, name, password)).list_topics(
            timeout=10
        )
        assert metadata.brokers, name
    with pytest.raises(KafkaException):
        AdminClient(_sasl(secured_broker.bootstrap_servers, "carol", "pa:ss")).list_topics(timeout=1)
    assert secured_broker.process is not None
    command_line = Path(f"/proc/{secured_broker.process.pid}/cmdline").read_bytes()
    for password in [*FILE_USERS.values(), ENV_USER[1]]:
        assert password.encode() not in command_line
    assert "without authentication" not in secured_broker.log_path.read_text()


def _broker_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`sparkafka broker` expected to refuse its arguments before it starts."""
    command = [sys.executable, "-m", "sparkafka", "broker", "--data-dir", str(tmp_path / "data")]
    command += ["--listen", "127.0.0.1:0", *args]
    environment = {**os.environ, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=30, env=environment)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("alice:secret\n\nbob-without-password\n", "line 3: expected USER:PASSWORD, found no ':'"),
        ("# users\n:secret\n", "line 2: the user name before ':' is empty"),
        ("alice:\n", "line 1: user 'alice' has an empty password"),
        (
            "alice:secret\nalice:other\n",
            "SASL user 'alice' is given twice: {file}, line 1 and {file}, line 2",
        ),
    ],
)
def test_malformed_users_file_is_refused_naming_file_and_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    users = _users_file(tmp_path / "users", text)
    result = _broker_cli(tmp_path, "--sasl-users-file", str(users))
    assert result.returncode == 2
    assert problem.format(file=users) in result.stderr
    assert str(users) in result.stderr
    assert "secret" not in result.stderr and "other" not in result.stderr  # passwords are not echoed


def test_an_empty_password_on_the_command_line_is_refused(tmp_path: Path) -> None:
    """Kafka's PLAIN refuses an empty password; the embedded Schema Registry, which takes the same
    users for HTTP Basic auth, would otherwise let the name in without one."""
    result = _broker_cli(tmp_path, "--sasl-plain-user", "admin:secret", "--sasl-plain-user", "alice:")
    assert result.returncode == 2
    assert "--sasl-plain-user alice: the password after ':' is empty" in result.stderr
    users = [SaslUser("alice", "")]
    assert not credentials_match(users, "alice", ""), "an empty password never matches"


def test_users_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    users = _users_file(tmp_path / "users", "alice:secret\n", mode=0o644)
    result = _broker_cli(tmp_path, "--sasl-users-file", str(users))
    assert result.returncode == 2
    assert f"permissions 0644 for the SASL users file '{users}' are too open" in result.stderr
    assert f"chmod 600 {users}" in result.stderr

    missing = _broker_cli(tmp_path, "--sasl-users-file", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert "cannot read the SASL users file" in missing.stderr and "No such file" in missing.stderr


def test_malformed_environment_users_and_duplicates_across_sources(tmp_path: Path) -> None:
    result = _broker_cli(tmp_path, env={SASL_USERS_ENV: "alice:secret\nbob"})
    assert result.returncode == 2
    assert f"${SASL_USERS_ENV}, line 2: expected USER:PASSWORD" in result.stderr

    users = _users_file(tmp_path / "users", "alice:secret\n")
    both = _broker_cli(tmp_path, "--sasl-users-file", str(users), env={SASL_USERS_ENV: "alice:secret"})
    assert both.returncode == 2
    assert f"SASL user 'alice' is given twice: {users}, line 1 and ${SASL_USERS_ENV}, line 1" in both.stderr


def _fail_authentication(connection: RawConnection) -> float:
    """Authenticate with a wrong password over SaslHandshake v1; when the password was sent."""
    connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
    token = f"\0{USER}\0wrong".encode()
    sent_at = time.monotonic()
    answer = connection.roundtrip(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 2)
    assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
    return sent_at


def test_failed_authentication_closes_only_after_the_delay(sasl_broker: SaslListener) -> None:
    """Kafka's connection.failed.authentication.delay.ms (100 ms by default): a connection that
    failed authentication closes no sooner, and takes no second attempt, so a client guessing
    passwords gets at most about ten tries a second per connection. Kafka and the embedded broker
    both hold back the failure's answer for the delay, then close."""
    with RawConnection(sasl_broker.port) as connection:
        sent_at = _fail_authentication(connection)
        retry = f"\0{USER}\0{PASSWORD}".encode()
        connection.send_frame(_encoded(SaslAuthenticateRequest(auth_bytes=retry), 2))
        assert connection.closed_by_peer()  # the retry is not answered
        assert time.monotonic() - sent_at >= 0.09


def test_the_delay_holds_back_only_the_failed_connection(secured_broker: BrokerProcess) -> None:
    """Guessing passwords gets one try per connection and per delay (1 s here): the failure's answer
    itself waits for the delay, as Kafka's does, so dropping the connection on it gains nothing;
    raw tokens after a SaslHandshake v0 get no answer and are closed after the delay. Other clients
    are served during the delay."""
    port = secured_broker.port
    with RawConnection(port) as failed, RawConnection(port) as raw_failed:
        answered: list[float] = []

        def guess() -> None:
            _fail_authentication(failed)
            answered.append(time.monotonic())

        guesser = threading.Thread(target=guess)
        started = time.monotonic()
        guesser.start()
        raw_failed.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=0)
        raw_failed.send_frame(b"\0carol\0wrong")
        raw_failed_at = time.monotonic()

        name, password = ENV_USER
        metadata = AdminClient(_sasl(secured_broker.bootstrap_servers, name, password)).list_topics(
            timeout=10
        )
        assert metadata.brokers
        assert time.monotonic() - started < SLOW_DELAY_S * 0.8  # not queued behind the delay

        guesser.join(10)
        assert answered and answered[0] - started >= SLOW_DELAY_S * 0.9, "the failure was answered early"
        assert failed.closed_by_peer()
        assert raw_failed.closed_by_peer()
        assert time.monotonic() - raw_failed_at >= SLOW_DELAY_S * 0.9


def test_warning_when_listening_beyond_loopback_without_authentication(tmp_path: Path) -> None:
    args = ["--listen", "0.0.0.0:0", "--schema-registry", "0.0.0.0:0"]
    with BrokerProcess(tmp_path / "open", extra_args=args) as open_broker:
        log = open_broker.log_path.read_text()
    assert f"the broker listens on 0.0.0.0:{open_broker.port}, reachable from other machines" in log
    assert "without authentication: anyone who can connect can read and change every topic" in log
    assert "the schema registry listens on 0.0.0.0:" in log
    with BrokerProcess(tmp_path / "loopback") as loopback_broker:
        pass
    assert "without authentication" not in loopback_broker.log_path.read_text()


def test_the_limit_before_authentication_is_the_brokers_setting(tmp_path: Path) -> None:
    """sasl.server.max.receive.size (--sasl-server-max-receive-size, a row of the broker's settings
    table that DescribeConfigs answers as Kafka does): a request under it is answered before login,
    one over it closes the connection unanswered."""
    args = ["--sasl-plain-user", f"{USER}:{PASSWORD}", "--sasl-server-max-receive-size", "2048"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as broker:
        with RawConnection(broker.port) as connection:
            connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
            token = f"\0{USER}\0{'x' * 1500}".encode()
            answer = connection.roundtrip(
                SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 2
            )
            assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED: read and judged
        with RawConnection(broker.port) as connection:
            connection.roundtrip(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, version=1)
            connection.send_frame(_encoded(SaslAuthenticateRequest(auth_bytes=b"\0" * 3000), 2))
            assert connection.closed_by_peer()
        assert "sasl.server.max.receive.size=2048 before authentication" in broker.log_path.read_text()
