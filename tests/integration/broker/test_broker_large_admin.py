"""Creating, extending and deleting topics of a thousand and more partitions, on a real broker process: other
clients are served meanwhile, no request ever sees a topic half made, and a second change of the
same name is answered as Kafka's controller answers it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import Record
from sparkafka.broker.runner import BrokerProcess
from tests.integration.raw_kafka import RawConnection, fetch_request, produce_batch

BIG = 1_500  # enough that the file work outlasts many client round trips
_GROWN = 500
_METADATA_VERSION = 12


def _create_request(name: str, partitions: int) -> Any:
    return CreateTopicsRequest(
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
            )
        ],
        timeout_ms=120_000,
        validate_only=False,
    )


def _create(connection: RawConnection, name: str, partitions: int) -> Any:
    response = connection.roundtrip(_create_request(name, partitions), CreateTopicsResponse, version=7)
    return response.topics[0]


def _partitions_seen(connection: RawConnection, name: str) -> int | None:
    """How many partitions Metadata lists for ``name``; None when it does not know the topic."""
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=name)],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    topic = connection.roundtrip(request, MetadataResponse, version=_METADATA_VERSION).topics[0]
    if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return None
    assert topic.error_code == ErrorCode.NONE, topic
    return len(topic.partitions)


def _directories(data_dir: Path, name: str) -> set[int]:
    return {
        int(path.name.rpartition("-")[2])
        for path in data_dir.iterdir()
        if path.name.rpartition("-")[0] == name and path.name.rpartition("-")[2].isdigit()
    }


def _batch(value: bytes) -> bytes:
    return encode_batch([Record(0, int(time.time() * 1000), None, value)], base_offset=0)


class _InBackground:
    """Runs ``work`` on a thread and times it."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.result = work()
        except BaseException as error:
            self.error = error
        finally:
            self.finished = time.monotonic()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> Any:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the admin request did not finish"
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def seconds(self) -> float:
        assert self.finished is not None
        return self.finished - self.started


def _serve_while(
    job: _InBackground, port: int, busy: str, on_round: Callable[[RawConnection], None]
) -> list[float]:
    """Produce, fetch and Metadata round trips on topic ``busy`` for as long as ``job`` runs: the
    latency of each round."""
    latencies: list[float] = []
    with RawConnection(port, timeout_s=60) as client:
        while job.running:
            began = time.monotonic()
            error, offset = produce_batch(client, busy, 0, _batch(b"value"))
            assert error == ErrorCode.NONE
            fetched = client.roundtrip(fetch_request(busy, offset), FetchResponse, version=12)
            assert fetched.responses[0].partitions[0].error_code == ErrorCode.NONE
            assert fetched.responses[0].partitions[0].high_watermark == offset + 1
            on_round(client)
            latencies.append(time.monotonic() - began)
            time.sleep(0.01)  # a client, not a load test: the broker's CPU is for the admin work
    return latencies


