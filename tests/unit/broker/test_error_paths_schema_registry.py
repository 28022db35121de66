"""Error paths of sparkafka.broker.schema_registry: the status, error code and message the embedded
Schema Registry answers bad requests, unknown subjects, versions and ids, incompatible schemas and
unknown routes with, over HTTP from a real broker; and the Avro parse error itself, without one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.broker.schema_errors import (
    INCOMPATIBLE_SCHEMA,
    INVALID_SCHEMA,
    INVALID_VERSION,
    SCHEMA_NOT_FOUND,
    SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
    SUBJECT_NOT_FOUND,
    VERSION_NOT_FOUND,
    RegistryError,
)
from sparkafka.broker.schema_registry import parse_avro

ORDER = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
ORDER_WITH_REQUIRED_NOTE = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("registry") / "data"
    with BrokerProcess(data_dir, schema_registry=True) as process:
        yield process.schema_registry_url


@pytest.fixture
def subject() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}-value"


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """(HTTP status, decoded JSON answer) of one request, errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def register(registry: str, subject: str, schema: dict[str, Any]) -> tuple[int, Any]:
    return call(f"{registry}/subjects/{subject}/versions", "POST", {"schema": json.dumps(schema)})


def test_an_invalid_avro_schema_is_refused_with_what_is_wrong() -> None:
    text = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "decimal128"}]}'
    with pytest.raises(RegistryError) as raised:
        parse_avro(text)
    assert (raised.value.status, raised.value.error_code) == (422, INVALID_SCHEMA)
    assert raised.value.message.startswith(f"Invalid schema {text}, details: ")
    assert "decimal128" in raised.value.message.removeprefix(f"Invalid schema {text}")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"schema": 5}, 'Invalid schema: the request body needs a "schema" string'),
        (
            {"schema": json.dumps(ORDER), "schemaType": "PROTOBUF"},
            "Invalid schema: schemaType 'PROTOBUF' is not supported by sparkafka's schema registry "
            "(AVRO only)",
        ),
        (
            {"schema": json.dumps(ORDER), "references": [{"name": "x", "subject": "y", "version": 1}]},
            "Invalid schema: schema references are not supported by sparkafka's schema registry",
        ),
    ],
)
def test_a_registration_without_a_usable_avro_schema_is_unprocessable(
    registry: str, subject: str, body: dict[str, Any], message: str
) -> None:
    answer = call(f"{registry}/subjects/{subject}/versions", "POST", body)
    assert answer == (422, {"error_code": INVALID_SCHEMA, "message": message})


def test_the_versions_of_an_unknown_subject_are_not_found(registry: str, subject: str) -> None:
    answer = call(f"{registry}/subjects/{subject}/versions")
    assert answer == (404, {"error_code": SUBJECT_NOT_FOUND, "message": f"Subject '{subject}' not found."})


def test_a_version_the_subject_does_not_have_is_not_found(registry: str, subject: str) -> None:
    assert register(registry, subject, ORDER)[0] == 200
    answer = call(f"{registry}/subjects/{subject}/versions/7")
    assert answer == (404, {"error_code": VERSION_NOT_FOUND, "message": "Version 7 not found."})


def test_a_version_outside_the_allowed_range_is_unprocessable(registry: str, subject: str) -> None:
    assert register(registry, subject, ORDER)[0] == 200
    status, answer = call(f"{registry}/subjects/{subject}/versions/0")
    assert (status, answer["error_code"]) == (422, INVALID_VERSION)
    assert answer["message"].startswith(
        "The specified version '0' is not a valid version id. Allowed values are between [1, "
    )


def test_a_schema_incompatible_with_the_subject_is_a_conflict(registry: str, subject: str) -> None:
    assert register(registry, subject, ORDER)[0] == 200
    status, answer = register(registry, subject, ORDER_WITH_REQUIRED_NOTE)
    assert (status, answer["error_code"]) == (409, INCOMPATIBLE_SCHEMA)
    assert answer["message"].startswith(
        f'Schema being registered is incompatible with an earlier schema for subject "{subject}", details: '
    )
    assert call(f"{registry}/subjects/{subject}/versions") == (200, [1])


def test_looking_up_a_schema_the_subject_never_registered_is_not_found(registry: str, subject: str) -> None:
    assert register(registry, subject, ORDER)[0] == 200
    answer = call(f"{registry}/subjects/{subject}", "POST", {"schema": json.dumps(ORDER_WITH_REQUIRED_NOTE)})
    assert answer == (404, {"error_code": SCHEMA_NOT_FOUND, "message": "Schema not found"})


def test_an_unknown_schema_id_is_not_found(registry: str) -> None:
    answer = call(f"{registry}/schemas/ids/987654")
    assert answer == (404, {"error_code": SCHEMA_NOT_FOUND, "message": "Schema 987654 not found"})


def test_a_compatibility_check_against_a_version_of_an_unknown_subject_is_not_found(
    registry: str, subject: str
) -> None:
    answer = call(
        f"{registry}/compatibility/subjects/{subject}/versions/1", "POST", {"schema": json.dumps(ORDER)}
    )
    assert answer == (404, {"error_code": SUBJECT_NOT_FOUND, "message": f"Subject '{subject}' not found."})


def test_the_config_of_a_subject_without_its_own_level_is_not_found(registry: str, subject: str) -> None:
    answer = call(f"{registry}/config/{subject}")
    assert answer == (
        404,
        {
            "error_code": SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
            "message": f"Subject '{subject}' does not have subject-level compatibility configured",
        },
    )
    assert call(f"{registry}/config/{subject}?defaultToGlobal=true")[0] == 200


def test_a_method_a_route_does_not_support_is_not_allowed(registry: str) -> None:
    answer = call(f"{registry}/subjects", "DELETE")
    assert answer == (405, {"error_code": 405, "message": "HTTP DELETE is not supported on /subjects"})


def test_a_path_no_route_matches_is_not_found(registry: str) -> None:
    answer = call(f"{registry}/nowhere/at/all")
    assert answer == (404, {"error_code": 404, "message": "HTTP 404 Not Found: /nowhere/at/all"})
