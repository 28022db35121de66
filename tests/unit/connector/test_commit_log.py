"""The commit log's record types and what one write task learns from the marker partition
(sparkafka.connector.sink.commit_log): no Kafka. Reading the partition itself is tested against real
brokers in tests/integration/connector/test_marker_writes.py and test_frozen_broker.py."""

from __future__ import annotations

import json

import pytest

from sparkafka.connector.sink.claims import belongs_to
from sparkafka.connector.sink.commit_log import (
    LAYOUT_KEY,
    CommitMarker,
    MarkerLayout,
    PrefixClaim,
    ProgressRecord,
    RefusalRecord,
    Registration,
    claim_owner,
    claimed_prefixes,
    committed_state,
    encode_query_claim,
    marker_of_query,
    query_claim_key,
    registered_query,
)
from sparkafka.errors import CommitMarkerError

# How readers of earlier releases found the commit markers of query q-1: the records the sink writes
# that are not markers must not hold these bytes.
OLDER_READERS_NEEDLE = b'"query_id":"q-1"'


def test_a_prefix_claim_is_read_by_every_release_and_never_taken_for_a_marker() -> None:
    """Every earlier sparkafka wrote claims with json.dumps' default separators and read the owner
    from "query_id"; the space after its colon keeps the needle by which earlier releases found commit
    markers from matching a claim. A claim written before versions existed reads as version 1."""
    claim = PrefixClaim("sparkafka-q-1", "q-1", 1700000000000)
    assert claim.key == "claim/sparkafka-q-1"
    assert json.loads(claim.encode()) == {
        "version": 1,
        "prefix": "sparkafka-q-1",
        "query_id": "q-1",
        "time_ms": 1700000000000,
    }
    assert PrefixClaim.decode(claim.encode()) == claim
    assert OLDER_READERS_NEEDLE not in claim.encode()
    written_before = json.dumps({"prefix": "sparkafka-q-1", "query_id": "q-1", "time_ms": 1700000000000})
    assert PrefixClaim.decode(written_before.encode()) == claim


@pytest.mark.parametrize(
    "raw", [b'{"prefix": "p"}', b'{"prefix": "p", "query_id": null}', b'{"query_id": ""}']
)
def test_a_claim_without_a_query_names_no_owner(raw: bytes) -> None:
    assert PrefixClaim.decode(raw).query_id is None


def test_a_registration_is_read_by_every_release() -> None:
    """Readers of earlier releases parse the JSON and read "query_id" only; the version they ignore.
    Written with json.dumps' default separators, a registration never matches their marker needle,
    and one written before versions existed reads as version 1."""
    record = Registration("p-3", "q-1", 3)
    assert record.key == "registration/p-3"
    written = json.loads(record.encode())
    assert written == {"version": 1, "transactional_id": "p-3", "query_id": "q-1", "partition": 3}
    assert OLDER_READERS_NEEDLE not in record.encode()
    assert Registration.decode(record.encode()) == record
    written_before = json.dumps({"transactional_id": "p-3", "query_id": "q-1", "partition": 3}).encode()
    assert Registration.decode(written_before) == record


def test_a_commit_marker_is_read_by_every_release() -> None:
    """Readers of earlier releases find a query's markers by their needle and read the fields they
    know; a marker written before versions existed (and before its optional fields) reads as
    version 1."""
    marker = CommitMarker("p-0", "q-1", 4, 0, 2, 1, "out", 4, "digest", "run-1", None)
    assert OLDER_READERS_NEEDLE in marker.encode()
    assert json.loads(marker.encode())["version"] == 1
    assert CommitMarker.decode(marker.encode()) == marker
    written_before = (
        b'{"transactional_id":"p-0","query_id":"q-1","batch_id":4,"partition":0,"records":2,"time_ms":1}'
    )
    assert CommitMarker.decode(written_before) == CommitMarker("p-0", "q-1", 4, 0, 2, 1)


