"""The sink's replay rule (sparkafka.connector.sink.replay), branch by branch: write, skip or refuse."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkafka.connector.sink.batch_plan import offsets_gap
from sparkafka.connector.sink.commit_log import CommitMarker, ProgressRecord
from sparkafka.connector.sink.replay import (
    Action,
    TaskView,
    adaptive_execution_refusal,
    adopted_partial_batch,
    beyond_refusal,
    decide,
    partitions_beyond,
)
from sparkafka.connector.sink.task import (
    ADAPTIVE_ENABLED,
    ADAPTIVE_STATELESS_STREAMING,
    query_run_id,
    task_identity,
)
from sparkafka.errors import ReplayRefused, ReshapedReplayRefused, SparkafkaError, WrongShapeAcceptance

QUERY = "q-1"
OTHER_QUERY = "q-0"
BATCH = 7


def marker(
    *,
    query: str = QUERY,
    batch: int = BATCH,
    records: int = 10,
    partition: int = 2,
    prefix: str = "p",
    topic: str | None = "out",
    width: int | None = None,
    plan: str | None = None,
    run: str | None = None,
    accepted_run: str | None = None,
) -> CommitMarker:
    return CommitMarker(
        f"{prefix}-{partition}", query, batch, partition, records, 0, topic, width, plan, run, accepted_run
    )


END_OFFSETS = ('{"in":{"0":120,"1":80},"sparkafka:split":{"calculator":2}}',)


def progress(*, batch: int = BATCH - 1, plan: str | None = "plan-a", query: str = QUERY) -> ProgressRecord:
    return ProgressRecord("p", query, batch, plan, END_OFFSETS, 0)


def width(count: int | None) -> dict:
    """The task's stage has ``count`` write partitions (None: the driver could not say)."""
    return {"write_partitions": lambda: count}


VIEW = TaskView(
    query_id=QUERY,
    batch_id=BATCH,
    partition=2,
    transactional_id="p-2",
    topic="out",
    batch_write=False,
    own_marker=None,
    registered_query=QUERY,
)


