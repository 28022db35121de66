"""Mutated requests, derived from what confluent-kafka clients really send, against a broker process:
it never crashes or hangs, answers or closes every connection in time, keeps its memory, and serves
a real client afterwards (benchmarks/fuzz.py; longer runs: ``python -m benchmarks.fuzz``)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from benchmarks import fuzz
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from tests.integration.raw_kafka import RawConnection

SEED = 20_260_528
CASES = 5_000
MAX_RSS_GROWTH_MIB = 100


def test_a_few_thousand_mutated_requests_neither_crash_nor_hang_the_broker(tmp_path: Path) -> None:
    corpus = fuzz.capture_corpus()
    assert len(corpus) >= 20, "the clients' requests were not recorded"
    with fuzz.fuzz_target(tmp_path / "data") as broker:
        report = fuzz.fuzz(broker, corpus, seed=SEED, cases=CASES, seconds=45, case_timeout_s=5)
        print(report.summary())
        assert report.findings == []
        assert report.cases >= 1_000, report.summary()
        assert report.rss_growth_mib < MAX_RSS_GROWTH_MIB, report.summary()


def test_a_transactional_batch_with_a_broken_length_is_a_corrupt_message(tmp_path: Path) -> None:
    """Found by the fuzzer: the transaction check read the batch header before validation, and its
    error closed the connection unanswered. Kafka answers CORRUPT_MESSAGE for the partition."""
    batch = bytearray(
        encode_batch(
            [Record(0, int(time.time() * 1000), None, b"v")],
            base_offset=0,
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
    )
    struct.pack_into(">i", batch, 8, 9)  # batchLength below a header's
    partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
    request = ProduceRequest(
        transactional_id="txn",
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=fuzz.FUZZ_TOPIC, partition_data=[partition_class(index=0, records=bytes(batch))]
            )
        ],
    )
    with fuzz.fuzz_target(tmp_path / "data") as broker, RawConnection(broker.port) as connection:
        response = connection.roundtrip(request, ProduceResponse, version=9)
        answer = response.responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
        again = connection.roundtrip(request, ProduceResponse, version=9)  # the connection stays open
        assert again.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
