"""A Confluent-compatible Schema Registry for the embedded broker (``sparkafka broker --schema-registry``).

It serves the subset of Confluent's REST API (v1) that serializers, deserializers and
``confluent_kafka.schema_registry.SchemaRegistryClient`` use, for Avro schemas:

    POST   /subjects/{subject}/versions                  register; answers {"id": ...}
    POST   /subjects/{subject}                           look a schema up under a subject
    GET    /subjects                                     subject names
    GET    /subjects/{subject}/versions                  version numbers
    GET    /subjects/{subject}/versions/{version|latest} one version
    GET    /schemas/ids/{id}                             a schema by id (plus .../versions, .../subjects)
    GET    /schemas/types                                ["AVRO"]
    POST   /compatibility/subjects/{subject}/versions[/{version|latest}]
    GET|PUT /config, GET|PUT|DELETE /config/{subject}    compatibility level

Errors have Confluent's shape ``{"error_code": N, "message": "..."}`` and codes: 40401 subject not
found, 40402 version not found, 40403 schema not found, 40408 no subject-level config, 409
incompatible schema, 42201 invalid schema, 42202 invalid version, 42203 invalid compatibility level,
50001 the store (Kafka) failed.

Storage, as Confluent's registry does it: every change is a record of the compacted topic
``_schemas`` on the broker itself, written through a Kafka client to the broker's own listener
before the change is applied in memory and answered; at start the whole topic is read back to
rebuild the in-memory state, so schemas, ids and configs survive restarts (and SIGKILL: a record
is acknowledged only once it is in the log). Keys and values are Confluent's JSON formats —
``{"keytype":"SCHEMA","subject":s,"version":v,"magic":1}`` -> ``{"subject","version","id","schema",
"deleted"}`` and ``{"keytype":"CONFIG","subject":s|null,"magic":0}`` -> ``{"compatibilityLevel"}``
(a null value deletes a subject's config) — so the topic reads like a real registry's.

With SASL users on the broker, every request needs HTTP Basic credentials of one of them, as
Confluent's registry asks with ``authentication.method=BASIC``: without, or with wrong ones, the
answer is 401 with ``WWW-Authenticate: Basic`` and ``{"error_code": 401, "message": "Unauthorized"}``.
Request bodies need a Content-Length of at most MAX_REQUEST_BODY_BYTES (else 400, 411 or 413 from the
head alone), and at most MAX_CONNECTIONS connections are served at once (one more is answered 503).

One registry process writes the topic (the embedded broker is a single node), so ids are allocated
under a lock in memory; there is no leader election. Schema references, soft or hard deletes and
JSON/Protobuf schemas are not supported. Independent of Spark: only fastavro and confluent-kafka.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.broker.config import SaslUser
from sparkafka.broker.sasl import credentials_match
from sparkafka.broker.schema_avro import (
    InvalidAvroSchema,
    ParsedAvro,
    canonical_text,
    compatibility_problems,
    parse_avro_schema,
)
from sparkafka.broker.schema_errors import (
    INCOMPATIBLE_SCHEMA,
    INVALID_COMPATIBILITY_LEVEL,
    INVALID_SCHEMA,
    INVALID_VERSION,
    SCHEMA_NOT_FOUND,
    STORE_ERROR,
    SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
    VERSION_NOT_FOUND,
    RegistryError,
    subject_not_found,
)

log = logging.getLogger(__name__)

SCHEMAS_TOPIC = "_schemas"
READY_LINE = "sparkafka schema registry ready on {url}"
DEFAULT_COMPATIBILITY = "BACKWARD"
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# Larger bodies are refused (413) before they are read: a schema has to fit in one record of
# _schemas (message.max.bytes, 1 MiB by default), so nothing larger could be stored anyway.
MAX_REQUEST_BODY_BYTES = 4 * 1024 * 1024
# Connections served at once, a thread each; one more is answered 503 and closed rather than given
# a thread, so many connections cannot exhaust the process.
MAX_CONNECTIONS = 64
# A connection that sends nothing for this long is closed, freeing its place (Jetty's idle timeout,
# which Confluent's registry runs on).
IDLE_TIMEOUT_S = 30.0
REALM = "SchemaRegistry"
_MAX_VERSION = 2**31 - 1


def parse_avro(schema_text: str) -> ParsedAvro:
    """Parse and validate an Avro schema; a RegistryError 42201 names what is wrong."""
    try:
        return parse_avro_schema(schema_text)
    except InvalidAvroSchema as invalid:
        # Confluent's words for it, which clients show as they are.
        message = f"Invalid schema {invalid.schema_text}, details: {invalid.problem}"
        raise RegistryError(422, INVALID_SCHEMA, message) from None


# -- in-memory state, rebuilt from _schemas ------------------------------------------------------------


@dataclass(frozen=True)
class SchemaVersion:
    subject: str
    version: int
    schema_id: int
    schema: str

    def response(self) -> dict[str, Any]:
        return {"subject": self.subject, "version": self.version, "id": self.schema_id, "schema": self.schema}


@dataclass
class RegistryState:
    """Everything the registry knows; changed only by applying ``_schemas`` records, so that the
    live state and the state rebuilt at start are the same function of the topic."""

    subjects: dict[str, dict[int, SchemaVersion]] = field(default_factory=dict)
    schemas_by_id: dict[int, str] = field(default_factory=dict)
    ids_by_canonical: dict[str, int] = field(default_factory=dict)
    global_compatibility: str = DEFAULT_COMPATIBILITY
    subject_compatibility: dict[str, str] = field(default_factory=dict)

    @property
    def next_id(self) -> int:
        return max(self.schemas_by_id, default=0) + 1

    def apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        keytype = key.get("keytype")
        if keytype == "SCHEMA":
            subject, version = str(key["subject"]), int(key["version"])
            versions = self.subjects.setdefault(subject, {})
            if value is None or value.get("deleted"):
                versions.pop(version, None)
                if not versions:
                    del self.subjects[subject]
                return
            schema_id = int(value["id"])
            schema = str(value["schema"])
            versions[version] = SchemaVersion(subject, version, schema_id, schema)
            self.schemas_by_id[schema_id] = schema
            self.ids_by_canonical.setdefault(canonical_text(schema), schema_id)
        elif keytype == "CONFIG":
            config_subject: str | None = key.get("subject")
            level = None if value is None else value.get("compatibilityLevel")
            if config_subject is None:
                self.global_compatibility = level or DEFAULT_COMPATIBILITY
            elif level is None:
                self.subject_compatibility.pop(config_subject, None)
            else:
                self.subject_compatibility[config_subject] = level
        # Other key types of Confluent's registry (NOOP, MODE, DELETE_SUBJECT ...) carry nothing we use.


def schema_key(subject: str, version: int) -> dict[str, Any]:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}


def config_key(subject: str | None) -> dict[str, Any]:
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


# -- the Kafka-backed store ----------------------------------------------------------------------------


class KafkaSchemaStore:
    """Reads and appends ``_schemas`` through Kafka clients connected to the broker's own listener."""

    def __init__(
        self, client_config: dict[str, Any], topic: str = SCHEMAS_TOPIC, timeout_s: float = 30.0
    ) -> None:
        self.client_config = dict(client_config)
        self.topic = topic
        self.timeout_s = timeout_s
        self._producer: Producer | None = None

    def ensure_topic(self) -> None:
        admin = AdminClient(self.client_config)
        metadata = admin.list_topics(timeout=self.timeout_s)
        if self.topic in metadata.topics and metadata.topics[self.topic].error is None:
            return
        new_topic = NewTopic(self.topic, 1, -1, config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([new_topic], operation_timeout=self.timeout_s)[self.topic].result(
                self.timeout_s
            )
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def read_all(self) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Every (key, value) of the topic from its start to the end offset seen now, in order."""
        consumer = Consumer(
            {
                **self.client_config,
                "group.id": "sparkafka-schema-registry",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        partition = TopicPartition(self.topic, 0)
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=self.timeout_s)
            if high <= low:
                return
            consumer.assign([TopicPartition(self.topic, 0, low)])
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None:
                    failure = message.error()
                    if failure is None:
                        raw_value = message.value()
                        yield (
                            json.loads(message.key() or b"{}"),
                            json.loads(raw_value) if raw_value is not None else None,
                        )
                    elif failure.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(failure)
                if consumer.position([partition])[0].offset >= high:
                    return
            raise TimeoutError(
                f"reading {self.topic} up to offset {high} took longer than {self.timeout_s:.0f} s"
            )
        finally:
            consumer.close()

    def append(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """Write one record and return once the broker acknowledged it (acks=all)."""
        if self._producer is None:
            self._producer = Producer(
                {**self.client_config, "acks": "all", "enable.idempotence": True, "linger.ms": 0}
            )
        outcome: list[KafkaError | None] = []
        self._producer.produce(
            self.topic,
            key=_encode(key),
            value=None if value is None else _encode(value),
            partition=0,
            on_delivery=lambda error, _message: outcome.append(error),
        )
        self._producer.flush(self.timeout_s)
        if not outcome:
            raise RegistryError(
                500,
                STORE_ERROR,
                f"writing to {self.topic} was not acknowledged within {self.timeout_s:.0f} s",
            )
        if outcome[0] is not None:
            raise RegistryError(500, STORE_ERROR, f"writing to {self.topic} failed: {outcome[0]}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None


# -- the registry's operations (no HTTP) ---------------------------------------------------------------


def _parse_version(text: str) -> int | None:
    """``latest`` (or -1) -> None; else a version number in Confluent's allowed range."""
    if text in ("latest", "-1"):
        return None
    if text.isdigit() and 1 <= int(text) <= _MAX_VERSION:
        return int(text)
    raise RegistryError(
        422,
        INVALID_VERSION,
        f"The specified version '{text}' is not a valid version id. "
        f'Allowed values are between [1, {_MAX_VERSION}] and the string "latest"',
    )


def _schema_text(body: Any) -> str:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(422, INVALID_SCHEMA, 'Invalid schema: the request body needs a "schema" string')
    schema_type = body.get("schemaType") or "AVRO"
    if schema_type != "AVRO":
        raise RegistryError(
            422,
            INVALID_SCHEMA,
            f"Invalid schema: schemaType {schema_type!r} is not supported by sparkafka's schema registry "
            "(AVRO only)",
        )
    if body.get("references"):
        raise RegistryError(
            422,
            INVALID_SCHEMA,
            "Invalid schema: schema references are not supported by sparkafka's schema registry",
        )
    return body["schema"]


class SchemaRegistry:
    """The REST semantics over a store; thread-safe (one lock around every read and change)."""

    def __init__(self, store: KafkaSchemaStore) -> None:
        self.store = store
        self.state = RegistryState()
        self._lock = threading.Lock()

    def load(self) -> None:
        self.store.ensure_topic()
        state = RegistryState()
        for key, value in self.store.read_all():
            state.apply(key, value)
        with self._lock:
            self.state = state
        log.info(
            "schema registry loaded %d subject(s), %d schema(s) from %s",
            len(state.subjects),
            len(state.schemas_by_id),
            self.store.topic,
        )

    def _write(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """Log first, then apply (under the caller's lock): memory never holds a change the topic
        lacks, so what a client was told survives a crash, and a failed write changes nothing."""
        self.store.append(key, value)
        self.state.apply(key, value)

    def _versions(self, subject: str) -> dict[int, SchemaVersion]:
        versions = self.state.subjects.get(subject)
        if not versions:
            raise subject_not_found(subject)
        return versions

    def _version(self, subject: str, version_text: str) -> SchemaVersion:
        version = _parse_version(version_text)
        versions = self._versions(subject)
        number = max(versions) if version is None else version
        if number not in versions:
            raise RegistryError(404, VERSION_NOT_FOUND, f"Version {version_text} not found.")
        return versions[number]

    def compatibility_level(self, subject: str | None) -> str:
        if subject is not None and subject in self.state.subject_compatibility:
            return self.state.subject_compatibility[subject]
        return self.state.global_compatibility

    # -- subjects and schemas

    def register(self, subject: str, body: Any) -> dict[str, Any]:
        text = _schema_text(body)
        candidate = parse_avro(text)
        canonical = canonical_text(text)
        with self._lock:
            versions = self.state.subjects.get(subject, {})
            for existing in versions.values():
                if canonical_text(existing.schema) == canonical:
                    return {"id": existing.schema_id, "version": existing.version}
            history = [
                (v.version, parse_avro(v.schema)) for v in sorted(versions.values(), key=lambda v: v.version)
            ]
            problems = compatibility_problems(self.compatibility_level(subject), candidate, history)
            if problems:
                raise RegistryError(
                    409,
                    INCOMPATIBLE_SCHEMA,
                    f"Schema being registered is incompatible with an earlier schema for subject "
                    f'"{subject}", details: {problems}',
                )
            schema_id = self.state.ids_by_canonical.get(canonical, self.state.next_id)
            version = max(versions, default=0) + 1
            stored = (
                json.dumps(json.loads(text), separators=(",", ":"))
                if text.strip().startswith(("{", "["))
                else text
            )
            self._write(
                schema_key(subject, version),
                {"subject": subject, "version": version, "id": schema_id, "schema": stored, "deleted": False},
            )
            log.info("registered %s version %d as schema id %d", subject, version, schema_id)
            return {"id": schema_id, "version": version}

    def lookup(self, subject: str, body: Any) -> dict[str, Any]:
        text = _schema_text(body)
        parse_avro(text)
        canonical = canonical_text(text)
        with self._lock:
            for existing in self._versions(subject).values():
                if canonical_text(existing.schema) == canonical:
                    return existing.response()
        raise RegistryError(404, SCHEMA_NOT_FOUND, "Schema not found")

    def subjects(self) -> list[str]:
        with self._lock:
            return sorted(self.state.subjects)

    def versions(self, subject: str) -> list[int]:
        with self._lock:
            return sorted(self._versions(subject))

    def version(self, subject: str, version_text: str) -> dict[str, Any]:
        with self._lock:
            return self._version(subject, version_text).response()

    def schema_by_id(self, schema_id_text: str) -> dict[str, Any]:
        with self._lock:
            schema_id = int(schema_id_text) if schema_id_text.isdigit() else -1
            if schema_id not in self.state.schemas_by_id:
                raise RegistryError(404, SCHEMA_NOT_FOUND, f"Schema {schema_id_text} not found")
            return {"schema": self.state.schemas_by_id[schema_id]}

    def schema_versions(self, schema_id_text: str) -> list[dict[str, Any]]:
        self.schema_by_id(schema_id_text)
        with self._lock:
            return [
                {"subject": v.subject, "version": v.version}
                for subject in sorted(self.state.subjects)
                for v in sorted(self.state.subjects[subject].values(), key=lambda v: v.version)
                if v.schema_id == int(schema_id_text)
            ]

    # -- compatibility

    def check_compatibility(self, subject: str, version_text: str | None, body: Any) -> dict[str, Any]:
        """Against one version (``version_text``), or against what the level requires (None)."""
        candidate = parse_avro(_schema_text(body))
        with self._lock:
            level = self.compatibility_level(subject)
            versions = self.state.subjects.get(subject)
            if not versions:
                if version_text is None or _parse_version(version_text) is None:
                    return {"is_compatible": True}  # nothing to be incompatible with, as Confluent's
                raise subject_not_found(subject)
            if version_text is None:
                history = [
                    (v.version, parse_avro(v.schema))
                    for v in sorted(versions.values(), key=lambda v: v.version)
                ]
                problems = compatibility_problems(level, candidate, history)
            else:
                target = self._version(subject, version_text)
                problems = compatibility_problems(
                    level, candidate, [(target.version, parse_avro(target.schema))]
                )
        answer: dict[str, Any] = {"is_compatible": not problems}
        if problems:
            answer["messages"] = problems
        return answer

    def get_config(self, subject: str | None, default_to_global: bool) -> dict[str, Any]:
        with self._lock:
            if subject is None or subject in self.state.subject_compatibility or default_to_global:
                return {"compatibilityLevel": self.compatibility_level(subject)}
        raise RegistryError(
            404,
            SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
            f"Subject '{subject}' does not have subject-level compatibility configured",
        )

    def put_config(self, subject: str | None, body: Any) -> dict[str, Any]:
        level = body.get("compatibility") if isinstance(body, dict) else None
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise RegistryError(
                422,
                INVALID_COMPATIBILITY_LEVEL,
                f"Invalid compatibility level {level!r}. Valid values are {', '.join(COMPATIBILITY_LEVELS)}",
            )
        with self._lock:
            self._write(config_key(subject), {"compatibilityLevel": level.upper()})
        return {"compatibility": level.upper()}

    def delete_config(self, subject: str) -> dict[str, Any]:
        with self._lock:
            previous = self.compatibility_level(subject)
            self._write(config_key(subject), None)
        return {"compatibilityLevel": previous}


# -- HTTP ----------------------------------------------------------------------------------------------

Route = tuple[str, re.Pattern[str], Callable[["SchemaRegistry", list[str], dict[str, list[str]], Any], Any]]


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() == "true"


_ROUTES: list[Route] = [
    ("GET", re.compile(r"subjects"), lambda r, p, q, b: r.subjects()),
    ("GET", re.compile(r"subjects/([^/]+)/versions"), lambda r, p, q, b: r.versions(p[0])),
    ("GET", re.compile(r"subjects/([^/]+)/versions/([^/]+)"), lambda r, p, q, b: r.version(p[0], p[1])),
    ("POST", re.compile(r"subjects/([^/]+)/versions"), lambda r, p, q, b: r.register(p[0], b)),
    ("POST", re.compile(r"subjects/([^/]+)"), lambda r, p, q, b: r.lookup(p[0], b)),
    ("GET", re.compile(r"schemas/types"), lambda r, p, q, b: ["AVRO"]),
    ("GET", re.compile(r"schemas/ids/([^/]+)"), lambda r, p, q, b: r.schema_by_id(p[0])),
    ("GET", re.compile(r"schemas/ids/([^/]+)/versions"), lambda r, p, q, b: r.schema_versions(p[0])),
    (
        "GET",
        re.compile(r"schemas/ids/([^/]+)/subjects"),
        lambda r, p, q, b: sorted({v["subject"] for v in r.schema_versions(p[0])}),
    ),
    (
        "POST",
        re.compile(r"compatibility/subjects/([^/]+)/versions/([^/]+)"),
        lambda r, p, q, b: r.check_compatibility(p[0], p[1], b),
    ),
    (
        "POST",
        re.compile(r"compatibility/subjects/([^/]+)/versions"),
        lambda r, p, q, b: r.check_compatibility(p[0], None, b),
    ),
    ("GET", re.compile(r"config"), lambda r, p, q, b: r.get_config(None, True)),
    ("PUT", re.compile(r"config"), lambda r, p, q, b: r.put_config(None, b)),
    (
        "GET",
        re.compile(r"config/([^/]+)"),
        lambda r, p, q, b: r.get_config(p[0], _flag(q, "defaultToGlobal")),
    ),
    ("PUT", re.compile(r"config/([^/]+)"), lambda r, p, q, b: r.put_config(p[0], b)),
    ("DELETE", re.compile(r"config/([^/]+)"), lambda r, p, q, b: r.delete_config(p[0])),
]


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so clients (httpx) keep their connection; every answer has a Content-Length.
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    server: _RegistryHTTPServer

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        length = self._body_length()
        if length is None or not self._authorized(length):
            return
        raw_body = self.rfile.read(length) if length else b""
        if len(raw_body) < length:  # the client went away mid-body
            self.close_connection = True
            return
        # Split before unquoting: subjects may contain an encoded '/' (%2F).
        path = url.path.strip("/")
        try:
            body = json.loads(raw_body) if raw_body else None
        except json.JSONDecodeError:
            self._send(400, {"error_code": 400, "message": "The request body is not valid JSON"})
            return
        try:
            self._send(200, self._dispatch(method, path, parse_qs(url.query), body))
        except RegistryError as error:
            self._send(error.status, {"error_code": error.error_code, "message": error.message})
        except Exception as error:  # answer rather than drop the connection; the log has the traceback
            log.exception("schema registry: %s %s failed", method, self.path)
            self._send(500, {"error_code": 50001, "message": f"Error in the backend data store: {error}"})

    def _dispatch(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        path_exists = False
        for route_method, pattern, action in _ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            path_exists = True
            if route_method == method:
                return action(self.server.registry, [unquote(g) for g in match.groups()], query, body)
        if path_exists:
            raise RegistryError(405, 405, f"HTTP {method} is not supported on /{path}")
        raise RegistryError(404, 404, f"HTTP 404 Not Found: /{path}")

    def _body_length(self) -> int | None:
        """The announced body's length, or None once a request whose body cannot be bounded is answered
        (and its connection closed: what follows its head cannot be told from the next request)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._refuse(411, "Length Required: send the request body with a Content-Length")
            return None
        values = {value.strip() for value in self.headers.get_all("Content-Length") or ()}
        if not values:
            return 0  # HTTP/1.1: a request without Content-Length or Transfer-Encoding has no body
        if len(values) > 1 or re.fullmatch(r"[0-9]+", next(iter(values))) is None:
            self._refuse(400, f"Invalid Content-Length: {', '.join(sorted(values))[:100]}")
            return None
        length = int(values.pop())
        if length > MAX_REQUEST_BODY_BYTES:
            self._refuse(413, f"Request body of {length} bytes is larger than {MAX_REQUEST_BODY_BYTES} bytes")
            return None
        return length

    def _authorized(self, body_length: int) -> bool:
        """Whether the request's HTTP Basic credentials are a SASL user's (always, without SASL users);
        otherwise answers 401 as Confluent's registry does with basic authentication."""
        users = self.server.users
        if not users:
            return True
        scheme, _, encoded = self.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(encoded.strip(), validate=True).decode()
                username, separator, password = decoded.partition(":")
            except ValueError:  # not base64, or not UTF-8
                separator = ""
            if separator and credentials_match(users, username, password):
                return True
        if scheme:
            log.info("schema registry: failed authentication with %s", self.address_string())
            # As the broker does, so guessing passwords over one connection is slow.
            time.sleep(self.server.failed_authentication_delay_s)
        # An unread body would be taken for the next request: close instead of reading it unauthorized.
        self._send(
            401,
            {"error_code": 401, "message": "Unauthorized"},
            headers={"WWW-Authenticate": f'Basic realm="{REALM}"'},
            close=body_length > 0,
        )
        return False

    def _refuse(self, status: int, message: str) -> None:
        self._send(status, {"error_code": status, "message": message}, close=True)

    def _send(
        self, status: int, document: Any, *, headers: dict[str, str] | None = None, close: bool = False
    ) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("schema registry %s: " + format, self.address_string(), *args)


class _RegistryHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Connections beyond MAX_CONNECTIONS are turned away, not left in the kernel's queue.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        registry: SchemaRegistry,
        users: Sequence[SaslUser],
        failed_authentication_delay_s: float,
        max_connections: int,
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.users = list(users)
        self.failed_authentication_delay_s = failed_authentication_delay_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections = max_connections
        self._last_full_warning = float("-inf")

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._turn_away(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _turn_away(self, request: socket.socket, client_address: Any) -> None:
        """Answer 503 on the accepting thread, without a thread of its own, and close."""
        now = time.monotonic()
        if now - self._last_full_warning >= 60:  # once a minute, not once per connection of a flood
            self._last_full_warning = now
            log.warning(
                "schema registry: %d connections are open, the most it serves at once; answering 503 to %s",
                self._max_connections,
                client_address[0] if isinstance(client_address, tuple) else client_address,
            )
        payload = json.dumps(
            {"error_code": 503, "message": f"Too many connections (at most {self._max_connections})"}
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(payload)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\n\r\n"
        )
        try:
            request.settimeout(1.0)
            request.sendall(head.encode() + payload)
            # Read what the request sent so far: closing with unread bytes resets the connection, which
            # can discard the answer before the client reads it.
            request.setblocking(False)
            while request.recv(65536):
                pass
        except OSError:
            pass
        finally:
            self.shutdown_request(request)


class SchemaRegistryServer:
    """The registry over HTTP in a background thread. ``start()`` reads ``_schemas`` (the broker must
    already accept connections on ``client_config['bootstrap.servers']``), then listens.

    With ``users`` (the broker's SASL users) every request needs HTTP Basic credentials of one of them."""

    def __init__(
        self,
        host: str,
        port: int,
        client_config: dict[str, Any],
        *,
        users: Sequence[SaslUser] = (),
        failed_authentication_delay_s: float = 0.1,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.host = host
        self.port = port
        self.users = list(users)
        self.failed_authentication_delay_s = failed_authentication_delay_s
        self.max_connections = max_connections
        self.registry = SchemaRegistry(KafkaSchemaStore(client_config))
        self._server: _RegistryHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SchemaRegistryServer:
        self.registry.load()
        self._server = _RegistryHTTPServer(
            (self.host, self.port),
            self.registry,
            self.users,
            self.failed_authentication_delay_s,
            self.max_connections,
        )
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sparkafka-schema-registry", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.registry.store.close()
