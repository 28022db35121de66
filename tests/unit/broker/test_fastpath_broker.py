"""The broker answers the same request sequence with the same bytes whether Produce and Fetch take the fast
path (fastpath.py codecs, file regions sent with sendfile) or the general codec and handlers."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    ProduceResponse,
)

from sparkafka.broker import connection, fastpath, server
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.handlers import data
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record

TOPICS = {
    "a": (1, {}),
    "b": (3, {}),
    "c": (1, {"cleanup.policy": "compact"}),
    "small": (1, {"max.message.bytes": "300"}),
}


def _frame(request: Any, version: int, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="fastpath-test")
    return bytes(request.encode(version=version, header=True, framed=True))


def _batch(rng: random.Random, *, keys: bool = True, producer: tuple[int, int, int] | None = None) -> bytes:
    now = 1_700_000_000_000
    records = [
        Record(
            i,
            now + i,
            (b"k%d" % i) if keys or rng.random() < 0.5 else None,
            rng.randbytes(rng.choice([0, 10, 90])),
        )
        for i in range(rng.choice([1, 3, 40]))
    ]
    if producer is None:
        return encode_batch(records, base_offset=0)
    producer_id, epoch, sequence = producer
    return encode_batch(
        records, base_offset=0, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
    )


def _produce(
    topics: list[tuple[str, list[tuple[int, bytes | None]]]], acks: int = -1, txn: str | None = None
) -> Any:
    topic_class = ProduceRequest.TopicProduceData
    partition_class = topic_class.PartitionProduceData
    return ProduceRequest(
        transactional_id=txn,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[
            topic_class(name=name, partition_data=[partition_class(index=i, records=r) for i, r in parts])
            for name, parts in topics
        ],
    )


def _fetch(
    topics: list[tuple[str, list[tuple[int, int, int]]]], *, isolation: int, max_bytes: int = 1 << 20
) -> Any:
    topic_class = FetchRequest.FetchTopic
    partition_class = topic_class.FetchPartition
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=isolation,
        session_id=0,
        session_epoch=-1,
        topics=[
            topic_class(
                topic=name,
                partitions=[
                    partition_class(
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=limit,
                    )
                    for p, offset, limit in parts
                ],
            )
            for name, parts in topics
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def _script() -> list[tuple[bytes, bool]]:
    """(framed request, whether a response is due), deterministic."""
    rng = random.Random(5)
    steps: list[tuple[bytes, bool]] = []
    correlation = iter(range(1, 10_000))

    def add(request: Any, version: int, answered: bool = True) -> None:
        steps.append((_frame(request, version, next(correlation)), answered))

    # A transaction that aborts and one that commits, so read_committed fetches carry aborted transactions.
    add(
        InitProducerIdRequest(
            transactional_id="tx", transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
        ),
        4,
    )
    sequence = 0
    for commit in (False, True):
        add(
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id="tx",
                v3_and_below_producer_id=0,
                v3_and_below_producer_epoch=0,
                v3_and_below_topics=[
                    AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="a", partitions=[0])
                ],
            ),
            3,
        )
        count = rng.choice([1, 5])
        batch = encode_batch(
            [Record(i, 1_700_000_000_000, b"t%d" % i, b"txn") for i in range(count)],
            base_offset=0,
            producer_id=0,
            producer_epoch=0,
            base_sequence=sequence,
            is_transactional=True,
        )
        sequence += count
        add(_produce([("a", [(0, batch)])], txn="tx"), 9)
        add(EndTxnRequest(transactional_id="tx", producer_id=0, producer_epoch=0, committed=commit), 3)

    for version in range(3, 10):
        good = [(0, _batch(rng)), (1, _batch(rng)), (7, _batch(rng))]
        corrupt = bytearray(_batch(rng))
        corrupt[-1] ^= 0xFF
        add(_produce([("a", [(0, _batch(rng))]), ("b", good), ("nope", [(0, _batch(rng))])]), version)
        add(
            _produce([("a", [(0, None), (0, bytes(corrupt)), (0, _batch(rng) + _batch(rng)), (0, b"")])]),
            version,
        )
        add(_produce([("c", [(0, _batch(rng, keys=False))]), ("small", [(0, _batch(rng))])]), version)
        idempotent = _batch(rng, producer=(1000 + version, 0, 0))
        add(_produce([("b", [(2, idempotent)])]), version)
        add(_produce([("b", [(2, idempotent)])]), version)  # a duplicate retry
        add(_produce([("a", [(0, _batch(rng))])], acks=0), version, answered=False)
        add(_produce([("a", [(0, _batch(rng))])], acks=2), version)

    for version in range(4, 13):
        for isolation in (0, 1):
            add(
                _fetch(
                    [("a", [(0, 0, 1 << 20)]), ("b", [(0, 0, 1 << 20), (1, 3, 200), (2, 0, 1)])],
                    isolation=isolation,
                ),
                version,
            )
            add(
                _fetch(
                    [("a", [(0, 1, 1 << 20), (0, 99_999, 100)]), ("nope", [(0, 0, 100)])], isolation=isolation
                ),
                version,
            )
            add(
                _fetch(
                    [("a", [(0, 0, 1 << 20)]), ("b", [(0, 0, 1 << 20)])], isolation=isolation, max_bytes=1
                ),
                version,
            )
    # A Produce v9 with a tagged field: the fast path leaves it to the general codec.
    tagged = bytearray(_frame(_produce([("a", [(0, _batch(rng))])]), 9, next(correlation)))
    tagged[-1:] = b"\x01\x05\x01\xaa"
    struct.pack_into(">i", tagged, 0, len(tagged) - 4)
    steps.append((bytes(tagged), True))
    return steps


async def _run(
    data_dir: Path, steps: list[tuple[bytes, bool]], *, chunks: random.Random | None = None
) -> list[bytes]:
    """The answers to `steps`, sent one by one, each after the previous answer; with `chunks`, all
    requests are sent at once (pipelined) in pieces of random sizes, the way TCP may deliver them."""
    broker = server.Broker(
        BrokerConfig(port=0, data_dir=data_dir, group_initial_rebalance_delay_ms=0, auto_create_topics=False)
    )
    for name, (partitions, configs) in TOPICS.items():
        broker.topic_controller.create_topic(name, partitions, dict(configs))
    await broker.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        answers = []
        if chunks is not None:
            stream = b"".join(frame for frame, _ in steps)

            async def send_all() -> None:
                position = 0
                while position < len(stream):
                    size = chunks.choice([1, 3, 100, 4096, 70_000])
                    writer.write(stream[position : position + size])
                    await writer.drain()
                    position += size

            sending = asyncio.create_task(send_all())
            for _ in range(sum(answered for _, answered in steps)):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                answers.append(await reader.readexactly(size))
            await sending
        else:
            for frame, answered in steps:
                writer.write(frame)
                await writer.drain()
                if answered:
                    size = struct.unpack(">i", await reader.readexactly(4))[0]
                    answers.append(await reader.readexactly(size))
        writer.close()
        return answers
    finally:
        await broker.stop()


def _counting(function: Any, name: str, used: Counter[str]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        used[name] += 1
        return function(*args, **kwargs)

    return counted


def test_fast_and_general_paths_answer_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _script()
    # Transaction markers carry the broker's clock: the same one for both runs.
    monkeypatch.setattr(server, "now_ms", lambda: 1_700_000_100_000)
    monkeypatch.setattr(data, "SENDFILE_MIN_BYTES", 1)  # every fetched chunk goes out with sendfile
    used: Counter[str] = Counter()
    for name in ("encode_produce_response", "encode_fetch_response"):
        monkeypatch.setattr(fastpath, name, _counting(getattr(fastpath, name), name, used))
    monkeypatch.setattr(
        connection.Connection, "_send_region", _counting(connection.Connection._send_region, "sendfile", used)
    )
    fast = asyncio.run(_run(tmp_path / "fast", steps))
    assert used["encode_produce_response"] >= 30 and used["encode_fetch_response"] >= 50
    assert used["sendfile"] >= 50
    monkeypatch.setattr(connection, "FAST_HANDLERS", {})
    general = asyncio.run(_run(tmp_path / "general", steps))
    assert len(fast) == len(general) == sum(answered for _, answered in steps)
    for index, (fast_answer, general_answer) in enumerate(zip(fast, general, strict=True)):
        assert fast_answer == general_answer, f"answer {index} differs"
    # The script really exercised records, errors and aborted transactions.
    fetched = [
        FetchResponse.decode(answer, version=version, header=True)
        for (frame, _), answer in zip([step for step in steps if step[1]], general, strict=True)
        if struct.unpack_from(">h", frame, 4)[0] == 1 and (version := struct.unpack_from(">h", frame, 6)[0])
    ]
    partitions = [p for response in fetched for topic in response.responses for p in topic.partitions]
    assert any(p.aborted_transactions for p in partitions)
    assert any(len(p.records or b"") > 1000 for p in partitions)
    assert {p.error_code for p in partitions} >= {0, 1, 3}


def _open_files_under(directory: Path) -> list[str]:
    """Files of ``directory`` this process holds open (only our own: other threads open and close
    descriptors of their own at any time, so a count of all of them is not stable)."""
    if not os.path.isdir("/proc/self/fd"):
        return []
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since listdir
        if target.startswith(str(directory)):
            held.append(target)
    return held


def test_pipelined_requests_in_arbitrary_pieces_get_the_same_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests sent back to back and cut anywhere (one byte, across frames) are framed correctly and
    answered in order; no file region is left open."""
    steps = _script()
    monkeypatch.setattr(server, "now_ms", lambda: 1_700_000_100_000)
    monkeypatch.setattr(data, "SENDFILE_MIN_BYTES", 1)
    one_by_one = asyncio.run(_run(tmp_path / "sequential", steps))
    pipelined = asyncio.run(_run(tmp_path / "pipelined", steps, chunks=random.Random(3)))
    assert pipelined == one_by_one
    assert _open_files_under(tmp_path) == []


