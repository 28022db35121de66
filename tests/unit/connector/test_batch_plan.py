"""What the sink reads of the checkpoint: the newest offsets-log entry, its plan digest, where its
input ended, and the query id; and what it does with a checkpoint it cannot read."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sparkafka.connector.sink.batch_plan import (
    CheckpointFiles,
    input_records_between,
    offsets_gap,
    plan_digest,
    read_batch_plan,
    starting_offsets_of,
)
from sparkafka.connector.sink.commit_log import ProgressRecord
from sparkafka.errors import CommitMarkerError

META = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'


def _entry(offsets: dict) -> str:
    return f"v1\n{META}\n{json.dumps(offsets)}"


def _checkpoint(root: Path, *entries: dict, query_id: str = "q-1") -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for batch, offsets in enumerate(entries):
        (root / "offsets" / str(batch)).write_text(_entry(offsets))
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    return root


def test_the_newest_entry_is_the_batch_being_written(tmp_path: Path) -> None:
    checkpoint = _checkpoint(
        tmp_path / "c",
        {"in": {"0": 5, "1": 3}},
        {"in": {"0": 9, "1": 4}, "sparkafka:split": {"calculator": 2}},
    )
    plan = read_batch_plan(str(checkpoint))
    assert plan is not None
    assert plan.batch_id == 1
    assert plan.query_id == "q-1"
    assert plan.input_records == 5
    assert plan.end_offsets == ('{"in": {"0": 9, "1": 4}, "sparkafka:split": {"calculator": 2}}',)
    assert plan.digest == plan_digest(('{"in": {"0": 5, "1": 3}}',), plan.end_offsets)
    assert plan.start_offsets == ('{"in": {"0": 5, "1": 3}}',)
    assert read_batch_plan(f"file://{checkpoint}") == plan


def test_the_digest_changes_with_the_start_or_the_end_of_the_batch_only() -> None:
    start, end = ('{"in":{"0":5}}',), ('{"in":{"0":9}}',)
    assert plan_digest(start, end) == plan_digest(start, end)
    assert plan_digest(start, end) != plan_digest(start, ('{"in":{"0":10}}',))
    assert plan_digest(start, end) != plan_digest(('{"in":{"0":4}}',), end)


def test_a_batch_planned_anew_has_another_digest(tmp_path: Path) -> None:
    """A restored checkpoint plans batch 1 again from the input present now."""
    first = read_batch_plan(str(_checkpoint(tmp_path / "a", {"in": {"0": 5}}, {"in": {"0": 9}})))
    again = read_batch_plan(str(_checkpoint(tmp_path / "b", {"in": {"0": 5}}, {"in": {"0": 14}})))
    assert first is not None and again is not None
    assert first.batch_id == again.batch_id and first.digest != again.digest


def test_no_checkpoint_or_no_entry_yet_means_no_plan(tmp_path: Path) -> None:
    assert read_batch_plan(None) is None
    assert read_batch_plan(str(tmp_path / "missing")) is None


def test_an_unreadable_checkpoint_is_said_once_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = _checkpoint(tmp_path / "c", {"in": {"0": 5}})
    (checkpoint / "offsets" / "1").write_text("not an offsets entry")
    with caplog.at_level(logging.WARNING):
        assert read_batch_plan(str(checkpoint)) is None
        assert read_batch_plan(str(checkpoint)) is None
    warned = [r for r in caplog.records if "cannot read the checkpoint" in r.getMessage()]
    assert len(warned) == 1
    assert "not an offsets-log entry" in warned[0].getMessage()


def test_starting_offsets_drop_the_sources_own_entries() -> None:
    line = '{"in":{"0":9,"1":4},"sparkafka:split":{"calculator":2}}'
    assert starting_offsets_of((line,)) == '{"in":{"0":9,"1":4}}'
    assert starting_offsets_of((line, line)) is None, "two sources: no single startingOffsets"
    assert starting_offsets_of(("-",)) is None
    assert starting_offsets_of(("not json",)) is None


def test_input_records_need_a_start_for_every_partition() -> None:
    assert input_records_between(('{"in":{"0":5}}',), ('{"in":{"0":9,"1":3}}',)) is None
    assert input_records_between(None, ('{"in":{"0":9}}',)) is None
    assert input_records_between(('{"a":{"0":1},"b":{"0":0}}',), ('{"a":{"0":4},"b":{"0":2}}',)) == 5


def test_a_progress_record_round_trips_and_refuses_a_newer_version() -> None:
    record = ProgressRecord("p", "q-1", 4, "d", ('{"in":{"0":9}}',), 17)
    assert ProgressRecord.decode(record.encode()) == record
    newer = json.dumps({**json.loads(record.encode()), "version": 2}).encode()
    with pytest.raises(CommitMarkerError, match="written by a newer sparkafka"):
        ProgressRecord.decode(newer)


def test_an_offsets_gap_counts_records_read_again_and_never_read() -> None:
    end = ('{"in":{"0":120,"1":80},"sparkafka:split":{"calculator":2}}',)
    assert offsets_gap(('{"in":{"0":120,"1":80}}',), end) == (0, 0)
    assert offsets_gap(('{"in":{"0":100,"1":90}}',), end) == (20, 10)
    assert offsets_gap(('{"in":{"0":100}}',), end) is None, "a partition missing from the start"
    assert offsets_gap((), end) is None


def test_no_offsets_entry_where_spark_wrote_one_is_said_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer exists only after Spark wrote the batch's entry: finding none means the sink reads
    another place than Spark writes (a path resolved against another default file system)."""
    (tmp_path / "elsewhere" / "offsets").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert read_batch_plan(str(tmp_path / "elsewhere")) is None
    assert any("no offsets-log entry found there" in r.getMessage() for r in caplog.records)


def test_a_querys_first_batch_starts_where_its_own_entry_says(tmp_path: Path) -> None:
    """The source resolves startingOffsets into the first batch's end offsets
    (``sparkafka:firstBatchStart:<topic>``): that is where the query starts."""
    first = {"sparkafka:firstBatchStart:in": {"0": 5, "1": 5}, "in": {"0": 10, "1": 12}}
    plan = read_batch_plan(str(_checkpoint(tmp_path / "c", first)))
    assert plan is not None
    assert plan.start_offsets == ('{"in":{"0":5,"1":5}}',)
    assert plan.input_records == 12
    assert offsets_gap(plan.start_offsets, ('{"in":{"0":10,"1":10}}',)) == (10, 0)


def test_checkpoint_files_are_replaced_whole_and_read_back(tmp_path: Path) -> None:
    files = CheckpointFiles(str(tmp_path))
    files.write("sparkafka/claims/a.json", "first")
    files.write("sparkafka/claims/a.json", "second")
    assert files.text("sparkafka/claims/a.json") == "second"
    assert files.names("sparkafka/claims") == ["a.json"], "no temporary file left behind"
    assert CheckpointFiles(f"file://{tmp_path}").text("sparkafka/claims/a.json") == "second"
    assert files.text("sparkafka/claims/b.json") is None
