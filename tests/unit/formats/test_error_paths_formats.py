"""Error paths of sparkafka.formats.functions reached without a Spark session or a registry: schemas
from_json and from_avro refuse while the Column is being built, values the Avro encoder refuses, and a
writer schema whose logical types the reader would misread (which fails the batch, not one record)."""

from __future__ import annotations

import datetime
import io
import re
from typing import Any

import fastavro
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from sparkafka.errors import SparkafkaError, SparkafkaOptionError
from sparkafka.formats.functions import AvroCodec, AvroSchemaError, decode_avro_values, from_avro, from_json

SCHEMA = StructType([StructField("id", IntegerType())])


# -- from_json --------------------------------------------------------------------------------------


def test_from_json_refuses_ddl_that_does_not_parse_and_says_what_it_takes() -> None:
    # Invalid with or without an active session, so the refusal is the same in any test process.
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape("cannot parse the schema 'id INT,, name STRING' ("),
    ) as refused:
        from_json("value", "id INT,, name STRING")
    assert "give a StructType or DDL such as 'id INT NOT NULL, name STRING'" in str(refused.value)


def test_from_json_refuses_a_schema_with_the_field_it_keeps_corrupt_records_in() -> None:
    schema = StructType([*SCHEMA.fields, StructField("__sparkafka_corrupt_record", StringType())])
    with pytest.raises(
        SparkafkaOptionError, match="the schema must not have a field named __sparkafka_corrupt_record"
    ):
        from_json("value", schema)


@pytest.mark.parametrize(
    ("given", "named"),
    [("MODE", "mode"), ("columnnameofcorruptrecord", "columnNameOfCorruptRecord")],
)
def test_from_json_names_the_reserved_option_whatever_case_it_was_given_in(given: str, named: str) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"from_json option '{named}' is set by sparkafka; use on_error='fail', 'null' or "
            "dead_letter('<topic>') instead"
        ),
    ):
        from_json("value", SCHEMA, options={given: "x"})


# -- from_avro: schemas Spark types cannot represent ------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "shown"),
    [
        ('"null"', '"null"'),
        # JSON's null, as a user writes the Avro type without quotes: the same type, the same message.
        ("null", '"null"'),
        ({"type": "null"}, '{"type": "null"}'),
        ({"type": "record", "name": "Row", "fields": [{"name": "nothing", "type": "null"}]}, '"null"'),
    ],
    ids=["bare", "unquoted", "object", "field"],
)
def test_from_avro_refuses_the_null_type_alone(schema: Any, shown: str) -> None:
    with pytest.raises(
        AvroSchemaError, match=re.escape(f"Avro type {shown} cannot be mapped to a Spark type")
    ):
        from_avro("value", schema)


def test_from_avro_refuses_a_union_of_several_types_and_says_how_to_model_it() -> None:
    schema = {"type": "record", "name": "Row", "fields": [{"name": "u", "type": ["null", "int", "string"]}]}
    with pytest.raises(
        AvroSchemaError,
        match=re.escape(
            'Avro union ["null", "int", "string"] has 2 non-null branches; sparkafka maps only unions of '
            "null and one type to Spark types. Use a record with one optional field per branch"
        ),
    ):
        from_avro("value", schema)


def test_from_avro_refuses_a_type_recursive_through_an_array() -> None:
    schema = {
        "type": "record",
        "name": "Tree",
        "fields": [{"name": "children", "type": {"type": "array", "items": "Tree"}}],
    }
    with pytest.raises(AvroSchemaError, match="Avro type Tree is recursive; Spark types cannot represent it"):
        from_avro("value", schema)


# -- Avro values and writer schemas -----------------------------------------------------------------


@pytest.mark.parametrize("logical_type", ["timestamp-millis", "timestamp-micros"])
def test_a_timestamp_without_time_zone_is_not_written_as_an_instant(logical_type: str) -> None:
    codec = AvroCodec.of({"type": "long", "logicalType": logical_type})
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"a timestamp without time zone (TIMESTAMP_NTZ) cannot be written as {logical_type}, an instant; "
            f"cast the column to TIMESTAMP, or use local-{logical_type}"
        ),
    ):
        codec.encode(datetime.datetime(2024, 1, 1, 12, 0))


def test_a_writer_schema_with_other_logical_types_fails_the_batch_instead_of_one_record() -> None:
    writer = AvroCodec.of({"type": "record", "name": "Reading", "fields": [{"name": "at", "type": "long"}]})
    reader = AvroCodec.of(
        {
            "type": "record",
            "name": "Reading",
            "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
        }
    )
    body = io.BytesIO()
    fastavro.schemaless_writer(body, writer.parsed, {"at": 1_700_000_000_000})
    # decode_avro_values turns a corrupt body into that record's error; this is no record's fault.
    with pytest.raises(
        SparkafkaError,
        match=re.escape(
            "the reader schema Reading reads fields with other logical types than their writer schema "
            "wrote them with (at: written as long, read as long/timestamp-millis): the values would be wrong"
        ),
    ):
        decode_avro_values([body.getvalue()], lambda value: reader.decode(value, writer))
