"""The pure Avro helpers of sparkafka.formats.functions: schema -> Spark/Arrow types, decode/encode
with corrupt inputs, schema resolution, and Confluent's wire-format header (no Spark session, no broker)."""

from __future__ import annotations

import datetime
import io
import json
import re
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sparkafka.errors import SparkafkaError
from sparkafka.formats.functions import (
    AvroCodec,
    AvroSchemaError,
    confluent_header,
    decode_avro_values,
    encode_avro_values,
    logical_type_differences,
    split_confluent_header,
)

EVERYTHING: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "test",
    "fields": [
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "optional", "type": ["null", "string"], "default": None},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "nums", "type": {"type": "array", "items": "long"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "int"]}},
        {
            "name": "inner",
            "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]},
        },
        {"name": "again", "type": "Inner"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "money", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    ],
}

SAMPLE: dict[str, Any] = {
    "i": -3,
    "l": 2**40,
    "d": 0.25,
    "s": "zoë",
    "b": b"\x00\xff",
    "optional": None,
    "colour": "GREEN",
    "hash": b"abcd",
    "nums": [1, 2, 3],
    "attrs": {"a": 1, "b": None},
    "inner": {"x": 1},
    "again": {"x": 2},
    "day": datetime.date(2020, 2, 29),
    "at": datetime.datetime(2021, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
    "local": datetime.datetime(2021, 1, 2, 3, 4, 5, 6000),
    "money": Decimal("-1234.567"),
    "id": "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
    "clock": 3_723_004,  # 01:02:03.004 as milliseconds after midnight
}


def written_by_fastavro(schema: Any, record: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def test_spark_type_of_every_supported_avro_type() -> None:
    spark_type = AvroCodec.of(EVERYTHING).spark_type
    assert isinstance(spark_type, StructType)
    types = {f.name: f.dataType for f in spark_type.fields}
    assert types["i"] == IntegerType() and types["l"] == LongType() and types["d"] == DoubleType()
    assert types["s"] == StringType() and types["b"] == BinaryType() and types["optional"] == StringType()
    assert types["colour"] == StringType() and types["hash"] == BinaryType()
    assert types["nums"] == ArrayType(LongType())
    assert types["attrs"] == MapType(StringType(), IntegerType())
    assert types["inner"] == types["again"] == StructType([StructField("x", IntegerType())])
    assert (
        types["day"] == DateType() and types["at"] == TimestampType() and types["local"] == TimestampNTZType()
    )
    assert (
        types["money"] == DecimalType(10, 3)
        and types["id"] == StringType()
        and types["clock"] == IntegerType()
    )
    assert AvroCodec.of('"string"').spark_type == StringType()


def test_decode_gives_values_arrow_accepts_for_the_spark_type() -> None:
    codec = AvroCodec.of(EVERYTHING)
    decoded = codec.decode(written_by_fastavro(EVERYTHING, SAMPLE))
    assert decoded["id"] == SAMPLE["id"]  # uuid.UUID turned into its text
    assert decoded["clock"] == SAMPLE["clock"]  # datetime.time turned back into milliseconds
    assert decoded["money"] == SAMPLE["money"] and decoded["at"] == SAMPLE["at"]
    array = pa.array([decoded, None], type=codec.arrow_type)
    assert array.to_pylist()[0]["attrs"] == [("a", 1), ("b", None)]
    assert array.null_count == 1


def test_encode_accepts_what_arrow_gives_and_round_trips() -> None:
    codec = AvroCodec.of(EVERYTHING)
    # As an Arrow UDF sees a Spark row: maps are lists of pairs.
    from_arrow = pa.array([SAMPLE], type=codec.arrow_type).to_pylist()[0]
    assert isinstance(from_arrow["attrs"], list)
    encoded = codec.encode(from_arrow)
    assert encoded == written_by_fastavro(EVERYTHING, SAMPLE)
    assert codec.decode(encoded)["attrs"] == {"a": 1, "b": None}


def test_decode_reports_corrupt_bodies() -> None:
    codec = AvroCodec.of(EVERYTHING)
    body = written_by_fastavro(EVERYTHING, SAMPLE)
    with pytest.raises(EOFError):
        codec.decode(body[:-4])
    with pytest.raises(ValueError, match="1 byte\\(s\\) left after the Avro datum"):
        codec.decode(body + b"\x00")
    values, errors = decode_avro_values([body, body[:10], None, b"\x80"], codec.decode)
    assert values[0] is not None and values[1:] == [None, None, None]
    assert errors[0] is None and errors[2] is None
    assert errors[1] is not None and errors[1].startswith("the Avro body ends early")
    assert errors[3] is not None


def test_invalid_utf8_is_a_corrupt_record() -> None:
    codec = AvroCodec.of('"string"')
    _, errors = decode_avro_values([b"\x04\xff\xfe"], codec.decode)
    assert errors == ["an Avro string is not valid UTF-8 (invalid start byte at byte 0)"]


def test_reader_schema_resolution() -> None:
    writer = AvroCodec.of({"type": "record", "name": "P", "fields": [{"name": "id", "type": "int"}]})
    reader = AvroCodec.of(
        {
            "type": "record",
            "name": "P",
            "fields": [{"name": "id", "type": "long"}, {"name": "cur", "type": "string", "default": "EUR"}],
        }
    )
    body = writer.encode({"id": 5})
    assert reader.decode(body, writer) == {"id": 5, "cur": "EUR"}
    unrelated = AvroCodec.of({"type": "record", "name": "Q", "fields": [{"name": "z", "type": "string"}]})
    _, errors = decode_avro_values([body], lambda b: unrelated.decode(b, writer))
    assert errors[0] is not None


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}, "2 non-null"),
        (
            {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
            "recursive",
        ),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}, "exceeds Spark's maximum"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}, "invalid Avro schema"),
        ("{not json", "invalid Avro schema"),
    ],
)
def test_unsupported_or_invalid_schemas_are_named(schema: Any, message: str) -> None:
    with pytest.raises(AvroSchemaError, match=message):
        _ = AvroCodec.of(schema).spark_type


