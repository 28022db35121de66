"""Conformance of the broker's transactions, driven by librdkafka (confluent-kafka)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.harness import wait_until
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import (
    create_topic,
    open_transaction,
    producer,
    read_all,
    read_to_end,
    transactional_producer,
    values,
)
from tests.integration.raw_kafka import RawConnection


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's cluster: the embedded broker, then Apache Kafka (``kafka`` in conftest): the same
    assertions hold for both, or the embedded broker is wrong."""
    return kafka


def test_committed_transaction_visible_to_read_committed(broker: Any, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    producer = transactional_producer(broker.bootstrap_servers, f"tx-{topic_name}")
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic_name, value=f"v{i}".encode())
    producer.commit_transaction(30)

    committed = read_all(broker.bootstrap_servers, topic_name, expect=5)
    assert values(committed) == [f"v{i}".encode() for i in range(5)]


def test_aborted_records_hidden_from_read_committed_only(broker: Any, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    producer = transactional_producer(broker.bootstrap_servers, f"tx-{topic_name}")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"aborted")
    producer.flush(10)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"committed")
    producer.commit_transaction(30)

    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"committed"]
    assert values(read_all(broker.bootstrap_servers, topic_name, isolation="read_uncommitted", expect=2)) == [
        b"aborted",
        b"committed",
    ]


def test_open_transaction_holds_read_committed_at_lso(broker: Any, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    plain = transactional_producer(broker.bootstrap_servers, f"tx-a-{topic_name}")
    plain.init_transactions(30)
    plain.begin_transaction()
    plain.produce(topic_name, value=b"before")
    plain.commit_transaction(30)

    open_txn = open_transaction(broker.bootstrap_servers, f"tx-b-{topic_name}", topic_name, b"pending")

    for isolation, expected_end in (("read_uncommitted", 3), ("read_committed", 2)):
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": "lso-check",
                "isolation.level": isolation,
            }
        )
        # High watermark after data, COMMIT marker and pending data; the LSO stops at the pending record.
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, expected_end)
        consumer.close()
    assert values(read_all(broker.bootstrap_servers, topic_name, timeout_s=3)) == [b"before"]
    assert values(read_all(broker.bootstrap_servers, topic_name, isolation="read_uncommitted", expect=2)) == [
        b"before",
        b"pending",
    ]
    open_txn.commit_transaction(30)
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=2)) == [b"before", b"pending"]


def test_reinit_aborts_open_transaction_and_fences_zombie(broker: Any, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    transactional_id = f"tx-{topic_name}"
    zombie = transactional_producer(broker.bootstrap_servers, transactional_id)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic_name, value=b"zombie")
    zombie.flush(10)

    successor = transactional_producer(broker.bootstrap_servers, transactional_id)
    successor.init_transactions(30)  # aborts the zombie's transaction and bumps the epoch
    successor.begin_transaction()
    successor.produce(topic_name, value=b"successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(10)
    assert raised.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )

    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"successor"]
    assert values(read_all(broker.bootstrap_servers, topic_name, isolation="read_uncommitted", expect=2)) == [
        b"zombie",
        b"successor",
    ]


def test_transaction_timeout_above_broker_maximum_is_rejected(broker: Any) -> None:
    producer = transactional_producer(
        broker.bootstrap_servers, "tx-too-long", transaction_timeout_ms=3_600_000, message_timeout_ms=300_000
    )
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(30)
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_broker_aborts_transaction_after_its_timeout(tmp_path, topic_name: str) -> None:
    args = ["--group-initial-rebalance-delay-ms", "0", "--transaction-abort-check-interval-ms", "200"]
    with BrokerProcess(tmp_path / "data", extra_args=args) as short_broker:
        create_topic(short_broker.bootstrap_servers, topic_name)
        producer = transactional_producer(
            short_broker.bootstrap_servers,
            f"tx-{topic_name}",
            transaction_timeout_ms=1500,
            message_timeout_ms=1500,
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic_name, value=b"expires")
        producer.flush(10)
        started = time.monotonic()
        # The broker aborts it (ABORT marker), so read_committed readers are no longer held back.
        consumer = Consumer(
            {
                "bootstrap.servers": short_broker.bootstrap_servers,
                "group.id": "g",
                "isolation.level": "read_committed",
            }
        )
        try:
            # The data record and the ABORT marker: the LSO reached the log end.
            assert wait_until(
                lambda: consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)[1] == 2,
                timeout_s=60,
            )
        finally:
            consumer.close()
        assert time.monotonic() - started >= 1.0  # not before its timeout (1.5 s from its first record)
        assert read_to_end(short_broker.bootstrap_servers, topic_name) == []
        with pytest.raises(KafkaException):
            producer.commit_transaction(10)


