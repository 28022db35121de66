"""Small helpers around the real clients used by the conformance tests."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: dict[str, str] | None = None,
    *,
    replicas: int = 1,
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, replicas, config=config or {})
    # A node of a cluster that just started may drop the request's connection (librdkafka then
    # fails it with _DESTROY_BROKER or _TRANSPORT): ask again; a topic the lost request created is
    # there already.
    for attempt in range(5):
        try:
            admin.create_topics([topic], operation_timeout=10)[name].result(timeout=30)
            break
        except KafkaException as error:
            code = error.args[0].code()
            if attempt and code == KafkaError.TOPIC_ALREADY_EXISTS:
                break
            if code not in (KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT) or attempt == 4:
                raise
            time.sleep(1)
    # Apache Kafka answers CreateTopics before its partitions have a leader (the controller
    # propagates them): wait until they do, as a client's first request would.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = admin.list_topics(name, timeout=10).topics.get(name)
        ready = listed is not None and listed.error is None and len(listed.partitions) == partitions
        if ready and all(partition.leader >= 0 for partition in listed.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {name} has no leader for every partition after 30 s")


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
    """Read a topic from the beginning until ``expect`` records arrived (then stop: copies beyond it
    go unseen), or, without ``expect``, to each partition's end as :func:`read_to_end` does (at least
    30 s allowed for it)."""
    if expect is None:
        return read_to_end(
            bootstrap, topic, partitions=partitions, isolation=isolation, timeout_s=max(timeout_s, 30.0)
        )
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
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {message.error()}")
            messages.append(message)
            if len(messages) >= expect:
                break
    finally:
        consumer.close()
    return messages


def read_to_end(
    bootstrap: str,
    topic: str,
    *,
    partitions: int = 1,
    isolation: str = "read_committed",
    timeout_s: float = 30.0,
) -> list[Message]:
    """Every record of ``topic`` that a reader of ``isolation`` sees now, read from the beginning
    until each partition reported its end (with read_committed: the last stable offset). Unlike
    :func:`read_all`, an empty answer means the topic holds nothing for that reader, not that the
    consumer was still connecting; and it never stops at an expected count, so copies show."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"to-end-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages: list[Message] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(at_end)} reached their end only"
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise AssertionError(f"consumer error: {message.error()}")
            at_end.discard(message.partition())
            messages.append(message)
    finally:
        consumer.close()
    return messages


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's high watermark, as the broker answers it: 0 everywhere means nothing was
    ever written, committed or not (a read that finds nothing may only have been too early)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"watermarks-{time.monotonic_ns()}"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)
        ]
    finally:
        consumer.close()


def values(messages: list[Message]) -> list[bytes]:
    return [m.value() for m in messages]


def committed_markers(
    bootstrap: str,
    batch_id: int,
    *,
    prefix: str = "",
    field: str = "records",
    marker_topic: str = "_sparkafka_commit_markers",
) -> dict[str, Any]:
    """Transactional id -> ``field`` (records, write_partitions, ...), of the sink's commit markers of
    micro-batch ``batch_id`` committed so far (ids starting with ``prefix``), read with
    read_committed from ``marker_topic``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"markers-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    partitions = marker_topic_partitions(bootstrap, marker_topic)
    if not partitions:
        consumer.close()
        return {}
    consumer.assign([TopicPartition(marker_topic, partition, 0) for partition in partitions])
    found: dict[str, Any] = {}
    ended: set[int] = set()
    try:
        while len(ended) < len(partitions):
            message = consumer.poll(2)
            if message is None:
                break
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                    continue
                break
            key = (message.key() or b"").decode()
            records_of_another_kind = (
                "registration/",
                "progress/",
                "claim/",
                "refusal/",
                "query/",
                "layout/",
            )
            if key.startswith(records_of_another_kind) or not key.startswith(prefix):
                continue
            marker = json.loads(message.value())
            if marker["batch_id"] == batch_id:
                found[key] = marker.get(field)
    finally:
        consumer.close()
    return found


def marker_topic_partitions(bootstrap: str, marker_topic: str = "_sparkafka_commit_markers") -> list[int]:
    """Every partition of the commit-marker topic (the sink keeps a prefix's records in one of them,
    chosen by the topic's layout); none while it does not exist. Every topic is listed: a metadata
    request naming the topic would have a broker that auto-creates topics create it, not compacted,
    before the sink could."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    topic = metadata.topics.get(marker_topic)
    return [] if topic is None or topic.error is not None else sorted(topic.partitions)


def wait_for_committed(
    bootstrap: str, topic: str, *, expect: int, partitions: int, timeout_s: float = 180
) -> list[Message]:
    """Everything read_committed readers see in ``topic`` once that is at least ``expect`` records,
    each look a :func:`read_to_end`; fails naming the count reached when ``timeout_s`` ran out.
    A count reached is no proof against copies still to come: see :func:`committed_ids`."""
    deadline = time.monotonic() + timeout_s
    while True:
        messages = read_to_end(bootstrap, topic, partitions=partitions)
        if len(messages) >= expect:
            return messages
        assert time.monotonic() < deadline, f"{topic}: {len(messages)} of {expect} records committed"
        time.sleep(0.5)


def committed_ids(
    bootstrap: str, topic: str, *, expect: int, partitions: int, stop: Callable[[], object] | None
) -> Counter[str]:
    """How often each record id (a value's text up to its first ``|``) is in ``topic`` for read_committed
    readers: once ``expect`` records are there, the writer is stopped (``stop``; None when it has
    stopped already), and the topic is read to its end. A copy written after the count was reached
    is counted too: after the stop nothing more can come."""
    wait_for_committed(bootstrap, topic, expect=expect, partitions=partitions)
    if stop is not None:
        stop()
    return record_ids(read_to_end(bootstrap, topic, partitions=partitions))


def record_ids(messages: list[Message]) -> Counter[str]:
    """How often each record id (a value's text up to its first ``|``) is among ``messages``."""
    return Counter((m.value() or b"").decode().split("|")[0] for m in messages)


def assert_exactly_once(output: Counter[str], ids: set[str]) -> None:
    """Every id of ``ids`` exactly once in ``output``, and nothing else."""
    doubled = sorted(i for i, n in output.items() if n > 1)
    missing = sorted(ids - set(output))
    assert not doubled and not missing, f"{len(doubled)} doubled, {len(missing)} missing"
    assert set(output) == ids
