"""Error paths of the tools behind the command line, without Kafka or Spark running: a pipeline's
configuration checks, its batch gate once a stop has begun, a pipeline process stopped before it
started, and offsets files of a checkpoint that `checkpoint to-spark-kafka` cannot rewrite."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sparkafka.errors import SparkafkaError, SparkafkaOptionError
from sparkafka.tools.checkpoint import CheckpointError, to_spark_kafka
from sparkafka.tools.pipeline import BatchGate, PipelineConfig, PipelineStopping
from sparkafka.tools.pipeline_process import PipelineProcess

# -- PipelineConfig ---------------------------------------------------------------------------------


def config(**overrides: object) -> PipelineConfig:
    settings: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:1",
        "sink_topic": "out",
        "checkpoint": "/tmp/checkpoint",
        "source_topics": ["in"],
        **overrides,
    }
    return PipelineConfig(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "selection",
    [{"source_topics": []}, {"source_topics": ["in"], "source_pattern": "in.*"}],
    ids=["neither", "both"],
)
def test_a_pipeline_reads_topics_or_a_pattern_exactly_one_of_them(selection: dict[str, object]) -> None:
    with pytest.raises(
        SparkafkaOptionError,
        match=r"give the input as --source-topic \(repeatable\) or --source-pattern, exactly one of them",
    ):
        config(**selection)


def test_a_pipeline_takes_sql_or_a_transform_not_both() -> None:
    with pytest.raises(SparkafkaOptionError, match="give --sql or --transform, not both"):
        config(sql="SELECT value FROM input", transform="jobs:enrich")


@pytest.mark.parametrize("mode", ["upsert", "Append", ""])
def test_a_pipeline_refuses_an_output_mode_spark_does_not_have(mode: str) -> None:
    with pytest.raises(
        SparkafkaOptionError, match=f"output mode must be append, update or complete, got '{mode}'"
    ):
        config(output_mode=mode)


def test_a_pipeline_with_a_pattern_alone_is_accepted() -> None:
    # The counterpart of the checks above: they refuse mistakes, not the other valid selection.
    assert config(source_topics=[], source_pattern="in.*").source_option_map()["subscribePattern"] == "in.*"


# -- BatchGate --------------------------------------------------------------------------------------


def test_a_batch_that_would_start_writing_after_a_stop_began_is_refused() -> None:
    gate = BatchGate()
    with gate.writing():
        pass  # before the stop: allowed
    assert gate.close(timeout_s=1)
    with (
        pytest.raises(
            PipelineStopping, match="the pipeline is stopping: this micro-batch is left to the next run"
        ),
        gate.writing(),
    ):
        pytest.fail("a refused batch must not run its write")


def test_a_stop_waits_for_the_write_in_progress_and_refuses_the_next() -> None:
    gate = BatchGate()
    started, release = threading.Event(), threading.Event()

    def write() -> None:
        with gate.writing():
            started.set()
            release.wait(10)

    writer = threading.Thread(target=write)
    writer.start()
    assert started.wait(10)
    assert not gate.close(timeout_s=0.1), "the write in progress outlasted the wait"
    release.set()
    writer.join(10)
    assert gate.close(timeout_s=1)
    with pytest.raises(PipelineStopping, match="this micro-batch is left to the next run"), gate.writing():
        pass


# -- PipelineProcess --------------------------------------------------------------------------------


def test_terminating_a_pipeline_process_that_never_started_is_an_error(tmp_path: Path) -> None:
    process = PipelineProcess(tmp_path / "pipeline.log", ["--sink-topic", "out"])
    with pytest.raises(SparkafkaError, match=r"the pipeline logging to .*pipeline\.log was never started"):
        process.terminate()


# -- checkpoint to-spark-kafka ----------------------------------------------------------------------

METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
SPARKAFKA_END = {"in": {"0": 100}, "sparkafka:split": {"calculator": 2}}


def checkpoint_with(tmp_path: Path, *offset_files: str) -> Path:
    """A checkpoint whose first batch is committed, with these texts as offsets files 0, 1, ..."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text('{"id":"5f0c"}')
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    for batch, text in enumerate(offset_files):
        (checkpoint / "offsets" / str(batch)).write_text(text)
    return checkpoint


def test_a_source_line_that_is_not_json_stops_the_rewrite_before_any_change(tmp_path: Path) -> None:
    good = "\n".join(["v1", METADATA, json.dumps(SPARKAFKA_END)])
    torn = "\n".join(["v1", METADATA, '{"in":{"0":1', "-"])
    checkpoint = checkpoint_with(tmp_path, good, torn)
    with pytest.raises(CheckpointError, match=r"offsets/1, line 3: not JSON \(Expecting "):
        to_spark_kafka(checkpoint, tmp_path / "backup")
    assert (checkpoint / "offsets" / "0").read_text() == good, "the other files are left as they were"
    assert not (tmp_path / "backup").exists()


@pytest.mark.parametrize("version", ["v3", "v10"])
def test_offsets_files_of_any_version_but_1_are_refused(tmp_path: Path, version: str) -> None:
    checkpoint = checkpoint_with(tmp_path, "\n".join([version, METADATA, json.dumps(SPARKAFKA_END)]))
    with pytest.raises(
        CheckpointError,
        match=f"is an offsets file of version '{version[1:]}'; this command rewrites version 1 only",
    ):
        to_spark_kafka(checkpoint, tmp_path / "backup")


def test_a_cluster_that_does_not_answer_is_named_with_librdkafkas_reason(tmp_path: Path) -> None:
    """The demo's and verify's first question to an existing cluster: unanswered, it names the servers
    and librdkafka's reason, not the KafkaError repr."""
    from sparkafka.errors import KafkaUnavailableError
    from sparkafka.tools.harness import Cluster

    with pytest.raises(KafkaUnavailableError) as refused:
        Cluster(tmp_path, "127.0.0.1:9").check_reachable(timeout_s=1)
    message = str(refused.value)
    assert message.startswith("Kafka at 127.0.0.1:9 did not answer within 1 s (")
    assert "check --bootstrap-servers" in message
    assert "KafkaError{" not in message


@pytest.mark.parametrize("step", [{}, {"sql": "SELECT * FROM input", "transform": "module:function"}])
def test_a_pipeline_is_given_sql_or_a_transform_exactly(step: dict[str, str]) -> None:
    from sparkafka.tools.pipeline_process import run_arguments

    with pytest.raises(ValueError, match=r"^give sql or transform, one of them$"):
        run_arguments("127.0.0.1:1", "in", "out", Path("/tmp/checkpoint"), **step)