def test_without_native_sendfile_regions_go_through_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = _script()
    monkeypatch.setattr(server, "now_ms", lambda: 1_700_000_100_000)
    expected = asyncio.run(_run(tmp_path / "native", steps))

    async def no_sendfile(*args: Any, **kwargs: Any) -> int:
        raise NotImplementedError

    monkeypatch.setattr(asyncio.BaseEventLoop, "sendfile", no_sendfile)
    monkeypatch.setattr(data, "SENDFILE_MIN_BYTES", 1)
    assert asyncio.run(_run(tmp_path / "fallback", steps)) == expected


def test_large_frames_and_responses_cross_the_connection_intact(tmp_path: Path) -> None:
    """A produce frame larger than the receive buffer and a fetch response sent with sendfile."""
    rng = random.Random(9)
    records = [Record(i, 1_700_000_000_000, None, rng.randbytes(1000)) for i in range(900)]
    batch = encode_batch(records, base_offset=0)
    assert len(batch) > connection._RECEIVE_BUFFER_BYTES
    steps = [
        (_frame(_produce([("a", [(0, batch)])]), 9, 1), True),
        (_frame(_fetch([("a", [(0, 0, 10 << 20)])], isolation=0), 12, 2), True),
    ]
    produced, fetched = asyncio.run(_run(tmp_path / "big", steps))
    assert (
        ProduceResponse.decode(produced, version=9, header=True)
        .responses[0]
        .partition_responses[0]
        .error_code
        == 0
    )
    records_back = FetchResponse.decode(fetched, version=12, header=True).responses[0].partitions[0].records
    assert records_back == batch  # the stored batch (base offset 0) came back whole
