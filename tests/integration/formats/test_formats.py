"""sparkafka.formats.functions on a real local SparkSession against a real broker and its Schema Registry:
JSON with corrupt records under each on_error, Avro round trips, Confluent's wire format through the
registry (checked against Confluent's own serializers), and a streaming exactly-once pipeline whose
dead letters commit with its output."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Message
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.formats.functions import (
    dead_letter,
    from_avro,
    from_confluent_avro,
    from_json,
    is_dead_letter,
    route_dead_letters,
    to_avro,
    to_confluent_avro,
    to_json,
)
from tests.integration.kafka_clients import create_topic, producer, read_all

ORDER_DDL = "id INT NOT NULL, item STRING, amount DOUBLE"
GOOD = b'{"id": 1, "item": "tea", "amount": 2.5}'
# Input of the JSON tests: (value, why it is corrupt or None).
JSON_INPUT: list[tuple[bytes | None, str | None]] = [
    (GOOD, None),
    (b'{"id": "seven", "item": "cake"}', "field 'id' does not hold a valid int"),
    (b"{not json", "the value is not valid JSON"),
    (b'{"id": 3, "item": "jam"}', None),
    (b'{"item": "no id"}', "required field 'id' (NOT NULL in the schema) is missing or null"),
    (b"[1, 2]", "the value is JSON but not an object"),
    (b"", "the value is empty"),
    (None, None),  # a tombstone: null, not an error
]

ORDER_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "lines", "type": {"type": "array", "items": "int"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker with a Schema Registry for the module."""
    data_dir = tmp_path_factory.mktemp("formats") / "data"
    with BrokerProcess(
        data_dir, schema_registry=True, extra_args=["--group-initial-rebalance-delay-ms", "0"]
    ) as b:
        yield b


def produce(bootstrap: str, topic: str, values: list[bytes | None], headers: list[Any] | None = None) -> None:
    sender = producer(bootstrap)
    for index, value in enumerate(values):
        sender.produce(topic, key=f"k{index}".encode(), value=value, headers=headers)
    assert sender.flush(30) == 0