def test_offsets_sent_to_transaction_are_visible_only_after_commit(broker: Any, topic_name: str) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    group = f"g-{topic_name}"
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False}
    )
    producer = transactional_producer(broker.bootstrap_servers, f"tx-{topic_name}")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"x")
    producer.send_offsets_to_transaction(
        [TopicPartition(topic_name, 0, 42)], consumer.consumer_group_metadata(), 30
    )
    # KIP-447: a read_committed consumer's OffsetFetch asks for stable offsets and is told
    # UNSTABLE_OFFSET_COMMIT (librdkafka retries until its timeout) while the commit is pending...
    with pytest.raises(KafkaException) as pending:
        consumer.committed([TopicPartition(topic_name, 0)], timeout=2)
    assert pending.value.args[0].code() == KafkaError._TIMED_OUT
    # ...while a read_uncommitted consumer sees the last committed offset: none yet.
    uncommitted_view = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "isolation.level": "read_uncommitted",
        }
    )
    assert uncommitted_view.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset < 0
    uncommitted_view.close()
    producer.commit_transaction(30)
    assert consumer.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset == 42
    consumer.close()


def test_broker_sigkill_mid_transaction_loses_nothing(fresh_broker: Any, topic_name: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name)
    committer = transactional_producer(fresh_broker.bootstrap_servers, f"tx-c-{topic_name}")
    committer.init_transactions(30)
    committer.begin_transaction()
    for i in range(100):
        committer.produce(topic_name, value=f"c{i}".encode())
    committer.commit_transaction(30)
    pending = transactional_producer(fresh_broker.bootstrap_servers, f"tx-p-{topic_name}")
    pending.init_transactions(30)
    pending.begin_transaction()
    pending.produce(topic_name, value=b"pending")
    pending.flush(10)

    fresh_broker.kill()
    fresh_broker.start()

    expected = [f"c{i}".encode() for i in range(100)]
    # The transaction open at the crash is still open after recovery: it holds read_committed back.
    assert values(read_all(fresh_broker.bootstrap_servers, topic_name, expect=100)) == expected
    assert (
        values(
            read_all(fresh_broker.bootstrap_servers, topic_name, isolation="read_uncommitted", expect=101)
        )[-1]
        == b"pending"
    )
    # A new instance of the transactional id aborts it.
    successor = transactional_producer(fresh_broker.bootstrap_servers, f"tx-p-{topic_name}")
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic_name, value=b"after")
    successor.commit_transaction(30)
    assert values(read_all(fresh_broker.bootstrap_servers, topic_name, expect=101)) == [*expected, b"after"]


def _list_offsets(
    broker: Any,
    topic: str,
    timestamp: int,
    *,
    read_committed: bool,
    version: int = 7,
    twice: bool = False,
) -> list[tuple[int, int, int, int]]:
    """(error code, timestamp, offset, leader epoch) per partition entry of one raw ListOffsets request."""
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

    topic_class = ListOffsetsRequest.ListOffsetsTopic
    wanted = [
        topic_class.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
    ]
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=1 if read_committed else 0,
        topics=[topic_class(name=topic, partitions=wanted * (2 if twice else 1))],
    )
    with RawConnection(broker.port) as connection:
        response = connection.roundtrip(request, ListOffsetsResponse, version)
    return [(p.error_code, p.timestamp, p.offset, p.leader_epoch) for p in response.topics[0].partitions]


