"""The driver's snapshot of the commit log (sparkafka.connector.sink.marker_snapshot): its encoding in
the checkpoint and the filter that keeps what concerns a query. No Kafka: reading the log on from a
snapshot is tested against real brokers in tests/integration/connector/test_marker_snapshot.py."""

from __future__ import annotations

import pytest

from sparkafka.connector.sink.commit_log import (
    CommitMarker,
    MarkerLayout,
    ProgressRecord,
    RecordAnchor,
    RefusalRecord,
    Registration,
    committed_state,
    encode_query_claim,
    query_claim_key,
)
from sparkafka.connector.sink.marker_snapshot import MarkerSnapshot, concerns_query
from sparkafka.connector.sink.options import SinkOptions

QUERY = "0f3a2b1c-1111-4222-8333-944455556666"
OTHER_QUERY = "9e8d7c6b-aaaa-4bbb-8ccc-dddddddddddd"


def test_a_snapshot_reads_back_as_written_binary_values_and_all() -> None:
    snapshot = MarkerSnapshot(
        topic="_sparkafka_commit_markers",
        topic_id=(-5, 17),
        layout_partitions=16,
        prefix="sparkafka-q",
        query_id=QUERY,
        positions={3: RecordAnchor(120, "0a1b2c"), 11: None},
        records={3: {"sparkafka-q-0": b"\x00\xff{}", "": b""}, 11: {}},
        taken_ms=1_765_000_000_000,
    )
    assert MarkerSnapshot.decode(snapshot.encode()) == snapshot
    without_id = MarkerSnapshot("m", None, 1, "p", QUERY, {0: RecordAnchor(4, "ff")})
    assert MarkerSnapshot.decode(without_id.encode()) == without_id


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"version": 1}',
        '{"version": 2, "topic": "m"}',
        '{"version": 2, "topic": "m", "topic_id": null, "layout_partitions": 1, "prefix": "p", '
        '"query_id": "q", "positions": {"zero": null}, "records": {}, "taken_ms": 0}',
        '{"version": 2, "topic": "m", "topic_id": null, "layout_partitions": 1, "prefix": "p", '
        '"query_id": "q", "positions": {}, "records": {"0": {"k": "not base64!"}}, "taken_ms": 0}',
    ],
)
def test_a_damaged_snapshot_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="not a commit-marker snapshot"):
        MarkerSnapshot.decode(text)


def test_a_snapshot_stands_only_for_its_topic_layout_prefix_and_query() -> None:
    options = SinkOptions.parse({"kafka.bootstrap.servers": "k:9092", "commitMarkerTopic": "m"})
    snapshot = MarkerSnapshot("m", None, 4, "p", QUERY, {0: None})
    assert snapshot.is_for(options, MarkerLayout(4), "p", QUERY)
    assert not snapshot.is_for(options, MarkerLayout(4), "p2", QUERY), "another prefix"
    assert not snapshot.is_for(options, MarkerLayout(4), "p", OTHER_QUERY), "another query"
    assert not snapshot.is_for(options, MarkerLayout(1), "p", QUERY), "another layout"
    moved = SinkOptions.parse({"kafka.bootstrap.servers": "k:9092", "commitMarkerTopic": "m2"})
    assert not snapshot.is_for(moved, MarkerLayout(4), "p", QUERY), "another topic"
    assert snapshot.layout == MarkerLayout(4)


def _marker(transactional_id: str, query_id: str, batch_id: int, partition: int) -> bytes:
    return CommitMarker(transactional_id, query_id, batch_id, partition, 5, 1).encode()


def _commit_log_of_two_queries() -> dict[str, bytes]:
    """What a marker partition may hold: this query's records of every kind under prefix ``orders``, its
    markers under prefix ``old`` it wrote before, and another query's records under ``payments``."""
    return {
        "orders-0": _marker("orders-0", QUERY, 7, 0),
        "orders-1": _marker("orders-1", QUERY, 6, 1),
        "registration/orders-0": Registration("orders-0", QUERY, 0).encode(),
        "registration/orders-1": Registration("orders-1", QUERY, 1).encode(),
        "claim/orders": b'{"prefix": "orders", "query_id": "%s", "time_ms": 1}' % QUERY.encode(),
        "progress/orders": ProgressRecord("orders", QUERY, 6, None, None, 1).encode(),
        "refusal/orders": RefusalRecord("orders", QUERY, 7, "run-1", 1).encode(),
        query_claim_key(QUERY, "orders"): encode_query_claim(QUERY, "orders"),
        query_claim_key(QUERY, "old"): encode_query_claim(QUERY, "old"),
        "old-0": _marker("old-0", QUERY, 5, 0),
        "payments-0": _marker("payments-0", OTHER_QUERY, 40, 0),
        "registration/payments-0": Registration("payments-0", OTHER_QUERY, 0).encode(),
        "claim/payments": b'{"prefix": "payments", "query_id": "%s", "time_ms": 1}' % OTHER_QUERY.encode(),
        "progress/payments": ProgressRecord("payments", OTHER_QUERY, 40, None, None, 1).encode(),
        query_claim_key(OTHER_QUERY, "payments"): encode_query_claim(OTHER_QUERY, "payments"),
    }


def test_the_filter_keeps_every_record_of_the_query_and_drops_another_querys() -> None:
    found = _commit_log_of_two_queries()
    assert concerns_query("orders2-0", _marker("orders2-0", OTHER_QUERY, 1, 0), "orders", QUERY), (
        "a key that merely contains the prefix is kept: more is harmless, less would not be"
    )
    kept = {key for key, value in found.items() if concerns_query(key, value, "orders", QUERY)}
    assert kept == {
        "orders-0",
        "orders-1",
        "registration/orders-0",
        "registration/orders-1",
        "claim/orders",
        "progress/orders",
        "refusal/orders",
        query_claim_key(QUERY, "orders"),
        query_claim_key(QUERY, "old"),
        "old-0",
    }


@pytest.mark.parametrize("transactional_id", ["orders-0", "orders-1", "orders-2"])
@pytest.mark.parametrize("other_prefixes", [True, False])
def test_what_a_task_learns_is_the_same_from_the_filtered_records(
    transactional_id: str, other_prefixes: bool
) -> None:
    """The invariant the snapshot rests on: a task judges a batch by the filtered records exactly as
    by the whole partition."""
    found = _commit_log_of_two_queries()
    filtered = {key: value for key, value in found.items() if concerns_query(key, value, "orders", QUERY)}
    whole = committed_state(found, transactional_id, "orders", QUERY, other_prefixes=other_prefixes)
    assert (
        committed_state(filtered, transactional_id, "orders", QUERY, other_prefixes=other_prefixes) == whole
    )
    assert whole.marker is not None or transactional_id == "orders-2"


def test_a_snapshot_of_another_version_is_refused_naming_both() -> None:
    """A snapshot an older sparkafka wrote (version 1 kept positions, not last records) is taken anew."""
    with pytest.raises(ValueError, match="version 1, this code reads 2"):
        MarkerSnapshot.decode('{"version": 1, "positions": {"0": 12}}')


def test_the_filter_keeps_the_markers_of_a_query_whose_id_json_escapes() -> None:
    """The snapshot keeps a superset of what tasks read: for an id JSON writes escaped (a quote, a
    letter outside ASCII) the query's markers under another prefix are kept all the same."""
    for query in ('q-"1"', "q-\u00e9t\u00e9"):
        marker = _marker("shipments-v1-0", query, 5, 0)
        assert query.encode() not in marker
        assert concerns_query("shipments-v1-0", marker, "shipments-v2", query)
