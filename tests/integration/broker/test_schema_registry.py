"""`sparkafka broker --schema-registry` against Confluent's own client (SchemaRegistryClient): register,
ids, versions, lookups, compatibility, configs, error codes, and survival of restarts and SIGKILL."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from sparkafka.broker.runner import BrokerProcess
from sparkafka.broker.schema_registry import MAX_CONNECTIONS, MAX_REQUEST_BODY_BYTES
from tests.integration.kafka_clients import read_all


def record(*fields: dict[str, object], name: str = "Order") -> Schema:
    return Schema(json.dumps({"type": "record", "name": name, "fields": list(fields)}), "AVRO")


ID = {"name": "id", "type": "long"}
AMOUNT = {"name": "amount", "type": "double"}
NOTE_WITH_DEFAULT = {"name": "note", "type": ["null", "string"], "default": None}
NOTE_WITHOUT_DEFAULT = {"name": "note", "type": "string"}


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("registry") / "data"
    with BrokerProcess(data_dir, schema_registry=True) as process:
        yield process


@pytest.fixture
def client(registry_broker: BrokerProcess) -> SchemaRegistryClient:
    # A fresh client per test: its caches must not hide what the server answers.
    return SchemaRegistryClient({"url": registry_broker.schema_registry_url})


@pytest.fixture
def subject(topic_name: str) -> str:
    return f"{topic_name}-value"


def error_of(call: object) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as raised:
        call()  # type: ignore[operator]
    return raised.value


def test_ready_lines_and_url(registry_broker: BrokerProcess) -> None:
    assert registry_broker.schema_registry_url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{registry_broker.schema_registry_url}/schemas/types") as response:
        assert json.load(response) == ["AVRO"]
        assert response.headers["Content-Type"] == "application/vnd.schemaregistry.v1+json"


def test_register_ids_versions_and_lookup(client: SchemaRegistryClient, subject: str) -> None:
    v1 = record(ID, AMOUNT)
    first_id = client.register_schema(subject, v1)
    assert client.register_schema(subject, v1) == first_id  # same schema: same id, no new version
    v2 = record(ID, AMOUNT, NOTE_WITH_DEFAULT)
    second_id = client.register_schema(subject, v2)
    assert second_id != first_id

    assert subject in client.get_subjects()
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id, latest.subject) == (2, second_id, subject)
    assert json.loads(latest.schema.schema_str) == json.loads(v2.schema_str)
    assert client.get_version(subject, 1).schema_id == first_id
    assert json.loads(client.get_schema(first_id).schema_str) == json.loads(v1.schema_str)

    found = client.lookup_schema(subject, v1)
    assert (found.schema_id, found.version) == (first_id, 1)

    # The same schema under another subject keeps its id, as Confluent's registry does.
    assert client.register_schema(f"{subject}-copy", v1) == first_id
    versions = client.get_schema_versions(first_id)
    assert sorted((v.subject, v.version) for v in versions) == [(subject, 1), (f"{subject}-copy", 1)]


def test_backward_compatibility_rules(client: SchemaRegistryClient, subject: str) -> None:
    client.register_schema(subject, record(ID, AMOUNT, NOTE_WITH_DEFAULT))
    assert client.get_compatibility() == "BACKWARD"
    # Removing a field and adding one with a default: readable with the new schema.
    assert client.test_compatibility(subject, record(ID, {"name": "tip", "type": "double", "default": 0.0}))
    # Promotion int -> long is allowed for the reader; long -> int is not.
    assert client.test_compatibility(subject, record({"name": "id", "type": "double"}, AMOUNT))
    assert not client.test_compatibility(subject, record({"name": "id", "type": "int"}, AMOUNT))
    # A new field without a default cannot be filled from old data.
    assert not client.test_compatibility(subject, record(ID, AMOUNT, {"name": "tip", "type": "double"}))
    # A type change.
    assert not client.test_compatibility(subject, record(ID, {"name": "amount", "type": "string"}))

    incompatible = error_of(lambda: client.register_schema(subject, record(ID, AMOUNT, NOTE_WITHOUT_DEFAULT)))
    assert (incompatible.http_status_code, incompatible.error_code) == (409, 409)
    assert "incompatible" in incompatible.error_message and "note" in incompatible.error_message
    assert client.get_versions(subject) == [1]


def test_compatibility_levels_by_subject(client: SchemaRegistryClient, subject: str) -> None:
    client.register_schema(subject, record(ID))
    assert client.set_compatibility(subject, "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility(subject) == "NONE"
    assert client.register_schema(subject, record({"name": "id", "type": "string"})) > 0
    assert client.set_compatibility(subject, "FORWARD") == {"compatibility": "FORWARD"}
    # FORWARD: the latest version must read the new schema's data; an added field is fine...
    assert client.test_compatibility(subject, record({"name": "id", "type": "string"}, AMOUNT))
    # ...a removed field without a default in the latest is not.
    assert not client.test_compatibility(subject, record(AMOUNT))
    invalid = error_of(lambda: client.set_compatibility(subject, "SIDEWAYS"))
    assert (invalid.http_status_code, invalid.error_code) == (422, 42203)
    # The global level stays as it was.
    assert client.get_compatibility() == "BACKWARD"


def test_error_codes(client: SchemaRegistryClient, subject: str, registry_broker: BrokerProcess) -> None:
    subject_missing = error_of(lambda: client.get_versions(subject))
    assert (subject_missing.http_status_code, subject_missing.error_code) == (404, 40401)
    assert error_of(lambda: client.get_latest_version(subject)).error_code == 40401
    assert error_of(lambda: client.lookup_schema(subject, record(ID))).error_code == 40401

    client.register_schema(subject, record(ID))
    version_missing = error_of(lambda: client.get_version(subject, 7))
    assert (version_missing.http_status_code, version_missing.error_code) == (404, 40402)
    schema_missing = error_of(lambda: client.lookup_schema(subject, record(AMOUNT)))
    assert (schema_missing.http_status_code, schema_missing.error_code) == (404, 40403)
    id_missing = error_of(lambda: client.get_schema(999_999))
    assert (id_missing.http_status_code, id_missing.error_code) == (404, 40403)

    invalid = error_of(
        lambda: client.register_schema(subject, Schema('{"type": "record", "name": "X"}', "AVRO"))
    )
    assert (invalid.http_status_code, invalid.error_code) == (422, 42201)
    unknown_type = error_of(
        lambda: client.register_schema(subject, record({"name": "x", "type": "no.such.Type"}))
    )
    assert unknown_type.error_code == 42201
    json_schema = error_of(lambda: client.register_schema(subject, Schema('{"type": "object"}', "JSON")))
    assert json_schema.error_code == 42201 and "AVRO only" in json_schema.error_message

    bad_version = error_of(lambda: client.get_version(subject, "first"))  # type: ignore[arg-type]
    assert (bad_version.http_status_code, bad_version.error_code) == (422, 42202)


def test_schemas_survive_restart_and_sigkill(tmp_path: Path, topic_name: str) -> None:
    subject = f"{topic_name}-value"
    with BrokerProcess(tmp_path / "data", schema_registry=True) as process:
        url = process.schema_registry_url
        client = SchemaRegistryClient({"url": url})
        first_id = client.register_schema(subject, record(ID))
        second_id = client.register_schema(subject, record(ID, NOTE_WITH_DEFAULT))
        client.set_compatibility(subject, "FULL")

        process.terminate()
        process.start()
        assert process.schema_registry_url == url  # same port after a restart
        restarted = SchemaRegistryClient({"url": url})
        assert restarted.get_versions(subject) == [1, 2]
        assert restarted.get_latest_version(subject).schema_id == second_id
        assert restarted.get_compatibility(subject) == "FULL"

        third_id = restarted.register_schema(
            subject, record(ID, NOTE_WITH_DEFAULT, AMOUNT | {"default": 0.0})
        )
        process.kill()  # SIGKILL: nothing flushed or closed
        process.start()
        after_kill = SchemaRegistryClient({"url": url})
        assert after_kill.get_versions(subject) == [1, 2, 3]
        assert [after_kill.get_version(subject, v).schema_id for v in (1, 2, 3)] == [
            first_id,
            second_id,
            third_id,
        ]
        # New ids continue after the recovered ones.
        fourth_id = after_kill.register_schema(f"{subject}-other", record({"name": "z", "type": "int"}))
        assert fourth_id > third_id

        # The store is a compacted topic on the broker itself, in Confluent's record format.
        records = read_all(process.bootstrap_servers, "_schemas", expect=5)
        keys = [json.loads(m.key()) for m in records]
        assert {"keytype": "SCHEMA", "subject": subject, "version": 1, "magic": 1} in keys
        assert {"keytype": "CONFIG", "subject": subject, "magic": 0} in keys


# -- authentication and limits ----------------------------------------------------------------------

REGISTRY_USER, REGISTRY_PASSWORD = "registry-user", "s3cret:with-colon"


@pytest.fixture(scope="module")
def secured_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with SASL users, whose registry then asks for the same users' credentials."""
    directory = tmp_path_factory.mktemp("secured-registry")
    users = directory / "users"
    users.write_text(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}\n")
    users.chmod(0o600)
    with BrokerProcess(
        directory / "data", schema_registry=True, extra_args=["--sasl-users-file", str(users)]
    ) as process:
        yield process