def read_topic(spark: SparkSession, stack: BrokerProcess, topic: str) -> DataFrame:
    return (
        spark.read.format("sparkafka")
        .option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


# -- JSON --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def json_topic(stack: BrokerProcess) -> str:
    create_topic(stack.bootstrap_servers, "json-in")
    produce(stack.bootstrap_servers, "json-in", [value for value, _ in JSON_INPUT])
    return "json-in"


def test_json_on_error_null(spark: SparkSession, stack: BrokerProcess, json_topic: str) -> None:
    rows = (
        read_topic(spark, stack, json_topic)
        .select("offset", from_json("value", ORDER_DDL, on_error="null").alias("order"))
        .orderBy("offset")
        .collect()
    )
    decoded = [row.order.asDict() if row.order is not None else None for row in rows]
    assert decoded[0] == {"id": 1, "item": "tea", "amount": 2.5}
    assert decoded[3] == {"id": 3, "item": "jam", "amount": None}
    # Corrupt records are null as a whole, never half-decoded (Spark's PERMISSIVE keeps item='cake').
    assert [i for i, d in enumerate(decoded) if d is None] == [1, 2, 4, 5, 6, 7]


def test_json_on_error_fail_names_the_record(
    spark: SparkSession, stack: BrokerProcess, json_topic: str
) -> None:
    decoded = read_topic(spark, stack, json_topic).select(from_json("value", ORDER_DDL).alias("order"))
    with pytest.raises(PySparkException) as failure:
        decoded.collect()
    message = str(failure.value)
    assert f"the record at topic '{json_topic}' partition 0 offset 1" in message
    assert "field 'id' does not hold a valid int" in message
    assert "on_error=dead_letter" in message  # the fix is named


def test_json_on_error_dead_letter(spark: SparkSession, stack: BrokerProcess, json_topic: str) -> None:
    rows = (
        read_topic(spark, stack, json_topic)
        .select("offset", from_json("value", ORDER_DDL, on_error=dead_letter("json-dlq")).alias("order"))
        .orderBy("offset")
        .collect()
    )
    for row, (value, reason) in zip(rows, JSON_INPUT, strict=True):
        letter = row.order.dead_letter
        if reason is None:
            assert letter is None
            assert (row.order.value is None) == (value is None)
        else:
            assert row.order.value is None
            assert letter.asDict() == {
                "topic": "json-dlq",
                "format": "json",
                "error": reason,
                "source_topic": json_topic,
                "source_partition": 0,
                "source_offset": row.offset,
                "raw_value": value,
            }


def test_json_not_null_holds_inside_structs_arrays_and_maps(spark: SparkSession) -> None:
    schema = (
        "id INT NOT NULL, o STRUCT<x: INT NOT NULL, y: STRING>, "
        "tags ARRAY<STRUCT<k: STRING NOT NULL>>, scores MAP<STRING, STRUCT<v: INT NOT NULL>>"
    )
    values = [
        '{"id": 1, "o": {"x": 1}, "tags": [{"k": "a"}, null], "scores": {"a": {"v": 2}}}',
        '{"id": 2}',  # o, tags and scores are nullable themselves
        '{"id": 3, "o": {"y": "no x"}}',
        '{"id": 4, "tags": [{"k": "a"}, {"k": null}]}',
        '{"id": 5, "scores": {"a": {"v": null}}}',
        '{"id": 6, "o": {"x": 1, "y": null}, "tags": [], "scores": {}}',
    ]
    frame = spark.createDataFrame([(v,) for v in values], "value string")
    rows = frame.select(
        from_json("value", schema, dead_letter("dlq"), topic=None, partition=None, offset=None).alias("r")
    ).collect()
    errors = [None if row.r.dead_letter is None else row.r.dead_letter.error for row in rows]
    assert errors == [
        None,
        None,
        "field 'o' lacks a value its schema declares NOT NULL, or holds a null there",
        "field 'tags' lacks a value its schema declares NOT NULL, or holds a null there",
        "field 'scores' lacks a value its schema declares NOT NULL, or holds a null there",
        None,
    ]
    assert rows[0].r.value.o.x == 1 and rows[5].r.value.o.x == 1


def test_json_encode_round_trip(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1, "tea", 2.5)], ORDER_DDL.replace(" NOT NULL", ""))
    encoded = frame.select(to_json(F.struct("*")).alias("value"))
    decoded = encoded.select(
        from_json("value", ORDER_DDL, topic=None, partition=None, offset=None).alias("o")
    )
    assert decoded.collect()[0].o.asDict() == {"id": 1, "item": "tea", "amount": 2.5}


# -- Avro --------------------------------------------------------------------------------------------


def sample_orders() -> list[dict[str, Any]]:
    import datetime
    from decimal import Decimal

    return [
        {
            "id": 7,
            "item": "tea",
            "amount": 2.5,
            "tags": {"colour": "green"},
            "lines": [1, 2],
            "status": "PAID",
            "note": None,
            "at": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
            "day": datetime.date(2024, 5, 1),
            "price": Decimal("12.34"),
        },
        {
            "id": 8,
            "item": "jam",
            "amount": 0.0,
            "tags": {},
            "lines": [],
            "status": "NEW",
            "note": "fragile",
            "at": datetime.datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=datetime.UTC),
            "day": datetime.date(1999, 12, 31),
            "price": Decimal("-0.01"),
        },
    ]


