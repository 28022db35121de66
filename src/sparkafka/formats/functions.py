"""Column functions to decode and encode Kafka values — JSON, Avro, and Avro in Confluent's wire format
through a Schema Registry — with an explicit choice of what happens to corrupt records.

    from sparkafka.formats.functions import dead_letter, from_json, route_dead_letters, to_json

    events = spark.readStream.format("sparkafka")...load()   # key, value, topic, partition, offset ...
    orders = events.select("key", from_json("value", "id INT NOT NULL, amount DOUBLE",
                                            on_error=dead_letter("orders-dlq")).alias("order"))
    out = route_dead_letters(orders, "order", topic="orders-clean", value=to_json("order.value"))
    out.writeStream.format("sparkafka").option("deliveryGuarantee", "exactly-once")...start()

Decoders: ``from_json(col, schema)``, ``from_avro(col, schema_json)``,
``from_confluent_avro(col, registry_url, subject=... | reader_schema=...)``. Encoders: ``to_json``,
``to_avro``, ``to_confluent_avro``. Avro runs in fastavro inside Arrow UDFs (no Maven jar, no pandas);
JSON is Spark's own ``from_json``/``to_json`` with corrupt-record detection added.

Corrupt records (``on_error``)
    ``"fail"`` (default)    the query fails with an error naming the record's topic, partition and
                            offset and what is wrong with it.
    ``"null"``              the decoded value is null (the whole struct: never half-decoded rows).
    ``dead_letter(topic)``  the decoder returns ``struct<value, dead_letter>``: ``value`` is the
                            decoded value (null for corrupt records), ``dead_letter`` is null for good
                            records and otherwise ``struct<topic, format, error, source_topic,
                            source_partition, source_offset, raw_value>``. ``route_dead_letters`` turns
                            that into the sink's columns: good rows go to the output topic, corrupt
                            ones — original key and bytes, plus error headers — to the dead-letter
                            topic, in the same exactly-once transaction as the output.

A record is corrupt when its value is not null and cannot be decoded: for JSON, not JSON, not an
object, a field whose value is not of the schema's type, or a field declared NOT NULL (at any
depth: in nested structs, array elements, map values) that is missing or null (Spark's own
``from_json`` returns nulls for all of these); for Avro, a body that ends early, has bytes left
over, or holds invalid data; for Confluent's format also a missing magic
byte or a schema id the registry does not know, or a writer schema the reader schema cannot resolve.
A null value (a tombstone) decodes to null and is not an error. A Schema Registry that does not
answer is not a corrupt record: the task fails (and Spark retries it) rather than dead-lettering
every record.

Where a record came from: ``fail`` and ``dead_letter`` need the record's topic, partition and offset.
Every decoder takes them as keyword arguments ``topic``, ``partition`` and ``offset`` — column names
or Columns — whose defaults are the columns of the ``sparkafka`` (and Spark's Kafka) source, so on a
DataFrame read from Kafka nothing needs to be passed. On other DataFrames pass other columns, or
``None`` to leave that part out of error messages.

Determinism (exactly-once replays re-decode the same records): the decoders are deterministic given
the schemas; Confluent schemas are fetched by immutable id, the reader schema once when the Column is
built. Restart a query to pick up a newer reader schema.
"""

from __future__ import annotations

import datetime
import functools
import io
import json
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, cast

import fastavro
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sparkafka.connector.eventtime import drop_heartbeats, is_heartbeat
from sparkafka.errors import SparkafkaError, SparkafkaOptionError

__all__ = [
    "DEAD_LETTER_TYPE",
    "ERROR_FORMAT_HEADER",
    "ERROR_HEADER",
    "SOURCE_OFFSET_HEADER",
    "SOURCE_PARTITION_HEADER",
    "SOURCE_TOPIC_HEADER",
    "DeadLetter",
    "dead_letter",
    "drop_heartbeats",
    "from_avro",
    "from_confluent_avro",
    "from_json",
    "is_dead_letter",
    "is_heartbeat",
    "route_dead_letters",
    "to_avro",
    "to_confluent_avro",
    "to_json",
]

ColumnOrName = Column | str

# Headers of a dead-letter record (values are UTF-8 text).
ERROR_HEADER = "sparkafka.error"
ERROR_FORMAT_HEADER = "sparkafka.error.format"
SOURCE_TOPIC_HEADER = "sparkafka.source.topic"
SOURCE_PARTITION_HEADER = "sparkafka.source.partition"
SOURCE_OFFSET_HEADER = "sparkafka.source.offset"

# What route_dead_letters writes to the sink's headers column.
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
# The dead_letter field of a decoder's result under on_error=dead_letter(topic).
DEAD_LETTER_TYPE = StructType(
    [
        StructField("topic", StringType()),
        StructField("format", StringType()),
        StructField("error", StringType()),
        StructField("source_topic", StringType()),
        StructField("source_partition", IntegerType()),
        StructField("source_offset", LongType()),
        StructField("raw_value", BinaryType()),
    ]
)
# Confluent's wire format: magic byte 0, 4-byte big-endian schema id, then the Avro body.
CONFLUENT_MAGIC_BYTE = 0
CONFLUENT_HEADER_SIZE = 5
# The field Spark's from_json puts the text of a corrupt record in (PERMISSIVE mode).
_CORRUPT_FIELD = "__sparkafka_corrupt_record"


# -- on_error ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetter:
    """``on_error`` policy: keep corrupt records for a dead-letter topic (see ``route_dead_letters``)."""

    topic: str


def dead_letter(topic: str) -> DeadLetter:
    """``on_error=dead_letter("orders-dlq")``: corrupt records go to ``orders-dlq`` with error headers."""
    if not isinstance(topic, str) or not topic:
        raise SparkafkaOptionError(f"dead_letter() needs a topic name, got {topic!r}")
    return DeadLetter(topic)


OnError = Literal["fail", "null"] | DeadLetter


def _check_on_error(on_error: object) -> OnError:
    if on_error in ("fail", "null") or isinstance(on_error, DeadLetter):
        return on_error
    raise SparkafkaOptionError(f"on_error must be 'fail', 'null' or dead_letter('<topic>'), got {on_error!r}")


@dataclass(frozen=True)
class _SourcePosition:
    topic: Column
    partition: Column
    offset: Column


def _column(col: ColumnOrName) -> Column:
    return F.col(col) if isinstance(col, str) else col


