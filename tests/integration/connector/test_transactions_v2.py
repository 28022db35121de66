"""Transactions v2 (KIP-890) and librdkafka: what the sink's producers get from Kafka 4.x and 3.9.

librdkafka (confluent-kafka's core) implements only the client side of transaction version 1: it
sends EndTxn v1, AddPartitionsToTxn v0 and Produce v10 whatever the broker advertises, so the
coordinator keeps the producer epoch across the transactions of one producer session and bumps it
only at InitProducerId (a new instance: the zombie is fenced) and when it aborts a timed-out
transaction. What keeps a late write from opening a hanging transaction is the broker's partition
verification (KIP-890 part 1, ``transaction.partition.verification.enable``, on by default since
3.6), which applies to version 1 clients too."""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from sparkafka.broker.runner import BrokerProcess
from sparkafka.connector.sink.failures import kafka_exception_of
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.writer import KafkaStreamWriter
from sparkafka.errors import ProducerFencedError
from sparkafka.tools.harness import wait_until
from tests.conftest import FAST_BROKER_ARGS
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.kafka_clients import create_topic, read_to_end, values
from tests.integration.raw_kafka import RawConnection

# How often the coordinator looks for transactions older than their timeout (Kafka's default is 10 s).
ABORT_CHECK_MS = 500
# The timeout of the transactions these tests let the coordinator abort.
SHORT_TRANSACTION_MS = 2000
VERIFICATION = "transaction.partition.verification.enable"

EMBEDDED = "embedded"
KAFKA_4 = "4.4.0"
KAFKA_3 = "3.9.2"


@pytest.fixture(scope="module")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    args = [*FAST_BROKER_ARGS, "--transaction-abort-check-interval-ms", str(ABORT_CHECK_MS)]
    with BrokerProcess(tmp_path_factory.mktemp("embedded") / "data", extra_args=args) as broker:
        yield broker


def _apache_kafka(tmp_path_factory: pytest.TempPathFactory, version: str) -> Iterator[ApacheKafka]:
    settings = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": str(ABORT_CHECK_MS)}
    with ApacheKafka(tmp_path_factory.mktemp(f"kafka-{version}"), version, settings=settings) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def kafka_4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    yield from _apache_kafka(tmp_path_factory, KAFKA_4)


@pytest.fixture(scope="module")
def kafka_3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    yield from _apache_kafka(tmp_path_factory, KAFKA_3)


_FIXTURES = {EMBEDDED: "embedded_broker", KAFKA_4: "kafka_4", KAFKA_3: "kafka_3"}