def test_a_big_topic_is_created_and_deleted_while_other_clients_are_served(
    fresh_broker: BrokerProcess,
) -> None:
    port, data_dir = fresh_broker.port, fresh_broker.data_dir
    with RawConnection(port) as admin:
        assert _create(admin, "busy", 1).error_code == ErrorCode.NONE

    big = "big"
    seen: list[int | None] = []
    second_answers: list[int] = []

    def watch(client: RawConnection) -> None:
        # What Metadata lists is whole: nothing, or every partition, each with its directory.
        count = _partitions_seen(client, big)
        if count is not None:
            assert count == BIG
            assert _directories(data_dir, big) == set(range(BIG))
        seen.append(count)
        if not second_answers and _directories(data_dir, big):
            # The first creation is under way (its files are being made): the name is taken.
            second_answers.append(_create(client, big, 1).error_code)

    with RawConnection(port, timeout_s=120) as admin:
        creation = _InBackground(lambda: _create(admin, big, BIG))
        latencies = _serve_while(creation, port, "busy", watch)
        created = creation.join(120)
    assert created.error_code == ErrorCode.NONE, created
    print(f"create: {creation.seconds:.2f} s, {len(latencies)} rounds, max {max(latencies):.3f} s")
    assert created.num_partitions == BIG
    assert second_answers == [ErrorCode.TOPIC_ALREADY_EXISTS]
    assert None in seen, "the topic was visible before its creation was answered"
    assert len(latencies) >= 5, f"only {len(latencies)} round trip(s) in {creation.seconds:.1f} s"
    assert max(latencies) < creation.seconds / 4, (
        f"a round trip took {max(latencies):.2f} s while the {creation.seconds:.1f} s creation ran"
    )

    with RawConnection(port) as client:
        assert _partitions_seen(client, big) == BIG
        assert produce_batch(client, big, BIG - 1, _batch(b"last")) == (ErrorCode.NONE, 0)
    assert _directories(data_dir, big) == set(range(BIG))

    # Killed, not stopped: what was answered as created is on disk, whole, without a clean shutdown.
    fresh_broker.kill()
    fresh_broker.start()
    port = fresh_broker.port
    with RawConnection(port) as client:
        assert _partitions_seen(client, big) == BIG
        fetched = client.roundtrip(fetch_request(big), FetchResponse, version=12)
        assert fetched.responses[0].partitions[0].high_watermark == 0
        assert produce_batch(client, big, BIG - 1, _batch(b"after")) == (ErrorCode.NONE, 1)

    deletion_request = DeleteTopicsRequest(
        topics=[DeleteTopicsRequest.DeleteTopicState(name=big, topic_id=None)], timeout_ms=60_000
    )
    with RawConnection(port, timeout_s=120) as admin:
        deletion = _InBackground(lambda: admin.roundtrip(deletion_request, DeleteTopicsResponse, version=6))
        latencies = _serve_while(deletion, port, "busy", lambda client: None)
        deleted = deletion.join(120)
    assert deleted.responses[0].error_code == ErrorCode.NONE, deleted
    print(f"delete: {deletion.seconds:.2f} s, {len(latencies)} rounds, max {max(latencies, default=0):.3f} s")
    assert not latencies or max(latencies) < max(deletion.seconds / 2, 0.5), (
        f"a round trip took {max(latencies):.2f} s while the {deletion.seconds:.1f} s deletion ran"
    )
    assert _directories(data_dir, big) == set()
    assert not [path for path in data_dir.iterdir() if path.name.startswith(f"{big}-")]
    with RawConnection(port) as client:
        assert _partitions_seen(client, big) is None
        assert _create(client, big, 2).error_code == ErrorCode.NONE  # the name is free again


def test_partitions_added_by_the_thousand_appear_together(fresh_broker: BrokerProcess) -> None:
    port, data_dir = fresh_broker.port, fresh_broker.data_dir
    with RawConnection(port) as admin:
        assert _create(admin, "grows", 1).error_code == ErrorCode.NONE
    request = CreatePartitionsRequest(
        topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="grows", count=_GROWN, assignments=None)],
        timeout_ms=60_000,
        validate_only=False,
    )
    seen: set[int | None] = set()

    def watch(client: RawConnection) -> None:
        count = _partitions_seen(client, "grows")
        assert count in (1, _GROWN)
        assert count is not None and _directories(data_dir, "grows") >= set(range(count))
        seen.add(count)

    with RawConnection(port, timeout_s=120) as admin:
        growth = _InBackground(lambda: admin.roundtrip(request, CreatePartitionsResponse, version=3))
        latencies = _serve_while(growth, port, "grows", watch)
        grown = growth.join(120)
    assert grown.results[0].error_code == ErrorCode.NONE, grown
    assert 1 in seen, "the new partitions were visible before the request was answered"
    assert latencies and max(latencies) < growth.seconds / 3
    with RawConnection(port) as client:
        assert _partitions_seen(client, "grows") == _GROWN
        assert produce_batch(client, "grows", _GROWN - 1, _batch(b"new")) == (ErrorCode.NONE, 0)
    fresh_broker.kill()  # closing 1,000 partitions takes seconds, and proves nothing here