def _position(
    topic: ColumnOrName | None, partition: ColumnOrName | None, offset: ColumnOrName | None
) -> _SourcePosition:
    def typed(value: ColumnOrName | None, spark_type: str) -> Column:
        return F.lit(None).cast(spark_type) if value is None else _column(value).cast(spark_type)

    return _SourcePosition(typed(topic, "string"), typed(partition, "int"), typed(offset, "long"))


def _handle_corrupt(
    on_error: OnError,
    *,
    decoded: Column,
    corrupt: Column,
    reason: Column,
    raw: Column,
    position: _SourcePosition,
    description: str,
    data_format: str,
) -> Column:
    """The decoder's result under ``on_error``: ``corrupt`` says which rows failed, ``reason`` why."""
    if on_error == "null":
        return F.when(corrupt, F.lit(None)).otherwise(decoded)
    if on_error == "fail":
        message = F.format_string(
            "sparkafka: cannot decode the record at topic '%s' partition %s offset %s as "
            + description.replace("%", "%%")
            + ": %s. To keep the query running, choose on_error='null' (corrupt records become null) "
            "or on_error=dead_letter('<topic>') (they go to a dead-letter topic)",
            position.topic,
            position.partition,
            position.offset,
            reason,
        )
        # raise_error runs in the JVM, only for the corrupt rows: the query fails with this message.
        return F.when(corrupt, F.raise_error(message)).otherwise(decoded)
    assert isinstance(on_error, DeadLetter)
    details = F.struct(
        F.lit(on_error.topic).alias("topic"),
        F.lit(data_format).alias("format"),
        reason.alias("error"),
        position.topic.alias("source_topic"),
        position.partition.alias("source_partition"),
        position.offset.alias("source_offset"),
        raw.cast("binary").alias("raw_value"),
    )
    return F.struct(
        F.when(corrupt, F.lit(None)).otherwise(decoded).alias("value"),
        F.when(corrupt, details).alias("dead_letter"),
    )


# -- JSON ----------------------------------------------------------------------------------------------


