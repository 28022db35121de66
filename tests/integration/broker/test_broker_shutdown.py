"""A clean stop with thousands of partitions, which closes them concurrently
(benchmarks/broker_shutdown.py measures how fast): every record written before SIGTERM is there after
the restart, and every partition was left with its clean-shutdown marker."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkafka.broker.runner import BrokerProcess
from tests.conftest import FAST_BROKER_ARGS

PARTITIONS = 1000  # the 3,000-partition stop time is measured in benchmarks/broker_shutdown.py


def test_clean_stop_keeps_every_partitions_records(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data, extra_args=FAST_BROKER_ARGS).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("many", PARTITIONS, 1)])["many"].result(timeout=60)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20, "acks": "all"})
        for partition in range(PARTITIONS):
            producer.produce("many", key=b"k", value=f"p{partition}".encode(), partition=partition)
        assert producer.flush(60) == 0
        del producer, admin
        broker.terminate()
        # The marker is written only once the partition's log is fsynced, as its last step.
        unmarked = [p for p in range(PARTITIONS) if not (data / f"many-{p}" / ".clean_shutdown").exists()]
        assert unmarked == []
        broker.start()
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "check", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("many", p, 0) for p in range(PARTITIONS)])
        found: dict[int, bytes | None] = {}
        while len(found) < PARTITIONS:
            messages = consumer.consume(PARTITIONS, 10)
            assert messages, f"only {len(found)} of {PARTITIONS} records came back"
            for message in messages:
                assert message.error() is None, message.error()
                assert message.offset() == 0
                found[message.partition()] = message.value()
        consumer.close()
        assert found == {p: f"p{p}".encode() for p in range(PARTITIONS)}
    finally:
        broker.terminate()