class Rows:
    """The task's row count, remembering whether the rule asked for it (it costs reading the input)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.asked = False

    def __call__(self) -> int:
        self.asked = True
        return self.count


# (case, view changes, the task's rows, expected action or a phrase of the refusal, rows counted)
CASES = [
    ("first write of the id", {}, 10, Action.WRITE, False),
    ("marker of an earlier batch", {"own_marker": marker(batch=BATCH - 1)}, 10, Action.WRITE, False),
    ("replay, same row count", {"own_marker": marker()}, 10, Action.SKIP, True),
    ("replay, fewer rows", {"own_marker": marker()}, 4, "committed 10 record(s) of it", True),
    ("replay, more rows", {"own_marker": marker()}, 25, "the replay gives that partition 25", True),
    ("replay, no rows at all", {"own_marker": marker()}, 0, "another shape", True),
    ("marker of a later batch", {"own_marker": marker(batch=BATCH + 1)}, 3, "is behind its output", False),
    (
        "marker of another query",
        {"own_marker": marker(query=OTHER_QUERY, batch=BATCH + 5)},
        3,
        Action.WRITE,
        False,
    ),
    ("registered by another query", {"registered_query": OTHER_QUERY}, 10, "belongs to query q-0", False),
    (
        "registered by another query, marker at this batch",
        {"registered_query": OTHER_QUERY, "own_marker": marker(query=OTHER_QUERY)},
        10,
        "adoptTransactionalIdsFrom",
        False,
    ),
    (
        "registration not read (producer reused within a run)",
        {"registered_query": None, "own_marker": marker()},
        10,
        Action.SKIP,
        True,
    ),
    (
        "df.write replay to the same topic",
        {"batch_write": True, "own_marker": marker()},
        10,
        Action.SKIP,
        True,
    ),
    (
        "df.write, marker of another write's topic",
        {"batch_write": True, "own_marker": marker(topic="dlq")},
        10,
        "need a transactionalIdPrefix each",
        False,
    ),
    (
        "df.write, marker from before topics were recorded",
        {"batch_write": True, "own_marker": marker(topic=None)},
        10,
        Action.SKIP,
        True,
    ),
    (
        "df.write, rows name their topics",
        {"batch_write": True, "topic": "", "own_marker": marker(topic="")},
        10,
        Action.SKIP,
        True,
    ),
    (
        "streaming write, batch committed under another prefix",
        {"other_prefix_markers": (marker(prefix="old", partition=0),)},
        10,
        "'old-0'",
        False,
    ),
    (
        "streaming write, another prefix at an earlier batch",
        {"other_prefix_markers": (marker(prefix="old", batch=BATCH - 1),)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "streaming write, marker of this batch for another topic",
        {"own_marker": marker(topic="old-out")},
        10,
        "restarted with another output topic",
        False,
    ),
    (
        "replay, another row count, this batch accepted as written",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH, "refusal_recorded": True},
        4,
        Action.WRITE,
        False,
    ),
    (
        # Option left set on a query whose batch was never refused: an ordinary replay, which skips.
        "replay, this batch accepted as written but never refused",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH},
        10,
        Action.SKIP,
        True,
    ),
    (
        "replay, another row count, this batch accepted but never refused",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH},
        4,
        "is replayed in another shape",
        True,
    ),
    (
        "replay, another row count, another batch accepted",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH - 1},
        4,
        "acceptReshapedBatch', '7'",
        True,
    ),
    (
        "streaming write, another id of the prefix committed this batch for another topic",
        {"sibling_markers": (marker(partition=0, topic="old-out"),)},
        10,
        "restarted with another output topic",
        False,
    ),
    (
        "streaming write, another id of the prefix committed this batch for this topic",
        {"sibling_markers": (marker(partition=0), marker(partition=1, batch=BATCH - 1, topic="x"))},
        10,
        Action.WRITE,
        False,
    ),
    (
        "streaming write, batch split over two topics, accepted as written",
        {
            "sibling_markers": (marker(partition=0, topic="old-out"),),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "marker for another topic, accepted as written",
        {"own_marker": marker(topic="old-out"), "accepted_reshaped_batch": BATCH, "refusal_recorded": True},
        10,
        Action.WRITE,
        False,
    ),
    (
        "acceptReshapedBatch beyond the run's first batch",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH + 1, "run_first_batch": BATCH},
        10,
        "names a micro-batch this run of query q-1 has not reached",
        False,
    ),
    (
        "acceptReshapedBatch of a batch done before this run",
        {"own_marker": marker(), "accepted_reshaped_batch": BATCH - 3, "run_first_batch": BATCH},
        10,
        Action.SKIP,
        True,
    ),
    (
        "adopted ids, other query's marker, this batch committed under another prefix",
        {
            "own_marker": marker(query=OTHER_QUERY, batch=BATCH + 5),
            "other_prefix_markers": (marker(prefix="old", partition=0),),
        },
        10,
        "'old-0'",
        False,
    ),
    (
        "replay, own marker of this batch recorded another number of write partitions",
        {"own_marker": marker(width=4), **width(3)},
        10,
        "split into 3 write partitions",
        False,
    ),
    (
        "no own marker, a sibling recorded another number of write partitions",
        {"sibling_markers": (marker(partition=0, width=4),), **width(2)},
        10,
        "Write partition 2 writes nothing, and neither does any other task",
        False,
    ),
    (
        "replay as wide as the first run, same row count",
        {"own_marker": marker(width=4), "sibling_markers": (marker(partition=0, width=4),), **width(4)},
        10,
        Action.SKIP,
        True,
    ),
    (
        "no own marker, a sibling of as many write partitions",
        {"sibling_markers": (marker(partition=0, width=4),), **width(4)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "replay that cannot learn its number of write partitions, the first run could",
        {"own_marker": marker(width=4), **width(None)},
        10,
        "this replay cannot learn its own number",
        False,
    ),
    (
        "no own marker, a sibling recorded a number, this replay cannot learn its own",
        {"sibling_markers": (marker(partition=0, width=4),), **width(None)},
        10,
        "spark.ui.enabled=false",
        False,
    ),
    (
        "the number unknown now, this batch accepted as written",
        {
            "own_marker": marker(width=4),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            **width(None),
        },
        4,
        Action.WRITE,
        False,
    ),
    (
        "marker that recorded no number of write partitions",
        {"own_marker": marker(width=None), **width(3)},
        10,
        Action.SKIP,
        True,
    ),
    (
        "another number of write partitions, accepted as written",
        {
            "own_marker": marker(width=4),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            **width(3),
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "markers of the batch that disagree among themselves",
        {"own_marker": marker(width=4), "sibling_markers": (marker(partition=0, width=3),), **width(4)},
        10,
        "0 (10 records, of 3 write partitions), 2 (10 records, of 4 write partitions)",
        False,
    ),
    (
        "a sibling of an earlier batch with another number of write partitions",
        {"sibling_markers": (marker(partition=0, batch=BATCH - 1, width=4),), **width(2)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "df.write, a sibling recorded another number of write partitions",
        {"batch_write": True, "sibling_markers": (marker(partition=0, width=4),), **width(2)},
        10,
        "split into 2 write partitions",
        False,
    ),
    (
        "adopted ids, the other query's marker recorded another number",
        {"own_marker": marker(query=OTHER_QUERY, width=4), **width(2)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "marker of a later batch, another number of write partitions",
        {"own_marker": marker(batch=BATCH + 1, width=4), **width(2)},
        10,
        "shows micro-batch 8 of this query committed",
        False,
    ),
    (
        "df.write, another write's prefix at this batch",
        {"batch_write": True, "other_prefix_markers": (marker(prefix="dlq-writes"),)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "accepted as written, the refusing run committed what the partition has now",
        {
            "own_marker": marker(width=4, run="run-r"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a",
            **width(4),
        },
        10,
        Action.SKIP,
        True,
    ),
    (
        # This run is not in the shape it accepts: writing would double rows beyond the stated cost.
        "accepted as written, the refusing run committed other than the partition has now",
        {
            "own_marker": marker(width=4, run="run-r"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a",
            **width(4),
        },
        4,
        "is split otherwise than the shape it accepts",
        True,
    ),
    (
        "accepted as written, the refusing run recorded another number of write partitions",
        {
            "own_marker": marker(width=3, run="run-r"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a",
            **width(4),
        },
        10,
        "of 3 write partitions, and this run has 4 write partitions",
        False,
    ),
    (
        "accepted as written, the refusing run recorded its width and this run cannot learn its own",
        {
            "own_marker": marker(width=3, run="run-r"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a",
            **width(None),
        },
        10,
        "this replay cannot learn its own number",
        False,
    ),
    (
        # Another shape's rows, as many as the partition has now: a count cannot tell them apart.
        "accepted as written, the first run committed as many rows as the partition has now",
        {
            "own_marker": marker(run="run-f"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a",
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "accepted as written, an older marker without a run id",
        {
            "own_marker": marker(width=4),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            **width(4),
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "accepted as written, no refusal recorded, the first run's marker",
        {
            "own_marker": marker(run="run-f"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "run_id": "run-a",
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "accepted as written, a run that accepted the same refusal committed what the partition has now",
        {
            "own_marker": marker(run="run-a0", accepted_run="run-r"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r",
            "run_id": "run-a1",
        },
        10,
        Action.SKIP,
        True,
    ),
    (
        # Accepted in the shape of an earlier refusal, which need not be this one's.
        "accepted as written, a run that accepted another refusal committed as many rows",
        {
            "own_marker": marker(run="run-a0", accepted_run="run-r0"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "refused_run": "run-r1",
            "run_id": "run-a1",
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "two shapes: the refusing run committed one partition, the first run another",
        {
            "own_marker": marker(run="run-r"),
            "sibling_markers": (marker(partition=0, records=7, run="run-f"),),
            "refused_run": "run-r",
            "refusal_recorded": True,
            "run_id": "run-2",
        },
        10,
        "holds commits of two shapes: run run-r refused",
        False,
    ),
    (
        "two shapes: an acceptance of the refusal committed one partition, the first run another",
        {
            "sibling_markers": (
                marker(partition=0, records=7, run="run-f"),
                marker(partition=1, records=3, run="run-a", accepted_run="run-r"),
            ),
            "refused_run": "run-r",
            "refusal_recorded": True,
            "run_id": "run-2",
        },
        10,
        "records written twice: 7 (write partition 0: 7)",
        False,
    ),
    (
        "the refusing run committed nothing: a replay in the first run's shape goes on",
        {
            "own_marker": marker(run="run-f"),
            "refused_run": "run-r",
            "refusal_recorded": True,
            "run_id": "run-2",
        },
        10,
        Action.SKIP,
        True,
    ),
    (
        "the refusing run itself, retried: its own rules decide",
        {
            "own_marker": marker(run="run-r"),
            "sibling_markers": (marker(partition=0, records=7, run="run-f"),),
            "refused_run": "run-r",
            "run_id": "run-r",
        },
        10,
        Action.SKIP,
        True,
    ),
    (
        "accepted as written, a retry of this run after its first attempt committed",
        {
            "own_marker": marker(run="run-2"),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            "run_id": "run-2",
        },
        10,
        Action.SKIP,
        True,
    ),
    (
        "accepted as written, no own marker, a sibling of another number",
        {
            "sibling_markers": (marker(partition=0, width=4),),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
            **width(2),
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "a sibling committed a later batch (checkpoint restored from an older copy)",
        {"sibling_markers": (marker(partition=0, batch=BATCH + 2),)},
        10,
        "shows micro-batch 9 of this query committed",
        False,
    ),
    (
        "a later batch under another prefix of this query",
        {"other_prefix_markers": (marker(prefix="old", batch=BATCH + 1),)},
        10,
        "is behind its output",
        False,
    ),
    (
        "a later batch accepted as written does not hide a checkpoint behind its output",
        {
            "sibling_markers": (marker(partition=0, batch=BATCH + 2),),
            "accepted_reshaped_batch": BATCH,
            "refusal_recorded": True,
        },
        10,
        "is behind its output",
        False,
    ),
    (
        "the progress record is past this batch",
        {"progress": progress(batch=BATCH + 1)},
        10,
        "shows micro-batch 8 of this query committed",
        False,
    ),
    (
        "another query's progress past this batch (adopted ids)",
        {"progress": progress(batch=BATCH + 1, query=OTHER_QUERY)},
        10,
        Action.WRITE,
        False,
    ),
    (
        "own marker of this batch planned from other input",
        {"own_marker": marker(plan="plan-a"), "plan": "plan-b"},
        10,
        "was planned from other input",
        False,
    ),
    (
        "a sibling's marker of this batch planned from other input",
        {"sibling_markers": (marker(partition=0, plan="plan-a"),), "plan": "plan-b"},
        10,
        "was planned from other input",
        False,
    ),
    (
        "the progress record of this batch planned from other input",
        {"progress": progress(batch=BATCH, plan="plan-a"), "plan": "plan-b"},
        10,
        "was planned from other input",
        False,
    ),
    (
        "replay of the same plan",
        {"own_marker": marker(plan="plan-a"), "plan": "plan-a"},
        10,
        Action.SKIP,
        True,
    ),
    (
        "plan unknown now (checkpoint unreadable): batch ids alone",
        {"own_marker": marker(plan="plan-a"), "plan": None},
        10,
        Action.SKIP,
        True,
    ),
    (
        "marker from before plans were recorded",
        {"own_marker": marker(plan=None), "plan": "plan-b"},
        10,
        Action.SKIP,
        True,
    ),
    (
        "nothing of the query in the marker topic, past its first batch",
        {"history_found": False, "run_first_batch": BATCH, "marker_topic": "markers-b", "plan": "d"},
        10,
        "commit-marker topic 'markers-b' holds nothing of it",
        False,
    ),
    (
        "nothing of the query in the marker topic, its first batch",
        {"history_found": False, "batch_id": 0, "run_first_batch": 0, "plan": "d"},
        10,
        Action.WRITE,
        False,
    ),
    (
        "its first batch, a claim the checkpoint recorded gone from the marker topic",
        {"history_found": False, "batch_id": 0, "run_first_batch": 0, "plan": "d", "claim_missing": True},
        10,
        "its checkpoint records that it claimed its transactional-id prefix in this topic",
        False,
    ),
    (
        "its first batch, the recorded claim gone, exactly-once declared to start there",
        {
            "history_found": False,
            "batch_id": 0,
            "run_first_batch": 0,
            "plan": "d",
            "claim_missing": True,
            "exactly_once_from": 0,
        },
        10,
        Action.WRITE,
        False,
    ),
    (
        "nothing of the query in the marker topic, exactly-once declared to start here",
        {"history_found": False, "run_first_batch": BATCH, "exactly_once_from": BATCH, "plan": "d"},
        10,
        Action.WRITE,
        False,
    ),
    (
        "exactlyOnceFromBatch beyond the run's first batch",
        {"history_found": False, "run_first_batch": BATCH, "exactly_once_from": BATCH + 1, "plan": "d"},
        10,
        "option exactlyOnceFromBatch=8 names a micro-batch this run of query q-1 has not reached",
        False,
    ),
    (
        "nothing of the query in the marker topic, a later batch of the run",
        {"history_found": False, "run_first_batch": BATCH - 1, "plan": "d"},
        10,
        Action.WRITE,
        False,
    ),
    (
        "nothing of the query in the marker topic, the checkpoint unread: refused all the same",
        {"history_found": False, "run_first_batch": BATCH, "plan": None},
        10,
        "takes this way at no cost",
        False,
    ),
    (
        "exactlyOnceFromBatch below the run's first batch is said to have no effect",
        {"history_found": False, "run_first_batch": BATCH, "exactly_once_from": 2},
        10,
        "option exactlyOnceFromBatch=2 given names an earlier micro-batch",
        False,
    ),
    (
        "progress two batches behind the checkpoint (a marker topic used before)",
        {"progress": progress(batch=BATCH - 3), "run_first_batch": BATCH, "plan": "d"},
        10,
        "progress up to micro-batch 4 only, and its checkpoint committed up to micro-batch 6",
        False,
    ),
    (
        "progress of the batch before this one",
        {"progress": progress(batch=BATCH - 1), "run_first_batch": BATCH, "plan": "d"},
        10,
        Action.WRITE,
        False,
    ),
    (
        "stale progress, exactly-once declared to start here",
        {"progress": progress(batch=1), "run_first_batch": BATCH, "plan": "d", "exactly_once_from": BATCH},
        10,
        Action.WRITE,
        False,
    ),
    (
        "stale progress of a df.write (no progress for batches without tasks)",
        {"progress": progress(batch=1), "run_first_batch": BATCH, "plan": "d", "batch_write": True},
        10,
        Action.WRITE,
        False,
    ),
]


@pytest.mark.parametrize(("case", "changes", "rows", "expected", "counted"), CASES, ids=[c[0] for c in CASES])
def test_decide(case: str, changes: dict, rows: int, expected: Action | str, counted: bool) -> None:
    view = replace(VIEW, **changes)
    count = Rows(rows)
    if isinstance(expected, Action):
        assert decide(view, count) is expected
    else:
        with pytest.raises(ReplayRefused, match=expected.replace("(", r"\(").replace(")", r"\)")):
            decide(view, count)
    assert count.asked is counted


def test_a_reshaped_replay_names_the_batch_the_partition_and_the_way_out() -> None:
    with pytest.raises(ReplayRefused) as refused:
        decide(replace(VIEW, own_marker=marker(records=12)), Rows(3))
    message = str(refused.value)
    for phrase in (
        "micro-batch 7",
        "write partition 2",
        "'p-2'",
        "REPARTITION",
        ADAPTIVE_STATELESS_STREAMING,
        "until micro-batch 7 is done",
    ):
        assert phrase in message


def test_partitions_beyond_lists_only_this_batch_of_this_query_and_prefix() -> None:
    markers = [
        marker(partition=0),
        marker(partition=3),  # beyond: the replay has 2 partitions
        marker(partition=2, records=4),  # beyond
        marker(partition=4, batch=BATCH - 1),  # an earlier batch: a narrower restart after it is fine
        marker(partition=5, query=OTHER_QUERY),
        marker(partition=6, prefix="other"),
        CommitMarker("p-9", QUERY, BATCH, 8, 1, 0, "out"),  # the id's suffix disagrees with its partition
    ]
    beyond = partitions_beyond(markers, query_id=QUERY, batch_id=BATCH, prefix="p", partitions=2)
    assert [m.partition for m in beyond] == [2, 3]
    message = str(beyond_refusal(beyond, [], batch_id=BATCH, partitions=2))
    assert "partition(s) 2 (4 records), 3 (10 records)" in message
    assert "the 2 of this replay" in message
    assert ".option('acceptReshapedBatch', '7')" in message
    assert (
        "they write nothing more: records written twice: 14 (write partition 2: 4, write partition 3: 10)"
        in (message)
    )
    assert "missing" not in message


def test_a_narrower_replay_that_skipped_by_the_first_runs_markers_says_those_rows_may_be_missing() -> None:
    """The web UI off: the replay's partition 1 skipped because the first run's partition 1 committed
    as many rows, which split otherwise can be other rows. Accepting writes it again, and the cost says so."""
    beyond = [marker(partition=2, records=4, run="run-f")]
    skipped = [marker(partition=1, records=6, run="run-f")]
    message = str(beyond_refusal(beyond, skipped, batch_id=BATCH, partitions=2))
    assert "Write partition(s) 1 (6 records) of this replay wrote nothing" in message
    assert "which are then missing until the batch is accepted" in message
    assert "the partitions that wrote nothing write all their rows, so no record is lost" in message
    assert "records written twice: 10 (write partition 1: 6, write partition 2: 4)" in message


def test_partitions_beyond_is_empty_for_a_replay_as_wide_as_the_first_run() -> None:
    markers = [marker(partition=p) for p in range(4)]
    assert partitions_beyond(markers, query_id=QUERY, batch_id=BATCH, prefix="p", partitions=4) == []


ADAPTIVE_CASES = [
    # (settings the session set explicitly, df.write in foreachBatch, refused because of)
    ({}, False, ADAPTIVE_STATELESS_STREAMING),
    ({ADAPTIVE_STATELESS_STREAMING: "true"}, False, ADAPTIVE_STATELESS_STREAMING),
    ({ADAPTIVE_STATELESS_STREAMING: "false"}, False, None),
    ({ADAPTIVE_STATELESS_STREAMING: " FALSE "}, False, None),
    ({ADAPTIVE_ENABLED: "false"}, False, None),
    ({ADAPTIVE_ENABLED: "true", ADAPTIVE_STATELESS_STREAMING: "false"}, False, None),
    ({}, True, ADAPTIVE_ENABLED),
    ({ADAPTIVE_STATELESS_STREAMING: "false"}, True, ADAPTIVE_ENABLED),
    ({ADAPTIVE_ENABLED: "false"}, True, None),
]


@pytest.mark.parametrize(("settings", "batch_write", "refused_for"), ADAPTIVE_CASES)
def test_adaptive_execution_refusal(settings: dict, batch_write: bool, refused_for: str | None) -> None:
    refusal = adaptive_execution_refusal(settings, batch_write=batch_write)
    if refused_for is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert f"{refused_for}=" in refusal
        assert f"spark.conf.set('{refused_for}', 'false')" in refusal
        assert ("unset (Spark's default: true)" in refusal) == (refused_for not in settings)


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("\nid = q-1\nrunId = 5f0c-run\nbatch = 3", "5f0c-run"),
        # A foreachBatch function set a description (or a job group, which sets one) of its own.
        ("nightly load", None),
        (None, None),
    ],
)
def test_spark_run_id_comes_from_the_batch_description_only(
    description: str | None, expected: str | None
) -> None:
    assert query_run_id(description) == expected


def test_the_sinks_write_outside_a_spark_task_is_refused() -> None:
    with pytest.raises(SparkafkaError, match="must run inside a Spark task"):
        task_identity()


def test_a_checkpoint_behind_its_output_names_a_restart_point_and_its_exact_cost() -> None:
    partial = (marker(partition=0, batch=BATCH, records=6), marker(partition=1, batch=BATCH, records=4))
    view = replace(VIEW, batch_id=BATCH - 5, sibling_markers=partial, progress=progress(), marker_topic="m")
    with pytest.raises(ReplayRefused) as refused:
        decide(view, Rows(10))
    message = str(refused.value)
    for phrase in (
        "it is at micro-batch 2, and the commit-marker topic 'm' shows micro-batch 7 of this query committed",
        "Restore the newest copy of the checkpoint (one whose offsets log reaches micro-batch 7)",
        """.option('startingOffsets', '{"in":{"0":120,"1":80}}')""",
        "records written twice: 10 record(s) — the part of micro-batch 7 that committed",
        "'p-0': 6, 'p-1': 4",
        "nothing is lost",
    ):
        assert phrase in message, phrase


def test_a_checkpoint_behind_without_a_progress_record_offers_no_restart_point() -> None:
    view = replace(VIEW, own_marker=marker(batch=BATCH + 3))
    with pytest.raises(ReplayRefused) as refused:
        decide(view, Rows(10))
    assert "no restart point can be offered that loses nothing" in str(refused.value)
    assert "startingOffsets" not in str(refused.value)


def test_every_refusal_that_offers_acceptance_states_the_records_written_twice() -> None:
    first_run = (marker(partition=0, records=7, width=2), marker(partition=1, records=5, width=2))
    wider = replace(VIEW, partition=3, sibling_markers=first_run, **width(4))
    with pytest.raises(ReplayRefused) as refused:
        decide(wider, Rows(3))
    assert "records written twice: 12 (write partition 0: 7, write partition 1: 5)" in str(refused.value)
    reshaped = replace(VIEW, own_marker=marker(records=9), sibling_markers=(marker(partition=0, records=7),))
    with pytest.raises(ReshapedReplayRefused) as refused:
        decide(reshaped, Rows(3))
    assert "records written twice: 16 (write partition 0: 7, write partition 2: 9)" in str(refused.value)
    assert refused.value.batch_id == BATCH


def test_the_cost_of_accepting_leaves_out_what_the_refusing_run_commits() -> None:
    """Partition 0 committed in this (refusing) run, 1 in a run that accepted an earlier refusal
    (another shape's): accepted, only partition 0 is kept; 1 and the first run's 2 are written again."""
    view = replace(
        VIEW,
        run_id="run-r",
        own_marker=marker(records=9, run="run-f"),
        sibling_markers=(
            marker(partition=0, records=7, run="run-r"),
            marker(partition=1, records=5, run="run-a", accepted_run="run-r0"),
        ),
    )
    with pytest.raises(ReshapedReplayRefused) as refused:
        decide(view, Rows(3))
    message = str(refused.value)
    assert "records written twice: 14 (write partition 1: 5, write partition 2: 9)" in message
    assert "this run's query and settings" in message


def test_accepting_a_batch_no_other_run_committed_costs_nothing() -> None:
    view = replace(
        VIEW, run_id="run-r", sibling_markers=(marker(partition=0, records=7, run="run-r", width=2),)
    )
    with pytest.raises(ReshapedReplayRefused) as refused:
        decide(replace(view, **width(4)), Rows(3))
    assert "no record is written twice" in str(refused.value)


def test_accepted_as_written_counts_only_where_the_accepted_shape_committed() -> None:
    """A marker of the accepted shape is checked by count (and refuses when it differs); a marker of
    another run is not counted at all: the task writes every row."""
    counted = Rows(4)
    view = replace(
        VIEW,
        own_marker=marker(records=10, run="run-r"),
        accepted_reshaped_batch=BATCH,
        refused_run="run-r",
        refusal_recorded=True,
        run_id="run-a",
    )
    with pytest.raises(ReplayRefused, match="is split otherwise than the shape it accepts"):
        decide(view, counted)
    assert counted.asked
    other = Rows(4)
    assert decide(replace(view, own_marker=marker(records=10, run="run-f")), other) is Action.WRITE
    assert not other.asked


def test_an_adopting_query_counts_what_a_lagging_start_reads_again() -> None:
    """The old query's last complete batch ended at 120/80; the adopting query starts at 100/80 (a
    consumer group's offsets a batch behind): 20 records read again, named with the way on."""
    message = adopted_partial_batch(
        "q-new",
        "q-old",
        progress(batch=3),
        (),
        "p-0",
        1,
        offsets_gap(('{"in":{"0":100,"1":80}}',), END_OFFSETS),
    )
    assert "this query starts 20 input record(s) before where that batch ended" in message
    assert """.option('startingOffsets', '{"in":{"0":120,"1":80}}')""" in message
    assert (
        ".option('acceptReshapedBatch', '1') (this query's micro-batch 1): 20 record(s) written twice"
        in message
    )


def _batch_of_runs(*markers: CommitMarker) -> dict[int, CommitMarker]:
    return {m.partition: m for m in markers}


def _decide_each(
    markers: dict[int, CommitMarker], rows: dict[int, int], **view: object
) -> dict[int, Action | ReplayRefused]:
    """``decide`` for each write partition of ``rows`` (its row count), with ``markers`` of the batch."""
    decided: dict[int, Action | ReplayRefused] = {}
    for partition, count in rows.items():
        task = replace(
            VIEW,
            partition=partition,
            transactional_id=f"p-{partition}",
            own_marker=markers.get(partition),
            sibling_markers=tuple(m for p, m in markers.items() if p != partition),
            run_first_batch=BATCH,
            **view,  # type: ignore[arg-type]
        )
        try:
            decided[partition] = decide(task, Rows(count))
        except ReplayRefused as refused:
            decided[partition] = refused
    return decided


def test_a_refused_run_without_a_run_id_stops_every_later_run_until_the_batch_is_accepted() -> None:
    """Web UI off, a refusal record without a run (as an earlier version of the sink recorded one
    where a foreachBatch function hid Spark's run id). The first run (A: p0 {1-4}, p1 {5-7}, p2
    {8-10}) committed p0 and p2; the changed query (B: p0 {1-5}, p1 {6-8}, p2 {9, 10}) refused at p0
    and p2, recorded as unknown, and committed p1 {6, 7, 8}. The first run's query again would skip
    all three by their counts (record 5 lost, 8 twice): every task refuses instead, counting every
    commit of the batch as the cost of accepting; and the
    acceptance keeps none of them."""
    markers = _batch_of_runs(
        marker(partition=0, records=4), marker(partition=1, records=3), marker(partition=2, records=3)
    )
    decided = _decide_each(markers, {0: 4, 1: 3, 2: 3}, batch_write=True, refusal_recorded=True)
    for outcome in decided.values():
        assert isinstance(outcome, ReplayRefused), decided
        assert "by a run its refusal record names no id for" in str(outcome)
        assert (
            "records written twice: 10 (write partition 0: 4, write partition 1: 3, write partition 2: 3)"
            in (str(outcome))
        )
    accepted = _decide_each(
        markers, {0: 5, 1: 3, 2: 2}, batch_write=True, refusal_recorded=True, accepted_reshaped_batch=BATCH
    )
    assert accepted == {0: Action.WRITE, 1: Action.WRITE, 2: Action.WRITE}


def test_a_wrong_shape_acceptance_leaves_nothing_the_right_one_keeps_by_count() -> None:
    """Refused run r2 (B: p0 {1, 2}, p1 {3, 4}, p2 {5, 6}) committed p0 and p1; an acceptance r3 in
    shape D refused at p0 (a kept marker it does not match) and recorded itself as rejected, while
    its p2 {3, 4} committed (accepted_run r2). The right acceptance (B) writes p2 {5, 6} again
    instead of skipping it because D's marker also counts two rows; and a run that does not accept
    counts D's commit in the cost of the two shapes."""
    wrong = _decide_each(
        _batch_of_runs(
            marker(partition=0, records=2, run="r2"),
            marker(partition=1, records=2, run="r2"),
            marker(partition=2, records=3, run="r1"),
        ),
        {0: 1, 2: 2},
        run_id="r3",
        refused_run="r2",
        refusal_recorded=True,
        accepted_reshaped_batch=BATCH,
    )
    assert isinstance(wrong[0], WrongShapeAcceptance) and wrong[0].batch_id == BATCH
    assert "recorded as not in the accepted shape" in str(wrong[0])
    assert wrong[2] is Action.WRITE
    markers = _batch_of_runs(
        marker(partition=0, records=2, run="r2"),
        marker(partition=1, records=2, run="r2"),
        marker(partition=2, records=2, run="r3", accepted_run="r2"),
    )
    decided = _decide_each(
        markers,
        {0: 2, 1: 2, 2: 2},
        run_id="r4",
        refused_run="r2",
        refusal_recorded=True,
        rejected_runs=("r3",),
        accepted_reshaped_batch=BATCH,
    )
    assert decided == {0: Action.SKIP, 1: Action.SKIP, 2: Action.WRITE}
    unaccepted = _decide_each(
        markers, {0: 2}, run_id="r5", refused_run="r2", refusal_recorded=True, rejected_runs=("r3",)
    )
    assert "records written twice: 2 (write partition 2: 2)" in str(unaccepted[0])
