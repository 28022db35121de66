"""``sparkafka checkpoint to-spark-kafka`` on checkpoint files laid out as Spark writes them (the
whole way back to format("kafka") runs in tests/integration/connector/test_migration_spark_kafka.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparkafka.cli.app import app
from sparkafka.tools.checkpoint import CheckpointError, to_spark_kafka

METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
SPARKAFKA_END = {
    "in": {"0": 100, "1": 100},
    "sparkafka:firstBatchStart:in": {"0": 0, "1": 0},
    "sparkafka:split": {"calculator": 2, "maxRecordsPerPartition": 0, "minPartitions": 0},
}


def _checkpoint(tmp_path: Path, *sources: str) -> Path:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text('{"id":"5f0c"}')
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')  # batch 0 is done
    for batch, source in enumerate(sources):
        (checkpoint / "offsets" / str(batch)).write_text("\n".join(["v1", METADATA, source]))
        (checkpoint / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    return checkpoint


def test_sparkafkas_entries_go_and_the_rest_stays_as_spark_wrote_it(tmp_path: Path) -> None:
    spark_written = '{"in":{"0":50,"1":50}}'
    checkpoint = _checkpoint(tmp_path, spark_written, json.dumps(SPARKAFKA_END), "-")
    done = to_spark_kafka(checkpoint, tmp_path / "backup")

    assert done.rewritten_batches == [1]
    assert done.removed_entries == {"sparkafka:firstBatchStart:in", "sparkafka:split"}
    lines = (checkpoint / "offsets" / "1").read_text().split("\n")
    assert lines == ["v1", METADATA, '{"in":{"0":100,"1":100}}']
    assert not (checkpoint / "offsets" / ".1.crc").exists(), "a stale checksum fails Spark's read"
    assert (checkpoint / "offsets" / ".0.crc").exists(), "untouched files keep theirs"
    assert (checkpoint / "offsets" / "0").read_text().endswith(spark_written)
    assert (checkpoint / "offsets" / "2").read_text().endswith("-")
    backup = tmp_path / "backup"
    assert json.loads((backup / "offsets" / "1").read_text().split("\n")[2]) == SPARKAFKA_END
    assert (backup / "commits" / "0").exists()

    again = to_spark_kafka(checkpoint, tmp_path / "second-backup")
    assert again.rewritten_batches == [], "a second run changes nothing"


def test_a_source_line_that_is_not_kafka_offsets_stops_everything_before_any_change(tmp_path: Path) -> None:
    other_source = json.dumps({"sparkafka:idleHeartbeat": {"0": 1}, "files": ["a.csv"]})
    checkpoint = _checkpoint(tmp_path, json.dumps(SPARKAFKA_END), other_source)
    with pytest.raises(CheckpointError, match=r"line 3: entry 'files' is not a topic's partition offsets"):
        to_spark_kafka(checkpoint, tmp_path / "backup")
    assert json.loads((checkpoint / "offsets" / "0").read_text().split("\n")[2]) == SPARKAFKA_END
    assert not (tmp_path / "backup").exists()


def test_a_source_line_that_is_not_json_stops_everything_before_any_change(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, json.dumps(SPARKAFKA_END), '{"in": {"0": 100,')
    before = (checkpoint / "offsets" / "0").read_text()
    with pytest.raises(CheckpointError, match=r"offsets/1, line 3: not JSON \("):
        to_spark_kafka(checkpoint, tmp_path / "backup")
    assert (checkpoint / "offsets" / "0").read_text() == before, "the valid batch was left as it was"


def test_what_is_not_a_checkpoint_or_an_existing_backup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="needs a 'metadata' file and an 'offsets' directory"):
        to_spark_kafka(tmp_path, tmp_path / "backup")
    checkpoint = _checkpoint(tmp_path, json.dumps(SPARKAFKA_END))
    (tmp_path / "backup").mkdir()
    with pytest.raises(CheckpointError, match="exists already: name another with --backup"):
        to_spark_kafka(checkpoint, tmp_path / "backup")
    (checkpoint / "offsets" / "1").write_text("not an offsets file")
    with pytest.raises(CheckpointError, match="is not an offsets file of Spark's"):
        to_spark_kafka(checkpoint, tmp_path / "other-backup")


def test_an_uncommitted_first_batch_or_a_version_2_log_is_refused_before_any_change(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, json.dumps(SPARKAFKA_END))
    (checkpoint / "commits" / "0").unlink()
    with pytest.raises(CheckpointError, match=r"first micro-batch .* is not committed"):
        to_spark_kafka(checkpoint, tmp_path / "backup")
    assert not (tmp_path / "backup").exists()
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (checkpoint / "offsets" / "0").write_text("\n".join(["v2", METADATA, "0:" + json.dumps(SPARKAFKA_END)]))
    with pytest.raises(CheckpointError, match="version '2'; this command rewrites version 1 only"):
        to_spark_kafka(checkpoint, tmp_path / "backup")


def test_the_command_says_what_it_did_and_fails_with_a_message(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, json.dumps(SPARKAFKA_END))
    runner = CliRunner()
    done = runner.invoke(
        app, ["checkpoint", "to-spark-kafka", str(checkpoint), "--backup", str(tmp_path / "b")]
    )
    assert done.exit_code == 0, done.output
    assert "rewrote the offsets of micro-batch(es) 0" in done.output
    assert "sparkafka:split" in done.output
    refused = runner.invoke(app, ["checkpoint", "to-spark-kafka", str(tmp_path / "nowhere")])
    assert refused.exit_code == 1
    assert "is not a streaming query's checkpoint" in refused.output