def _struct_schema(schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    try:
        parsed = DataType.fromDDL(schema)
    except Exception as error:
        raise SparkafkaOptionError(
            f"cannot parse the schema {schema!r} ({error}); give a StructType or DDL such as "
            "'id INT NOT NULL, name STRING' (parsing DDL needs an active SparkSession)"
        ) from None
    if not isinstance(parsed, StructType):
        raise SparkafkaOptionError(f"the JSON schema must be a struct, got {parsed.simpleString()}")
    return parsed


def _json_path(name: str) -> str:
    """A variant path selecting top-level key ``name`` whatever characters it has."""
    return "$[" + json.dumps(name) + "]" if "'" in name else f"$['{name}']"


def from_json(
    col: ColumnOrName,
    schema: StructType | str,
    on_error: OnError = "fail",
    *,
    options: Mapping[str, str] | None = None,
    topic: ColumnOrName | None = "topic",
    partition: ColumnOrName | None = "partition",
    offset: ColumnOrName | None = "offset",
) -> Column:
    """Decode a JSON object (string or binary column) into a struct of ``schema`` (StructType or DDL).

    Fields declared ``NOT NULL``, at any depth, must be present and non-null, else the record is
    corrupt. ``options`` are Spark's JSON options (``timestampFormat``, ``allowComments`` ...),
    except ``mode`` and ``columnNameOfCorruptRecord``, which ``on_error`` replaces."""
    on_error = _check_on_error(on_error)
    struct_schema = _struct_schema(schema)
    json_options = dict(options or {})
    for reserved in ("mode", "columnNameOfCorruptRecord"):
        if any(key.lower() == reserved.lower() for key in json_options):
            raise SparkafkaOptionError(
                f"from_json option '{reserved}' is set by sparkafka; use on_error='fail', 'null' or "
                "dead_letter('<topic>') instead"
            )
    if _CORRUPT_FIELD in struct_schema.fieldNames():
        raise SparkafkaOptionError(f"the schema must not have a field named {_CORRUPT_FIELD}")
    json_options.update({"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT_FIELD})
    raw = _column(col)
    text = raw.cast("string")
    parse_schema = StructType([*struct_schema.fields, StructField(_CORRUPT_FIELD, StringType())])
    parsed = F.from_json(text, parse_schema, json_options)
    required = [f.name for f in struct_schema.fields if not f.nullable]

    corrupt = parsed.isNull() | parsed.getField(_CORRUPT_FIELD).isNotNull()
    for name in required:
        corrupt = corrupt | parsed.getField(name).isNull()
    nested_nulls = [
        (f.name, violation)
        for f in struct_schema.fields
        if (violation := _nested_null_violation(parsed.getField(f.name), f.dataType)) is not None
    ]
    for _name, violation in nested_nulls:
        corrupt = corrupt | violation
    corrupt = text.isNotNull() & corrupt

    # Why, in the order a person would look; evaluated only for corrupt rows (CASE WHEN is lazy).
    variant = F.try_parse_json(text)
    reason = F.coalesce(
        F.when(text.rlike(r"^\s*$"), F.lit("the value is empty")),
        F.when(variant.isNull(), F.lit("the value is not valid JSON")),
        F.when(~text.rlike(r"^\s*\{"), F.lit("the value is JSON but not an object")),
        *[
            F.when(
                F.try_variant_get(variant, _json_path(f.name), "string").isNotNull()
                & parsed.getField(f.name).isNull(),
                F.lit(f"field '{f.name}' does not hold a valid {f.dataType.simpleString()}"),
            )
            for f in struct_schema.fields
        ],
        *[
            F.when(
                parsed.getField(name).isNull(),
                F.lit(f"required field '{name}' (NOT NULL in the schema) is missing or null"),
            )
            for name in required
        ],
        *[
            F.when(
                violation,
                F.lit(f"field '{name}' lacks a value its schema declares NOT NULL, or holds a null there"),
            )
            for name, violation in nested_nulls
        ],
        F.lit("the value does not match the schema"),
    )
    return _handle_corrupt(
        on_error,
        decoded=parsed.dropFields(_CORRUPT_FIELD),
        corrupt=corrupt,
        reason=reason,
        raw=raw,
        position=_position(topic, partition, offset),
        description=f"JSON of schema {struct_schema.simpleString()}",
        data_format="json",
    )


def _nested_null_violation(value: Column, data_type: DataType) -> Column | None:
    """True where a non-null ``value`` holds a null its type forbids inside it: a NOT NULL field of a
    struct, an element of an array or a map value declared not null, at any depth. (Spark's from_json
    makes every type nullable, so nothing else checks it.) None when the type forbids no null."""
    if not _forbids_nulls(data_type):
        return None
    if isinstance(data_type, StructType):
        checks: list[Column] = []
        for field in data_type.fields:
            child = value.getField(field.name)
            if not field.nullable:
                checks.append(child.isNull())
            inner = _nested_null_violation(child, field.dataType)
            if inner is not None:
                checks.append(child.isNotNull() & inner)
        return _any_of(value, checks)
    if isinstance(data_type, ArrayType):
        return _any_element_violates(value, data_type.elementType, data_type.containsNull)
    if isinstance(data_type, MapType):
        return _any_element_violates(F.map_values(value), data_type.valueType, data_type.valueContainsNull)
    return None


def _forbids_nulls(data_type: DataType) -> bool:
    """Whether a value of ``data_type`` may not hold a null somewhere inside."""
    if isinstance(data_type, StructType):
        return any(not f.nullable or _forbids_nulls(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return not data_type.containsNull or _forbids_nulls(data_type.elementType)
    if isinstance(data_type, MapType):
        return not data_type.valueContainsNull or _forbids_nulls(data_type.valueType)
    return False


def _any_element_violates(elements: Column, element_type: DataType, contains_null: bool) -> Column | None:
    if contains_null and not _forbids_nulls(element_type):
        return None

    def violates(element: Column) -> Column:
        inner = _nested_null_violation(element, element_type)
        checks = [] if contains_null else [element.isNull()]
        if inner is not None:
            checks.append(element.isNotNull() & inner)
        return _either(checks)

    return elements.isNotNull() & F.exists(elements, violates)


def _any_of(value: Column, checks: list[Column]) -> Column | None:
    return None if not checks else value.isNotNull() & _either(checks)


def _either(checks: list[Column]) -> Column:
    """True where any check is, false (not null) elsewhere."""
    return F.coalesce(functools.reduce(lambda a, b: a | b, checks), F.lit(False))


def to_json(col: ColumnOrName, options: Mapping[str, str] | None = None) -> Column:
    """Encode a struct, map or array column as JSON text (Spark's ``to_json``), ready for a sink's value."""
    # No options at all rather than an empty map: a Spark Connect client sends an empty dict as a
    # map of no type, which the server refuses (INVALID_OPTIONS.NON_STRING_TYPE).
    return F.to_json(_column(col), dict(options)) if options else F.to_json(_column(col))


# -- Avro schemas as Spark and Arrow types -------------------------------------------------------------


class AvroSchemaError(SparkafkaOptionError):
    """An Avro schema is invalid or has a construct sparkafka cannot map to Spark types."""


def _schema_text(schema: str | Mapping[str, Any] | list[Any]) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


def _parse_avro(schema_text: str) -> tuple[Any, dict[str, Any]]:
    """(fastavro-parsed schema, its named types). Raises AvroSchemaError naming the problem."""
    try:
        document = json.loads(schema_text)
    except json.JSONDecodeError:
        document = schema_text.strip()  # a bare primitive such as: string
    if document is None:  # the text null, JSON's null: the Avro type named null, as "null" is
        document = "null"
    named: dict[str, Any] = {}
    try:
        parsed = fastavro.parse_schema(document, named)
    except Exception as error:  # fastavro raises several unrelated exception types
        raise AvroSchemaError(
            f"invalid Avro schema ({type(error).__name__}: {error}): {schema_text}"
        ) from None
    return parsed, named


def _avro_branches(schema: Any) -> tuple[Any, bool]:
    """(the non-null branch of a union, whether null is allowed); non-unions are returned as they are."""
    if not isinstance(schema, list):
        return schema, schema == "null"
    others = [branch for branch in schema if branch != "null"]
    if len(others) != 1:
        raise AvroSchemaError(
            f"Avro union {json.dumps(schema)} has {len(others)} non-null branches; sparkafka maps only "
            "unions of null and one type to Spark types. Use a record with one optional field per branch"
        )
    return others[0], len(others) < len(schema)


def _avro_to_spark(schema: Any, named: Mapping[str, Any], seen: frozenset[str] = frozenset()) -> DataType:
    """The Spark type fastavro's decoded value of ``schema`` is converted to (every field nullable)."""
    schema, _ = _avro_branches(schema)
    if isinstance(schema, str) and schema in named:
        if schema in seen:
            raise AvroSchemaError(f"Avro type {schema} is recursive; Spark types cannot represent it")
        return _avro_to_spark(named[schema], named, seen | {schema})
    kind = schema["type"] if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if isinstance(kind, dict | list):
        return _avro_to_spark(kind, named, seen)
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        if precision > 38:
            raise AvroSchemaError(f"Avro decimal precision {precision} exceeds Spark's maximum of 38")
        return DecimalType(precision, scale)
    if logical == "date" and kind == "int":
        return DateType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return TimestampNTZType()
    simple: dict[str, DataType] = {
        "boolean": BooleanType(),
        "int": IntegerType(),
        "long": LongType(),
        "float": FloatType(),
        "double": DoubleType(),
        "bytes": BinaryType(),
        "string": StringType(),
        "enum": StringType(),
        "fixed": BinaryType(),
    }
    if kind in simple:
        return simple[kind]
    if kind == "record":
        name = schema["name"]
        inner = seen | {name}
        return StructType(
            [StructField(f["name"], _avro_to_spark(f["type"], named, inner)) for f in schema["fields"]]
        )
    if kind == "array":
        return ArrayType(_avro_to_spark(schema["items"], named, seen))
    if kind == "map":
        return MapType(StringType(), _avro_to_spark(schema["values"], named, seen))
    raise AvroSchemaError(f"Avro type {json.dumps(schema)} cannot be mapped to a Spark type")


def _arrow_type(spark_type: DataType) -> pa.DataType:
    """Arrow type of the Spark types ``_avro_to_spark`` produces, as Spark's Arrow UDFs exchange them."""
    if isinstance(spark_type, StructType):
        return pa.struct([pa.field(f.name, _arrow_type(f.dataType)) for f in spark_type.fields])
    if isinstance(spark_type, ArrayType):
        return pa.list_(_arrow_type(spark_type.elementType))
    if isinstance(spark_type, MapType):
        return pa.map_(pa.string(), _arrow_type(spark_type.valueType))
    if isinstance(spark_type, DecimalType):
        return pa.decimal128(spark_type.precision, spark_type.scale)
    simple: dict[type[DataType], pa.DataType] = {
        BooleanType: pa.bool_(),
        IntegerType: pa.int32(),
        LongType: pa.int64(),
        FloatType: pa.float32(),
        DoubleType: pa.float64(),
        BinaryType: pa.binary(),
        StringType: pa.string(),
        DateType: pa.date32(),
        TimestampType: pa.timestamp("us", tz="UTC"),
        TimestampNTZType: pa.timestamp("us"),
    }
    return simple[type(spark_type)]


Converter = Callable[[Any], Any]


def _time_to_units(unit: int) -> Converter:
    def convert(value: Any) -> Any:
        if isinstance(value, datetime.time):
            seconds = value.hour * 3600 + value.minute * 60 + value.second
            return seconds * unit + value.microsecond * unit // 1_000_000
        return value

    return convert


def _read_converter(
    schema: Any, named: Mapping[str, Any], seen: frozenset[str] = frozenset()
) -> Converter | None:
    """Turns fastavro's decoded value into what Arrow takes for the Spark type, or None if it already is
    (only uuid, whose reader gives uuid.UUID, and time-*, which gives datetime.time, need it)."""
    schema, _ = _avro_branches(schema)
    if isinstance(schema, str) and schema in named:
        return None if schema in seen else _read_converter(named[schema], named, seen | {schema})
    if not isinstance(schema, dict):
        return None
    kind, logical = schema["type"], schema.get("logicalType")
    if isinstance(kind, dict | list):
        return _read_converter(kind, named, seen)
    if logical == "uuid":
        return lambda value: str(value) if isinstance(value, uuid.UUID) else value
    if logical == "time-millis":
        return _time_to_units(1000)
    if logical == "time-micros":
        return _time_to_units(1_000_000)
    if kind == "record":
        inner = seen | {schema["name"]}
        fields = [(f["name"], _read_converter(f["type"], named, inner)) for f in schema["fields"]]
        converting = [(name, convert) for name, convert in fields if convert is not None]
        if not converting:
            return None

        def convert_record(value: Any) -> Any:
            if isinstance(value, dict):
                for name, convert in converting:
                    if value.get(name) is not None:
                        value[name] = convert(value[name])
            return value

        return convert_record
    if kind in ("array", "map"):
        item = _read_converter(schema["items" if kind == "array" else "values"], named, seen)
        if item is None:
            return None
        if kind == "array":
            return lambda value: None if value is None else [None if v is None else item(v) for v in value]
        return lambda value: (
            None if value is None else {k: None if v is None else item(v) for k, v in value.items()}
        )
    return None


_AVRO_INT_RANGE = range(-(2**31), 2**31)
_AVRO_FLOAT_MAX = 3.4028234663852886e38


def _checked_primitive(kind: Any, logical_type: str | None) -> Converter | None:
    """Checks, for values the Avro encoder would otherwise write wrongly without a word: a number
    beyond an ``int`` (Java readers wrap it) or a ``float`` (becomes infinity), and a timestamp
    without time zone for a ``timestamp-*`` type, which is an instant (fastavro would take the
    machine's local time zone). As Spark's to_avro, which refuses those types outright."""
    if kind == "int" and logical_type is None:

        def check_int(value: Any) -> Any:
            if isinstance(value, int) and value not in _AVRO_INT_RANGE:
                raise ValueError(f"{value} is outside the range of Avro's int (32 bits); use long")
            return value

        return check_int
    if kind == "float":

        def check_float(value: Any) -> Any:
            if isinstance(value, float) and math.isfinite(value) and abs(value) > _AVRO_FLOAT_MAX:
                raise ValueError(f"{value} is outside the range of Avro's float (32 bits); use double")
            return value

        return check_float
    if kind == "long" and logical_type in ("timestamp-millis", "timestamp-micros"):

        def check_instant(value: Any) -> Any:
            if isinstance(value, datetime.datetime) and value.tzinfo is None:
                raise ValueError(
                    f"a timestamp without time zone (TIMESTAMP_NTZ) cannot be written as {logical_type}, "
                    f"an instant; cast the column to TIMESTAMP, or use local-{logical_type}"
                )
            return value

        return check_instant
    return None


def _write_converter(
    schema: Any, named: Mapping[str, Any], seen: frozenset[str] = frozenset()
) -> Converter | None:
    """Turns a Spark value as Arrow gives it (maps as lists of pairs) into what fastavro writes."""
    if isinstance(schema, list):
        others = [branch for branch in schema if branch != "null"]
        return _write_converter(others[0], named, seen) if len(others) == 1 else None
    if isinstance(schema, str) and schema in named:
        return None if schema in seen else _write_converter(named[schema], named, seen | {schema})
    if not isinstance(schema, dict):
        return _checked_primitive(schema, None)
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _write_converter(kind, named, seen)
    if isinstance(kind, str) and kind not in ("record", "array", "map"):
        return _checked_primitive(kind, schema.get("logicalType"))
    if kind == "record":
        inner = seen | {schema["name"]}
        fields = [(f["name"], _write_converter(f["type"], named, inner)) for f in schema["fields"]]
        converting = [(name, convert) for name, convert in fields if convert is not None]
        if not converting:
            return None

        def convert_record(value: Any) -> Any:
            if isinstance(value, dict):
                value = dict(value)
                for name, convert in converting:
                    if value.get(name) is not None:
                        value[name] = convert(value[name])
            return value

        return convert_record
    if kind == "array":
        item = _write_converter(schema["items"], named, seen)
        if item is None:
            return None
        return lambda value: value if value is None else [v if v is None else item(v) for v in value]
    if kind == "map":
        values = _write_converter(schema["values"], named, seen) or (lambda v: v)

        def convert_map(value: Any) -> Any:
            pairs = value.items() if isinstance(value, dict) else value
            return None if value is None else {k: v if v is None else values(v) for k, v in pairs}

        return convert_map
    return None


class AvroCodec:
    """One Avro schema, parsed once per Python process, with its Spark and Arrow types and converters
    (computed on first use: a writer schema fetched from a registry needs none of them)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.parsed, self.named = _parse_avro(text)
        self._logical_differences: dict[str, list[str]] = {}  # by writer schema text

    @classmethod
    def of(cls, schema: str | Mapping[str, Any] | list[Any]) -> AvroCodec:
        text = _schema_text(schema)
        with _codecs_lock:
            codec = _codecs.get(text)
        if codec is None:
            codec = cls(text)
            with _codecs_lock:
                _codecs[text] = codec
        return codec

    @cached_property
    def spark_type(self) -> DataType:
        return _avro_to_spark(self.parsed, self.named)

    @cached_property
    def arrow_type(self) -> pa.DataType:
        return _arrow_type(self.spark_type)

    @cached_property
    def read_converter(self) -> Converter | None:
        return _read_converter(self.parsed, self.named)

    @cached_property
    def write_converter(self) -> Converter | None:
        return _write_converter(self.parsed, self.named)

    @property
    def name(self) -> str:
        schema = self.parsed
        if isinstance(schema, dict):
            return str(schema.get("name") or schema.get("type"))
        return "union" if isinstance(schema, list) else str(schema)

    def decode(self, body: bytes, writer: AvroCodec | None = None) -> Any:
        """Decode one Avro body written with ``writer`` (default: this schema) into this schema.
        Raises ValueError (or fastavro's errors) for a corrupt body, SparkafkaError for a writer
        schema whose logical types this schema would read wrongly."""
        buffer = io.BytesIO(body)
        writer_schema = self.parsed if writer is None else writer.parsed
        reader_schema = None if writer is None or writer.text == self.text else self.parsed
        if writer is not None and reader_schema is not None:
            self._refuse_other_logical_types(writer)
        value = fastavro.schemaless_reader(buffer, writer_schema, reader_schema)
        left = len(body) - buffer.tell()
        if left:
            raise ValueError(f"{left} byte(s) left after the Avro datum (written with another schema?)")
        return value if self.read_converter is None or value is None else self.read_converter(value)

    def _refuse_other_logical_types(self, writer: AvroCodec) -> None:
        """fastavro converts values by the writer's logical types only: read as ``timestamp-millis``,
        a field written as a plain ``long`` would come out as microseconds, 1000 times off; read as
        ``long``, a ``timestamp-millis`` field as a timestamp that Spark refuses. Schema registries
        accept such changes (Avro's compatibility rules ignore logical types), so they are caught
        here, once per writer schema, and fail the query rather than give wrong values."""
        with _codecs_lock:
            differences = self._logical_differences.get(writer.text)
        if differences is None:
            differences = logical_type_differences(writer.parsed, self.parsed, writer.named, self.named)
            with _codecs_lock:
                self._logical_differences[writer.text] = differences
        if differences:
            raise SparkafkaError(
                f"the reader schema {self.name} reads fields with other logical types than their writer "
                f"schema wrote them with ({'; '.join(differences)}): the values would be wrong. Decode with "
                "the writer's logical types (a reader schema, or subject version, that keeps them) and "
                "convert the column in Spark, e.g. timestamp_millis(col) for a long of milliseconds"
            )

    def encode(self, value: Any) -> bytes:
        buffer = io.BytesIO()
        datum = value if self.write_converter is None else self.write_converter(value)
        # strict: a struct field the schema lacks, or a schema field the struct lacks, is an error
        # (as with Spark's to_avro), not a value dropped or a default written in its place.
        fastavro.schemaless_writer(buffer, self.parsed, datum, strict=True)
        return buffer.getvalue()


# Logical types fastavro converts; any other is ignored by reader and writer alike.
_CONVERTED_LOGICAL_TYPES = frozenset(
    {
        "decimal",
        "uuid",
        "date",
        "time-millis",
        "time-micros",
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    }
)
_COMPLEX_AVRO_TYPES = frozenset({"record", "error", "array", "map", "enum", "fixed"})


def logical_type_differences(
    writer: Any, reader: Any, writer_named: Mapping[str, Any], reader_named: Mapping[str, Any]
) -> list[str]:
    """Where Avro schema resolution pairs a writer value with a reader value of another logical type
    (or another decimal scale), as ``"<field path>: written as <type>, read as <type>"``.

    Follows Avro's resolution of parsed (fastavro) schemas: named types are looked up; every branch
    of a writer union is paired with the reader union's branch of the same type (else its first
    non-null one, a promotion); record fields by name or reader alias; array items; map values."""
    found: list[str] = []
    seen: set[tuple[str, str]] = set()

    def resolved(schema: Any, named: Mapping[str, Any]) -> Any:
        while isinstance(schema, str) and schema in named:
            schema = named[schema]
        return schema

    def base(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            kind = schema.get("type")
            return kind if isinstance(kind, str) else base(kind)
        return str(schema)

    def logical(schema: Any) -> tuple[str | None, int | None]:
        if not isinstance(schema, dict) or schema.get("logicalType") not in _CONVERTED_LOGICAL_TYPES:
            return None, None
        return schema["logicalType"], schema.get("scale") if schema["logicalType"] == "decimal" else None

    def described(schema: Any) -> str:
        kind, scale = logical(schema)
        if kind is None:
            return base(schema)
        return f"{base(schema)}/{kind}" + (f" (scale {scale or 0})" if kind == "decimal" else "")

    def same_kind(written: Any, read: Any) -> bool:
        """Whether Avro resolution pairs these two: named types (record, enum, fixed) by name."""
        if base(written) != base(read):
            return False
        if base(written) not in ("record", "error", "enum", "fixed"):
            return True
        names = {read["name"], read["name"].rsplit(".", 1)[-1], *read.get("aliases", ())}
        return written["name"] in names or written["name"].rsplit(".", 1)[-1] in names

    def walk(written: Any, read: Any, path: str) -> None:
        written, read = resolved(written, writer_named), resolved(read, reader_named)
        if isinstance(written, list):
            for branch in written:
                walk(branch, read, path)
            return
        if base(written) == "null":
            return  # no value to convert (a null read as anything else is refused by the decoder)
        if isinstance(read, list):
            branches = [resolved(b, reader_named) for b in read]
            same = [b for b in branches if same_kind(written, b)]
            # A promotion (int to long, ...) pairs primitives only; a named or complex type without
            # its match is a resolution error the decoder reports.
            primitive = base(written) not in _COMPLEX_AVRO_TYPES
            promoted = [b for b in branches if primitive and base(b) not in ("null", *_COMPLEX_AVRO_TYPES)]
            if same or promoted:
                walk(written, (same or promoted)[0], path)
            return
        kind = base(written)
        if kind != base(read) and kind in _COMPLEX_AVRO_TYPES:
            return  # a mismatch Avro resolution itself reports
        if kind in ("record", "error"):
            if (written["name"], read["name"]) in seen:
                return
            seen.add((written["name"], read["name"]))
            by_name = {field["name"]: field for field in written["fields"]}
            for field in read["fields"]:
                match = next(
                    (by_name[n] for n in (field["name"], *field.get("aliases", ())) if n in by_name), None
                )
                if match is not None:
                    walk(match["type"], field["type"], f"{path}.{field['name']}" if path else field["name"])
        elif kind == "array":
            walk(written["items"], read["items"], f"{path}[]")
        elif kind == "map":
            walk(written["values"], read["values"], f"{path}{{}}")
        elif logical(written) != logical(read):
            found.append(f"{path or 'the value'}: written as {described(written)}, read as {described(read)}")

    walk(writer, reader, "")
    return found


_codecs: dict[str, AvroCodec] = {}
_codecs_lock = threading.Lock()


def _describe_error(error: Exception) -> str:
    if isinstance(error, EOFError):
        return f"the Avro body ends early ({error})" if str(error) else "the Avro body ends early"
    if isinstance(error, UnicodeDecodeError):
        return f"an Avro string is not valid UTF-8 ({error.reason} at byte {error.start})"
    detail = str(error) or type(error).__name__
    return detail if isinstance(error, ValueError) else f"{type(error).__name__}: {detail}"


def decode_avro_values(
    values: list[Any], decode_one: Callable[[bytes], Any]
) -> tuple[list[Any], list[str | None]]:
    """Decode every non-null value; a corrupt one gives (None, its error message). Pure, for tests."""
    decoded: list[Any] = []
    errors: list[str | None] = []
    for value in values:
        if value is None:
            decoded.append(None)
            errors.append(None)
            continue
        body = value.encode() if isinstance(value, str) else bytes(value)
        try:
            decoded.append(decode_one(body))
            errors.append(None)
        except SparkafkaError:  # the registry did not answer: not this record's fault
            raise
        except Exception as error:  # any failure of one record's bytes is that record's error
            decoded.append(None)
            errors.append(_describe_error(error))
    return decoded, errors


def _scalar_arrow_udf(
    function: Callable[[pa.Array], pa.Array], return_type: DataType
) -> Callable[[Column], Column]:
    """A Spark Arrow UDF: batches of Arrow arrays in and out, no pandas, no per-row Python objects."""
    # The type hints (pa.Array -> pa.Array) make it a scalar Arrow UDF; mypy sees pyarrow as Any.
    udf = F.arrow_udf(function, return_type)  # type: ignore[call-overload]
    return cast(Callable[[Column], Column], udf)


def _udf_result_type(value_type: DataType) -> StructType:
    return StructType([StructField("value", value_type), StructField("error", StringType())])


def _arrow_result(decoded: list[Any], errors: list[str | None], value_type: pa.DataType) -> pa.Array:
    """struct<value, error> for a batch. A decoded value Arrow refuses for the Spark type (a decimal
    beyond its precision, say) makes that record corrupt rather than failing the whole batch."""
    try:
        values = pa.array(decoded, type=value_type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        for index, value in enumerate(decoded):
            if value is None:
                continue
            try:
                pa.array([value], type=value_type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as error:
                decoded[index] = None
                errors[index] = f"the decoded value does not fit the Spark type ({error})"
        values = pa.array(decoded, type=value_type)
    return pa.StructArray.from_arrays([values, pa.array(errors, type=pa.string())], names=["value", "error"])


def _decoder_column(
    decode_batch: Callable[[pa.Array], pa.Array],
    value_type: DataType,
    col: ColumnOrName,
    on_error: OnError,
    position: _SourcePosition,
    description: str,
    data_format: str,
) -> Column:
    """``col`` decoded by ``decode_batch`` (Arrow values in, ``{value, error}`` structs out), with
    corrupt values handled as ``on_error`` says."""
    raw = _column(col)
    udf_result = _scalar_arrow_udf(decode_batch, _udf_result_type(value_type))(raw)
    error = udf_result.getField("error")
    return _handle_corrupt(
        on_error,
        decoded=udf_result.getField("value"),
        corrupt=error.isNotNull(),
        reason=error,
        raw=raw,
        position=position,
        description=description,
        data_format=data_format,
    )


# -- Avro with an explicit schema ----------------------------------------------------------------------


def from_avro(
    col: ColumnOrName,
    schema_json: str | Mapping[str, Any],
    on_error: OnError = "fail",
    *,
    topic: ColumnOrName | None = "topic",
    partition: ColumnOrName | None = "partition",
    offset: ColumnOrName | None = "offset",
) -> Column:
    """Decode binary Avro bodies (no header, as Spark's ``from_avro``) written with ``schema_json``.

    Records become structs, enums strings, ``[null, T]`` unions nullable T, logical types Spark's
    date, timestamp, timestamp_ntz and decimal types; unions of several non-null types are refused."""
    on_error = _check_on_error(on_error)
    codec = AvroCodec.of(schema_json)
    text = codec.text

    def sparkafka_from_avro(values: pa.Array) -> pa.Array:
        reader = AvroCodec.of(text)
        decoded, errors = decode_avro_values(values.to_pylist(), reader.decode)
        return _arrow_result(decoded, errors, reader.arrow_type)

    return _decoder_column(
        sparkafka_from_avro,
        codec.spark_type,
        col,
        on_error,
        _position(topic, partition, offset),
        f"Avro of schema {codec.name}",
        "avro",
    )


def encode_avro_values(
    values: list[Any], encode_one: Callable[[Any], bytes]
) -> tuple[list[Any], list[str | None]]:
    """Encode every non-null value; one that does not fit gives (None, why). Pure, for tests."""
    encoded: list[bytes | None] = []
    errors: list[str | None] = []
    for value in values:
        if value is None:
            encoded.append(None)
            errors.append(None)
            continue
        try:
            encoded.append(encode_one(value))
            errors.append(None)
        except Exception as error:  # fastavro raises TypeError, ValueError, KeyError ... for misfits
            encoded.append(None)
            errors.append(_describe_error(error))
    return encoded, errors


def _encoder_column(codec: AvroCodec, header: bytes, name: str, col: Column) -> Column:
    """Avro bodies (after ``header``) of ``col``. A value that does not fit the schema fails the query,
    but only when its bytes are used: the error is raised in the JVM by a CASE WHEN branch, because
    Spark evaluates Python UDFs for every row, also rows a CASE WHEN does not take — such as the
    dead letters of ``route_dead_letters``, whose decoded value is null."""
    text = codec.text

    def encode(values: pa.Array) -> pa.Array:
        writer = AvroCodec.of(text)
        encoded, errors = encode_avro_values(values.to_pylist(), lambda value: header + writer.encode(value))
        return pa.StructArray.from_arrays(
            [pa.array(encoded, type=pa.binary()), pa.array(errors, type=pa.string())],
            names=["value", "error"],
        )

    encode.__name__ = name
    result = _scalar_arrow_udf(encode, _udf_result_type(BinaryType()))(col)
    error = result.getField("error")
    message = F.concat(
        F.lit(f"sparkafka: {name}: a value does not fit Avro schema {codec.name} ("),
        error,
        F.lit(
            "). Make the column's fields match the schema's: names, types, and non-null values for fields "
            "that are not unions with null"
        ),
    )
    return F.when(error.isNotNull(), F.raise_error(message)).otherwise(result.getField("value"))


def to_avro(col: ColumnOrName, schema_json: str | Mapping[str, Any]) -> Column:
    """Encode a column (a struct for a record schema) as binary Avro bodies of ``schema_json``.
    A null input gives a null value; a value that does not fit the schema fails the query."""
    return _encoder_column(AvroCodec.of(schema_json), b"", "sparkafka_to_avro", _column(col))


# -- Avro in Confluent's wire format, through a Schema Registry ----------------------------------------


class SchemaFetchError(SparkafkaError):
    """The Schema Registry could not be asked (not a corrupt record: the task fails and is retried)."""


_registry_clients: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_writer_schemas: dict[tuple[str, int], AvroCodec] = {}
_registry_lock = threading.Lock()


def _registry_client(url: str, config: Mapping[str, str] | None) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = (url, tuple(sorted((config or {}).items())))
    with _registry_lock:
        client = _registry_clients.get(key)
        if client is None:
            client = SchemaRegistryClient({**(config or {}), "url": url})
            _registry_clients[key] = client
    return client


class UnknownSchemaId(ValueError):
    """A record names a schema id the registry does not have: the record is corrupt."""


def writer_codec(url: str, config: Mapping[str, str] | None, schema_id: int) -> AvroCodec:
    """The writer schema of ``schema_id``, fetched once per Python process (ids never change)."""
    with _registry_lock:
        cached = _writer_schemas.get((url, schema_id))
    if cached is not None:
        return cached
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        schema = _registry_client(url, config).get_schema(schema_id)
    except SchemaRegistryError as error:
        # Only Confluent's "schema not found" makes the record corrupt; any other 404 (a wrong URL
        # path, a proxy) would dead-letter every record, so it fails the task instead.
        if error.error_code == 40403:
            raise UnknownSchemaId(f"schema id {schema_id} is not in the schema registry at {url}") from None
        raise SchemaFetchError(
            f"the schema registry at {url} refused schema id {schema_id}: {error}. This is not a corrupt "
            "record, so it is not dead-lettered; fix the registry or its credentials (registry_config)"
        ) from None
    except Exception as error:
        raise SchemaFetchError(
            f"the schema registry at {url} did not answer for schema id {schema_id} ({error}); check "
            "registry_url and that the registry is up. This is not a corrupt record, so it is not "
            "dead-lettered: the task fails and Spark retries it"
        ) from None
    if (schema.schema_type or "AVRO") != "AVRO":
        raise UnknownSchemaId(f"schema id {schema_id} is a {schema.schema_type} schema, not Avro")
    codec = AvroCodec.of(schema.schema_str)
    with _registry_lock:
        _writer_schemas[(url, schema_id)] = codec
    return codec


def split_confluent_header(body: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of a value in Confluent's wire format; ValueError if it is not one."""
    if len(body) < CONFLUENT_HEADER_SIZE:
        raise ValueError(
            f"the value has {len(body)} byte(s), fewer than the {CONFLUENT_HEADER_SIZE} of Confluent's "
            "header (magic byte and schema id)"
        )
    if body[0] != CONFLUENT_MAGIC_BYTE:
        raise ValueError(f"unknown magic byte {body[0]} (Confluent's wire format starts with 0)")
    return int.from_bytes(body[1:CONFLUENT_HEADER_SIZE], "big"), body[CONFLUENT_HEADER_SIZE:]


def confluent_header(schema_id: int) -> bytes:
    return bytes([CONFLUENT_MAGIC_BYTE]) + schema_id.to_bytes(4, "big")


def from_confluent_avro(
    col: ColumnOrName,
    registry_url: str,
    on_error: OnError = "fail",
    *,
    subject: str | None = None,
    reader_schema: str | Mapping[str, Any] | None = None,
    registry_config: Mapping[str, str] | None = None,
    topic: ColumnOrName | None = "topic",
    partition: ColumnOrName | None = "partition",
    offset: ColumnOrName | None = "offset",
) -> Column:
    """Decode values in Confluent's wire format (magic byte 0, schema id, Avro body).

    Each record's writer schema is fetched from the registry by id (once per Python worker) and
    resolved to the reader schema, which fixes the column's Spark type: ``reader_schema`` if given,
    else the latest version of ``subject`` (e.g. ``orders-value``) when the Column is built.
    ``registry_config`` takes SchemaRegistryClient settings such as ``basic.auth.user.info``."""
    on_error = _check_on_error(on_error)
    config = dict(registry_config or {})
    if reader_schema is None:
        if subject is None:
            raise SparkafkaOptionError(
                "from_confluent_avro needs the schema to decode into: pass subject='<topic>-value' (its "
                "latest version is used) or reader_schema='<Avro schema JSON>'"
            )
        reader_schema = _latest_schema(registry_url, config, subject)
    codec = AvroCodec.of(reader_schema)
    text = codec.text

    def sparkafka_from_confluent_avro(values: pa.Array) -> pa.Array:
        reader = AvroCodec.of(text)

        def decode_one(value: bytes) -> Any:
            schema_id, body = split_confluent_header(value)
            return reader.decode(body, writer_codec(registry_url, config, schema_id))

        decoded, errors = decode_avro_values(values.to_pylist(), decode_one)
        return _arrow_result(decoded, errors, reader.arrow_type)

    return _decoder_column(
        sparkafka_from_confluent_avro,
        codec.spark_type,
        col,
        on_error,
        _position(topic, partition, offset),
        f"Confluent Avro (reader schema {codec.name}, registry {registry_url})",
        "confluent-avro",
    )


def _latest_schema(registry_url: str, config: Mapping[str, str], subject: str) -> str:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        latest = _registry_client(registry_url, config).get_latest_version(subject)
    except SchemaRegistryError as error:
        if error.error_code in (40401, 40402):
            raise SparkafkaOptionError(
                f"subject '{subject}' has no schema in the registry at {registry_url}; register one, "
                "or pass reader_schema="
            ) from None
        raise SchemaFetchError(
            f"the schema registry at {registry_url} refused subject '{subject}': {error}"
        ) from None
    except Exception as error:
        raise SchemaFetchError(
            f"the schema registry at {registry_url} did not answer ({error}); check registry_url"
        ) from None
    return str(latest.schema.schema_str)


def to_confluent_avro(
    col: ColumnOrName,
    registry_url: str,
    subject: str,
    schema_json: str | Mapping[str, Any],
    *,
    registry_config: Mapping[str, str] | None = None,
    auto_register: bool = True,
) -> Column:
    """Encode a column as Avro of ``schema_json`` in Confluent's wire format.

    The schema is registered under ``subject`` (or, with ``auto_register=False``, must already be
    registered there) when the Column is built, on the driver: an incompatible schema fails then, and
    every record carries the same id, so a replayed batch writes the same bytes."""
    codec = AvroCodec.of(schema_json)
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = _registry_client(registry_url, registry_config)
    schema = Schema(codec.text, "AVRO")
    try:
        if auto_register:
            schema_id = client.register_schema(subject, schema)
        else:
            schema_id = client.lookup_schema(subject, schema).schema_id
    except SchemaRegistryError as error:
        if error.error_code == 409:
            fix = (
                "make the change compatible (e.g. give added fields a default) or change the subject's level"
            )
        elif error.error_code in (40401, 40403):
            fix = "register the schema first, or use auto_register=True"
        else:
            fix = "check the schema and the registry"
        raise SparkafkaError(
            f"the schema registry at {registry_url} refused schema {codec.name} for subject '{subject}': "
            f"{error.error_message} (error code {error.error_code}); {fix}"
        ) from None
    except Exception as error:
        raise SchemaFetchError(
            f"the schema registry at {registry_url} did not answer ({error}); check registry_url"
        ) from None
    return _encoder_column(
        codec, confluent_header(int(schema_id)), "sparkafka_to_confluent_avro", _column(col)
    )


# -- dead letters --------------------------------------------------------------------------------------


def is_dead_letter(decoded: ColumnOrName) -> Column:
    """True for rows whose ``decoded`` column (decoded with ``on_error=dead_letter(...)``) is corrupt.
    Keep them through filters: ``df.where(is_dead_letter("order") | (col("order.value.amount") > 0))``."""
    return _column(decoded).getField("dead_letter").isNotNull()


def route_dead_letters(
    df: DataFrame,
    decoded: str,
    *,
    topic: str | Column,
    value: ColumnOrName,
    key: ColumnOrName | None = None,
    headers: ColumnOrName | None = None,
) -> DataFrame:
    """Columns ``topic``, ``key``, ``value``, ``headers`` for the sparkafka sink, one row per input row.

    Good rows: ``topic`` (a topic name, or a Column of names), ``value`` (e.g. ``to_json(...)``), ``key``
    (default: the input's ``key`` column) and ``headers`` (default: none). Corrupt rows of
    ``decoded`` (a column decoded with ``on_error=dead_letter(topic)``): that dead-letter topic, the
    input's ``key``, the original bytes of the value, and the input's ``headers`` (when read with
    ``includeHeaders``) followed by ``sparkafka.error``, ``sparkafka.error.format``,
    ``sparkafka.source.topic``, ``sparkafka.source.partition`` and ``sparkafka.source.offset``.

    Write the result without the sink's ``topic`` option: that option would override every row's topic.
    With ``deliveryGuarantee=exactly-once`` each dead-letter record commits in the same transaction as
    the output of its micro-batch task."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    decoded_type = fields.get(decoded)
    letter_type = (
        decoded_type["dead_letter"].dataType
        if isinstance(decoded_type, StructType) and decoded_type.fieldNames() == ["value", "dead_letter"]
        else None
    )
    if not isinstance(letter_type, StructType) or letter_type.fieldNames() != DEAD_LETTER_TYPE.fieldNames():
        raise SparkafkaOptionError(
            f"route_dead_letters needs column '{decoded}' decoded with on_error=dead_letter('<topic>'), "
            f"i.e. a struct<value, dead_letter>; the DataFrame has {df.schema.simpleString()}"
        )
    letter = F.col(decoded).getField("dead_letter")
    is_letter = letter.isNotNull()
    original_key = F.col("key").cast("binary") if "key" in fields else F.lit(None).cast("binary")
    good_key = original_key if key is None else _column(key).cast("binary")
    good_topic = F.lit(topic) if isinstance(topic, str) else topic
    good_headers = F.lit(None).cast(HEADERS_TYPE) if headers is None else _column(headers).cast(HEADERS_TYPE)

    def header(name: str, header_value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), header_value.cast("string").cast("binary").alias("value"))

    error_headers = F.filter(
        F.array(
            header(ERROR_HEADER, letter.getField("error")),
            header(ERROR_FORMAT_HEADER, letter.getField("format")),
            header(SOURCE_TOPIC_HEADER, letter.getField("source_topic")),
            header(SOURCE_PARTITION_HEADER, letter.getField("source_partition")),
            header(SOURCE_OFFSET_HEADER, letter.getField("source_offset")),
        ),
        lambda h: h.getField("value").isNotNull(),
    )
    original_headers = (
        F.coalesce(F.col("headers").cast(HEADERS_TYPE), F.array().cast(HEADERS_TYPE))
        if "headers" in fields
        else F.array().cast(HEADERS_TYPE)
    )
    return df.select(
        F.when(is_letter, letter.getField("topic")).otherwise(good_topic).alias("topic"),
        F.when(is_letter, original_key).otherwise(good_key).alias("key"),
        F.when(is_letter, letter.getField("raw_value"))
        .otherwise(_column(value).cast("binary"))
        .alias("value"),
        F.when(is_letter, F.concat(original_headers, error_headers)).otherwise(good_headers).alias("headers"),
    )
