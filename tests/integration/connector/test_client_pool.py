"""Pooled consumers (sparkafka.connector.client_pool) against the real broker: a consumer handed
from one read to the next must never leak records of the earlier assignment into the later one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition

from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector import client_pool
from sparkafka.connector.client_pool import ConsumerPool
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.options import SourceOptions
from sparkafka.connector.source.reader import read_offset_range
from tests.integration.kafka_clients import create_topic, producer

RECORDS_PER_PARTITION = 3_000


@pytest.fixture(scope="module")
def filled_topic(broker: BrokerProcess) -> str:
    name = "pool-input"
    create_topic(broker.bootstrap_servers, name, partitions=2)
    writer = producer(broker.bootstrap_servers)
    for partition in range(2):
        for offset in range(RECORDS_PER_PARTITION):
            writer.produce(name, value=f"{partition}:{offset}".encode(), partition=partition)
            writer.poll(0)
    assert writer.flush(30) == 0
    return name


@pytest.fixture
def pool() -> Iterator[ConsumerPool]:
    pool = ConsumerPool()
    yield pool
    pool.close_all()


def _config(broker: BrokerProcess) -> dict[str, object]:
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "group.id": "pool-test",
        "enable.auto.commit": False,
    }


def test_a_returned_consumer_is_reused_and_sees_only_its_new_assignment(
    pool: ConsumerPool, broker: BrokerProcess, filled_topic: str
) -> None:
    with pool.borrow(_config(broker)) as first:
        first.assign([TopicPartition(filled_topic, 0, 0)])
        got = first.consume(10, timeout=10)
        # Far more than ten records are fetched by now; the rest must not reach the next borrower.
        assert [m.offset() for m in got] == list(range(10))
    with pool.borrow(_config(broker)) as second:
        assert second is first
        second.assign([TopicPartition(filled_topic, 1, 2_500)])
        got = second.consume(5, timeout=10)
        assert [(m.partition(), m.offset()) for m in got] == [(1, 2_500 + i) for i in range(5)]
    with pool.borrow(_config(broker)) as third:
        third.assign([TopicPartition(filled_topic, 1, 100)])
        got = third.consume(3, timeout=10)
        assert [(m.partition(), m.offset()) for m in got] == [(1, 100), (1, 101), (1, 102)]


def test_a_consumer_whose_borrower_failed_is_closed_not_reused(
    pool: ConsumerPool, broker: BrokerProcess, filled_topic: str
) -> None:
    with pytest.raises(ValueError), pool.borrow(_config(broker)) as failed:
        failed.assign([TopicPartition(filled_topic, 0, 0)])
        raise ValueError("the borrower broke off")
    with pool.borrow(_config(broker)) as fresh:
        assert fresh is not failed
    with pytest.raises(RuntimeError):  # closed: librdkafka refuses any further call
        failed.assign([TopicPartition(filled_topic, 0, 0)])


def test_a_consumer_marked_not_to_reuse_is_closed_when_returned(
    pool: ConsumerPool, broker: BrokerProcess, filled_topic: str
) -> None:
    with pool.borrow(_config(broker)) as spoiled:
        spoiled.assign([TopicPartition(filled_topic, 0, 0)])
        pool.do_not_reuse(spoiled)
    with pool.borrow(_config(broker)) as fresh:
        assert fresh is not spoiled
    with pytest.raises(RuntimeError):
        spoiled.assign([TopicPartition(filled_topic, 0, 0)])
    with pool.borrow(_config(broker)) as again:  # the fresh one was pooled as usual
        assert again is fresh


def test_a_different_configuration_gets_a_different_consumer(
    pool: ConsumerPool, broker: BrokerProcess, filled_topic: str
) -> None:
    with pool.borrow(_config(broker)) as plain:
        pass
    with pool.borrow({**_config(broker), "isolation.level": "read_uncommitted"}) as other:
        assert other is not plain


def test_a_consumer_idle_too_long_is_closed_at_the_next_borrow(
    pool: ConsumerPool, broker: BrokerProcess, filled_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pool.borrow(_config(broker)) as idle:
        pass
    monkeypatch.setattr(client_pool, "IDLE_TIMEOUT_S", 0.0)
    with pool.borrow(_config(broker)) as fresh:
        assert fresh is not idle
    with pytest.raises(RuntimeError):
        idle.assign([TopicPartition(filled_topic, 0, 0)])


def test_back_to_back_range_reads_return_exactly_their_ranges(
    broker: BrokerProcess, filled_topic: str
) -> None:
    """The source's reads share pooled consumers: a replay of an earlier range, a range of the other
    partition and a range stopped early each yield exactly their own records."""
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": filled_topic}
    ).for_stream()

    def values(topic_partition: int, start: int, end: int) -> list[bytes]:
        batches = read_offset_range(OffsetRange(filled_topic, topic_partition, start, end), options)
        return [value for batch in batches for value in batch.column("value").to_pylist()]

    def expected(topic_partition: int, start: int, end: int) -> list[bytes]:
        return [f"{topic_partition}:{offset}".encode() for offset in range(start, end)]

    assert values(0, 0, 2_000) == expected(0, 0, 2_000)
    assert values(0, 500, 700) == expected(0, 500, 700)
    assert values(1, 2_990, 3_000) == expected(1, 2_990, 3_000)
    assert values(0, 0, 2_000) == expected(0, 0, 2_000)
    # A reader Spark stops after its first batch (a LIMIT) must not hand on a consumer mid-read.
    stopped = read_offset_range(OffsetRange(filled_topic, 1, 0, RECORDS_PER_PARTITION), options)
    assert next(stopped).num_rows > 0
    stopped.close()
    assert values(1, 0, 50) == expected(1, 0, 50)
