"""The checkpoint's record of a prefix claim, and when a claim counts as missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkafka.connector.sink.batch_plan import BatchPlan, CheckpointFiles
from sparkafka.connector.sink.claims import (
    ClaimRecord,
    belongs_to,
    claim_missing,
    holds_query,
    read_claim_records,
)
from sparkafka.connector.sink.commit_log import CommitMarker
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.errors import CommitMarkerError, ReplayRefused

OPTIONS_SOURCE = {
    "kafka.bootstrap.servers": "localhost:9092",
    "topic": "out",
    "deliveryGuarantee": "exactly-once",
    "commitMarkerTopic": "markers-a",
}
OPTIONS = SinkOptions.parse(OPTIONS_SOURCE)
PLAN = BatchPlan(0, "d", ("{}",), "q-1")


def _claim(query: str) -> dict[str, bytes]:
    return {"claim/p": json.dumps({"prefix": "p", "query_id": query}).encode()}


def test_a_record_round_trips_under_a_file_name_any_prefix_can_have(tmp_path: Path) -> None:
    files = CheckpointFiles(str(tmp_path))
    record = ClaimRecord("odd/prefix: ü", "markers-a", "q-1")
    from sparkafka.connector.sink.claims import _record_name

    files.write(_record_name(record.prefix), record.encode())
    assert read_claim_records(files, "q-1") == {"odd/prefix: ü": record}
    assert read_claim_records(files, "q-2") == {}
    assert json.loads(record.encode())["version"] == 1


def test_a_claim_is_missing_only_where_the_checkpoint_recorded_one_in_this_topic() -> None:
    recorded = BatchPlan(0, "d", ("{}",), "q-1", claimed_in="markers-a")
    assert claim_missing(OPTIONS, {}, "p", recorded)
    assert not claim_missing(OPTIONS, _claim("q-0"), "p", recorded), "refused as another query's"
    assert not claim_missing(OPTIONS, _claim("q-1"), "p", recorded)
    assert not claim_missing(OPTIONS, {}, "p", PLAN), "recorded just now, or never"
    assert not claim_missing(OPTIONS, {}, "p", None)
    elsewhere = BatchPlan(0, "d", ("{}",), "q-1", claimed_in="markers-b")
    assert not claim_missing(OPTIONS, {}, "p", elsewhere), "the driver judged a moved topic"


def test_a_claim_alone_does_not_hold_a_query() -> None:
    marker = CommitMarker("p-0", "q-1", 3, 0, 10, 0, "out")
    assert not holds_query(_claim("q-1"), "q-1", "p")
    assert holds_query({"p-0": marker.encode()}, "q-1", "p")
    assert holds_query({"registration/p-3": b"{}"}, "q-1", "p")
    assert not belongs_to("registration/p-x", b"{}", "q-1", "p")
    assert not belongs_to("p-0", b"not json", "q-1", "p")


def test_the_newest_batch_counts_markers_of_the_query_and_the_prefixs_progress() -> None:
    from sparkafka.connector.sink.claims import newest_batch
    from sparkafka.connector.sink.commit_log import ProgressRecord

    found = {
        "p-0": CommitMarker("p-0", "q-1", 3, 0, 10, 0, "out").encode(),
        "p-1": CommitMarker("p-1", "q-0", 9, 1, 10, 0, "out").encode(),  # another query's
        "progress/p": ProgressRecord("p", "q-1", 4, None, None, 0).encode(),
        "progress/other": ProgressRecord("other", "q-1", 8, None, None, 0).encode(),
        **_claim("q-1"),
    }
    assert newest_batch(found, "q-1", "p") == 4
    assert newest_batch({}, "q-1", "p") == -1


def test_an_unreadable_record_names_the_file_and_what_deleting_it_costs(tmp_path: Path) -> None:
    import pytest

    from sparkafka.connector.sink.claims import read_claim_records
    from sparkafka.errors import SparkafkaError

    files = CheckpointFiles(str(tmp_path))
    files.write("sparkafka/claims/abc.json", '{"version": 1, "prefix": "p"')
    files.write("sparkafka/claims/abc.json.77.tmp", "left by a write cut short")
    with pytest.raises(SparkafkaError, match=r"sparkafka/claims/abc.json .*Delete that file"):
        read_claim_records(files, "q-1")
    files.write("sparkafka/claims/abc.json", ClaimRecord("p", "m", "q-0").encode())
    assert read_claim_records(files, "q-1") == {}, "another query's record (a copied checkpoint)"
    files.write(
        "sparkafka/claims/abc.json", '{"version": 2, "prefix": "p", "marker_topic": "m", "query_id": "q"}'
    )
    with pytest.raises(SparkafkaError, match="version 2, this sparkafka reads 1"):
        read_claim_records(files, "q")


def test_carrying_over_keeps_the_newer_record_of_each_key() -> None:
    from sparkafka.connector.sink.carry_over import _newer
    from sparkafka.connector.sink.commit_log import ProgressRecord

    old, new = CommitMarker("p-0", "q", 1, 0, 5, 0, "out"), CommitMarker("p-0", "q", 2, 0, 5, 0, "out")
    assert _newer("p-0", new.encode(), old.encode())
    assert not _newer("p-0", old.encode(), new.encode())
    assert _newer("p-0", old.encode(), None)
    assert not _newer("registration/p-0", b"{}", b"{}")
    assert not _newer("claim/p", b"{}", b"{}")
    progress = [ProgressRecord("p", "q", b, None, None, 0).encode() for b in (1, 2)]
    assert _newer("progress/p", progress[1], progress[0])
    assert not _newer("progress/p", progress[0], progress[1])
    from sparkafka.connector.sink.commit_log import RefusalRecord

    refusals = [RefusalRecord("p", "q", b, f"run-{b}", 0).encode() for b in (1, 2)]
    assert _newer("refusal/p", refusals[1], refusals[0])
    assert not _newer("refusal/p", refusals[0], refusals[1])


def test_a_refusal_record_belongs_to_its_query_and_prefix_but_holds_no_markers() -> None:
    from sparkafka.connector.sink.commit_log import RefusalRecord

    refusal = RefusalRecord("p", "q-1", 3, "run-r", 0).encode()
    assert belongs_to("refusal/p", refusal, "q-1", "p")
    assert not belongs_to("refusal/p", refusal, "q-0", "p")
    assert not belongs_to("refusal/p", refusal, "q-1", "other")
    assert not holds_query({"refusal/p": refusal}, "q-1", "p")


def test_a_query_shows_in_a_marker_partition_by_its_claim_registration_progress_or_marker() -> None:
    """What an adopting query looks for of the query it adopts. A registration is encoded with
    spaces after its separators, unlike markers and progress records: it is decoded, not searched."""
    import json as json_module

    from sparkafka.connector.sink.claims import shows_query
    from sparkafka.connector.sink.commit_log import ProgressRecord

    registration = {
        "registration/p-0": json_module.dumps({"transactional_id": "p-0", "query_id": "q-0"}).encode()
    }
    assert shows_query(registration, "q-0", "p")
    assert not shows_query(registration, "q-1", "p")
    assert shows_query(_claim("q-0"), "q-0", "p") and not shows_query(_claim("q-0"), "q-1", "p")
    progress = {"progress/p": ProgressRecord("p", "q-0", 3, None, None, 0).encode()}
    assert shows_query(progress, "q-0", "p") and not shows_query(progress, "q-0", "other")
    marker = {"p-0": CommitMarker("p-0", "q-0", 3, 0, 10, 0, "out").encode()}
    assert shows_query(marker, "q-0", "p") and not shows_query(marker, "q-1", "p")
    assert not shows_query({}, "q-0", "p")


def test_records_that_name_the_query_but_are_no_markers_of_it_are_not_counted_as_its_batches() -> None:
    """A query's records other than commit markers (its claims' query/ records, a refusal, another
    query's progress record that happens to hold its id) hold the query's id too: they pass the
    quick test of a value, and are then judged by their key and type."""
    from sparkafka.connector.sink.claims import newest_batch, shows_query
    from sparkafka.connector.sink.commit_log import (
        ProgressRecord,
        RefusalRecord,
        encode_query_claim,
        query_claim_key,
    )

    found = {
        query_claim_key("q-1", "p"): encode_query_claim("q-1", "p"),
        query_claim_key("q-1", "other"): encode_query_claim("q-1", "other"),
        "refusal/p": RefusalRecord("p", "q-1", 7, "run-r", 0).encode(),
        # The prefix's progress, written by another query: its offsets name a topic called like q-1.
        "progress/p": ProgressRecord("p", "q-0", 9, None, ('{"q-1":{"0":5}}',), 0).encode(),
    }
    assert all(b"q-1" in value for value in found.values())
    assert newest_batch(found, "q-1", "p") == -1
    assert not shows_query(found, "q-1", "p")
    assert newest_batch(found, "q-0", "p") == 9 and shows_query(found, "q-0", "p")


def test_a_query_id_that_json_escapes_is_found_by_decoding_every_record() -> None:
    """The quick test looks for the id as JSON writes it; an id JSON would escape (a quote, a
    non-ASCII letter) is never missed: then every record is decoded."""
    from sparkafka.connector.sink.claims import newest_batch, shows_query
    from sparkafka.connector.sink.commit_log import may_name_query

    for query in ('q-"1"', "q-\u00e9t\u00e9"):
        marker = {"p-0": CommitMarker("p-0", query, 3, 0, 10, 0, "out").encode()}
        assert query.encode() not in marker["p-0"]
        assert may_name_query(query)(b"anything")
        assert newest_batch(marker, query, "p") == 3 and shows_query(marker, query, "p")
    assert not may_name_query("q-1")(CommitMarker("p-0", "q-2", 3, 0, 10, 0, "out").encode())


def _newer_version(record: bytes) -> bytes:
    """``record`` as a newer sparkafka might write it: version 2."""
    fields = json.loads(record)
    fields["version"] = 2
    return json.dumps(fields, separators=(",", ":")).encode()


def test_a_damaged_marker_of_the_query_is_refused_not_left_behind() -> None:
    """Carry-over takes what belongs_to says is the query's: a marker of the query with a field of
    the wrong type (or missing) taken for nobody's would stay behind, and a replay in the new topic
    would write that id's last batch again. The readers of the tasks refuse the same record."""
    for damaged in (
        b'{"transactional_id":"p-0","query_id":"q-1","batch_id":4,"partition":0,"records":null,"time_ms":1}',
        b'{"transactional_id":"p-0","query_id":"q-1","batch_id":4,"partition":0}',
    ):
        with pytest.raises(
            CommitMarkerError, match=r"under key 'p-0' names query q-1 but is no commit marker"
        ):
            belongs_to("p-0", damaged, "q-1", "p")
    assert not belongs_to("p-0", b'{"query_id":"q-2","records":null}', "q-1", "p"), "another query's"


