"""Topic set-up and read-back shared by the examples: the Kafka side of a demo, not of the pipeline."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(bootstrap: str, *names: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1) for name in names]).values():
        future.result(30)


def read_committed(bootstrap: str, topic: str) -> list[Message]:
    """Every record a read_committed consumer sees in partition 0 of ``topic``, in order, up to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "example-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    records = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                break
            raise RuntimeError(f"reading {topic}: {message.error()}")
        records.append(message)
    consumer.close()
    return records
