"""Small helpers around the real clients used by the conformance tests."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})], operation_timeout=10)
    futures[name].result(timeout=30)


def producer(bootstrap: str, **overrides: Any) -> Producer:
    config = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    config.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Producer(config)


def transactional_producer(bootstrap: str, transactional_id: str, **overrides: Any) -> Producer:
    return producer(bootstrap, transactional_id=transactional_id, **overrides)


def open_transaction(bootstrap: str, transactional_id: str, topic: str, value: bytes) -> Producer:
    """A transactional producer that wrote ``value`` to ``topic`` in a transaction it leaves open (the
    record is in the log); the caller commits or aborts it."""
    writer = transactional_producer(bootstrap, transactional_id)
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(topic, value=value)
    writer.flush(30)
    return writer


def read_all(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    expect: int | None = None,
    timeout_s: float = 10.0,
    partitions: int = 1,
) -> list[Message]:
    """Read a topic from the beginning until `expect` records arrived, or until it has been idle."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if expect is None and time.monotonic() - idle_since > 2.0:
                    break
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {message.error()}")
            messages.append(message)
            idle_since = time.monotonic()
            if expect is not None and len(messages) >= expect:
                break
    finally:
        consumer.close()
    return messages


def values(messages: list[Message]) -> list[bytes]:
    return [m.value() for m in messages]