def test_carrying_over_refuses_to_lay_the_querys_marker_over_another_querys() -> None:
    """The new topic holds another query's marker (or registration) under a key the query carries
    over: batch numbers of two queries do not say which is newer, and overwriting the other query's
    marker could make it write a batch twice. Refused before anything is copied, naming both queries,
    the key and the way on; another query's record of a newer release is refused the same way."""
    from sparkafka.connector.sink.carry_over import _refuse_overwriting_another_query
    from sparkafka.connector.sink.commit_log import Registration

    moving = SinkOptions.parse({**dict(OPTIONS_SOURCE), "previousCommitMarkerTopic": "markers-old"})
    ours = {
        "p-0": CommitMarker("p-0", "q-1", 8, 0, 5, 1, "out").encode(),
        "registration/p-0": Registration("p-0", "q-1", 0).encode(),
    }
    theirs_marker = CommitMarker("p-0", "q-0", 50, 0, 5, 1, "out").encode()
    for here in (
        {"p-0": theirs_marker},
        {"p-0": _newer_version(theirs_marker)},
        {"registration/p-0": Registration("p-0", "q-0", 0).encode()},
    ):
        with pytest.raises(CommitMarkerError) as refused:
            _refuse_overwriting_another_query(moving, "q-1", ours, here)
        text = str(refused.value)
        assert "holds query q-0's record under" in text and "Nothing was copied" in text
        assert ".option('commitMarkerTopic', 'markers-old') without previousCommitMarkerTopic" in text
    # A record naming no query under the key would stay (it cannot be dated) and hide the marker.
    with pytest.raises(CommitMarkerError, match=r"holds a record under 'p-0' that names no query") as refused:
        _refuse_overwriting_another_query(moving, "q-1", ours, {"p-0": b'{"batch_id": 9}'})
    assert "write a tombstone for key 'p-0' into 'markers-a'" in str(refused.value)
    # ... and once that key's tombstone is written (read as an empty value), the marker is carried.
    _refuse_overwriting_another_query(moving, "q-1", ours, {"p-0": b""})
    from sparkafka.connector.sink.carry_over import _newer

    assert _newer("p-0", ours["p-0"], b"")
    # The query's own older records, and keys the new topic does not hold, are carried as before.
    older_own = {"p-0": CommitMarker("p-0", "q-1", 3, 0, 5, 1, "out").encode()}
    _refuse_overwriting_another_query(moving, "q-1", ours, older_own)
    _refuse_overwriting_another_query(moving, "q-1", ours, {})


def test_another_querys_claim_of_a_newer_release_is_refused_as_another_querys() -> None:
    """Upgrading would not help: the prefix belongs to another query, whatever release wrote its claim."""
    from sparkafka.connector.sink.claims import require_prefix_claim
    from sparkafka.connector.sink.commit_log import PrefixClaim

    found = {"claim/p": _newer_version(PrefixClaim("p", "q-2", 5).encode())}
    with pytest.raises(ReplayRefused, match=r"q-2"):
        require_prefix_claim(OPTIONS, found, "p", "q-1", "p-0")
    own = {"claim/p": _newer_version(PrefixClaim("p", "q-1", 5).encode())}
    with pytest.raises(CommitMarkerError, match=r"prefix claim record .* has version 2"):
        require_prefix_claim(OPTIONS, own, "p", "q-1", "p-0")