def fastavro_bytes(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def test_avro_round_trip_and_corrupt_records(spark: SparkSession) -> None:
    orders = sample_orders()
    values = [fastavro_bytes(ORDER_AVRO, order) for order in orders]
    truncated = values[0][:-3]
    trailing = values[1] + b"\x00\x00"
    frame = spark.createDataFrame(
        [(v, "avro-in", 0, i) for i, v in enumerate([*values, truncated, trailing, None])],
        "value binary, topic string, partition int, offset long",
    )
    decoded = frame.select(
        "offset", from_avro("value", ORDER_AVRO, on_error=dead_letter("avro-dlq")).alias("o")
    )
    rows = decoded.withColumn("at_us", F.unix_micros("o.value.at")).orderBy("offset").collect()
    for row, order in zip(rows, orders, strict=False):
        assert row.o.dead_letter is None
        # Timestamps come back in the session's time zone: compare instants.
        assert row.at_us == int(order["at"].timestamp() * 1_000_000)
        assert {**row.o.value.asDict(), "at": order["at"]} == order
    assert rows[2].o.dead_letter.error.startswith("the Avro body ends early")
    assert rows[3].o.dead_letter.error == "2 byte(s) left after the Avro datum (written with another schema?)"
    assert rows[3].o.dead_letter.raw_value == trailing
    assert rows[4].o.value is None and rows[4].o.dead_letter is None

    # Routing re-encodes good rows only: the dead letters' null values never reach to_avro.
    routed = route_dead_letters(
        decoded, "o", topic="avro-out", value=to_avro("o.value", ORDER_AVRO)
    ).collect()
    assert [(r.topic, r.value) for r in routed] == [
        ("avro-out", values[0]),
        ("avro-out", values[1]),
        ("avro-dlq", truncated),
        ("avro-dlq", trailing),
        ("avro-out", None),
    ]
    # A value that does not fit the schema fails the query, naming the schema.
    misfit = spark.createDataFrame([(1,)], "id int").select(to_avro(F.struct("id"), ORDER_AVRO))
    with pytest.raises(
        PySparkException, match=r"sparkafka_to_avro: a value does not fit Avro schema shop\.Order"
    ):
        misfit.collect()
    # Encoding the decoded structs gives back the very bytes fastavro wrote.
    good = decoded.where(~is_dead_letter("o") & F.col("o.value").isNotNull())
    reencoded = good.orderBy("offset").select(to_avro("o.value", json.dumps(ORDER_AVRO)).alias("v")).collect()
    assert [row.v for row in reencoded] == values


def test_to_avro_refuses_struct_fields_the_schema_lacks_and_schema_fields_the_struct_lacks(
    spark: SparkSession,
) -> None:
    """As Spark's to_avro: no renamed column silently lost, no default silently written in its place."""
    schema = {
        "type": "record",
        "name": "Payment",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "amount", "type": ["null", "double"], "default": None},
            {"name": "currency", "type": "string", "default": "EUR"},
        ],
    }
    renamed = spark.sql("SELECT 7L AS id, 12.5D AS amount_cents, 'USD' AS Currency")
    with pytest.raises(
        PySparkException, match="more fields than the schema specifies: amount_cents, Currency"
    ):
        renamed.select(to_avro(F.struct("*"), schema)).collect()
    lacking = spark.sql("SELECT 7L AS id, 'USD' AS currency")
    with pytest.raises(PySparkException, match="Field amount is specified in the schema but missing"):
        lacking.select(to_avro(F.struct("*"), schema)).collect()
    exact = spark.sql("SELECT 7L AS id, CAST(NULL AS DOUBLE) AS amount, 'USD' AS currency")
    (encoded,) = exact.select(to_avro(F.struct("*"), schema).alias("v")).first()
    assert fastavro.schemaless_reader(io.BytesIO(encoded), fastavro.parse_schema(schema)) == {
        "id": 7,
        "amount": None,
        "currency": "USD",
    }


def test_avro_fail_names_the_record(spark: SparkSession) -> None:
    frame = spark.createDataFrame(
        [(b"\x01", "orders", 3, 42)], "value binary, topic string, partition int, offset long"
    )
    with pytest.raises(PySparkException) as failure:
        frame.select(from_avro("value", ORDER_AVRO)).collect()
    message = str(failure.value)
    assert "the record at topic 'orders' partition 3 offset 42 as Avro of schema shop.Order" in message


