"""Error paths of sparkafka.broker.handlers.data's Produce: a request with an acks value Kafka does not
know is refused per partition, over the wire of a real broker, and nothing is appended."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from sparkafka.broker.runner import BrokerProcess

PRODUCE_VERSION = 8


@pytest.fixture
def debug_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # DEBUG: the broker logs the reason of each refused partition there, and only there.
    with BrokerProcess(tmp_path / "data", extra_args=["--log-level", "DEBUG"]) as process:
        admin = AdminClient({"bootstrap.servers": process.bootstrap_servers})
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(timeout=30)
        yield process


def produce(broker: BrokerProcess, acks: int, correlation_id: int) -> Any:
    """One Produce v8 of a one-record batch to orders-0; the decoded partition response."""
    topic_class = ProduceRequest.TopicProduceData
    batch = encode_batch([Record(0, 1_700_000_000_000, b"key", b"value")], base_offset=0)
    request = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[
            topic_class(
                name="orders", partition_data=[topic_class.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    request.with_header(correlation_id=correlation_id, client_id="acks-test")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as connection:
        connection.sendall(bytes(request.encode(version=PRODUCE_VERSION, header=True, framed=True)))
        reader = connection.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        frame = reader.read(size)
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    response = ProduceResponse.decode(frame[4:], version=PRODUCE_VERSION)
    return response.responses[0].partition_responses[0]


def test_a_produce_with_acks_2_is_refused_as_invalid_required_acks(debug_broker: BrokerProcess) -> None:
    refused = produce(debug_broker, acks=2, correlation_id=1)
    # As Kafka: the code alone, no custom message, no offsets.
    assert (refused.error_code, refused.error_message, refused.base_offset) == (
        ErrorCode.INVALID_REQUIRED_ACKS,
        None,
        -1,
    )
    assert (
        "produce to orders-0 rejected: acks=2 is invalid; use -1 (all), 0 or 1"
        in debug_broker.log_path.read_text()
    )
    accepted = produce(debug_broker, acks=-1, correlation_id=2)
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.NONE, 0)  # the refused one left nothing
