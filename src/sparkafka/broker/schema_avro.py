"""Avro schemas as Confluent's Schema Registry judges them: parsed and validated (AvroSchema), put in
canonical form, and checked for compatibility between a reader and a writer at each level
(AvroCompatibilityChecker: BACKWARD, FORWARD, FULL, their transitive forms, NONE)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fastavro


@dataclass(frozen=True)
class ParsedAvro:
    """A schema as fastavro parsed it, with the named types it defines (full name -> definition)."""

    schema: Any
    named: dict[str, Any]


class InvalidAvroSchema(ValueError):
    """An Avro schema that does not parse: the text given, and what is wrong with it."""

    def __init__(self, schema_text: str, problem: str) -> None:
        super().__init__(f"{problem} (in {schema_text})")
        self.schema_text = schema_text
        self.problem = problem


def parse_avro_schema(schema_text: str) -> ParsedAvro:
    """Parse and validate an Avro schema; :class:`InvalidAvroSchema` names what is wrong."""
    try:
        document = json.loads(schema_text)
    except json.JSONDecodeError:
        # A bare primitive name ("string") is valid Avro text that is not JSON.
        document = schema_text.strip()
    named: dict[str, Any] = {}
    problem = _missing_attribute(document)
    if problem is None:
        try:
            parsed = fastavro.parse_schema(document, named, _write_hint=False)
        except Exception as error:  # fastavro raises several unrelated types for bad schemas
            problem = f"{type(error).__name__}: {error}"
    if problem is not None:
        raise InvalidAvroSchema(schema_text, problem)
    return ParsedAvro(parsed, named)


_REQUIRED_ATTRIBUTES = {"record": "fields", "error": "fields", "enum": "symbols", "fixed": "size"}


def _missing_attribute(document: Any) -> str | None:
    """What Avro requires and fastavro lets pass (a record without "fields") or reports only as a
    KeyError: the first complex type lacking its required attribute."""
    if isinstance(document, list):
        return next((p for p in map(_missing_attribute, document) if p is not None), None)
    if not isinstance(document, dict):
        return None
    kind = document.get("type")
    required = _REQUIRED_ATTRIBUTES.get(kind) if isinstance(kind, str) else None
    if kind == "array":
        required = "items"
    elif kind == "map":
        required = "values"
    if required is not None and required not in document:
        return f"an Avro {kind} needs the attribute {required!r}"
    children: list[Any] = [kind] if isinstance(kind, dict | list) else []
    children += [document.get("items"), document.get("values")]
    children += [f.get("type") for f in document.get("fields") or [] if isinstance(f, dict)]
    return next((p for p in map(_missing_attribute, children) if p is not None), None)


def canonical_text(schema_text: str) -> str:
    """The form two registrations are compared in: the JSON with whitespace removed and keys sorted
    (a stand-in for Confluent's canonical string; docs and defaults still count, as in Confluent's)."""
    try:
        return json.dumps(json.loads(schema_text), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError:
        return json.dumps(schema_text.strip())


_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED_TYPES = ("record", "enum", "fixed")


def _resolve(schema: Any, named: dict[str, Any]) -> Any:
    """A named reference becomes its definition; ``{"type": "int", ...}`` becomes ``"int"`` (logical
    types do not take part in Avro schema resolution, as in Avro's own compatibility checker)."""
    if isinstance(schema, str):
        return named.get(schema, schema)
    if isinstance(schema, dict) and isinstance(schema.get("type"), str):
        kind = schema["type"]
        if kind not in (*_NAMED_TYPES, "array", "map"):
            return _resolve(kind, named)
    return schema


def _type_name(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


def reader_incompatibilities(reader: ParsedAvro, writer: ParsedAvro) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (Avro schema resolution rules),
    empty when it can. Each message names the path in the reader schema."""
    problems: list[str] = []
    _check(reader.schema, writer.schema, reader.named, writer.named, "", problems, set())
    return problems


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    def short(name: str) -> str:
        return name.rpartition(".")[2]

    aliases = {short(alias) for alias in reader.get("aliases", [])}
    return short(reader["name"]) == short(writer["name"]) or short(writer["name"]) in aliases


def _check(
    reader_schema: Any,
    writer_schema: Any,
    reader_named: dict[str, Any],
    writer_named: dict[str, Any],
    path: str,
    problems: list[str],
    in_progress: set[tuple[str, str]],
) -> None:
    reader = _resolve(reader_schema, reader_named)
    writer = _resolve(writer_schema, writer_named)
    where = path or "/"
    if isinstance(writer, list):
        # Every branch the writer may have used must be readable.
        for index, branch in enumerate(writer):
            _check(reader, branch, reader_named, writer_named, path, problems, in_progress)
            if problems and index < len(writer) - 1:
                break
        return
    if isinstance(reader, list):
        for branch in reader:
            attempt: list[str] = []
            _check(branch, writer, reader_named, writer_named, path, attempt, in_progress)
            if not attempt:
                return
        problems.append(
            f"TYPE_MISMATCH at {where}: the reader's union has no branch that reads the writer's "
            f"{_type_name(writer)}"
        )
        return
    reader_kind, writer_kind = _type_name(reader), _type_name(writer)
    if reader_kind != writer_kind:
        if reader_kind not in _PROMOTIONS.get(writer_kind, set()):
            problems.append(
                f"TYPE_MISMATCH at {where}: reader type {reader_kind} cannot read writer type {writer_kind}"
            )
        return
    if reader_kind in _NAMED_TYPES and not _names_match(reader, writer):
        problems.append(f"NAME_MISMATCH at {where}: reader {reader['name']} vs writer {writer['name']}")
        return
    if reader_kind == "record":
        pair = (reader["name"], writer["name"])
        if pair in in_progress:  # a recursive type already being compared further up
            return
        in_progress.add(pair)
        writer_fields = {f["name"]: f for f in writer["fields"]}
        for reader_field in reader["fields"]:
            names = [reader_field["name"], *reader_field.get("aliases", [])]
            match = next((writer_fields[n] for n in names if n in writer_fields), None)
            field_path = f"{path}/{reader_field['name']}"
            if match is not None:
                _check(
                    reader_field["type"],
                    match["type"],
                    reader_named,
                    writer_named,
                    field_path,
                    problems,
                    in_progress,
                )
            elif "default" not in reader_field:
                problems.append(
                    f"READER_FIELD_MISSING_DEFAULT_VALUE at {field_path}: field '{reader_field['name']}' "
                    "is missing in the writer schema and has no default"
                )
        in_progress.discard(pair)
    elif reader_kind == "enum":
        missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
        if missing and "default" not in reader:
            problems.append(f"MISSING_ENUM_SYMBOLS at {where}: the reader lacks symbols {missing}")
    elif reader_kind == "fixed":
        if reader["size"] != writer["size"]:
            problems.append(f"FIXED_SIZE_MISMATCH at {where}: size {reader['size']} vs {writer['size']}")
    elif reader_kind == "array":
        _check(
            reader["items"],
            writer["items"],
            reader_named,
            writer_named,
            f"{path}/items",
            problems,
            in_progress,
        )
    elif reader_kind == "map":
        _check(
            reader["values"],
            writer["values"],
            reader_named,
            writer_named,
            f"{path}/values",
            problems,
            in_progress,
        )


def compatibility_problems(
    level: str, candidate: ParsedAvro, existing: list[tuple[int, ParsedAvro]], *, transitive_ok: bool = True
) -> list[str]:
    """Problems of registering ``candidate`` after ``existing`` (version, schema), oldest first.

    BACKWARD: the candidate reads data of the latest version; FORWARD: the latest version reads the
    candidate's data; FULL: both. ``*_TRANSITIVE`` checks every version instead of the latest only."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") and transitive_ok else existing[-1:]
    problems = []
    for version, old in against:
        if level.startswith(("BACKWARD", "FULL")):
            problems += [
                f"{p} (the new schema cannot read data written with version {version})"
                for p in reader_incompatibilities(candidate, old)
            ]
        if level.startswith(("FORWARD", "FULL")):
            problems += [
                f"{p} (version {version} cannot read data written with the new schema)"
                for p in reader_incompatibilities(old, candidate)
            ]
    return problems