def _cluster(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(_FIXTURES[request.param])


@pytest.fixture(params=[EMBEDDED, KAFKA_4, KAFKA_3])
def any_kafka(request: pytest.FixtureRequest) -> Any:
    return _cluster(request)


class ClientLog:
    """librdkafka's debug log of one client, as the lines it wrote (served by poll/flush)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"librdkafka-{time.monotonic_ns()}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        handler = logging.Handler()
        handler.emit = lambda record: self.lines.append(record.getMessage())  # type: ignore[method-assign]
        self.logger.addHandler(handler)

    def sent_versions(self, request: str) -> set[int]:
        """The versions of every ``request`` (e.g. ``EndTxnRequest``) the client sent."""
        return {int(v) for v in re.findall(rf"Sent {request} \(v(\d+),", "\n".join(self.lines))}

    def advertised_max(self, api: str) -> int:
        """The highest version of ``api`` the broker advertised in its ApiVersions response."""
        found = re.findall(rf"ApiKey {api} \(\d+\) Versions \d+\.\.(\d+)", "\n".join(self.lines))
        assert found, f"no ApiVersions entry for {api} in the client's log"
        return int(found[0])

    def producer_ids(self) -> list[tuple[int, int]]:
        """(producer id, epoch) of each InitProducerId answer the client accepted."""
        acquired = re.findall(r"Acquired PID\{Id:(\d+),Epoch:(\d+)\}", "\n".join(self.lines))
        return [(int(pid), int(epoch)) for pid, epoch in acquired]


def _producer(kafka: Any, transactional_id: str, log: ClientLog | None = None, **settings: Any) -> Producer:
    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "transactional.id": transactional_id,
    }
    if log is not None:
        config.update({"debug": "protocol,eos,feature", "logger": log.logger})
    config.update(settings)
    return Producer(config)


def _fatal_error(raised: BaseException) -> KafkaError:
    """The KafkaError of a fatal error confluent-kafka raised from flush() or poll(). With a delivery
    callback configured (as the sink configures one) it surfaces as a SystemError whose cause is the
    KafkaException."""
    error = raised if isinstance(raised, KafkaException) else raised.__cause__
    assert isinstance(error, KafkaException), f"not a Kafka error: {raised!r}"
    return error.args[0]


def _finalized_transaction_version(kafka: ApacheKafka) -> int | None:
    """``transaction.version``'s finalized level, as kafka-features describe prints it (None when the
    cluster does not list the feature)."""
    described = subprocess.run(
        kafka._java(
            "org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", kafka.bootstrap_servers, "describe"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "metadata.version" in described, described
    found = re.search(r"Feature: transaction\.version\s.*?FinalizedVersionLevel: (\d+)", described)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize(
    ("version", "transaction_version", "end_txn_max", "produce_max"),
    [(KAFKA_4, 2, 5, 13), (KAFKA_3, None, 4, 11)],
)
def test_librdkafka_speaks_transaction_version_1_to_kafka_4_and_3(
    request: pytest.FixtureRequest,
    topic_name: str,
    version: str,
    transaction_version: int | None,
    end_txn_max: int,
    produce_max: int,
) -> None:
    """Kafka 4.4.0 finalizes transaction version 2 and advertises EndTxn v5 and Produce v12+; 3.9.2
    has no finalized transaction.version. librdkafka sends the same version 1 requests to both, so
    the epoch stays the same across the transactions of one producer and only a new instance bumps
    it (which a version 2 client would see at every commit)."""
    kafka: ApacheKafka = request.getfixturevalue(_FIXTURES[version])
    assert _finalized_transaction_version(kafka) == transaction_version
    create_topic(kafka.bootstrap_servers, topic_name)
    transactional_id = f"tv-{topic_name}"
    log = ClientLog()
    first = _producer(kafka, transactional_id, log)
    first.init_transactions(30)
    for value in (b"one", b"two"):
        first.begin_transaction()
        first.produce(topic_name, value=value)
        first.commit_transaction(30)
    first.poll(0)

    assert log.advertised_max("EndTxn") == end_txn_max
    assert log.advertised_max("Produce") >= produce_max
    assert log.advertised_max("AddPartitionsToTxn") == 5
    assert log.sent_versions("InitProducerIdRequest") == {4}
    assert log.sent_versions("AddPartitionsToTxnRequest") == {0}
    assert log.sent_versions("ProduceRequest") == {10}
    assert log.sent_versions("EndTxnRequest") == {1}

    second_log = ClientLog()
    second = _producer(kafka, transactional_id, second_log)
    second.init_transactions(30)
    second.begin_transaction()
    second.produce(topic_name, value=b"three")
    second.commit_transaction(30)
    second.poll(0)
    [(producer_id, epoch)] = log.producer_ids()
    assert second_log.producer_ids() == [(producer_id, epoch + 1)]

    # The log as the broker wrote it: both transactions of the first instance, their records and
    # their COMMIT markers, carry one epoch; the second instance's, the next.
    assert wait_until(lambda: len(read_to_end(kafka.bootstrap_servers, topic_name)) == 3, timeout_s=30)
    dumped = kafka.dump_log(topic_name)
    batches = re.findall(r"producerId: (\d+) producerEpoch: (\d+) .*?isControl: (\w+)", dumped)
    expected = [(producer_id, e, c) for e in (epoch, epoch, epoch + 1) for c in ("false", "true")]
    assert [(int(p), int(e), c) for p, e, c in batches] == expected, dumped
    assert dumped.count("endTxnMarker: COMMIT") == 3


def test_a_zombie_is_fenced_at_commit(any_kafka: Any, topic_name: str) -> None:
    """A new instance's InitProducerId aborts the open transaction of the old one and bumps the
    epoch (twice, as there was a transaction open): the old instance's commit fails fatally
    (fenced) and its record stays aborted."""
    create_topic(any_kafka.bootstrap_servers, topic_name)
    transactional_id = f"zombie-{topic_name}"
    zombie_log, successor_log = ClientLog(), ClientLog()
    zombie = _producer(any_kafka, transactional_id, zombie_log)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic_name, value=b"zombie")
    zombie.flush(30)  # serves the client's log too

    successor = _producer(any_kafka, transactional_id, successor_log)
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic_name, value=b"successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(10)
    error = raised.value.args[0]
    assert error.fatal() and error.code() == KafkaError._FENCED
    successor.poll(0)
    # Two bumps: the coordinator fences the open transaction's epoch and aborts it with that epoch
    # (answering CONCURRENT_TRANSACTIONS), and the client's retried InitProducerId bumps once more.
    [(producer_id, epoch)] = zombie_log.producer_ids()
    assert successor_log.producer_ids() == [(producer_id, epoch + 2)]
    # The COMMIT marker may land just after the commit returned: until then the LSO holds the record.
    assert wait_until(
        lambda: values(read_to_end(any_kafka.bootstrap_servers, topic_name)) == [b"successor"], timeout_s=30
    )


def test_a_zombie_is_fenced_on_produce(any_kafka: Any, topic_name: str) -> None:
    """A zombie writing on to a partition already in its transaction sends Produce straight to the
    leader, which knows the bumped epoch from the ABORT marker the new instance's InitProducerId
    wrote: the batch is refused (INVALID_PRODUCER_EPOCH) and the client turns fatal (fenced)."""
    create_topic(any_kafka.bootstrap_servers, topic_name)
    transactional_id = f"zombie-{topic_name}"
    delivered: list[KafkaError | None] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        delivered.append(error)

    zombie = _producer(any_kafka, transactional_id, on_delivery=on_delivery)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic_name, value=b"before")
    zombie.flush(30)
    _producer(any_kafka, transactional_id).init_transactions(30)

    zombie.produce(topic_name, value=b"after")
    with pytest.raises((KafkaException, SystemError)) as raised:
        zombie.flush(30)
    error = _fatal_error(raised.value)
    assert error.fatal() and error.code() == KafkaError._FENCED
    assert [e.code() if e else None for e in delivered] == [None, KafkaError.INVALID_PRODUCER_EPOCH]
    # The sink tells the task's failure in its own words, whichever form the client raised.
    writer = KafkaStreamWriter(SinkOptions.parse({"kafka.bootstrap.servers": any_kafka.bootstrap_servers}))
    explained = writer._explain(kafka_exception_of(raised.value), transactional_id)
    assert isinstance(explained, ProducerFencedError)
    assert "was fenced by a newer producer" in str(explained)
    with pytest.raises(KafkaException) as committed:
        zombie.commit_transaction(10)
    assert committed.value.args[0].code() == KafkaError._FENCED
    assert read_to_end(any_kafka.bootstrap_servers, topic_name) == []


def _raw_produce(
    kafka: Any, transactional_id: str, topic: str, partition: int, producer: tuple[int, int], sequence: int
) -> int:
    """One transactional batch, as a late or retried Produce (v9, the verification path of version 1
    clients) would carry it; the error code of the answer."""
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    producer_id, epoch = producer
    batch = encode_batch(
        [Record(0, int(time.time() * 1000), b"k", b"late")],
        base_offset=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=True,
    )
    entry = ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)
    request = ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[entry])],
    )
    with RawConnection(int(kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)[1])) as connection:
        answer = connection.roundtrip(request, ProduceResponse, 9)
    return int(answer.responses[0].partition_responses[0].error_code)


def _offsets(kafka: Any, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of a partition."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    wanted = TopicPartition(topic, partition)
    committed = admin.list_offsets(
        {wanted: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED
    )
    uncommitted = admin.list_offsets({wanted: OffsetSpec.latest()})
    return committed[wanted].result().offset, uncommitted[wanted].result().offset


def _timed_out_transaction(kafka: Any, topic: str, transactional_id: str) -> tuple[Producer, tuple[int, int]]:
    """A producer whose transaction (one record in partition 0 of ``topic``) the coordinator aborted
    for its timeout; with the producer id and epoch it wrote with."""
    log = ClientLog()
    writer = _producer(
        kafka,
        transactional_id,
        log,
        **{"transaction.timeout.ms": SHORT_TRANSACTION_MS, "message.timeout.ms": SHORT_TRANSACTION_MS},
    )
    writer.init_transactions(30)
    writer.begin_transaction()
    before_the_transaction = time.monotonic()
    writer.produce(topic, value=b"in time", partition=0)
    writer.flush(30)
    [producer] = log.producer_ids()
    offsets = _offsets(kafka, topic, 0)
    if time.monotonic() - before_the_transaction < SHORT_TRANSACTION_MS / 1000:
        # Read before the timeout could expire: it must be open and hold read_committed readers at 0.
        assert offsets == (0, 1)
    else:
        # A loaded machine took longer than the timeout: the transaction may already be aborted.
        assert offsets in {(0, 1), (2, 2)}
    assert wait_until(lambda: _offsets(kafka, topic, 0) == (2, 2), timeout_s=30)  # the ABORT marker
    return writer, producer


def test_a_late_write_after_a_timeout_abort_opens_no_hanging_transaction(
    any_kafka: Any, topic_name: str
) -> None:
    """The coordinator aborts a timed-out transaction with a bumped epoch. A late write of the old
    producer is refused both where its transaction wrote (the partition saw the ABORT marker's
    epoch) and where it had not (the leader asks the coordinator: partition verification), so no
    partition's last stable offset is held by a transaction nobody will end. The same holds after a
    commit, where a version 1 client keeps its epoch: only verification refuses the stray batch."""
    create_topic(any_kafka.bootstrap_servers, topic_name, partitions=2)
    transactional_id = f"late-{topic_name}"
    writer, producer = _timed_out_transaction(any_kafka, topic_name, transactional_id)

    assert (
        _raw_produce(any_kafka, transactional_id, topic_name, 0, producer, 1)
        == ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert (
        _raw_produce(any_kafka, transactional_id, topic_name, 1, producer, 0)
        == ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert _offsets(any_kafka, topic_name, 1) == (0, 0)
    with pytest.raises(KafkaException) as raised:
        writer.commit_transaction(10)
    assert raised.value.args[0].code() == KafkaError._FENCED

    log = ClientLog()
    successor = _producer(any_kafka, transactional_id, log)
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic_name, value=b"committed", partition=0)
    successor.commit_transaction(30)
    successor.poll(0)
    [committed_with] = log.producer_ids()
    assert committed_with == (producer[0], producer[1] + 2)  # the timeout's bump and this instance's
    assert wait_until(lambda: _offsets(any_kafka, topic_name, 0) == (4, 4), timeout_s=30)
    assert (
        _raw_produce(any_kafka, transactional_id, topic_name, 1, committed_with, 0)
        == ErrorCode.INVALID_TXN_STATE
    )
    assert _offsets(any_kafka, topic_name, 1) == (0, 0)


def test_without_partition_verification_a_late_write_hangs_the_partition(
    kafka_4: ApacheKafka, topic_name: str
) -> None:
    """What the sink relies on: with the broker's verification turned off (it is on by default),
    the same late write of a version 1 producer to a partition its aborted transaction never
    reached is appended and opens a transaction no coordinator knows of. The partition's last stable
    offset stays behind it, past the transaction timeout and other producers' commits, so every
    read_committed reader of the partition stops there; and the next transaction of the same
    transactional id (the sink's retry) that writes to that partition commits the stray record."""
    admin = AdminClient({"bootstrap.servers": kafka_4.bootstrap_servers})

    def set_verification(operation: Any, value: str) -> None:
        entry = ConfigEntry(VERIFICATION, value, incremental_operation=operation)
        resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
        admin.incremental_alter_configs([resource])[resource].result(30)

    def verification() -> str | None:
        """The setting as the broker applies it (DescribeConfigs answers from the broker's own
        current configuration)."""
        resource = ConfigResource(ResourceType.BROKER, "1")
        entries = admin.describe_configs([resource])[resource].result(30)
        return entries[VERIFICATION].value

    create_topic(kafka_4.bootstrap_servers, topic_name, partitions=2)
    transactional_id = f"hanging-{topic_name}"
    set_verification(AlterConfigOpType.SET, "false")
    try:
        assert wait_until(lambda: verification() == "false", timeout_s=30), "the broker kept verifying"
        _writer, producer = _timed_out_transaction(kafka_4, topic_name, transactional_id)
        # Where the aborted transaction wrote, the epoch still refuses the late batch.
        assert (
            _raw_produce(kafka_4, transactional_id, topic_name, 0, producer, 1)
            == ErrorCode.INVALID_PRODUCER_EPOCH
        )
        assert _raw_produce(kafka_4, transactional_id, topic_name, 1, producer, 0) == ErrorCode.NONE
    finally:
        set_verification(AlterConfigOpType.DELETE, "")

    def commit_to_partition_1(with_id: str, value: bytes) -> None:
        writer = _producer(kafka_4, with_id)
        writer.init_transactions(30)
        writer.begin_transaction()
        writer.produce(topic_name, value=value, partition=1)
        writer.commit_transaction(30)

    commit_to_partition_1(f"other-{topic_name}", b"other")
    # A witness: another transaction timed out and aborted by the coordinator's periodic check, which
    # has run since the stray write (a "still stuck" read before it ran would prove nothing).
    witness_topic = f"{topic_name}-witness"
    create_topic(kafka_4.bootstrap_servers, witness_topic, partitions=1)
    _timed_out_transaction(kafka_4, witness_topic, f"witness-{topic_name}")
    assert _offsets(kafka_4, topic_name, 1) == (0, 3)
    assert read_to_end(kafka_4.bootstrap_servers, topic_name, partitions=2) == []

    commit_to_partition_1(transactional_id, b"retry")
    assert wait_until(lambda: _offsets(kafka_4, topic_name, 1) == (5, 5), timeout_s=30)
    committed = read_to_end(kafka_4.bootstrap_servers, topic_name, partitions=2)
    assert values(committed) == [b"late", b"other", b"retry"]