# -- Confluent's wire format through the registry ------------------------------------------------------

PAYMENT_V1 = {"type": "record", "name": "Payment", "fields": [{"name": "id", "type": "long"}]}
PAYMENT_V2 = {
    "type": "record",
    "name": "Payment",
    "fields": [{"name": "id", "type": "long"}, {"name": "currency", "type": "string", "default": "EUR"}],
}


def test_confluent_avro_with_the_registry(spark: SparkSession, stack: BrokerProcess) -> None:
    url = stack.schema_registry_url
    client = SchemaRegistryClient({"url": url})
    topic = "payments"
    create_topic(stack.bootstrap_servers, topic)
    context = SerializationContext(topic, MessageField.VALUE)
    # Written by Confluent's own serializer: v1 records, then v2 records (schema evolution).
    serialize_v1 = AvroSerializer(client, json.dumps(PAYMENT_V1))
    serialize_v2 = AvroSerializer(client, json.dumps(PAYMENT_V2))
    unknown_id = b"\x00" + (99_999).to_bytes(4, "big") + b"\x02"
    values = [
        serialize_v1({"id": 1}, context),
        serialize_v2({"id": 2, "currency": "GBP"}, context),
        b"\x01not-confluent",
        unknown_id,
        b"\x00\x00",
    ]
    produce(stack.bootstrap_servers, topic, values)

    rows = (
        read_topic(spark, stack, topic)
        .select("offset", from_confluent_avro("value", url, "null", subject=f"{topic}-value").alias("p"))
        .orderBy("offset")
        .collect()
    )
    # Both decoded into the latest version (the reader schema): v1's record gets the default.
    assert [r.p.asDict() if r.p else None for r in rows] == [
        {"id": 1, "currency": "EUR"},
        {"id": 2, "currency": "GBP"},
        None,
        None,
        None,
    ]
    letters = (
        read_topic(spark, stack, topic)
        .select(
            "offset",
            from_confluent_avro("value", url, dead_letter("p-dlq"), reader_schema=PAYMENT_V1).alias("p"),
        )
        .orderBy("offset")
        .collect()
    )
    assert [r.p.value.id if r.p.value else None for r in letters] == [1, 2, None, None, None]
    errors = [r.p.dead_letter.error for r in letters[2:]]
    assert errors[0] == "unknown magic byte 1 (Confluent's wire format starts with 0)"
    assert errors[1] == f"schema id 99999 is not in the schema registry at {url}"
    assert errors[2].startswith("the value has 2 byte(s), fewer than the 5 of Confluent's header")

    # Encoded by sparkafka, read by Confluent's deserializer; the schema is registered on the way.
    frame = spark.createDataFrame([(3, "USD")], "id long, currency string")
    encoded = frame.select(to_confluent_avro(F.struct("*"), url, "payments-out-value", PAYMENT_V2).alias("v"))
    value = encoded.collect()[0].v
    schema_id = client.get_latest_version("payments-out-value").schema_id
    assert value[:5] == b"\x00" + schema_id.to_bytes(4, "big")
    assert AvroDeserializer(client)(value, SerializationContext("payments-out", MessageField.VALUE)) == {
        "id": 3,
        "currency": "USD",
    }

    # An incompatible schema is refused when the Column is built, with the fix named.
    incompatible = {"type": "record", "name": "Payment", "fields": [{"name": "id", "type": "string"}]}
    with pytest.raises(
        Exception, match=r"refused schema Payment for subject 'payments-out-value'.*compatible"
    ):
        to_confluent_avro(F.col("x"), url, "payments-out-value", incompatible)
    with pytest.raises(Exception, match="pass subject="):
        from_confluent_avro("value", url)