def _http(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=10)


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_registry_takes_the_brokers_sasl_users_over_basic_auth(
    secured_registry: BrokerProcess, subject: str
) -> None:
    url = secured_registry.schema_registry_url
    client = SchemaRegistryClient(
        {
            "url": url,
            "basic.auth.user.info": f"{REGISTRY_USER}:{REGISTRY_PASSWORD}",
        }
    )
    schema_id = client.register_schema(subject, record(ID))
    assert client.get_schema(schema_id).schema_type == "AVRO"
    assert subject in client.get_subjects()

    anonymous = error_of(lambda: SchemaRegistryClient({"url": url}).get_subjects())
    assert (anonymous.http_status_code, anonymous.error_code) == (401, 401)
    wrong = SchemaRegistryClient({"url": url, "basic.auth.user.info": f"{REGISTRY_USER}:wrong"})
    denied = error_of(lambda: wrong.register_schema(subject, record(ID, AMOUNT)))
    assert (denied.http_status_code, denied.error_code) == (401, 401)
    assert client.get_versions(subject) == [1]  # nothing registered without credentials


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        _basic(REGISTRY_USER, "wrong"),
        _basic("nobody", REGISTRY_PASSWORD),
        "Basic not-base64!",
        "Bearer x",
    ],
)
def test_registry_answers_401_as_confluent_does(
    secured_registry: BrokerProcess, authorization: str | None
) -> None:
    connection = _http(secured_registry.schema_registry_url)
    connection.request("GET", "/subjects", headers={"Authorization": authorization} if authorization else {})
    response = connection.getresponse()
    assert response.status == 401
    assert response.getheader("WWW-Authenticate", "").startswith("Basic realm=")
    assert response.getheader("Content-Type") == "application/vnd.schemaregistry.v1+json"
    assert json.loads(response.read()) == {"error_code": 401, "message": "Unauthorized"}
    # Without a body the connection carries on, and right credentials are served on it.
    connection.request(
        "GET", "/subjects", headers={"Authorization": _basic(REGISTRY_USER, REGISTRY_PASSWORD)}
    )
    served = connection.getresponse()
    assert served.status == 200 and isinstance(json.loads(served.read()), list)
    connection.close()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Length": "-1"}, 400),
        ({"Content-Length": "12abc"}, 400),
        ({"Content-Length": str(MAX_REQUEST_BODY_BYTES + 1)}, 413),
        ({"Content-Length": "99999999999999999999999"}, 413),
        ({"Transfer-Encoding": "chunked"}, 411),
    ],
)
def test_request_bodies_are_bounded(
    registry_broker: BrokerProcess, headers: dict[str, str], status: int
) -> None:
    """Refused from the head alone, at once, instead of reading until the client stops sending; the
    connection is closed since its remaining bytes cannot be told from a next request."""
    connection = _http(registry_broker.schema_registry_url)
    connection.putrequest("POST", "/subjects/bounded-value/versions")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()  # no body follows: the answer must not wait for one
    response = connection.getresponse()
    document = json.loads(response.read())
    assert (response.status, document["error_code"]) == (status, status)
    assert response.getheader("Connection") == "close"
    connection.close()


def test_registry_serves_a_bounded_number_of_connections(registry_broker: BrokerProcess) -> None:
    """MAX_CONNECTIONS idle connections hold every place: one more is answered 503 at once and
    closed (no thread of its own); once they close, requests are served again."""
    host, port = registry_broker.schema_registry_url.removeprefix("http://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer
        assert json.loads(body)["error_code"] == 503
    finally:
        for connection in idle:
            connection.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"{registry_broker.schema_registry_url}/schemas/types") as response:
                assert json.load(response) == ["AVRO"]
                break
        except urllib.error.HTTPError as error:  # the closed connections' places are freed soon after
            assert error.code == 503 and time.monotonic() < deadline
            time.sleep(0.05)
