"""SASL/PLAIN authentication (`sparkafka broker --sasl-plain-user USER:PASSWORD`), as a Kafka
SASL_PLAINTEXT listener behaves: SaslHandshake v1 + SaslAuthenticate (what librdkafka, kafka-python and
the Java client send), raw tokens after a SaslHandshake v0, and nothing served before authentication.
Every test runs against the embedded broker and against Apache Kafka with such a listener."""

from __future__ import annotations

import struct
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

from sparkafka.broker.runner import BrokerProcess
from tests.integration.apache_kafka import ApacheKafka, free_ports
from tests.integration.conftest import APACHE_KAFKA, EMBEDDED
from tests.integration.raw_kafka import RawConnection, fetch_request, idempotent_batch, produce_batch

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

    # A PLAINTEXT client gets nothing, not even metadata.
    with pytest.raises(KafkaException) as raised:
        AdminClient({"bootstrap.servers": sasl_broker.bootstrap_servers}).list_topics(timeout=3)
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