def test_list_offsets_max_timestamp_stops_at_the_last_stable_offset(broker: Any, topic_name: str) -> None:
    """Kafka's Partition.fetchOffsetForTimestamp: MAX_TIMESTAMP (-3, ListOffsets v7+, KIP-734) answers
    only offsets below the last fetchable offset, the last stable offset for read_committed."""
    max_timestamp = -3
    create_topic(broker.bootstrap_servers, topic_name)
    base = int(time.time() * 1000)
    writer = transactional_producer(broker.bootstrap_servers, f"tx-{topic_name}")
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(topic_name, value=b"committed", partition=0, timestamp=base)
    writer.commit_transaction(30)
    writer.begin_transaction()
    writer.produce(topic_name, value=b"open", partition=0, timestamp=base + 60_000)
    writer.flush(30)
    try:
        # The newest timestamp is in the open transaction, at offset 2 (the commit marker is at 1).
        assert _list_offsets(broker, topic_name, max_timestamp, read_committed=False) == [
            (0, base + 60_000, 2, 0)
        ]
        assert _list_offsets(broker, topic_name, max_timestamp, read_committed=True) == [(0, -1, -1, -1)]
        assert _list_offsets(broker, topic_name, max_timestamp, read_committed=False, version=6) == [
            (ErrorCode.UNSUPPORTED_VERSION, -1, -1, -1)
        ]
        assert (
            _list_offsets(broker, topic_name, -1, read_committed=True, twice=True)
            == [(ErrorCode.INVALID_REQUEST, -1, -1, -1)]  # ReplicaManager.fetchOffset: once per partition
        )
    finally:
        writer.abort_transaction(30)
    # Apache Kafka answers EndTxn before it writes the ABORT marker: wait until read_committed
    # readers are no longer held back (the marker at offset 3 is written).
    assert wait_until(
        lambda: _list_offsets(broker, topic_name, -1, read_committed=True) == [(0, -1, 4, 0)], timeout_s=30
    )
    # As in Kafka, the answer comes from the log's timestamps, aborted records included.
    assert _list_offsets(broker, topic_name, max_timestamp, read_committed=True) == [(0, base + 60_000, 2, 0)]


def test_list_offsets_special_timestamps_of_tiered_storage_answer_as_kafka_without_it(
    broker: Any, topic_name: str
) -> None:
    """Kafka's UnifiedLog.fetchOffsetByTimestamp on a broker without remote storage: EARLIEST_LOCAL
    (-4, v8+) is the log start; LATEST_TIERED (-5, v9+) and EARLIEST_PENDING_UPLOAD (-6, v11+) find
    nothing (offset -1, epoch -1). Below those versions, and for any other negative timestamp, the
    partition is UNSUPPORTED_VERSION (ReplicaManager.timestampMinSupportedVersion), checked before
    the partition exists."""
    create_topic(broker.bootstrap_servers, topic_name)
    writer = producer(broker.bootstrap_servers)
    for _ in range(3):
        writer.produce(topic_name, value=b"v", partition=0)
    assert writer.flush(30) == 0
    unsupported = (ErrorCode.UNSUPPORTED_VERSION, -1, -1, -1)
    answers = {
        (timestamp, version): _list_offsets(
            broker, topic_name, timestamp, read_committed=True, version=version
        )
        for timestamp, version in [(-4, 7), (-4, 8), (-5, 8), (-5, 9), (-6, 10), (-6, 11), (-7, 11), (-2, 10)]
    }
    assert answers == {
        (-4, 7): [unsupported],
        (-4, 8): [(0, -1, 0, 0)],
        (-5, 8): [unsupported],
        (-5, 9): [(0, -1, -1, -1)],
        (-6, 10): [unsupported],
        (-6, 11): [(0, -1, -1, -1)],
        (-7, 11): [unsupported],
        (-2, 10): [(0, -1, 0, 0)],
    }
    assert _list_offsets(broker, f"never-{topic_name}", -4, read_committed=True, version=7) == [unsupported]