@pytest.mark.parametrize(
    "record",
    [CommitMarker("p-0", "q-1", 4, 0, 2, 1), Registration("p-0", "q-1", 0), PrefixClaim("p", "q-1", 5)],
)
def test_a_marker_registration_or_claim_of_a_newer_version_is_refused(
    record: CommitMarker | Registration | PrefixClaim,
) -> None:
    """A release reading a newer record's fields by their old meaning could take a batch for
    committed that is not (or the reverse); it refuses, naming the upgrade."""
    newer = json.loads(record.encode())
    newer["version"] = 2
    with pytest.raises(
        CommitMarkerError, match=r"has version 2, and this sparkafka reads version 1.*upgrade"
    ):
        type(record).decode(json.dumps(newer).encode())


def test_a_newer_marker_refuses_the_query_it_names_and_no_other() -> None:
    """Markers of other queries in a shared topic may be of a newer release: only the query's own
    refuse."""
    newer = json.loads(CommitMarker("p-0", "q-1", 4, 0, 2, 1).encode())
    newer["version"] = 2
    raw = json.dumps(newer, separators=(",", ":")).encode()
    assert marker_of_query("p-0", raw, "q-2") is None
    assert not belongs_to("p-0", raw, "q-2", "p")
    with pytest.raises(CommitMarkerError, match=r"commit marker .*record .* has version 2"):
        marker_of_query("p-0", raw, "q-1")
    with pytest.raises(CommitMarkerError, match=r"has version 2"):
        belongs_to("p-0", raw, "q-1", "p")


@pytest.mark.parametrize(
    "raw",
    [b'{"transactional_id": "p-3", "partition": 3}', b'{"query_id": null}', b"{}"],
)
def test_a_registration_without_a_query_counts_as_none(raw: bytes) -> None:
    """A damaged or hand-edited registration: the id is registered again, as it always was."""
    assert registered_query({"registration/p-3": raw}, "p-3") is None
    assert registered_query({}, "p-3") is None


def test_a_registrations_odd_partition_does_not_fail_the_read() -> None:
    for partition in (b"null", b'"x"'):
        raw = b'{"transactional_id": "p-3", "query_id": "q-1", "partition": ' + partition + b"}"
        assert Registration.decode(raw) == Registration("p-3", "q-1", -1)


@pytest.mark.parametrize(
    "record", [ProgressRecord("p", "q", 1, None, None, 0), RefusalRecord("p", "q", 1, "r", 0)]
)
def test_a_progress_or_refusal_record_of_a_newer_version_is_refused(
    record: ProgressRecord | RefusalRecord,
) -> None:
    newer = json.loads(record.encode())
    newer["version"] = 2
    with pytest.raises(CommitMarkerError, match=r"has version 2, and this sparkafka reads version 1"):
        type(record).decode(json.dumps(newer).encode())
    assert type(record).decode(record.encode()) == record


def _marker(transactional_id: str, query: str, batch: int) -> bytes:
    partition = int(transactional_id.rsplit("-", 1)[1])
    return CommitMarker(transactional_id, query, batch, partition, 10, 0, "out").encode()


def test_the_state_of_an_id_tells_its_own_marker_siblings_and_other_prefixes_apart() -> None:
    found = {
        "p-0": _marker("p-0", "q", 4),
        "p-1": _marker("p-1", "q", 4),
        "p-2": _marker("p-2", "other", 9),  # another query's id under this prefix
        "pp-0": _marker("pp-0", "q", 2),  # a prefix that merely starts the same
        "registration/p-0": Registration("p-0", "q", 0).encode(),
        "progress/p": ProgressRecord("p", "q", 3, None, None, 0).encode(),
        "refusal/p": RefusalRecord("p", "q", 4, "run", 0).encode(),
    }
    state = committed_state(found, "p-0", "p", "q", other_prefixes=True)
    assert state.marker == CommitMarker.decode(found["p-0"])
    assert state.registered_query == "q"
    assert [m.transactional_id for m in state.sibling_markers] == ["p-1"]
    assert [m.transactional_id for m in state.other_prefix_markers] == ["pp-0"]
    assert state.progress is not None and state.progress.batch_id == 3
    assert state.refusal is not None and state.refusal.names("q", 4)
    assert state.history_found and not state.claim_missing
    batch_write = committed_state(found, "p-0", "p", "q", other_prefixes=False)
    assert batch_write.other_prefix_markers == () and batch_write.sibling_markers == state.sibling_markers