def test_an_unreachable_registry_fails_the_task_instead_of_dead_lettering(spark: SparkSession) -> None:
    closed = "http://127.0.0.1:1"  # nothing listens on port 1
    frame = spark.createDataFrame(
        [(b"\x00\x00\x00\x00\x01\x02", "t", 0, 0)], "value binary, topic string, partition int, offset long"
    )
    decoded = frame.select(from_confluent_avro("value", closed, dead_letter("dlq"), reader_schema=PAYMENT_V1))
    with pytest.raises(PySparkException, match=r"did not answer for schema id 1.*not dead-lettered"):
        decoded.collect()


# -- streaming, exactly-once, with a dead-letter topic ------------------------------------------------


def headers_of(message: Message) -> dict[str, bytes]:
    return {key: value for key, value in (message.headers() or [])}


def run_available_now(spark: SparkSession, stack: BrokerProcess, checkpoint: Path) -> None:
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
    )
    decoded = events.select(
        "key", "headers", from_json("value", ORDER_DDL, on_error=dead_letter("orders-dlq")).alias("order")
    )
    # A filter that keeps the dead letters: nothing is dropped silently.
    kept = decoded.where(is_dead_letter("order") | (F.col("order.value.id") % 2 == 1))
    routed = route_dead_letters(
        kept,
        "order",
        topic="orders-clean",
        value=to_json(
            F.struct(F.col("order.value.id").alias("id"), F.upper("order.value.item").alias("item"))
        ),
    )
    query = (
        routed.writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the AvailableNow query did not finish"
    assert query.exception() is None, query.exception()


def test_streaming_exactly_once_with_dead_letters(
    spark: SparkSession, stack: BrokerProcess, tmp_path: Path
) -> None:
    for topic in ("orders", "orders-clean", "orders-dlq"):
        create_topic(stack.bootstrap_servers, topic)
    first = [
        b'{"id": 1, "item": "tea"}',
        b'{"id": 2, "item": "cake"}',
        b"garbage",
        b'{"id": 3, "item": "jam"}',
    ]
    produce(stack.bootstrap_servers, "orders", first, headers=[("trace", b"abc")])
    checkpoint = tmp_path / "checkpoint"
    started = time.monotonic()
    run_available_now(spark, stack, checkpoint)

    clean = read_all(stack.bootstrap_servers, "orders-clean", expect=2)
    assert [m.value() for m in clean] == [b'{"id":1,"item":"TEA"}', b'{"id":3,"item":"JAM"}']
    assert [m.key() for m in clean] == [b"k0", b"k3"]
    letters = read_all(stack.bootstrap_servers, "orders-dlq", expect=1)
    assert [(m.key(), m.value()) for m in letters] == [(b"k2", b"garbage")]
    assert headers_of(letters[0]) == {
        "trace": b"abc",  # the record's own headers come first
        "sparkafka.error": b"the value is not valid JSON",
        "sparkafka.error.format": b"json",
        "sparkafka.source.topic": b"orders",
        "sparkafka.source.partition": b"0",
        "sparkafka.source.offset": b"2",
    }

    # More input, one more run from the same checkpoint: only the new records, each exactly once.
    produce(stack.bootstrap_servers, "orders", [b'{"id": 5, "item": "pie"}', b'{"id": "x"}'])
    run_available_now(spark, stack, checkpoint)
    clean = read_all(stack.bootstrap_servers, "orders-clean", expect=3)
    assert [m.value() for m in clean][-1] == b'{"id":5,"item":"PIE"}' and len(clean) == 3
    letters = read_all(stack.bootstrap_servers, "orders-dlq", expect=2)
    assert [m.value() for m in letters] == [b"garbage", b'{"id": "x"}']
    assert headers_of(letters[1])["sparkafka.source.offset"] == b"5"
    # Output and dead letters were written in transactions (read_committed sees them; nothing aborted).
    assert len(read_all(stack.bootstrap_servers, "orders-dlq", isolation="read_uncommitted")) == 2
    assert time.monotonic() - started < 170