def test_list_transactions_duration_filter_keeps_longer_running_ones(broker: Any, topic_name: str) -> None:
    """KIP-994, as Kafka's TransactionStateManager: with a duration filter, only transactions running
    for longer than it; an id that never started one counts as running since the epoch."""
    from kafka.protocol.admin import ListTransactionsRequest, ListTransactionsResponse

    create_topic(broker.bootstrap_servers, topic_name)
    idle = transactional_producer(broker.bootstrap_servers, f"idle-{topic_name}")
    idle.init_transactions(30)
    running = open_transaction(broker.bootstrap_servers, f"open-{topic_name}", topic_name, b"open")
    try:

        def listed(duration_ms: int) -> set[str]:
            request = ListTransactionsRequest(
                state_filters=[], producer_id_filters=[], duration_filter=duration_ms
            )
            with RawConnection(broker.port) as connection:
                response = connection.roundtrip(request, ListTransactionsResponse, 1)
            mine = {f"idle-{topic_name}", f"open-{topic_name}"}
            return {s.transactional_id for s in response.transaction_states} & mine

        assert listed(-1) == {f"idle-{topic_name}", f"open-{topic_name}"}
        assert listed(0) == {f"idle-{topic_name}", f"open-{topic_name}"}
        assert listed(3_600_000) == {f"idle-{topic_name}"}
    finally:
        running.abort_transaction(30)


def test_describe_transactions_and_producers_answer_as_kafka(broker: Any, topic_name: str) -> None:
    """Kafka's TransactionCoordinator.handleDescribeTransactions (an unknown id: the error and the
    schema's zeros; an empty id: INVALID_REQUEST) and ProducerAppendInfo.appendEndTxnMarker (a marker
    sets the producer's last timestamp, which DescribeProducers reports)."""
    from kafka.protocol.admin import (
        DescribeProducersRequest,
        DescribeProducersResponse,
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
    )

    create_topic(broker.bootstrap_servers, topic_name)
    sender = transactional_producer(broker.bootstrap_servers, f"described-{topic_name}")
    sender.init_transactions(30)
    sender.begin_transaction()
    sender.produce(topic_name, value=b"v", partition=0, timestamp=1000)  # an old CreateTime
    before_commit_ms = int(time.time() * 1000)
    sender.commit_transaction(30)
    with RawConnection(broker.port) as connection:
        described = connection.roundtrip(
            DescribeTransactionsRequest(transactional_ids=[f"never-{topic_name}", ""]),
            DescribeTransactionsResponse,
            0,
        )
        wanted = DescribeProducersRequest.TopicRequest
        producers = connection.roundtrip(
            DescribeProducersRequest(
                topics=[
                    wanted(name=topic_name, partition_indexes=[0, 7]),
                    wanted(name=f"never-{topic_name}", partition_indexes=[0]),
                    wanted(name="bad/name", partition_indexes=[0]),
                ]
            ),
            DescribeProducersResponse,
            0,
        )
    assert [
        (s.error_code, s.transaction_start_time_ms, s.producer_id, s.producer_epoch)
        for s in described.transaction_states
    ] == [(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, 0, 0, 0), (ErrorCode.INVALID_REQUEST, 0, 0, 0)]
    (state,) = producers.topics[0].partitions[0].active_producers
    # Kafka's handleDescribeProducersRequest: its messages, or none, for each kind of missing partition.
    assert [(p.error_code, p.error_message) for t in producers.topics for p in t.partitions][1:] == [
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition."),
        (
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            "Topic name is invalid: 'bad/name' contains one or more characters other than ASCII "
            "alphanumerics, '.', '_' and '-'",
        ),
    ]
    assert state.last_timestamp >= before_commit_ms  # the COMMIT marker's, not the record's 1000