def test_an_id_whose_topic_holds_nothing_of_its_query_has_no_history() -> None:
    found = {"p-1": _marker("p-1", "other", 4), "registration/p-1": Registration("p-1", "other", 1).encode()}
    state = committed_state(found, "p-0", "p", "q", other_prefixes=True)
    assert state.marker is None and state.registered_query is None and not state.history_found
    assert state.sibling_markers == () and state.other_prefix_markers == ()
    assert committed_state(
        {"p-0": _marker("p-0", "q", 1)}, "p-0", "p", "q", other_prefixes=True
    ).history_found


def test_every_record_of_a_prefix_shares_its_partition_and_the_hash_is_fixed() -> None:
    """The partition is CRC-32 of the prefix over the layout's count: the same in every process and
    every release, or a restart would look for its markers elsewhere."""
    layout = MarkerLayout(16)
    assert [layout.partition_of(name) for name in ("sparkafka-q", "orders", "a")] == [1, 14, 3]
    prefix = "orders"
    keys = [
        "orders-0",
        "orders-17",
        "registration/orders-3",
        "claim/orders",
        "progress/orders",
        "refusal/orders",
    ]
    assert {layout.partition_of_key(key) for key in keys} == {layout.partition_of(prefix)}
    # A prefix that itself ends in -<number> is still found: only the last one is the partition.
    assert layout.partition_of_key("orders-7-2") == layout.partition_of("orders-7")
    assert layout.partition_of_key("query/q-1/orders") == layout.partition_of("q-1")
    assert layout.partition_of_key(LAYOUT_KEY) == 0
    assert {MarkerLayout(1).partition_of_key(key) for key in keys} == {0}


def test_a_key_the_sink_never_writes_has_no_partition() -> None:
    with pytest.raises(CommitMarkerError, match="no records under the key 'not-an-id'"):
        MarkerLayout(4).partition_of_key("not-an-id")


def test_a_layout_record_must_name_a_positive_count() -> None:
    assert MarkerLayout.decode(MarkerLayout(12).encode()) == MarkerLayout(12)
    for raw in (b'{"version":1,"partitions":0}', b'{"version":1,"partitions":"8"}', b'{"version":1}'):
        with pytest.raises(CommitMarkerError, match="written by hand, or damaged"):
            MarkerLayout.decode(raw)
    with pytest.raises(CommitMarkerError, match="newer sparkafka"):
        MarkerLayout.decode(b'{"version":2,"partitions":8}')


def test_a_query_finds_every_prefix_it_claimed_and_no_other_querys() -> None:
    found = {
        query_claim_key("q-1", "a"): encode_query_claim("q-1", "a"),
        query_claim_key("q-1", "b-2"): encode_query_claim("q-1", "b-2"),
        query_claim_key("q-10", "c"): encode_query_claim("q-10", "c"),
    }
    assert claimed_prefixes(found, "q-1") == {"a", "b-2"}
    # Earlier releases, finding markers by a needle, do not take them for markers of the query.
    assert all(OLDER_READERS_NEEDLE not in value for value in found.values())


def test_a_record_naming_the_query_elsewhere_than_in_its_query_id_is_not_its_marker() -> None:
    """A record under another write partition's key that holds the query's id, but not as its
    query_id (a note written by hand, say), is nobody's marker of the query: passed over."""
    note = json.dumps({"note": "moved from q-1", "query_id": "q-0"}).encode()
    state = committed_state(
        {"other-7": note, "p-1": CommitMarker("p-1", "q-1", 4, 1, 3, 1, "out").encode()},
        "p-0",
        "p",
        "q-1",
        other_prefixes=True,
    )
    assert [m.batch_id for m in state.sibling_markers] == [4] and state.other_prefix_markers == ()


