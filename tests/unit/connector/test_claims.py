"""The checkpoint's record of a prefix claim, and when a claim counts as missing."""

from __future__ import annotations

import json
from pathlib import Path

from sparkafka.connector.sink.batch_plan import BatchPlan, CheckpointFiles
from sparkafka.connector.sink.claims import (
    ClaimRecord,
    belongs_to,
    claim_missing,
    holds_query,
    read_claim_record,
)
from sparkafka.connector.sink.markers import CommitMarker
from sparkafka.connector.sink.options import SinkOptions

OPTIONS = SinkOptions.parse(
    {
        "kafka.bootstrap.servers": "localhost:9092",
        "topic": "out",
        "deliveryGuarantee": "exactly-once",
        "commitMarkerTopic": "markers-a",
    }
)
PLAN = BatchPlan(0, "d", ("{}",), "q-1")


def _claim(query: str) -> dict[str, bytes]:
    return {"claim/p": json.dumps({"prefix": "p", "query_id": query}).encode()}


def test_a_record_round_trips_under_a_file_name_any_prefix_can_have(tmp_path: Path) -> None:
    files = CheckpointFiles(str(tmp_path))
    record = ClaimRecord("odd/prefix: ü", "markers-a", "q-1")
    from sparkafka.connector.sink.claims import _record_name

    files.write(_record_name(record.prefix), record.encode())
    assert read_claim_record(files, "odd/prefix: ü") == record
    assert read_claim_record(files, "another") is None
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
