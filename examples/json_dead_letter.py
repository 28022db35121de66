"""JSON orders -> Spark -> Kafka exactly-once, corrupt records to a dead-letter topic. One command:

    .venv/bin/python examples/json_dead_letter.py

It starts the embedded broker (`sparkafka broker`) in a temporary directory, produces orders — some
of them corrupt — to `orders`, and runs a streaming query with trigger(availableNow=True):

    readStream sparkafka  ->  from_json(on_error=dead_letter("orders-dlq"))  ->  total = qty * price
    ->  route_dead_letters  ->  writeStream sparkafka, deliveryGuarantee=exactly-once

Good orders go to `orders-priced`; corrupt ones, byte for byte, to `orders-dlq` with headers saying
what was wrong and where they came from — in the same Kafka transactions as the output. Finally it
prints what a read_committed consumer sees in both topics.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.functions import dead_letter, from_json, route_dead_letters, to_json
from sparkafka.session import spark_session

if not __package__:  # run as `python examples/json_dead_letter.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.kafka_io import create_topics, read_committed

ORDER_SCHEMA = "id STRING NOT NULL, item STRING, qty INT NOT NULL, price DOUBLE"
ORDERS = [
    b'{"id": "o-1", "item": "tea", "qty": 2, "price": 3.5}',
    b'{"id": "o-2", "item": "cake", "qty": 1, "price": 4.0}',
    b'{"id": "o-3", "item": "jam", "qty": "three", "price": 2.0}',  # qty is not an int
    b'{"id": "o-4", "item": "scone", "qty": 6, "price": 1.25}',
    b"<order id='o-5'/>",  # not JSON at all
    b'{"item": "honey", "qty": 1, "price": 6.0}',  # no id
    b'{"id": "o-7", "item": "bread", "qty": 1, "price": 2.75}',
]


def produce_orders(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for number, order in enumerate(ORDERS, start=1):
        producer.produce("orders", key=f"customer-{number % 3}".encode(), value=order)
    producer.flush(30)


def run_pipeline(bootstrap: str, checkpoint: Path) -> None:
    spark = spark_session("sparkafka-example-json-dead-letter", master="local[2]")
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .load()
    )
    decoded = events.select(
        "key", from_json("value", ORDER_SCHEMA, on_error=dead_letter("orders-dlq")).alias("order")
    )
    order = F.col("order.value")
    priced = F.struct(
        order["id"].alias("id"),
        order["item"].alias("item"),
        F.round(order["qty"] * order["price"], 2).alias("total"),
    )
    routed = route_dead_letters(decoded, "order", topic="orders-priced", value=to_json(priced))
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
    workdir = Path(tempfile.mkdtemp(prefix="sparkafka-json-dlq-"))
    broker = BrokerProcess(workdir / "kafka").start()
    try:
        print(f"broker on {broker.bootstrap_servers} (data in {workdir})", flush=True)
        create_topics(broker.bootstrap_servers, "orders", "orders-priced", "orders-dlq")
        produce_orders(broker.bootstrap_servers)
        print(
            f"produced {len(ORDERS)} orders to 'orders'; running the pipeline (AvailableNow)...", flush=True
        )
        run_pipeline(broker.bootstrap_servers, workdir / "checkpoint")

        priced = read_committed(broker.bootstrap_servers, "orders-priced")
        print(f"\norders-priced ({len(priced)} records, read_committed):")
        for record in priced:
            print(f"  {record.key().decode()}  {record.value().decode()}")
        letters = read_committed(broker.bootstrap_servers, "orders-dlq")
        print(f"\norders-dlq ({len(letters)} records, read_committed):")
        for letter in letters:
            key, value, headers = letter.key(), letter.value(), dict(letter.headers() or [])
            where = (
                f"{headers['sparkafka.source.topic'].decode()}/{headers['sparkafka.source.partition'].decode()}"
                f"@{headers['sparkafka.source.offset'].decode()}"
            )
            print(f"  {key.decode()}  {value.decode()}")
            print(f"      from {where}: {headers['sparkafka.error'].decode()}")
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