def test_codecs_are_cached_per_schema_text() -> None:
    text = json.dumps({"type": "record", "name": "Cached", "fields": [{"name": "a", "type": "int"}]})
    assert AvroCodec.of(text) is AvroCodec.of(json.loads(text))


def test_confluent_header() -> None:
    assert confluent_header(258) == b"\x00\x00\x00\x01\x02"
    assert split_confluent_header(confluent_header(258) + b"body") == (258, b"body")
    with pytest.raises(ValueError, match="magic byte 7"):
        split_confluent_header(b"\x07\x00\x00\x00\x01")
    with pytest.raises(ValueError, match="fewer than the 5"):
        split_confluent_header(b"\x00\x01")


def test_time_micros_and_uuid_objects() -> None:
    codec = AvroCodec.of(
        {
            "type": "record",
            "name": "T",
            "fields": [
                {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
                {"name": "u", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
            ],
        }
    )
    value = uuid.uuid4()
    body = written_by_fastavro(codec.parsed, {"t": 1_000_001, "u": value})
    assert codec.decode(body) == {"t": 1_000_001, "u": str(value)}


def test_encode_values_reports_misfits_per_row() -> None:
    codec = AvroCodec.of({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    encoded, errors = encode_avro_values([{"a": 1}, None, {"a": "x"}, {"b": 1}], codec.encode)
    assert encoded[:2] == [b"\x02", None] and encoded[2:] == [None, None]
    assert errors[:2] == [None, None]
    assert all(error for error in errors[2:])


def _record(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


MILLIS = {"type": "long", "logicalType": "timestamp-millis"}


NOON = datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("written", "value", "read", "expected"),
    [
        ("long", 1_704_110_400_000, MILLIS, "at: written as long, read as long/timestamp-millis"),
        (MILLIS, NOON, "long", "at: written as long/timestamp-millis, read as long"),
        (MILLIS, NOON, {"type": "long", "logicalType": "timestamp-micros"}, "read as long/timestamp-micros"),
        ("int", 19_723, MILLIS, "at: written as int, read as long/timestamp-millis"),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            Decimal("1.25"),
            {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3},
            "written as bytes/decimal (scale 2), read as bytes/decimal (scale 3)",
        ),
    ],
)
def test_a_reader_schema_reading_a_field_with_another_logical_type_fails_instead_of_misreading(
    written: Any, value: Any, read: Any, expected: str
) -> None:
    writer = AvroCodec.of(_record("Event", ("id", "long"), ("at", written)))
    reader = AvroCodec.of(_record("Event", ("id", "long"), ("at", read)))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, writer.parsed, {"id": 1, "at": value})
    with pytest.raises(SparkafkaError, match=re.escape(expected)):
        reader.decode(body.getvalue(), writer)


def test_logical_type_differences_follow_avro_resolution_into_unions_arrays_maps_and_aliases() -> None:
    inner_written = _record("Inner", ("t", "long"))
    inner_read = _record("Inner", ("t", {"type": "long", "logicalType": "timestamp-micros"}))
    written = _record(
        "Outer",
        ("optional", ["null", inner_written]),
        ("again", "Inner"),
        ("days", {"type": "array", "items": "int"}),
        ("by_key", {"type": "map", "values": "int"}),
        ("old_name", "int"),
        ("same", MILLIS),
    )
    date = {"type": "int", "logicalType": "date"}
    read = _record(
        "Outer",
        ("optional", ["null", inner_read]),
        ("again", "Inner"),
        ("days", {"type": "array", "items": date}),
        ("by_key", {"type": "map", "values": date}),
        ("new_name", date),
        ("same", MILLIS),
    )
    read["fields"][4]["aliases"] = ["old_name"]
    writer, reader = AvroCodec.of(written), AvroCodec.of(read)
    assert logical_type_differences(writer.parsed, reader.parsed, writer.named, reader.named) == [
        "optional.t: written as long, read as long/timestamp-micros",
        "days[]: written as int, read as int/date",
        "by_key{}: written as int, read as int/date",
        "new_name: written as int, read as int/date",
    ]


def test_a_reader_schema_with_the_writers_logical_types_decodes_with_promotions_and_defaults() -> None:
    writer = AvroCodec.of(_record("Event", ("n", "int"), ("at", MILLIS)))
    reader = AvroCodec.of(_record("Event", ("n", "long"), ("at", MILLIS)))
    reader_with_default = AvroCodec.of(
        {
            "type": "record",
            "name": "Event",
            "fields": [
                {"name": "n", "type": "long"},
                {"name": "at", "type": MILLIS},
                {"name": "source", "type": "string", "default": "unknown"},
            ],
        }
    )
    body = io.BytesIO()
    at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    fastavro.schemaless_writer(body, writer.parsed, {"n": 5, "at": at})
    assert reader.decode(body.getvalue(), writer) == {"n": 5, "at": at}
    assert reader_with_default.decode(body.getvalue(), writer) == {"n": 5, "at": at, "source": "unknown"}


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        ("int", 3_000_000_000, "outside the range of Avro's int"),
        ("int", -(2**31) - 1, "outside the range of Avro's int"),
        ("float", 1e300, "outside the range of Avro's float"),
        (MILLIS, datetime.datetime(2024, 1, 1), "TIMESTAMP_NTZ"),
        (["null", "int"], 2**31, "outside the range of Avro's int"),
    ],
)
def test_values_the_avro_encoder_would_write_wrongly_are_refused(
    field: Any, value: Any, refusal: str
) -> None:
    codec = AvroCodec.of(_record("Row", ("x", field)))
    with pytest.raises(ValueError, match=re.escape(refusal)):
        codec.encode({"x": value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("int", 2**31 - 1),
        ("int", -(2**31)),
        ("float", 3.0e38),
        ("float", float("inf")),
        (MILLIS, datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)),
        (["null", "int"], None),
    ],
)
def test_values_within_the_avro_types_are_written(field: Any, value: Any) -> None:
    codec = AvroCodec.of(_record("Row", ("x", field)))
    decoded = fastavro.schemaless_reader(io.BytesIO(codec.encode({"x": value})), codec.parsed)
    assert decoded["x"] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value)


def test_logical_type_differences_pair_union_records_by_name_and_skip_null_branches() -> None:
    first = _record("First", ("at", "long"))
    second = _record("Second", ("at", MILLIS))
    written = _record("Outer", ("choice", ["null", "long", second]), ("maybe", ["null", MILLIS]))
    read = _record("Outer", ("choice", ["null", first, second]), ("maybe", MILLIS))
    writer, reader = AvroCodec.of(written), AvroCodec.of(read)
    # Second pairs with Second (same logical types), not with First; null has nothing to convert;
    # the long branch has no record to pair with (a resolution error, not a logical type's).
    assert logical_type_differences(writer.parsed, reader.parsed, writer.named, reader.named) == []
