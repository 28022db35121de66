"""acceptReshapedBatch when a write partition's new rows happen to be as many as it committed.

Batch 0 of five records over three write partitions (REPARTITION(3, a)): partitions 0 and 1
commit, partition 2 (r4, r5) is held before its commit and the pipeline is killed. The query is
changed to REPARTITION(3, b), which deals r4 and r5 to partition 0 (two rows, as many as it
committed: r1 and r2) and r1-r3 to partition 1 (three rows where it committed one): partition 1
refuses, and states what accepting costs. A count cannot tell partition 0's new rows from those it
committed, so accepted, partition 0 does not trust the first run's marker and writes r4 and r5:
nothing is lost, and exactly what the first run committed (r1-r3) is in the output twice, as the
refusal said."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess
from tests.integration.conftest import EMBEDDED, Kafka, started_kafka
from tests.integration.connector.test_sink_replay_shape import (
    INPUT_PARTITIONS,
    OUTPUT_PARTITIONS,
    _committed_ids,
    _committed_markers,
    _kill_after_commits,
    _output_ids,
    _paused_at,
    _pipeline,
)
from tests.integration.kafka_clients import create_topic, producer

WRITE_PARTITIONS = 3
# Each record's write partition under the first query (by a) and under the changed one (by b).
FIRST = {"r000001": 0, "r000002": 0, "r000003": 1, "r000004": 2, "r000005": 2}
CHANGED = {"r000001": 1, "r000002": 1, "r000003": 1, "r000004": 0, "r000005": 0}
QUERY = (
    "SELECT /*+ REPARTITION({n}, {column}) */ key, value FROM (SELECT key, value, "
    "CAST(split(CAST(key AS STRING), ',')[0] AS INT) AS a, "
    "CAST(split(CAST(key AS STRING), ',')[1] AS INT) AS b FROM input)"
)


@pytest.fixture
def topics(tmp_path: Path) -> Iterator[Kafka]:
    """The embedded broker of the test's own, with topics in and out (as test_sink_replay_shape's)."""
    with started_kafka(EMBEDDED, tmp_path) as kafka:
        create_topic(kafka.bootstrap_servers, "in", partitions=INPUT_PARTITIONS)
        create_topic(kafka.bootstrap_servers, "out", partitions=OUTPUT_PARTITIONS)
        yield kafka


def _hash_partition_values(spark: SparkSession, partitions: int = WRITE_PARTITIONS) -> list[int]:
    """An integer per write partition that Spark's hash partitioning (Murmur3, seed 42, as the SQL
    function ``hash``) deals to it among ``partitions``."""
    rows = spark.sql(f"SELECT id, pmod(hash(CAST(id AS INT)), {partitions}) AS p FROM range(100)").collect()
    chosen: dict[int, int] = {}
    for row in rows:
        chosen.setdefault(int(row["p"]), int(row["id"]))
    return [chosen[partition] for partition in range(partitions)]


def test_an_accepted_batch_whose_partition_count_coincides_loses_nothing(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    _send_placed(spark, topics, {r: (FIRST[r], CHANGED[r]) for r in FIRST}, (WRITE_PARTITIONS,) * 2)

    first = QUERY.format(n=WRITE_PARTITIONS, column="a")
    run = _pipeline(topics, tmp_path, first, *_paused_at("2"), master="local[2]").start()
    committed = _kill_after_commits(run, topics, held=[2], expect=[0, 1])
    assert committed == {0: 2, 1: 1}
    # Read uncommitted: partition 2's transaction is still open, and holds back read_committed
    # readers of every output partition it wrote to, whichever commit came after it there.
    assert _output_ids(topics, isolation="read_uncommitted") == Counter(
        {f"r00000{i}": 1 for i in range(1, 6)}
    )

    changed = QUERY.format(n=WRITE_PARTITIONS, column="b")
    refused = _pipeline(topics, tmp_path, changed, master="local[2]").start()
    try:
        refused.wait_for("is replayed in another shape than it was first written", timeout_s=180)
    finally:
        refused.kill_group()
    # The refusal states the cost before anyone takes this way on: all the first run committed.
    assert "records written twice: 3 (write partition 0: 2, write partition 1: 1)" in refused.output()

    accepted = _pipeline(
        topics, tmp_path, changed, "--sink-option", "acceptReshapedBatch=0", master="local[2]"
    ).start()
    try:
        output = _committed_ids(topics, 8, stop=accepted.terminate)
    finally:
        accepted.terminate()
    assert set(output) == set(FIRST), "no record of the accepted batch is lost"
    assert output == Counter({"r000001": 2, "r000002": 2, "r000003": 2, "r000004": 1, "r000005": 1})
    assert "3 record(s) written a second time" in accepted.output()


# The narrower replay the driver refuses: by a over 3 write partitions, then by b over 2.
NARROWER_FIRST = {"r000001": 0, "r000002": 1, "r000003": 1, "r000004": 2, "r000005": 2}
NARROWER_CHANGED = {"r000001": 1, "r000002": 0, "r000003": 1, "r000004": 0, "r000005": 0}


def test_a_narrower_replay_that_skipped_by_a_coinciding_count_is_refused_and_accepted_without_loss(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """The first run (web UI off, so its markers record no number of write partitions) deals r1 to
    write partition 0, r2-r3 to 1 and r4-r5 to 2; 1 and 2 commit, 0 is held and the pipeline is
    killed. The replay, by b over two partitions, deals r2, r4, r5 to partition 0, which has no
    marker and writes them, and r1, r3 to partition 1, whose first-run marker counts two rows as
    well: it skips, and r1, never committed, is missing. The driver finds partition 2's marker
    beyond the replay and refuses, naming partition 1's skip and the cost of accepting. Accepted,
    partition 0 keeps what the refusing run committed and partition 1 writes r1 and r3: nothing is
    lost, and exactly the four records the refusal stated are in the output twice."""
    first_values = _hash_partition_values(spark, 3)
    changed_values = _hash_partition_values(spark, 2)
    sender = producer(topics.bootstrap_servers)
    for number, record_id in enumerate(sorted(NARROWER_FIRST)):
        key = f"{first_values[NARROWER_FIRST[record_id]]},{changed_values[NARROWER_CHANGED[record_id]]}"
        sender.produce("in", key=key, value=f"{record_id}|payload", partition=number % INPUT_PARTITIONS)
    assert sender.flush(30) == 0

    without_ui = ("--spark-conf", "spark.ui.enabled=false")
    first = QUERY.format(n=3, column="a")
    run = _pipeline(topics, tmp_path, first, *without_ui, *_paused_at("0"), master="local[3]").start()
    committed = _kill_after_commits(run, topics, held=[0], expect=[1, 2])
    assert committed == {1: 2, 2: 2}

    changed = QUERY.format(n=2, column="b")
    refused = _pipeline(topics, tmp_path, changed, master="local[2]").start()
    try:
        refused.wait_for(
            "was first written by more write partitions than the 2 of this replay", timeout_s=180
        )
    finally:
        refused.kill_group()
    message = refused.output()
    assert "Write partition(s) 1 (2 records) of this replay wrote nothing" in message
    assert "records written twice: 4 (write partition 1: 2, write partition 2: 2)" in message
    missing = _output_ids(topics)
    assert "r000001" not in missing, "the refused replay left r1 unwritten, as its message says"

    accepted = _pipeline(
        topics, tmp_path, changed, "--sink-option", "acceptReshapedBatch=0", master="local[2]"
    ).start()
    try:
        output = _committed_ids(topics, 9, stop=accepted.terminate)
    finally:
        accepted.terminate()
    assert output == Counter({"r000001": 1, "r000002": 2, "r000003": 2, "r000004": 2, "r000005": 2})


# Records placed by a key of one integer per column: column k deals a record to a write partition
# among WIDTHS[k] (Spark's hash partitioning of that integer).
def _send_placed(
    spark: SparkSession, topics: Kafka, placements: Mapping[str, tuple[int, ...]], widths: tuple[int, ...]
) -> None:
    values = [_hash_partition_values(spark, width) for width in widths]
    sender = producer(topics.bootstrap_servers)
    for number, record_id in enumerate(sorted(placements)):
        key = ",".join(str(values[column][p]) for column, p in enumerate(placements[record_id]))
        sender.produce("in", key=key, value=f"{record_id}|payload", partition=number % INPUT_PARTITIONS)
    assert sender.flush(30) == 0


def _placed_query(write_partitions: int, column: int, columns: int) -> str:
    extracted = ", ".join(
        f"CAST(split(CAST(key AS STRING), ',')[{c}] AS INT) AS c{c}" for c in range(columns)
    )
    return (
        f"SELECT /*+ REPARTITION({write_partitions}, c{column}) */ key, value "
        f"FROM (SELECT key, value, {extracted} FROM input)"
    )


def _refused(run: PipelineProcess, text: str) -> str:
    try:
        run.wait_for(text, timeout_s=180)
    finally:
        run.kill_group()
    return run.output()


# Under c0 (the first run), c1 (the refused replay and its acceptance) and c2 (a third shape).
THREE_SHAPES = {
    "r000001": (0, 0, 1),
    "r000002": (1, 0, 1),
    "r000003": (1, 1, 1),
    "r000004": (2, 1, 0),
    "r000005": (2, 1, 0),
}


def test_an_acceptance_cut_short_then_another_shape_is_refused_and_the_accepted_shape_finishes(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """c0 commits write partitions 0 {r1} and 1 {r2, r3}, 2 is held; c1 refuses (three records
    written twice, it says). Accepted with c1, partition 0 commits {r1, r2} and the run is killed
    with partition 1 held. The query is changed again, to c2, whose partition 0 has two rows as the
    acceptance's marker does: the batch holds two shapes, so c2 refuses before writing (where an
    acceptance in c2's shape, trusting the marker by its count, would skip r4 and r5), naming c1's
    shape as the one to accept. Accepted with c1 again: nothing lost, and the three records c1's
    refusal stated are in the output twice."""
    _send_placed(spark, topics, THREE_SHAPES, (3, 3, 3))
    accept = ("--sink-option", "acceptReshapedBatch=0")
    first = _pipeline(topics, tmp_path, _placed_query(3, 0, 3), *_paused_at("2"), master="local[2]").start()
    assert _kill_after_commits(first, topics, held=[2], expect=[0, 1]) == {0: 1, 1: 2}
    refusal = _refused(
        _pipeline(topics, tmp_path, _placed_query(3, 1, 3), master="local[2]").start(),
        "is replayed in another shape than it was first written",
    )
    assert "records written twice: 3 (write partition 0: 1, write partition 1: 2)" in refusal

    cut_short = _pipeline(
        topics, tmp_path, _placed_query(3, 1, 3), *accept, *_paused_at("1"), master="local[2]"
    )
    cut_short.start()
    try:
        cut_short.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=180)
        assert wait_until(lambda: _committed_markers(topics, 0).get(0) == 2, timeout_s=60)
    finally:
        cut_short.kill_group()
    before = _output_ids(topics, isolation="read_uncommitted")

    refusal = _refused(
        _pipeline(topics, tmp_path, _placed_query(3, 2, 3), master="local[2]").start(),
        "holds commits of two shapes",
    )
    assert "records written twice: 2 (write partition 1: 2)" in refusal
    assert _output_ids(topics, isolation="read_uncommitted") == before, "the refused run wrote records"

    accepted = _pipeline(topics, tmp_path, _placed_query(3, 1, 3), *accept, master="local[2]").start()
    try:
        output = _committed_ids(topics, 8, stop=accepted.terminate)
    finally:
        accepted.terminate()
    assert output == Counter({"r000001": 2, "r000002": 2, "r000003": 2, "r000004": 1, "r000005": 1})


# Under c0 (the first run, two write partitions) and c1 (the refused replay, three).
WIDER_WITHOUT_UI = {"r000001": (0, 1), "r000002": (0, 2), "r000003": (1, 0), "r000004": (1, 0)}


def test_a_refused_replay_that_committed_in_its_shape_is_refused_by_either_query_until_accepted(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """The web UI off in every run. c0 commits write partition 1 {r3, r4}, 0 is held. The wider c1
    runs its tasks one after another: partition 0, without a marker, commits {r3, r4}, then 1
    refuses (2 is held before it writes). Both ways on its refusal names meet a batch of two
    shapes: the first run's query (whose partition 0 would otherwise skip by c1's marker of as many
    rows, losing r1 and r2) and c1's again (whose refusal would otherwise replace c1's and raise the
    cost). Each refuses before writing,
    stating what accepting c1's shape costs; accepted, r3 and r4 are in twice, as stated."""
    _send_placed(spark, topics, WIDER_WITHOUT_UI, (2, 3))
    without_ui = ("--spark-conf", "spark.ui.enabled=false")
    first_query, wider = _placed_query(2, 0, 2), _placed_query(3, 1, 2)
    first = _pipeline(topics, tmp_path, first_query, *without_ui, *_paused_at("0"), master="local[2]").start()
    assert _kill_after_commits(first, topics, held=[0], expect=[1]) == {1: 2}
    # Partition 2 is held before it writes: Spark may start it on the freed core before it ends the
    # stage that partition 1's refusal failed.
    hold_partition_2 = ("debug.pauseAt=beforeProduce", "debug.pausePartitions=2", "debug.pauseMs=600s")
    held = tuple(a for option in hold_partition_2 for a in ("--sink-option", option))
    refusal = _refused(
        _pipeline(topics, tmp_path, wider, *without_ui, *held, master="local[1]").start(),
        "is replayed in another shape than it was first written",
    )
    assert "the first run's query refuses in turn" in refusal
    assert _output_ids(topics) == Counter({"r000003": 2, "r000004": 2}), "c1's partition 0 committed"
    before = _output_ids(topics, isolation="read_uncommitted")

    for query in (first_query, wider):
        refusal = _refused(
            _pipeline(topics, tmp_path, query, *without_ui, master="local[2]").start(),
            "holds commits of two shapes",
        )
        assert "records written twice: 2 (write partition 1: 2)" in refusal
        assert _output_ids(topics, isolation="read_uncommitted") == before, "the refused run wrote records"

    accepted = _pipeline(
        topics, tmp_path, wider, *without_ui, "--sink-option", "acceptReshapedBatch=0", master="local[2]"
    ).start()
    try:
        output = _committed_ids(topics, 6, stop=accepted.terminate)
    finally:
        accepted.terminate()
    assert output == Counter({"r000001": 1, "r000002": 1, "r000003": 2, "r000004": 2})


