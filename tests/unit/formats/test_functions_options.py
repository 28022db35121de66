"""Argument checks of sparkafka.formats.functions that fail before any Column is built (no Spark session)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import IntegerType, StructField, StructType

from sparkafka.errors import SparkafkaOptionError
from sparkafka.formats.functions import DeadLetter, dead_letter, from_confluent_avro, from_json
from sparkafka.formats.functions import _check_on_error as check_on_error
from sparkafka.formats.functions import _json_path as json_path

SCHEMA = StructType([StructField("id", IntegerType(), nullable=False)])


def test_on_error_policies() -> None:
    assert check_on_error("fail") == "fail"
    assert check_on_error("null") == "null"
    assert check_on_error(dead_letter("orders-dlq")) == DeadLetter("orders-dlq")
    with pytest.raises(SparkafkaOptionError, match="on_error must be 'fail', 'null' or dead_letter"):
        check_on_error("skip")
    with pytest.raises(SparkafkaOptionError, match="on_error must be"):
        check_on_error("orders-dlq")  # a bare topic name is not a policy


def test_dead_letter_needs_a_topic() -> None:
    with pytest.raises(SparkafkaOptionError, match="needs a topic name"):
        dead_letter("")


@pytest.mark.parametrize("option", ["mode", "MODE", "columnNameOfCorruptRecord"])
def test_from_json_refuses_options_that_on_error_replaces(option: str) -> None:
    with pytest.raises(SparkafkaOptionError, match="use on_error="):
        from_json("value", SCHEMA, options={option: "FAILFAST"})


def test_from_json_refuses_a_bad_on_error_before_anything_else() -> None:
    with pytest.raises(SparkafkaOptionError, match="on_error must be"):
        from_json("value", SCHEMA, on_error="ignore")  # type: ignore[arg-type]


def test_from_confluent_avro_needs_a_reader_schema_or_subject() -> None:
    with pytest.raises(SparkafkaOptionError, match="pass subject='<topic>-value'"):
        from_confluent_avro("value", "http://127.0.0.1:1")


def test_json_paths_select_any_top_level_key() -> None:
    assert json_path("id") == "$['id']"
    assert json_path("a b.c") == "$['a b.c']"
    assert json_path("it's") == '$["it\'s"]'