def _raw_transactional_producer(connection: RawConnection, transactional_id: str) -> tuple[int, int]:
    """InitProducerId as a client sends it: after FindCoordinator, retrying the retriable errors (Apache
    Kafka creates its transaction state log when FindCoordinator first asks, then loads it)."""
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

    retriable = (
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    )
    find = FindCoordinatorRequest(key=transactional_id, key_type=1)
    request = InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
    )
    deadline = time.monotonic() + 30
    while True:
        found = connection.roundtrip(find, FindCoordinatorResponse, 3)
        response = (
            connection.roundtrip(request, InitProducerIdResponse, 4) if found.error_code == 0 else found
        )
        if response.error_code not in retriable or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.error_code == 0
    return response.producer_id, response.producer_epoch


def test_transactional_produce_is_verified_as_kafka_does(broker: Any, topic_name: str) -> None:
    """KafkaApis/ReplicaManager for transactional batches: no transactional id in the request refuses
    all of it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); a partition not in the transaction, even a
    retry after the commit, is INVALID_TXN_STATE with Kafka's text and no log start offset."""
    from kafka.protocol.producer import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        EndTxnRequest,
        EndTxnResponse,
        ProduceRequest,
        ProduceResponse,
    )

    from sparkafka.broker.record_builder import encode_batch
    from sparkafka.broker.records import Record

    create_topic(broker.bootstrap_servers, topic_name)
    transactional_id = f"verified-{topic_name}"
    with RawConnection(broker.port) as connection:
        producer_id, epoch = _raw_transactional_producer(connection, transactional_id)
        batch = encode_batch(
            [Record(0, int(time.time() * 1000), b"k", b"v")],
            base_offset=0,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )

        def produce(with_id: str | None) -> tuple[int, int, str | None]:
            partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
            request = ProduceRequest(
                transactional_id=with_id,
                acks=-1,
                timeout_ms=5000,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name=topic_name, partition_data=[partition_class(index=0, records=batch)]
                    )
                ],
            )
            # Apache Kafka verifies the partition with the transaction coordinator, and answers
            # NOT_LEADER_OR_FOLLOWER (retriable) while that coordinator is still loading, and
            # NOT_ENOUGH_REPLICAS naming CONCURRENT_TRANSACTIONS (retriable) while it completes the
            # transaction before (its COMMIT markers written, its state not Complete yet).
            for _ in range(100):
                answer = connection.roundtrip(request, ProduceResponse, 9).responses[0].partition_responses[0]
                completing = answer.error_code == ErrorCode.NOT_ENOUGH_REPLICAS and (
                    "CONCURRENT_TRANSACTIONS" in (answer.error_message or "")
                )
                if answer.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER and not completing:
                    break
                time.sleep(0.2)
            return answer.error_code, answer.log_start_offset, answer.error_message

        not_added = (ErrorCode.INVALID_TXN_STATE, -1, "Partition was not added to the transaction")
        assert produce(None) == (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, None)
        assert produce(transactional_id) == not_added
        assert produce(f"other-{topic_name}") == (ErrorCode.INVALID_PRODUCER_ID_MAPPING, -1, None)
        topic_class = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        added = connection.roundtrip(
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=transactional_id,
                v3_and_below_producer_id=producer_id,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[topic_class(name=topic_name, partitions=[0])],
            ),
            AddPartitionsToTxnResponse,
            3,
        )
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
        assert produce(transactional_id) == (ErrorCode.NONE, 0, None)
        assert produce(transactional_id) == (ErrorCode.NONE, 0, None)  # a retry within the transaction
        ended = connection.roundtrip(
            EndTxnRequest(
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=epoch,
                committed=True,
            ),
            EndTxnResponse,
            3,
        )
        assert ended.error_code == 0
        # Apache Kafka answers EndTxn before the COMMIT marker is in the partition; until then the
        # batch would still be a duplicate within the open transaction.
        assert wait_until(
            lambda: _list_offsets(broker, topic_name, -1, read_committed=True)[0][2] == 2, timeout_s=30
        )
        assert produce(transactional_id) == not_added  # the same batch once more, after the commit
    assert values(read_all(broker.bootstrap_servers, topic_name, expect=1)) == [b"v"]