# Under c0 (the first run), c1 (the refused replay) and c2 (an acceptance in a wrong shape).
WRONG_ACCEPTANCE = {
    "r000001": (1, 0, 1),
    "r000002": (2, 0, 2),
    "r000003": (0, 1, 2),
    "r000004": (2, 1, 2),
    "r000005": (0, 2, 0),
    "r000006": (2, 2, 0),
}


def test_an_acceptance_in_a_wrong_shape_leaves_nothing_the_right_one_keeps_by_count(
    spark: SparkSession, topics: Kafka, tmp_path: Path
) -> None:
    """The web UI off, tasks one after another. c0 commits write partitions 0 {r3, r5} and 2 {r2, r4,
    r6}, 1 is held. c1 skips 0 by its count, commits 1 {r3, r4} and refuses at 2. Accepted in the
    wrong shape c2, partition 0 (an untrusted marker) commits {r5, r6} before 1 meets c1's kept
    marker and refuses, recording its run as rejected. Accepted with c1, as that refusal says,
    partition 0 writes {r1, r2} again instead of keeping c2's two rows by their count: nothing lost;
    c1's refusal stated five records twice, and c2's commit (r5, r6) is in once more."""
    _send_placed(spark, topics, WRONG_ACCEPTANCE, (3, 3, 3))
    without_ui, accept = (
        ("--spark-conf", "spark.ui.enabled=false"),
        ("--sink-option", "acceptReshapedBatch=0"),
    )
    first, refused_shape, wrong = (_placed_query(3, column, 3) for column in range(3))
    run = _pipeline(topics, tmp_path, first, *without_ui, *_paused_at("1"), master="local[2]").start()
    assert _kill_after_commits(run, topics, held=[1], expect=[0, 2]) == {0: 2, 2: 3}
    refusal = _refused(
        _pipeline(topics, tmp_path, refused_shape, *without_ui, master="local[1]").start(),
        "is replayed in another shape than it was first written",
    )
    assert "records written twice: 5 (write partition 0: 2, write partition 2: 3)" in refusal
    refusal = _refused(
        _pipeline(topics, tmp_path, wrong, *without_ui, *accept, master="local[1]").start(),
        "is split otherwise than the shape it accepts",
    )
    assert "recorded as not in the accepted shape" in refusal

    accepted = _pipeline(topics, tmp_path, refused_shape, *without_ui, *accept, master="local[2]").start()
    try:
        output = _committed_ids(topics, 13, stop=accepted.terminate)
    finally:
        accepted.terminate()
    assert output == Counter(
        {"r000001": 1, "r000002": 2, "r000003": 2, "r000004": 2, "r000005": 3, "r000006": 3}
    )
