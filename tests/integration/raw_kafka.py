"""Raw Kafka requests over a socket, for tests that need exact control of what goes on the wire."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record


class RawConnection:
    """One blocking connection that sends a request and reads its response, in order."""

    def __init__(self, port: int, *, timeout_s: float = 10.0) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self._correlation_id = 0

    def roundtrip(self, request: Any, response_class: Any, version: int) -> Any:
        self._correlation_id += 1
        request.with_header(correlation_id=self._correlation_id, client_id="sparkafka-tests")
        self._socket.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        answer = self.read_frame()
        response = response_class.decode(answer, version=version, header=True, framed=True)
        return response

    def send_frame(self, payload: bytes) -> None:
        """Send `payload` size-prefixed, without a request header (a raw SASL token)."""
        self._socket.sendall(struct.pack(">i", len(payload)) + payload)

    def closed_by_peer(self) -> bool:
        """Whether the broker closed the connection (reads nothing more; fails if it sends data)."""
        try:
            data = self._socket.recv(1 << 16)
        except ConnectionResetError:
            return True
        assert data == b"", f"expected the connection to be closed, got {data!r}"
        return True

    def read_frame(self) -> bytes:
        """One size-prefixed frame, size included."""
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = self._socket.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the broker closed the connection before answering")
            data += chunk
        return data

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def init_idempotent_producer(connection: RawConnection) -> tuple[int, int]:
    """InitProducerId without a transactional id: (producer id, epoch) of a new idempotent producer."""
    request = InitProducerIdRequest(
        transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
    )
    response = connection.roundtrip(request, InitProducerIdResponse, version=4)
    assert response.error_code == 0, f"InitProducerId failed with error {response.error_code}"
    return response.producer_id, response.producer_epoch


def idempotent_batch(values: list[bytes], *, producer_id: int, epoch: int, base_sequence: int) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch(
        [Record(i, now, f"k{i}".encode(), value) for i, value in enumerate(values)],
        base_offset=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
    )


def produce_request(topic: str, partition: int, batch: bytes) -> Any:
    """A ProduceRequest of one batch to one partition, acks=all, 5 s timeout."""
    partition_class = ProduceRequest.TopicProduceData.PartitionProduceData
    return ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[partition_class(index=partition, records=batch)]
            )
        ],
    )


def produce_batch(connection: RawConnection, topic: str, partition: int, batch: bytes) -> tuple[int, int]:
    """Produce one batch with acks=all (ProduceRequest v8); returns (error code, base offset)."""
    response = connection.roundtrip(produce_request(topic, partition, batch), ProduceResponse, version=8)
    result = response.responses[0].partition_responses[0]
    return result.error_code, result.base_offset


def fetch_request(topic: str, offset: int = 0, *, session_id: int = 0, session_epoch: int = -1) -> Any:
    """A FetchRequest for partition 0 of ``topic`` from ``offset`` (read_uncommitted, no wait, 1 MiB);
    by default a full fetch that wants no session (KIP-227's final epoch)."""
    return fetch_partitions_request(
        [(topic, 0, offset)], max_wait_ms=0, min_bytes=0, session_id=session_id, session_epoch=session_epoch
    )


def fetch_partitions_request(
    wanted: list[tuple[str, int, int]],
    *,
    max_wait_ms: int,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    session_id: int = 0,
    session_epoch: int = -1,
) -> Any:
    """A read_uncommitted FetchRequest of (topic, partition, offset) each, 1 MiB per partition."""
    topic_class = FetchRequest.FetchTopic
    topics: dict[str, list[Any]] = {}
    for topic, partition, offset in wanted:
        topics.setdefault(topic, []).append(
            topic_class.FetchPartition(
                partition=partition,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[topic_class(topic=name, partitions=partitions) for name, partitions in topics.items()],
        forgotten_topics_data=[],
        rack_id="",
    )