def test_transactional_requests_are_checked_as_kafka_checks_them(broker: Any, topic_name: str) -> None:
    """InitProducerId with half a producer id/epoch is INVALID_REQUEST (KafkaApis); TxnOffsetCommit
    answers unknown partitions before the transaction's checks; DescribeTransactions lists the offsets
    partition AddOffsetsToTxn added; ListTransactions knows Kafka's every state name."""
    from kafka.protocol.admin import (
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
        ListTransactionsRequest,
        ListTransactionsResponse,
    )
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
    from kafka.protocol.producer import (
        AddOffsetsToTxnRequest,
        AddOffsetsToTxnResponse,
        InitProducerIdRequest,
        InitProducerIdResponse,
        TxnOffsetCommitRequest,
        TxnOffsetCommitResponse,
    )

    from sparkafka.broker.transactions import offsets_partition_for

    create_topic(broker.bootstrap_servers, topic_name)
    transactional_id, group = f"checked-{topic_name}", f"group-{topic_name}"
    with RawConnection(broker.port) as connection:
        producer_id, epoch = _raw_transactional_producer(connection, transactional_id)
        for half in ((producer_id, -1), (-1, epoch)):
            answer = connection.roundtrip(
                InitProducerIdRequest(
                    transactional_id=transactional_id,
                    transaction_timeout_ms=60_000,
                    producer_id=half[0],
                    producer_epoch=half[1],
                ),
                InitProducerIdResponse,
                4,
            )
            assert (answer.error_code, answer.producer_id) == (ErrorCode.INVALID_REQUEST, -1), half
        added = connection.roundtrip(
            AddOffsetsToTxnRequest(
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=epoch,
                group_id=group,
            ),
            AddOffsetsToTxnResponse,
            3,
        )
        assert added.error_code == 0

        def commit_offsets(producer_epoch: int, topics: list[str]) -> list[tuple[str, int]]:
            """Each topic's error (partition 0), in the answer's order: Kafka lists unknown topics first."""
            topic_class = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
            partition_class = topic_class.TxnOffsetCommitRequestPartition
            request = TxnOffsetCommitRequest(
                transactional_id=transactional_id,
                group_id=group,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                topics=[
                    topic_class(
                        name=name,
                        partitions=[
                            partition_class(
                                partition_index=0,
                                committed_offset=1,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                        ],
                    )
                    for name in topics
                ],
            )
            # Retriable, as for any client, which asks FindCoordinator again: Apache Kafka creates its
            # offsets topic when FindCoordinator first asks, and loads a new group's partition first.
            loading = (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.NOT_COORDINATOR,
            )
            for _ in range(100):
                connection.roundtrip(
                    FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse, 3
                )
                response = connection.roundtrip(request, TxnOffsetCommitResponse, 3)
                errors = [(t.name, p.error_code) for t in response.topics for p in t.partitions]
                if not {code for _, code in errors} & set(loading):
                    break
                time.sleep(0.2)
            return errors

        unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert commit_offsets(epoch + 1, [topic_name, "no-such-topic"]) == [
            ("no-such-topic", unknown),
            (topic_name, ErrorCode.INVALID_PRODUCER_EPOCH),
        ]
        assert commit_offsets(epoch + 1, ["no-such-topic"]) == [("no-such-topic", unknown)]
        assert commit_offsets(epoch, [topic_name, "no-such-topic"]) == [
            ("no-such-topic", unknown),
            (topic_name, ErrorCode.NONE),
        ]

        described = connection.roundtrip(
            DescribeTransactionsRequest(transactional_ids=[transactional_id]), DescribeTransactionsResponse, 0
        )
        (state,) = described.transaction_states
        assert state.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in state.topics] == [
            ("__consumer_offsets", [offsets_partition_for(group)])
        ]
        listed = connection.roundtrip(
            ListTransactionsRequest(
                state_filters=["Dead", "PrepareEpochFence", "Nonsense"], producer_id_filters=[]
            ),
            ListTransactionsResponse,
            0,
        )
        assert listed.unknown_state_filters == ["Nonsense"]


