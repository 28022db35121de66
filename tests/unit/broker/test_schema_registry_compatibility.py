"""The embedded Schema Registry's pure parts: Avro schema validation, compatibility rules (Avro schema
resolution, as Confluent's BACKWARD/FORWARD/FULL levels apply it), and state rebuilt from _schemas
records (no broker, no HTTP)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparkafka.broker.schema_avro import (
    InvalidAvroSchema,
    canonical_text,
    compatibility_problems,
    parse_avro_schema,
    reader_incompatibilities,
)
from sparkafka.broker.schema_errors import INVALID_SCHEMA, INVALID_VERSION, RegistryError
from sparkafka.broker.schema_registry import (
    RegistryState,
    config_key,
    parse_avro,
    schema_key,
)
from sparkafka.broker.schema_registry import _parse_version as parse_version


def avro(schema: Any) -> Any:
    return parse_avro(json.dumps(schema))


def record(*fields: dict[str, Any], name: str = "R") -> Any:
    return avro({"type": "record", "name": name, "namespace": "n", "fields": list(fields)})


A = {"name": "a", "type": "int"}
B_DEFAULT = {"name": "b", "type": "string", "default": ""}
B_REQUIRED = {"name": "b", "type": "string"}


def test_added_field_needs_a_default() -> None:
    assert reader_incompatibilities(record(A, B_DEFAULT), record(A)) == []
    problems = reader_incompatibilities(record(A, B_REQUIRED), record(A))
    assert len(problems) == 1 and problems[0].startswith("READER_FIELD_MISSING_DEFAULT_VALUE at /b")


def test_removed_field_is_fine_for_the_reader() -> None:
    assert reader_incompatibilities(record(A), record(A, B_REQUIRED)) == []


@pytest.mark.parametrize(
    ("writer", "reader", "compatible"),
    [
        ("int", "long", True),
        ("int", "double", True),
        ("long", "float", True),
        ("float", "double", True),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("long", "int", False),
        ("double", "float", False),
        ("string", "int", False),
        ("boolean", "int", False),
    ],
)
def test_type_changes(writer: str, reader: str, compatible: bool) -> None:
    problems = reader_incompatibilities(
        record({"name": "a", "type": reader}), record({"name": "a", "type": writer})
    )
    assert (problems == []) is compatible


def test_unions_enums_fixed_arrays_maps_and_names() -> None:
    nullable = {"name": "a", "type": ["null", "int"], "default": None}
    assert reader_incompatibilities(record(nullable), record(A)) == []  # int fits the reader's union
    assert reader_incompatibilities(record(A), record(nullable)) != []  # the writer may have written null
    enum_ab = {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}
    enum_abc = {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}}
    enum_ab_default = {
        "name": "e",
        "type": {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"},
    }
    assert reader_incompatibilities(record(enum_abc), record(enum_ab)) == []
    assert "MISSING_ENUM_SYMBOLS" in reader_incompatibilities(record(enum_ab), record(enum_abc))[0]
    assert reader_incompatibilities(record(enum_ab_default), record(enum_abc)) == []
    fixed4 = {"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}}
    fixed8 = {"name": "f", "type": {"type": "fixed", "name": "F", "size": 8}}
    assert "FIXED_SIZE_MISMATCH" in reader_incompatibilities(record(fixed8), record(fixed4))[0]
    ints = {"name": "x", "type": {"type": "array", "items": "int"}}
    longs = {"name": "x", "type": {"type": "array", "items": "long"}}
    assert reader_incompatibilities(record(longs), record(ints)) == []
    assert reader_incompatibilities(record(ints), record(longs)) != []
    map_int = {"name": "m", "type": {"type": "map", "values": "int"}}
    map_string = {"name": "m", "type": {"type": "map", "values": "string"}}
    assert "at /m/values" in reader_incompatibilities(record(map_string), record(map_int))[0]
    assert "NAME_MISMATCH" in reader_incompatibilities(record(A, name="Other"), record(A))[0]


def test_recursive_types_terminate() -> None:
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    assert reader_incompatibilities(avro(node), avro(node)) == []


def test_levels() -> None:
    v1, v2 = record(A), record(A, B_DEFAULT)
    v3_required = record(A, B_DEFAULT, {"name": "c", "type": "int"})
    history = [(1, v1), (2, v2)]
    assert compatibility_problems("BACKWARD", v3_required, history) != []
    assert compatibility_problems("NONE", v3_required, history) == []
    # FORWARD: the old schemas must read the new data; dropping b (which v2 reads with a default) is fine.
    assert compatibility_problems("FORWARD", record(A), history) == []
    assert compatibility_problems("FORWARD", record(B_DEFAULT), history) != []  # v2 needs a
    assert compatibility_problems("FULL", record(A, B_DEFAULT), history) == []
    # Transitive levels check every version, not only the latest.
    only_b = record(B_DEFAULT)
    assert compatibility_problems("BACKWARD", record(A, B_REQUIRED), [(1, record(A, B_REQUIRED))]) == []
    assert compatibility_problems("FORWARD_TRANSITIVE", only_b, [(1, record(B_REQUIRED)), (2, only_b)]) == []
    assert compatibility_problems("BACKWARD", v1, []) == []


@pytest.mark.parametrize(
    "schema",
    [
        '{"type": "record", "name": "X"}',
        '{"type": "enum", "name": "E"}',
        "{oops",
        '"nothing"',
        '{"type": "array"}',
    ],
)
def test_invalid_schemas(schema: str) -> None:
    with pytest.raises(RegistryError) as raised:
        parse_avro(schema)
    assert (raised.value.status, raised.value.error_code) == (422, INVALID_SCHEMA)


def test_versions() -> None:
    assert parse_version("latest") is None and parse_version("-1") is None
    assert parse_version("3") == 3
    for bad in ("0", "x", "2147483648"):
        with pytest.raises(RegistryError) as raised:
            parse_version(bad)
        assert raised.value.error_code == INVALID_VERSION


def test_canonical_text_ignores_whitespace_and_key_order() -> None:
    assert canonical_text('{"type": "int", "a": 1}') == canonical_text('{"a":1,"type":"int"}')
    assert canonical_text('"string"') == canonical_text(' "string" ')


def test_state_rebuilt_from_records() -> None:
    state = RegistryState()
    schema = '{"type":"string"}'
    state.apply(
        schema_key("s", 1), {"subject": "s", "version": 1, "id": 4, "schema": schema, "deleted": False}
    )
    state.apply(
        schema_key("t", 1), {"subject": "t", "version": 1, "id": 4, "schema": schema, "deleted": False}
    )
    state.apply(config_key(None), {"compatibilityLevel": "FULL"})
    state.apply(config_key("s"), {"compatibilityLevel": "NONE"})
    state.apply(config_key("s"), None)  # a tombstone removes the subject's level
    state.apply({"keytype": "NOOP", "magic": 0}, None)
    assert sorted(state.subjects) == ["s", "t"] and state.next_id == 5
    assert state.global_compatibility == "FULL" and state.subject_compatibility == {}
    assert state.ids_by_canonical[canonical_text(schema)] == 4
    state.apply(schema_key("t", 1), None)
    assert sorted(state.subjects) == ["s"]


def test_an_unparsable_schema_is_named_with_what_is_wrong_before_the_registry_words_it() -> None:
    with pytest.raises(InvalidAvroSchema) as raised:
        parse_avro_schema('{"type": "record", "name": "R"}')
    assert raised.value.schema_text == '{"type": "record", "name": "R"}'
    assert "fields" in raised.value.problem
