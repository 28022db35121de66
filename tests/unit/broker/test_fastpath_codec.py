"""The hand-written Produce/Fetch codecs (broker/fastpath.py) against the general codec (kafka-python's
generated classes, as protocol.py uses them): the same responses byte for byte, the same decoded
requests, and every request they do not take on themselves left to the general codec."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from sparkafka.broker import fastpath, protocol
from sparkafka.broker.fastpath import PartitionFetchResult, PartitionProduceResult
from sparkafka.broker.handlers.data import fetch_response_object, produce_response_object
from sparkafka.broker.log_segment import FileRegion

PRODUCE_VERSIONS = range(fastpath.PRODUCE_VERSIONS[0], fastpath.PRODUCE_VERSIONS[1] + 1)
FETCH_VERSIONS = range(fastpath.FETCH_VERSIONS[0], fastpath.FETCH_VERSIONS[1] + 1)
NAMES = ["t", "orders", "ünïcode-tøpic", "x" * 200]
MESSAGES = [None, "", "The record batch size in the append is too large", "ünïcode ✓"]


def _general(response: Any, version: int, correlation_id: int) -> bytes:
    return protocol.encode_response(response, version, correlation_id)


def _joined(pieces: list[Any]) -> bytes:
    return b"".join(piece.read() if isinstance(piece, FileRegion) else piece for piece in pieces)


def _request_frame(request: Any, version: int, correlation_id: int = 7, client_id: str | None = "c") -> bytes:
    """A request frame as the broker receives it (header included, size prefix excluded)."""
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True))


# -- Produce responses ---------------------------------------------------------------------------


def _produce_results(rng: random.Random) -> list[tuple[str, list[PartitionProduceResult]]]:
    topics = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        partitions = []
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            failed = rng.random() < 0.3
            partitions.append(
                PartitionProduceResult(
                    index=rng.randrange(0, 2**31 - 1),
                    error_code=rng.choice([2, 3, 10, 47, 87]) if failed else 0,
                    base_offset=-1 if failed else rng.choice([0, 1, 2**40, 2**63 - 1]),
                    log_append_time_ms=rng.choice([-1, -1, 1_700_000_000_000]),
                    log_start_offset=rng.choice([-1, 0, 12345]),
                    record_errors=[
                        (rng.randrange(1000), rng.choice(MESSAGES)) for _ in range(rng.choice([0, 0, 1, 3]))
                    ],
                    error_message=rng.choice(MESSAGES) if failed else None,
                )
            )
        topics.append((rng.choice(NAMES), partitions))
    return topics


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_responses_are_byte_identical(version: int) -> None:
    rng = random.Random(version)
    for _ in range(200):
        results = _produce_results(rng)
        correlation_id = rng.randrange(-(2**31), 2**31)
        expected = _general(produce_response_object(results), version, correlation_id)
        assert fastpath.encode_produce_response(version, correlation_id, results) == expected


# -- Produce requests ----------------------------------------------------------------------------


def _produce_request(rng: random.Random) -> Any:
    topic_class = ProduceRequest.TopicProduceData
    partition_class = topic_class.PartitionProduceData
    return ProduceRequest(
        transactional_id=rng.choice([None, "", "txn-1", "ünï"]),
        acks=rng.choice([-1, 0, 1, 2]),
        timeout_ms=rng.choice([0, 30000, 2**31 - 1]),
        topic_data=[
            topic_class(
                name=rng.choice(NAMES),
                partition_data=[
                    partition_class(
                        index=rng.randrange(0, 100),
                        records=rng.choice([None, b"", rng.randbytes(rng.choice([1, 61, 300]))]),
                    )
                    for _ in range(rng.choice([0, 1, 2, 4]))
                ],
            )
            for _ in range(rng.choice([0, 1, 1, 3]))
        ],
    )


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_requests_decode_like_the_general_codec(version: int) -> None:
    rng = random.Random(100 + version)
    for _ in range(200):
        frame = _request_frame(_produce_request(rng), version, client_id=rng.choice([None, "", "producer-1"]))
        general = protocol.decode_request(protocol.peek_header(frame), frame)
        fast = fastpath.decode_produce_request(frame, version)
        assert fast is not None
        assert (fast.transactional_id, fast.acks, fast.timeout_ms) == (
            general.transactional_id,
            general.acks,
            general.timeout_ms,
        )
        assert [
            (name, [(index, None if records is None else bytes(records)) for index, records in partitions])
            for name, partitions in fast.topics
        ] == [
            (topic.name, [(p.index, p.records) for p in topic.partition_data]) for topic in general.topic_data
        ]


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_records_are_views_into_the_frame(version: int) -> None:
    records = os.urandom(1000)
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="t",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
                ],
            )
        ],
    )
    frame = bytearray(_request_frame(request, version))
    decoded = fastpath.decode_produce_request(frame, version)
    assert decoded is not None
    view = decoded.topics[0][1][0][1]
    assert isinstance(view, memoryview) and view.obj is frame and bytes(view) == records


def _produce_frame(version: int, records: bytes = b"r" * 70) -> bytes:
    request = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="t",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
                ],
            )
        ],
    )
    return _request_frame(request, version)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_unusual_produce_requests_are_left_to_the_general_codec(version: int) -> None:
    frame = _produce_frame(version)
    assert fastpath.decode_produce_request(frame, version) is not None
    assert fastpath.decode_produce_request(frame + b"\x00", version) is None  # bytes left over
    for cut in range(len(frame) - 1, 9, -7):
        assert fastpath.decode_produce_request(frame[:cut], version) is None  # truncated anywhere
    assert fastpath.decode_produce_request(frame, 2) is None
    assert fastpath.decode_produce_request(frame, 10) is None


def test_produce_v9_tagged_fields_are_left_to_the_general_codec() -> None:
    frame = _produce_frame(9)
    assert frame.endswith(b"\x00\x00\x00")  # partition, topic and body tagged fields
    # One unknown tagged field (tag 5, 1 byte) at the end of the body.
    tagged = frame[:-1] + b"\x01\x05\x01\xaa"
    assert fastpath.decode_produce_request(tagged, 9) is None
    general = protocol.decode_request(protocol.peek_header(tagged), tagged)
    assert general.topic_data[0].partition_data[0].records == b"r" * 70
    # A tagged field in the request header (api key, version, correlation id, client id "c", then tags).
    assert frame[11] == 0
    header_tagged = frame[:11] + b"\x01\x05\x01\xaa" + frame[12:]
    assert fastpath.decode_produce_request(header_tagged, 9) is None
    general = protocol.decode_request(protocol.peek_header(header_tagged), header_tagged)
    assert general.topic_data[0].partition_data[0].records == b"r" * 70


def test_produce_invalid_utf8_topic_is_left_to_the_general_codec() -> None:
    frame = bytearray(_produce_frame(8))
    name_at = bytes(frame).index(b"\x00\x01t") + 2
    frame[name_at] = 0xFF
    assert fastpath.decode_produce_request(bytes(frame), 8) is None


# -- Fetch requests ------------------------------------------------------------------------------


def _fetch_request(rng: random.Random, version: int) -> Any:
    topic_class = FetchRequest.FetchTopic
    partition_class = topic_class.FetchPartition
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=rng.choice([0, 500, 2**31 - 1]),
        min_bytes=rng.choice([0, 1, 1 << 20]),
        max_bytes=rng.choice([0, 52428800, 2**31 - 1]),
        isolation_level=rng.choice([0, 1]),
        session_id=rng.choice([0, 12]),
        session_epoch=rng.choice([-1, 0, 5]),  # full fetches, and an incremental one
        topics=[
            topic_class(
                topic=rng.choice(NAMES),
                partitions=[
                    partition_class(
                        partition=rng.randrange(0, 100),
                        current_leader_epoch=rng.choice([-1, 0, 3]),
                        fetch_offset=rng.choice([0, 5, 2**62]),
                        last_fetched_epoch=rng.choice([-1, 2]),
                        log_start_offset=rng.choice([-1, 0]),
                        partition_max_bytes=rng.choice([1, 1048576]),
                    )
                    for _ in range(rng.choice([0, 1, 2, 4]))
                ],
            )
            for _ in range(rng.choice([0, 1, 1, 3]))
        ],
        forgotten_topics_data=[
            FetchRequest.ForgottenTopic(
                topic=rng.choice(NAMES), partitions=rng.sample(range(100), rng.choice([0, 1, 3]))
            )
            for _ in range(rng.choice([0, 0, 1, 2]))
        ],
        rack_id=rng.choice(["", "rack-a"]),
    )


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_requests_decode_like_the_general_codec(version: int) -> None:
    rng = random.Random(200 + version)
    for _ in range(200):
        frame = _request_frame(_fetch_request(rng, version), version)
        general = protocol.decode_request(protocol.peek_header(frame), frame)
        fast = fastpath.decode_fetch_request(frame, version)
        assert fast is not None
        assert (fast.max_wait_ms, fast.min_bytes, fast.max_bytes, fast.isolation_level) == (
            general.max_wait_ms,
            general.min_bytes,
            general.max_bytes,
            general.isolation_level,
        )
        assert fast.topics == [
            (t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
            for t in general.topics
        ]
        if version >= 7:
            assert (fast.session_id, fast.session_epoch) == (general.session_id, general.session_epoch)
            assert fast.forgotten == [(t.topic, list(t.partitions)) for t in general.forgotten_topics_data]


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_unusual_fetch_requests_are_left_to_the_general_codec(version: int) -> None:
    rng = random.Random(version)
    request = _fetch_request(rng, version)
    request.topics = [
        FetchRequest.FetchTopic(
            topic="t",
            partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0,
                    current_leader_epoch=-1,
                    fetch_offset=0,
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=100,
                )
            ],
        )
    ]
    frame = _request_frame(request, version)
    assert fastpath.decode_fetch_request(frame, version) is not None
    assert fastpath.decode_fetch_request(frame + b"\x00", version) is None
    for cut in range(len(frame) - 1, 9, -5):
        assert fastpath.decode_fetch_request(frame[:cut], version) is None
    if version >= 12:
        request.forgotten_topics_data = []
        request.cluster_id = "cluster"  # a tagged field
        frame = _request_frame(request, version)
        assert protocol.decode_request(protocol.peek_header(frame), frame).cluster_id == "cluster"
        assert fastpath.decode_fetch_request(frame, version) is None


# -- Fetch responses -----------------------------------------------------------------------------


@pytest.fixture
def segment(tmp_path: Path) -> tuple[int, bytes]:
    data = os.urandom(1 << 16)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _fetch_results(
    rng: random.Random, segment: tuple[int, bytes], *, regions: bool
) -> list[tuple[str, list[PartitionFetchResult]]]:
    fd, data = segment
    topics = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        partitions = []
        for _ in range(rng.choice([0, 1, 1, 2, 4])):
            chunks: list[Any] = []
            for _ in range(rng.choice([0, 0, 1, 2, 3])):
                start = rng.randrange(len(data))
                length = rng.randrange(len(data) - start + 1)
                as_region = rng.random() < 0.5  # drawn either way: both calls see the same sequence
                if regions and as_region:
                    chunks.append(FileRegion(os.dup(fd), start, length))
                else:
                    chunks.append(data[start : start + length])
            aborted = rng.choice(
                [None, [], [(rng.randrange(2**40), rng.randrange(2**40)) for _ in range(rng.choice([1, 3]))]]
            )
            partitions.append(
                PartitionFetchResult(
                    partition_index=rng.randrange(0, 2**31 - 1),
                    error_code=rng.choice([0, 0, 1, 3]),
                    high_watermark=rng.choice([-1, 0, 2**40]),
                    last_stable_offset=rng.choice([-1, 0, 2**40]),
                    log_start_offset=rng.choice([-1, 0, 7]),
                    aborted_transactions=aborted,
                    records=chunks,
                )
            )
        topics.append((rng.choice(NAMES), partitions))
    return topics


def _as_bytes(
    results: list[tuple[str, list[PartitionFetchResult]]],
) -> list[tuple[str, list[PartitionFetchResult]]]:
    for _, partitions in results:
        for result in partitions:
            result.records = [c.read() if isinstance(c, FileRegion) else c for c in result.records]
    return results


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_responses_are_byte_identical(version: int, segment: tuple[int, bytes]) -> None:
    rng = random.Random(300 + version)
    for _ in range(150):
        state = rng.getstate()
        results = _fetch_results(rng, segment, regions=True)
        correlation_id = rng.randrange(-(2**31), 2**31)
        pieces = fastpath.encode_fetch_response(version, correlation_id, results)
        try:
            fast = _joined(pieces)
        finally:
            for piece in pieces:
                if isinstance(piece, FileRegion):
                    piece.close()
        rng.setstate(state)
        general_results = _as_bytes(_fetch_results(rng, segment, regions=False))
        expected = _general(fetch_response_object(0, 0, general_results), version, correlation_id)
        assert fast == expected
        (size,) = struct.unpack_from(">i", fast)
        assert size == len(fast) - 4


def test_fetch_response_pieces_pass_file_regions_through(segment: tuple[int, bytes]) -> None:
    fd, data = segment
    region = FileRegion(os.dup(fd), 100, 50_000)
    try:
        results = [("t", [PartitionFetchResult(0, records=[b"abc", region])])]
        pieces = fastpath.encode_fetch_response(12, 1, results)
        assert any(piece is region for piece in pieces)
        assert _joined(pieces).endswith(b"abc" + data[100:50_100] + b"\x00\x00\x00")
    finally:
        region.close()
