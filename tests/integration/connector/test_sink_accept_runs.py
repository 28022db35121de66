"""Runs of a batch told apart by the sink's own id, whatever a foreachBatch function does to Spark's.

Each write of a micro-batch gets an id made on the driver (the writer's ``run_id``), carried by its
retried tasks and by no later run; markers, refusal records and acceptances name runs by it. Spark's
own run id is not used: a foreachBatch function that sets a job group replaces the description
naming it, and a UUID group of the user's (an orchestrator's run id, the same in every run) would
pass for it. The pipelines here write through foreachBatch (``--output-mode update``) under such
groups, refuse, and are accepted as their refusals advise; each asserts every record at least once
and exactly the copies the refusal stated. The last test leaves ``acceptReshapedBatch`` set on a
query whose batch was never refused: an ordinary replay, exactly once."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.conftest import Kafka
from tests.integration.connector.test_sink_accept_coincidence import (
    CHANGED,
    FIRST,
    QUERY,
    THREE_SHAPES,
    WRITE_PARTITIONS,
    _placed_query,
    _refused,
    _send_placed,
    topics,
)
from tests.integration.connector.test_sink_replay_shape import (
    _committed_ids,
    _committed_markers,
    _kill_after_commits,
    _output_ids,
    _paused_at,
)

__all__ = ["topics"]  # the fixture, shared with test_sink_accept_coincidence

JOB_GROUP_RUN = Path(__file__).with_name("job_group_run.py")
# A job group that is a UUID, the same in every run: an orchestrator's run id, say.
FIXED_UUID = "3f1c2a9e-7b1d-4e5a-9c0f-2d6b8e4a1c77"
ACCEPT = ("--sink-option", "acceptReshapedBatch=0")
WITHOUT_UI = ("--spark-conf", "spark.ui.enabled=false")


def _run(
    topics: Kafka, tmp_path: Path, sql: str, *extra: str, job_group: str = "", master: str = "local[2]"
) -> PipelineProcess:
    """``sparkafka run`` in update mode (its writes go through foreachBatch), every write under
    ``job_group`` when one is given."""
    args = run_arguments(
        topics.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=sql, trigger="500ms",
        master=master, extra=("--output-mode", "update", *extra),
    )  # fmt: skip
    env = {"SPARKAFKA_SHUFFLE_PARTITIONS": "8", "SPARKAFKA_TEST_JOB_GROUP": job_group}
    return PipelineProcess(
        tmp_path / "pipeline.log", args, env=env, command=[sys.executable, str(JOB_GROUP_RUN)]
    )


def _finished(run: PipelineProcess, topics: Kafka, expect: int) -> Counter[str]:
    try:
        return _committed_ids(topics, expect, stop=run.terminate)
    finally:
        run.terminate()


# Under c0 (the first run, three write partitions) and c1 (the replay, two).
NARROWER = {"r000001": (0, 1), "r000002": (1, 0), "r000003": (2, 1)}


def test_a_uuid_job_group_of_the_users_does_not_pass_for_the_run_that_refused(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """Every write under one fixed UUID job group, the web UI off. c0 commits write partitions 0 {r1}
    and 2 {r3}; 1 is held and the pipeline killed. c1 (p0 {r2}, p1 {r1, r3}): p0 skips by the first
    run's marker of as many rows, p1 writes, and the driver refuses for partition 2 beyond the
    replay, counting p0's skip in the cost. Accepted with c1, p0 is not taken for the refusing run's
    (the job group is the same, the run is not): it writes r2, and r1 and r3 are in twice, as
    stated."""
    _send_placed(spark, topics, NARROWER, (3, 2))
    c0, c1 = _placed_query(3, 0, 2), _placed_query(2, 1, 2)
    first = _run(topics, tmp_path, c0, *WITHOUT_UI, *_paused_at("1"), job_group=FIXED_UUID).start()
    assert _kill_after_commits(first, topics, held=[1], expect=[0, 2]) == {0: 1, 2: 1}
    refusal = _refused(
        _run(topics, tmp_path, c1, *WITHOUT_UI, job_group=FIXED_UUID).start(),
        "was first written by more write partitions",
    )
    assert "records written twice: 2 (write partition 0: 1, write partition 2: 1)" in refusal
    accepted = _run(topics, tmp_path, c1, *WITHOUT_UI, *ACCEPT, job_group=FIXED_UUID).start()
    assert _finished(accepted, topics, 5) == Counter({"r000001": 2, "r000002": 1, "r000003": 2})


def test_an_acceptance_under_a_uuid_job_group_keeps_only_the_refusing_runs_commits(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """test_sink_accept_coincidence's first case with every write under one fixed UUID job group.
    By a: p0 {r1, r2} and p1 {r3} commit, p2 {r4, r5} is held and the pipeline killed. By b (p0
    {r4, r5}, p1 {r1, r2, r3}) the replay refuses. The acceptance by b does not take the first run's
    p0 marker (two rows, as many as b gives p0) for the refusing run's though the job group is the
    same: p0 writes r4 and r5, and exactly the three records the refusal stated are in twice."""
    _send_placed(spark, topics, {r: (FIRST[r], CHANGED[r]) for r in FIRST}, (WRITE_PARTITIONS,) * 2)
    by_a, by_b = QUERY.format(n=3, column="a"), QUERY.format(n=3, column="b")
    first = _run(topics, tmp_path, by_a, *_paused_at("2"), job_group=FIXED_UUID).start()
    assert _kill_after_commits(first, topics, held=[2], expect=[0, 1]) == {0: 2, 1: 1}
    refusal = _refused(
        _run(topics, tmp_path, by_b, job_group=FIXED_UUID).start(), "is replayed in another shape"
    )
    assert "records written twice: 3 (write partition 0: 2, write partition 1: 1)" in refusal
    accepted = _run(topics, tmp_path, by_b, *ACCEPT, job_group=FIXED_UUID).start()
    assert _finished(accepted, topics, 8) == Counter(
        {"r000001": 2, "r000002": 2, "r000003": 2, "r000004": 1, "r000005": 1}
    )


# Under c0 (the first run) and c1 (the refused replay and its acceptance), three write partitions.
MIXED = {"r000001": (0, 1), "r000002": (1, 0), "r000003": (2, 0)}


def test_an_acceptance_under_a_job_group_cut_short_leaves_two_shapes_the_first_query_refuses(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """c0 commits write partition 0 {r1}; 1 and 2 are held, the pipeline killed. c1, one task at a
    time, refuses at p0 before writing anything. Its acceptance, whose writes run under a job group
    of the user's, commits p1 {r1} and is killed with p0 held. The first run's query without the
    option (the refusal's other way on) would skip p0 and p1 by their counts and lose r2: it refuses
    as a batch of two shapes instead, stating the cost; accepted with c1, r1 is in twice, as
    stated."""
    _send_placed(spark, topics, MIXED, (3, 3))
    c0, c1 = _placed_query(3, 0, 2), _placed_query(3, 1, 2)
    first = _run(topics, tmp_path, c0, *_paused_at("1,2"), master="local[3]").start()
    assert _kill_after_commits(first, topics, held=[1, 2], expect=[0]) == {0: 1}
    _refused(_run(topics, tmp_path, c1, master="local[1]").start(), "is replayed in another shape")
    assert _committed_markers(topics, 0) == {0: 1}, "the refusing run committed nothing"

    cut_short = _run(topics, tmp_path, c1, *ACCEPT, *_paused_at("0"), job_group="nightly-export").start()
    try:
        cut_short.wait_for("sparkafka debug pause: beforeCommit partition=0 batch=0", timeout_s=180)
        assert wait_until(lambda: _committed_markers(topics, 0).get(1) == 1, timeout_s=60)
    finally:
        cut_short.kill_group()
    before = _output_ids(topics, isolation="read_uncommitted")

    refusal = _refused(_run(topics, tmp_path, c0).start(), "holds commits of two shapes")
    assert "records written twice: 1 (write partition 0: 1)" in refusal
    assert _output_ids(topics, isolation="read_uncommitted") == before, "the refused run wrote records"
    accepted = _run(topics, tmp_path, c1, *ACCEPT).start()
    assert _finished(accepted, topics, 4) == Counter({"r000001": 2, "r000002": 1, "r000003": 1})


def test_an_acceptance_under_a_job_group_cut_short_and_resumed_costs_what_the_refusal_stated(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """Every write under the job group "nightly-export". c0 commits p0 {r1} and p1 {r2, r3}; p2 is
    held and the pipeline killed. c1 refuses: three records written twice. Accepted with c1, p0
    commits {r1, r2} and the run is killed with p1 held; run again with the option still set (the
    refusal says to remove it once the batch is done), the acceptance keeps its own p0 commit and
    the batch finishes with exactly the three copies stated."""
    _send_placed(spark, topics, THREE_SHAPES, (3, 3, 3))
    c0, c1 = _placed_query(3, 0, 3), _placed_query(3, 1, 3)
    group = "nightly-export"
    first = _run(topics, tmp_path, c0, *_paused_at("2"), job_group=group).start()
    assert _kill_after_commits(first, topics, held=[2], expect=[0, 1]) == {0: 1, 1: 2}
    refusal = _refused(_run(topics, tmp_path, c1, job_group=group).start(), "is replayed in another shape")
    assert "records written twice: 3 (write partition 0: 1, write partition 1: 2)" in refusal

    cut_short = _run(topics, tmp_path, c1, *ACCEPT, *_paused_at("1"), job_group=group).start()
    try:
        cut_short.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=180)
        assert wait_until(lambda: _committed_markers(topics, 0).get(0) == 2, timeout_s=60)
    finally:
        cut_short.kill_group()
    resumed = _run(topics, tmp_path, c1, *ACCEPT, job_group=group).start()
    assert _finished(resumed, topics, 8) == Counter(
        {"r000001": 2, "r000002": 2, "r000003": 2, "r000004": 1, "r000005": 1}
    )


def test_the_acceptance_option_left_set_on_a_batch_never_refused_is_an_ordinary_replay(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """A query started with acceptReshapedBatch=0 already set (left over from another query's
    acceptance) commits p0 {r1} and p1 {r2, r3} of batch 0; p2 is held and the pipeline killed.
    Restarted unchanged, the replay is an ordinary one: p0 and p1 skip, p2 writes, every record
    once. (Taken as an acceptance, every commit would have been written again, unannounced.)"""
    _send_placed(spark, topics, THREE_SHAPES, (3, 3, 3))
    c0 = _placed_query(3, 0, 3)
    first = _run(topics, tmp_path, c0, *ACCEPT, *_paused_at("2")).start()
    assert _kill_after_commits(first, topics, held=[2], expect=[0, 1]) == {0: 1, 1: 2}
    replay = _run(topics, tmp_path, c0, *ACCEPT).start()
    assert _finished(replay, topics, 5) == Counter({f"r00000{i}": 1 for i in range(1, 6)})