def test_idle_transactional_ids_expire_as_kafka_expires_them(tmp_path, topic_name: str) -> None:
    """transactional.id.expiration.ms: after a committed transaction and no change for that long, the
    id is unknown to DescribeTransactions and ListTransactions, also after a restart."""
    from kafka.protocol.admin import (
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
        ListTransactionsRequest,
        ListTransactionsResponse,
    )

    args = [
        "--transactional-id-expiration-ms",
        "1000",
        "--transactional-id-expiration-check-interval-ms",
        "200",
    ]
    transactional_id = f"expiring-{topic_name}"
    with BrokerProcess(tmp_path / "data", extra_args=args) as short_broker:
        create_topic(short_broker.bootstrap_servers, topic_name)
        writer = transactional_producer(short_broker.bootstrap_servers, transactional_id)
        writer.init_transactions(30)
        writer.begin_transaction()
        writer.produce(topic_name, value=b"kept")
        writer.commit_transaction(30)

        def known() -> tuple[int, bool]:
            with RawConnection(short_broker.port) as connection:
                described = connection.roundtrip(
                    DescribeTransactionsRequest(transactional_ids=[transactional_id]),
                    DescribeTransactionsResponse,
                    0,
                )
                listed = connection.roundtrip(
                    ListTransactionsRequest(state_filters=[], producer_id_filters=[]),
                    ListTransactionsResponse,
                    0,
                )
            return (
                described.transaction_states[0].error_code,
                transactional_id in {s.transactional_id for s in listed.transaction_states},
            )

        assert known() == (ErrorCode.NONE, True)
        deadline = time.monotonic() + 10
        while known() != (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, False) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert known() == (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, False)
        short_broker.terminate()
        short_broker.start()
        assert known() == (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, False)
        assert values(read_all(short_broker.bootstrap_servers, topic_name, expect=1)) == [b"kept"]


def _epoch_end_offsets(
    broker: Any, topic: str, leader_epoch: int, *, current_leader_epoch: int = -1, version: int = 4
) -> tuple[int, int, int]:
    """(error code, leader epoch, end offset) of partition 0 in one raw OffsetForLeaderEpoch request."""
    from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

    topic_class = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    wanted = topic_class.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current_leader_epoch, leader_epoch=leader_epoch
    )
    request = OffsetForLeaderEpochRequest(
        replica_id=-1, topics=[topic_class(topic=topic, partitions=[wanted])]
    )
    with RawConnection(broker.port) as connection:
        response = connection.roundtrip(request, OffsetForLeaderEpochResponse, version)
    answer = response.topics[0].partitions[0]
    return answer.error_code, answer.leader_epoch, answer.end_offset


def test_offset_for_leader_epoch_answers_as_kafkas_leader_epoch_cache(broker: Any, topic_name: str) -> None:
    """KIP-320, as a consumer (replica_id -1) asks it of a partition led since its creation in epoch
    0: that epoch ends at the log end offset; a later or undefined epoch has no end (-1, -1); a
    current leader epoch newer than the leader's is UNKNOWN_LEADER_EPOCH; an unknown partition is
    UNKNOWN_TOPIC_OR_PARTITION. The same from every version the broker offers."""
    create_topic(broker.bootstrap_servers, topic_name)
    writer = producer(broker.bootstrap_servers)
    for _ in range(3):
        writer.produce(topic_name, value=b"v", partition=0)
    assert writer.flush(30) == 0
    for version in (2, 3, 4):
        assert _epoch_end_offsets(broker, topic_name, 0, version=version) == (0, 0, 3)
        assert _epoch_end_offsets(broker, topic_name, 1, version=version) == (0, -1, -1)
        assert _epoch_end_offsets(broker, topic_name, -1, version=version) == (0, -1, -1)
    assert _epoch_end_offsets(broker, topic_name, 0, current_leader_epoch=0) == (0, 0, 3)
    assert _epoch_end_offsets(broker, topic_name, 0, current_leader_epoch=5) == (75, -1, -1)
    assert _epoch_end_offsets(broker, f"never-{topic_name}", 0) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        -1,
        -1,
    )
