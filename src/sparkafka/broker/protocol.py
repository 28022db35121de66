"""Kafka wire framing and the request/response codec, built on kafka-python's schema classes.

Every request on the wire is ``int32 size`` followed by a request header (api key, api version,
correlation id, client id, and tagged fields for flexible versions) and the body. kafka-python 3
generates one message class per API from Kafka's own JSON message definitions; this module maps
api keys to those classes and records which versions the broker actually implements — only those
are advertised by ApiVersions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import kafka.protocol.sasl
from kafka.protocol.api_message import ApiMessage

# Make sure every message module is imported before the registry is built.
_MESSAGE_MODULES = (
    kafka.protocol.admin,
    kafka.protocol.consumer,
    kafka.protocol.metadata,
    kafka.protocol.producer,
    kafka.protocol.sasl,
)


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


# The versions this broker implements. Lower bounds are Kafka 4's (KIP-896 removed the versions
# below them; JoinGroup v0-1 came back in 4.0.1). Upper bounds stop short of versions that need
# features a single-node broker does not have (topic ids in Fetch v13+/Produce v13, KIP-890 part 2
# epoch bumps in EndTxn v5, broker-to-broker batching in AddPartitionsToTxn v4+).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 9),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 11),
    ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    # Kafka 4 dropped v0-1 (KIP-896).
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
}

# Where ApiVersions lists a lower minimum than the broker accepts. Kafka 4 lists Produce from v0
# although it refuses v0-2 (ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION): a bug in librdkafka
# (KAFKA-18659) needs v0 in the list.
ADVERTISED_MIN_VERSIONS: dict[ApiKey, int] = {ApiKey.PRODUCE: 0}


def advertised_versions() -> list[tuple[ApiKey, tuple[int, int]]]:
    """What ApiVersions lists, by api key: the supported span, its minimum as Kafka lists it."""
    return [
        (key, (ADVERTISED_MIN_VERSIONS.get(key, low), high))
        for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
    ]


def _all_subclasses(cls: Any) -> list[Any]:
    found: list[Any] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def _build_registry() -> tuple[dict[int, Any], dict[int, Any]]:
    requests: dict[int, Any] = {}
    responses: dict[int, Any] = {}
    for cls in _all_subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        target = requests if cls.type == "request" else responses
        target[cls.API_KEY] = cls
    return requests, responses


REQUEST_CLASSES, RESPONSE_CLASSES = _build_registry()
for _key in SUPPORTED_VERSIONS:
    assert _key in REQUEST_CLASSES and _key in RESPONSE_CLASSES, f"kafka-python lacks a schema for {_key!r}"


class MalformedRequest(Exception):
    """A frame that cannot be decoded; the connection that sent it is closed, as Kafka does."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_header(frame: bytes | bytearray) -> RequestHeader:
    """Read the fixed, version-independent start of a request header (api key, version, correlation id,
    client id). Enough to answer or reject a request whose body cannot be decoded."""
    if len(frame) < 10:
        raise MalformedRequest(f"request frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_id_len = struct.unpack_from(">hhih", frame, 0)
    if client_id_len < -1 or 10 + max(client_id_len, 0) > len(frame):
        raise MalformedRequest(f"request header has an invalid client id length {client_id_len}")
    client_id = None if client_id_len < 0 else frame[10 : 10 + client_id_len].decode("utf-8", "replace")
    return RequestHeader(api_key, api_version, correlation_id, client_id)


# ApiVersions is flexible from v3: as Kafka's ApiMessageType.requestHeaderVersion, a request of v3 or
# any later version (one this broker does not know included) has a v2 header, with tagged fields.
API_VERSIONS_FIRST_FLEXIBLE = 3


def check_header_tagged_fields(frame: bytes | bytearray) -> None:
    """Raise MalformedRequest unless a v2 header's tagged-field section follows the client id: count,
    then tag, size and bytes of each field, all within the frame, as Kafka's RequestHeaderData reads
    them (it closes the connection of a header it cannot read)."""
    pos = 10 + max(struct.unpack_from(">h", frame, 8)[0], 0)

    def uvarint() -> int:
        nonlocal pos
        result = 0
        for shift in range(0, 35, 7):
            if pos >= len(frame):
                raise MalformedRequest("request header ends before its tagged fields")
            byte = frame[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
        raise MalformedRequest("request header has a varint longer than 5 bytes")

    for _ in range(uvarint()):
        uvarint()  # tag
        pos += uvarint()
        if pos > len(frame):
            raise MalformedRequest("request header has a tagged field past the frame's end")


def is_supported(api_key: int, api_version: int) -> bool:
    bounds = SUPPORTED_VERSIONS.get(api_key)  # type: ignore[call-overload]
    return bounds is not None and bounds[0] <= api_version <= bounds[1]


def decode_request(header: RequestHeader, frame: bytes | bytearray) -> Any:
    """Decode a whole request frame (header included) with the schema of its api key and version.

    Steps: decode with kafka-python's class for the api key; then refuse a null in any field the
    version's schema does not declare nullable (kafka-python decodes a null string, bytes or array
    wherever it finds one, while Kafka's generated readers fail the parse, so no handler ever sees a
    null name, id or list that Kafka would not let through)."""
    request_class = REQUEST_CLASSES[header.api_key]
    try:
        request = request_class.decode(frame, version=header.api_version, header=True)
    except Exception as exc:  # the codec raises assorted errors on garbage input
        raise MalformedRequest(
            f"cannot decode {request_class.__name__} v{header.api_version}: {type(exc).__name__}: {exc}"
        ) from exc
    null_field = _null_in_non_nullable_field(request_class._struct, request, header.api_version)
    if null_field is not None:
        raise MalformedRequest(
            f"cannot decode {request_class.__name__} v{header.api_version}: non-nullable field "
            f"{null_field} was serialized as null"
        )
    return request


_NULLABLE_TYPES = frozenset({"string", "bytes", "records"})


@dataclass(frozen=True, slots=True)
class _NullCheck:
    """What to look at in one field of a struct, for one version."""

    name: str  # Kafka's field name, for the error message
    attribute: str  # kafka-python's attribute
    null_refused: bool
    inner: tuple[_NullCheck, ...]  # the checks of the struct (or of each struct in the array) it holds
    # An array of strings or bytes: Kafka's generated readers refuse a null element in any version.
    null_elements_refused: bool = False


_NULL_CHECKS: dict[tuple[int, int], tuple[_NullCheck, ...]] = {}


def _null_checks(schema: Any, version: int) -> tuple[_NullCheck, ...]:
    """The fields of ``schema`` in ``version`` that may not be null or that hold such fields,
    computed once per struct and version. Tagged fields are left out: absent means their default.
    Only strings, bytes, records, arrays and structs have a null on the wire (kafka-python also
    decodes a zero uuid as None)."""
    key = (id(schema), version)
    checks = _NULL_CHECKS.get(key)
    if checks is None:
        found = []
        for field in schema.fields.values():
            if not field.for_version_q(version) or field.tagged_field_q(version):
                continue
            can_be_null = field.type_str in _NULLABLE_TYPES or field.type_str.startswith("[]") or field.fields
            null_refused = bool(can_be_null) and not field.nullable_for_version_q(version)
            inner = _null_checks(field, version) if field.fields is not None else ()
            null_elements_refused = field.type_str.removeprefix("[]") in _NULLABLE_TYPES and (
                field.type_str.startswith("[]")
            )
            if null_refused or inner or null_elements_refused:
                found.append(_NullCheck(field._name, field.name, null_refused, inner, null_elements_refused))
        checks = _NULL_CHECKS[key] = tuple(found)
    return checks


def _null_in_non_nullable_field(schema: Any, data: Any, version: int) -> str | None:
    """The dotted name of the first field of ``data`` that is null although ``schema`` does not
    allow null in ``version``, else None."""
    return _first_refused_null(_null_checks(schema, version), data)


def _first_refused_null(checks: tuple[_NullCheck, ...], data: Any) -> str | None:
    for check in checks:
        value = getattr(data, check.attribute, None)
        if value is None:
            if check.null_refused:
                return check.name
            continue
        if check.null_elements_refused and any(item is None for item in value):
            return f"{check.name} element"
        if check.inner:
            for item in value if isinstance(value, list) else (value,):
                inner = _first_refused_null(check.inner, item)
                if inner is not None:
                    return f"{check.name}.{inner}"
    return None


def response_class(api_key: int) -> Any:
    return RESPONSE_CLASSES[api_key]


def encode_response(response: Any, version: int, correlation_id: int) -> bytes:
    """Frame a response: size, response header (flexible where the API's version is), body."""
    response.API_VERSION = version
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))
