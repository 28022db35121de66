"""Avro payments in Confluent's wire format -> Spark -> Kafka exactly-once, through a Schema Registry.
One command:

    .venv/bin/python examples/avro_registry.py

It starts the embedded broker with its Schema Registry (`sparkafka broker --schema-registry`) in a
temporary directory. A producer using Confluent's own AvroSerializer writes payments with version 1
of the schema, then with version 2 (a new field with a default: a BACKWARD-compatible change), plus
two records that are not valid Confluent Avro. A streaming query with trigger(availableNow=True)

    readStream sparkafka  ->  from_confluent_avro(subject="payments-value", on_error=dead_letter(...))
    ->  amount in euros  ->  to_confluent_avro(subject="payments-eur-value")  ->  route_dead_letters
    ->  writeStream sparkafka, deliveryGuarantee=exactly-once

decodes every record into the latest schema (old records get the default), re-encodes them with a
schema it registers, and sends the corrupt records to `payments-dlq`. Finally it prints what a
read_committed consumer sees, decoded with Confluent's AvroDeserializer.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.functions import dead_letter, from_confluent_avro, route_dead_letters, to_confluent_avro
from sparkafka.session import spark_session

if not __package__:  # run as `python examples/avro_registry.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.kafka_io import create_topics, read_committed

PAYMENT_V1 = {
    "type": "record",
    "name": "Payment",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "cents", "type": "long"},
    ],
}
PAYMENT_V2 = {
    **PAYMENT_V1,
    "fields": [*PAYMENT_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}],
}
RATES_TO_EUR = {"EUR": 1.0, "GBP": 1.17, "USD": 0.92}
PAYMENT_EUR = {
    "type": "record",
    "name": "PaymentEur",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "euros", "type": "double"},
        {"name": "original_currency", "type": "string"},
    ],
}


def produce_payments(bootstrap: str, registry: SchemaRegistryClient) -> int:
    """Payments as Confluent's serializer writes them (registering v1 and v2), and two bad records."""
    context = SerializationContext("payments", MessageField.VALUE)
    write_v1 = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    write_v2 = AvroSerializer(registry, json.dumps(PAYMENT_V2))
    values = [
        write_v1({"id": "p-1", "cents": 1250}, context),
        write_v1({"id": "p-2", "cents": 99}, context),
        b"\x00\x00\x00\x03\xe7garbage",  # Confluent's header, but schema id 999 does not exist
        write_v2({"id": "p-3", "cents": 5000, "currency": "GBP"}, context),
        b'{"id": "p-4", "cents": 10}',  # JSON, not Confluent Avro
        write_v2({"id": "p-5", "cents": 700, "currency": "USD"}, context),
    ]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for number, value in enumerate(values, start=1):
        producer.produce("payments", key=f"account-{number}".encode(), value=value)
    producer.flush(30)
    return len(values)


def run_pipeline(bootstrap: str, registry_url: str, checkpoint: Path) -> None:
    spark = spark_session("sparkafka-example-avro-registry", master="local[2]")
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "payments")
        .option("startingOffsets", "earliest")
        .load()
    )
    decoded = events.select(
        "key",
        # The reader schema is the subject's latest version (v2), fetched now, on the driver.
        from_confluent_avro(
            "value", registry_url, dead_letter("payments-dlq"), subject="payments-value"
        ).alias("payment"),
    )
    payment = F.col("payment.value")
    rate = F.create_map(*[item for code, r in RATES_TO_EUR.items() for item in (F.lit(code), F.lit(r))])
    in_euros = F.struct(
        payment["id"].alias("id"),
        F.round(payment["cents"] / 100 * rate[payment["currency"]], 2).alias("euros"),
        payment["currency"].alias("original_currency"),
    )
    routed = route_dead_letters(
        decoded,
        "payment",
        topic="payments-eur",
        value=to_confluent_avro(in_euros, registry_url, "payments-eur-value", PAYMENT_EUR),
    )
    query = (
        routed.writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything runs on this machine
    workdir = Path(tempfile.mkdtemp(prefix="sparkafka-avro-registry-"))
    broker = BrokerProcess(workdir / "kafka", schema_registry=True).start()
    try:
        bootstrap, registry_url = broker.bootstrap_servers, broker.schema_registry_url
        print(f"broker on {bootstrap}, schema registry on {registry_url} (data in {workdir})", flush=True)
        registry = SchemaRegistryClient({"url": registry_url})
        create_topics(bootstrap, "payments", "payments-eur", "payments-dlq")
        count = produce_payments(bootstrap, registry)
        versions = registry.get_versions("payments-value")
        print(f"produced {count} records to 'payments' (subject payments-value, versions {versions})")
        print("running the pipeline (AvailableNow)...", flush=True)
        run_pipeline(bootstrap, registry_url, workdir / "checkpoint")

        read_avro = AvroDeserializer(registry)
        context = SerializationContext("payments-eur", MessageField.VALUE)
        output = read_committed(bootstrap, "payments-eur")
        print(f"\npayments-eur ({len(output)} records, read_committed, Confluent's AvroDeserializer):")
        for record in output:
            value = record.value()
            schema_id = int.from_bytes(value[1:5], "big")
            print(f"  {record.key().decode()}  schema id {schema_id}  {read_avro(value, context)}")
        letters = read_committed(bootstrap, "payments-dlq")
        print(f"\npayments-dlq ({len(letters)} records, read_committed):")
        for letter in letters:
            key, value, headers = letter.key(), letter.value(), dict(letter.headers() or [])
            offset = headers["sparkafka.source.offset"].decode()
            print(f"  {key.decode()}  {value!r}")
            print(f"      from payments@{offset}: {headers['sparkafka.error'].decode()}")
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