@pytest.mark.parametrize(
    "value", [b'{"query_id":"q-1","note":"written by hand"}', b'{"query_id":"q-1","batch_id":', b"\x00q-1"]
)
def test_a_record_that_may_be_the_querys_marker_but_is_no_whole_marker_is_refused_naming_its_key(
    value: bytes,
) -> None:
    """Taken for nothing, a damaged marker of the query could hide the last batch a write partition
    committed; a record that does not name the query's id as its query_id at all is another's."""
    found = {"p-3": value}
    if value == b"\x00q-1":
        assert committed_state(found, "p-0", "p", "q-1", other_prefixes=True).sibling_markers == ()
        return
    with pytest.raises(CommitMarkerError, match="under key 'p-3' names query q-1 but is no commit marker"):
        committed_state(found, "p-0", "p", "q-1", other_prefixes=True)


def test_a_newer_record_that_holds_the_querys_id_anywhere_is_refused_as_its_own() -> None:
    """A newer release may name the query otherwise than by "query_id": a record of a version this
    one does not read counts as the query's wherever its bytes hold the query's id, and is refused;
    one that does not hold it is another query's."""
    renamed = b'{"version":2,"transactional_id":"p-1","query":{"id":"q-1"},"batch_id":9,"partition":1}'
    with pytest.raises(CommitMarkerError, match=r"commit marker \(key 'p-1'\) record .* has version 2"):
        committed_state({"p-1": renamed}, "p-0", "p", "q-1", other_prefixes=True)
    with pytest.raises(CommitMarkerError, match=r"has version 2"):
        belongs_to("p-1", renamed, "q-1", "p")
    assert marker_of_query("p-1", renamed, "q-2") is None
    state = committed_state({"p-1": renamed}, "p-0", "p", "q-2", other_prefixes=True)
    assert state.sibling_markers == () and not state.history_found


def test_the_claims_owner_is_read_whatever_release_wrote_another_querys_claim() -> None:
    own = PrefixClaim("p", "q-1", 5).encode()
    assert claim_owner({"claim/p": own}, "p", "q-1") == "q-1"
    assert claim_owner({}, "p", "q-1") is None
    newer = json.loads(PrefixClaim("p", "q-2", 5).encode())
    newer["version"] = 2
    assert claim_owner({"claim/p": json.dumps(newer).encode()}, "p", "q-1") == "q-2"
    newer["query_id"] = "q-1"
    with pytest.raises(CommitMarkerError, match=r"prefix claim record .* has version 2"):
        claim_owner({"claim/p": json.dumps(newer).encode()}, "p", "q-1")


def test_a_process_keeps_one_admin_client_per_cluster_configuration_and_a_few_at_most() -> None:
    """The driver asks about the marker topic for every writer Spark builds: the same configuration
    gets the same client (connected once); many configurations keep only the most recently used."""
    from sparkafka.connector.sink import commit_log
    from sparkafka.connector.sink.options import SinkOptions

    def options(servers: str) -> SinkOptions:
        return SinkOptions.parse(
            {"kafka.bootstrap.servers": servers, "topic": "out", "deliveryGuarantee": "exactly-once"}
        )

    first = commit_log._pooled_admin(options("a:9092"))
    assert commit_log._pooled_admin(options("a:9092")) is first
    assert commit_log._pooled_admin(options("b:9092")) is not first
    for n in range(commit_log._ADMINS_KEPT):
        commit_log._pooled_admin(options(f"other-{n}:9092"))
    assert len(commit_log._ADMINS) <= commit_log._ADMINS_KEPT
    assert commit_log._pooled_admin(options("a:9092")) is not first, "the least recently used went"
