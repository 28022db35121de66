"""The rules of step 4 of the exactly-once protocol: whether a write task writes, skips or refuses.

The rules, their order and their reasons are told once, in the sink package docstring
(:mod:`sparkafka.connector.sink`, step 4 and its parts 4a-4k); this module holds their code and the
refusals' messages, which name the cause, the way on and its cost. Pure functions over what a task
and the driver already know; nothing here reads or writes Kafka.

Where each rule is:

- :func:`decide`: step 4, the rules in the package text's order; 4a, 4b, 4h, 4j and 4k inline.
- :func:`_refuse_lost_markers` and :func:`markers_lost`: 4c. :func:`markers_lost` also serves
  step 2 (:mod:`.claims`) and step 3b (:mod:`.id_state`).
- :func:`_refuse_checkpoint_behind`: 4d.
- :func:`_accepted_as_written` and :func:`kept_when_accepted`: 4e; :func:`rewritten_when_accepted`
  and :func:`written_twice`: the cost a refusal states.
- :func:`_refuse_two_shapes`: 4f; :func:`_refuse_another_width`: 4g; :func:`_refuse_another_prefix`:
  4i, and the end of 4e.
- :func:`partitions_beyond` and :func:`beyond_refusal`: the driver's check after the tasks.
- :func:`adaptive_execution_refusal`: step 0; :func:`prefix_claimed_by_another_query`: steps 2 and
  3d; :func:`adopted_partial_batch`: step 3c.

A refusal the writer records as the refusing run raises :class:`ReshapedReplayRefused` (4g, the row
count of 4h, the driver's check); one it records as a rejected acceptance raises
:class:`WrongShapeAcceptance` (4e); any other raises :class:`ReplayRefused`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sparkafka.connector.sink.options import (
    ACCEPT_RESHAPED_OPTION,
    ADOPT_OPTION,
    EXACTLY_ONCE_FROM_OPTION,
    PREVIOUS_MARKER_TOPIC_OPTION,
)
from sparkafka.connector.sink.task import ADAPTIVE_ENABLED, ADAPTIVE_STATELESS_STREAMING
from sparkafka.connector.sink.transactional_ids import transactional_id
from sparkafka.errors import ReplayRefused, ReshapedReplayRefused, WrongShapeAcceptance


class Action(enum.Enum):
    WRITE = "write"
    SKIP = "skip"


class Marker(Protocol):
    """What a commit marker tells (:class:`sparkafka.connector.sink.commit_log.CommitMarker`)."""

    @property
    def transactional_id(self) -> str: ...
    @property
    def query_id(self) -> str: ...
    @property
    def batch_id(self) -> int: ...
    @property
    def partition(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def write_partitions(self) -> int | None: ...
    @property
    def plan(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def accepted_run(self) -> str | None: ...


class Progress(Protocol):
    """What a progress record tells (:class:`sparkafka.connector.sink.commit_log.ProgressRecord`)."""

    @property
    def query_id(self) -> str: ...
    @property
    def batch_id(self) -> int: ...
    @property
    def plan(self) -> str | None: ...
    @property
    def end_offsets(self) -> tuple[str, ...] | None: ...


@dataclass(frozen=True)
class TaskView:
    """What one exactly-once write task knows when it decides.

    ``topic``: the write's ``topic`` option, "" when every row names its topic. ``registered_query``:
    the query the id's registration names, None when it was not read (a producer reused within a
    run). ``sibling_markers``: markers of this query of the other ids under this id's prefix, and
    ``other_prefix_markers`` those under other prefixes (streaming writes only, empty otherwise),
    both read at the first write of the id in this run. ``run_first_batch``:
    the micro-batch of that first write, the only one of the run that can be a replay."""

    query_id: str
    batch_id: int
    partition: int
    transactional_id: str
    topic: str
    batch_write: bool
    own_marker: Marker | None
    registered_query: str | None = None
    other_prefix_markers: Sequence[Marker] = field(default_factory=tuple)
    sibling_markers: Sequence[Marker] = field(default_factory=tuple)
    accepted_reshaped_batch: int | None = None
    run_first_batch: int | None = None
    # How many write partitions this task's stage has (the driver's status API); None when unknown.
    # Called only when a marker of this batch records its own number.
    write_partitions: Callable[[], int | None] = lambda: None
    # The digest of the input this batch was planned from (batch_plan.BatchPlan); None when unknown.
    plan: str | None = None
    # This run of the batch (the writer's own id, made on the driver for each run of each batch),
    # to tell a retried task of this run from a replay.
    run_id: str | None = None
    # The last batch of this query every task and the driver committed under this prefix.
    progress: Progress | None = None
    # The marker topic held anything of this query (a registration of this id before this run, a
    # marker, a progress record) when the id first wrote in this run. True when not read.
    history_found: bool = True
    # The commit-marker topic, for messages.
    marker_topic: str = ""
    # Option exactlyOnceFromBatch: the batch from which an output without markers starts.
    exactly_once_from: int | None = None
    # The input records of this batch by the checkpoint's offsets (None when unknown), for messages.
    batch_input_records: int | None = None
    # The checkpoint recorded a claim of this prefix in the marker topic, and the topic holds none
    # of this query (claims.claim_missing): its markers are lost, even at the query's first batch.
    claim_missing: bool = False
    # The run of this query that last refused to replay this batch in its shape (the prefix's
    # refusal record), whose markers an acceptance of the batch keeps.
    refused_run: str | None = None
    # The prefix's refusal record names this batch of this query (refused_run is None where the
    # refusing run was unknown).
    refusal_recorded: bool = False
    # Runs the refusal record names as acceptances in a wrong shape: their commits are never kept.
    rejected_runs: tuple[str, ...] = ()


def decide(view: TaskView, rows: Callable[[], int]) -> Action:
    """Write or skip: step 4 of the protocol (sink package docstring), its parts 4a-4k in order; raises
    :class:`ReplayRefused` where neither is safe. ``rows`` counts the task's input rows; it is
    called only when a skip has to be checked."""
    # Step 4a: the id's registration names another query.
    if view.registered_query is not None and view.registered_query != view.query_id:
        raise ReplayRefused(_owned_by_another_query(view))
    # Step 4b: acceptReshapedBatch names a batch past the run's first.
    accepted = view.accepted_reshaped_batch
    if accepted is not None and view.run_first_batch is not None and accepted > view.run_first_batch:
        raise ReplayRefused(_accepted_too_early(view, ACCEPT_RESHAPED_OPTION, accepted))
    _refuse_lost_markers(view)  # Step 4c
    _refuse_checkpoint_behind(view)  # Step 4d
    marker = view.own_marker
    ours = marker if marker is not None and marker.query_id == view.query_id else None
    # Step 4e. Only a batch the prefix's refusal record names can be accepted: the option left set
    # on a query whose batch was never refused has no effect, and its replay is decided as any other.
    if accepted == view.batch_id and view.refusal_recorded:
        return _accepted_as_written(view, ours, rows)
    _refuse_two_shapes(view)  # Step 4f
    _refuse_another_width(view, ours)  # Step 4g
    # Step 4h: the id's own marker holds this batch.
    if ours is not None and ours.batch_id == view.batch_id:
        if ours.topic not in (None, view.topic):
            raise ReplayRefused(_written_to_another_topic(view, ours))
        found = rows()
        if found != ours.records:
            raise ReshapedReplayRefused(_reshaped(view, ours, found), batch_id=view.batch_id)
        return Action.SKIP
    _refuse_another_prefix(view)  # Step 4i
    if not view.batch_write:
        # Step 4j. Every task refuses together, before any writes to the new topic: the batch is
        # not split.
        elsewhere = [
            m
            for m in view.sibling_markers
            if m.batch_id == view.batch_id and m.topic not in (None, view.topic)
        ]
        if elsewhere:
            raise ReplayRefused(_written_to_another_topic(view, elsewhere[0]))
    return Action.WRITE  # Step 4k


def _accepted_as_written(view: TaskView, ours: Marker | None, rows: Callable[[], int]) -> Action:
    """Step 4e of the protocol (sink package docstring): the user accepted this batch as written
    (``acceptReshapedBatch``). A task skips only where its own marker of the batch holds rows of the
    accepted shape (:func:`kept_when_accepted`); every other task writes all its rows. So no record
    of the batch is missing, and what the rewritten partitions had committed before is in the output
    twice, as the refusal listed it (the tasks log each such partition, the driver the total). A
    kept marker whose topic, number of write partitions or row count is not the task's says that
    this run is not in the accepted shape: skipping could drop rows and writing would double them
    beyond what the refusal stated, so the task refuses."""
    if (
        ours is not None
        and ours.batch_id == view.batch_id
        and kept_when_accepted(
            ours, run_id=view.run_id, refused_run=view.refused_run, rejected=view.rejected_runs
        )
    ):
        if ours.topic not in (None, view.topic):
            raise ReplayRefused(_written_to_another_topic(view, ours))
        if ours.write_partitions is not None:
            now = view.write_partitions()
            if now is None:
                raise ReplayRefused(_width_unknown(view, [ours.write_partitions]))
            if now != ours.write_partitions:
                raise WrongShapeAcceptance(
                    _not_the_accepted_shape(view, ours, f"{now} write partitions"), batch_id=view.batch_id
                )
        found = rows()
        if found != ours.records:
            raise WrongShapeAcceptance(
                _not_the_accepted_shape(view, ours, f"{found} rows for it"), batch_id=view.batch_id
            )
        return Action.SKIP
    _refuse_another_prefix(view)
    return Action.WRITE


def kept_when_accepted(
    marker: Marker, *, run_id: str | None, refused_run: str | None, rejected: Sequence[str] = ()
) -> bool:
    """Whether a marker of a batch being accepted as written holds rows of the accepted shape: it
    was committed by ``run_id`` itself (a task retried in the accepting run), by the run that refused
    the batch (whose shape the refusal offered to accept), or by an earlier run that accepted that
    same refusal. Any other marker was committed in another shape, and as many rows need not be the
    same rows: its partition is written again. So is that of a marker of a ``rejected`` run (an
    acceptance in a wrong shape)."""
    if marker.run_id is not None and marker.run_id == run_id:
        return True
    if marker.run_id is not None and marker.run_id in rejected:
        return False
    return refused_run is not None and refused_run in (marker.run_id, marker.accepted_run)


def rewritten_when_accepted(
    markers: Iterable[Marker], *, refusing_run: str | None, rejected: Sequence[str] = ()
) -> list[Marker]:
    """The markers of a batch that accepting it in the shape of ``refusing_run`` writes again (sorted
    by write partition): the cost a refusal states."""
    return sorted(
        (
            m
            for m in markers
            if not kept_when_accepted(m, run_id=None, refused_run=refusing_run, rejected=rejected)
        ),
        key=lambda m: m.partition,
    )


def written_twice(rewritten: Sequence[Marker]) -> str:
    """``rewritten`` (markers whose records are written again) as a refusal states its cost."""
    if not rewritten:
        return "no record is written twice"
    listed = ", ".join(
        f"write partition {m.partition}: {m.records}" for m in sorted(rewritten, key=lambda m: m.partition)
    )
    return f"records written twice: {sum(m.records for m in rewritten)} ({listed})"


def _refuse_two_shapes(view: TaskView) -> None:
    """Step 4f of the protocol (sink package docstring): the batch's markers hold two shapes. A run
    refused the batch as split otherwise than it was first written (its refusal record names it),
    and some of its tasks committed their part before it stopped, beside the earlier shape's
    commits: no shape can finish the batch by skipping what matches, since a count cannot tell rows
    of the other shape from its own. Every task sees the same markers, so all refuse before writing,
    and the refusal stays the recorded run's, whose shape is the one to accept."""
    refused = view.refused_run
    if not view.refusal_recorded or (refused is not None and refused == view.run_id):
        return
    of_batch = [
        m
        for m in (view.own_marker, *view.sibling_markers)
        if m is not None and m.query_id == view.query_id and m.batch_id == view.batch_id
    ]
    if refused is None:
        # The refusing run was unknown: its commits, if any, cannot be told from the others.
        if of_batch:
            raise ReplayRefused(_unknown_shapes(view, rewritten_when_accepted(of_batch, refusing_run=None)))
        return
    rejected = view.rejected_runs
    kept = [m for m in of_batch if kept_when_accepted(m, run_id=None, refused_run=refused, rejected=rejected)]
    earlier = rewritten_when_accepted(of_batch, refusing_run=refused, rejected=rejected)
    if kept and earlier:
        raise ReplayRefused(_two_shapes(view, refused, kept, earlier))


def _refuse_another_prefix(view: TaskView) -> None:
    """Step 4i of the protocol (sink package docstring), also at the end of 4e: a streaming write
    that finds its batch committed under another prefix of the same query: the prefix changed in the
    middle of a replay, and writing would double what the old ids wrote."""
    if view.batch_write:
        return
    earlier = [m for m in view.other_prefix_markers if m.batch_id == view.batch_id]
    if earlier:
        raise ReplayRefused(_prefix_changed(view, earlier))


def _markers_of_this_query(view: TaskView) -> list[Marker]:
    candidates = (view.own_marker, *view.sibling_markers, *view.other_prefix_markers)
    return [m for m in candidates if m is not None and m.query_id == view.query_id]


def _refuse_lost_markers(view: TaskView) -> None:
    """Step 4c of the protocol (sink package docstring; see :func:`markers_lost`), at the run's
    first batch; and, for a streaming write whose checkpoint was read, markers that stop short of
    the checkpoint: Spark commits batch ``b - 1`` only after the driver recorded its progress, so a
    progress record of this query older than ``b - 1`` comes from a marker topic (or prefix) the
    query used before, and its markers of the batches since are elsewhere."""
    starts_here = view.run_first_batch is not None and view.run_first_batch == view.batch_id
    if not starts_here:
        return
    refusal = markers_lost(
        query_id=view.query_id,
        batch_id=view.batch_id,
        transactional_id=view.transactional_id,
        marker_topic=view.marker_topic,
        history_found=view.history_found,
        exactly_once_from=view.exactly_once_from,
        batch_input_records=view.batch_input_records,
        claim_recorded=view.claim_missing,
    )
    if refusal is not None:
        raise ReplayRefused(refusal)
    progress = view.progress
    stale = (
        not view.batch_write
        and view.plan is not None
        and progress is not None
        and progress.query_id == view.query_id
        and progress.batch_id < view.batch_id - 1
        and view.exactly_once_from != view.batch_id
    )
    if stale and progress is not None:
        raise ReplayRefused(_stale_markers(view, progress.batch_id))


def _stale_markers(view: TaskView, recorded: int) -> str:
    topic = view.marker_topic or "the commit-marker topic"
    return (
        f"the commit-marker topic '{topic}' holds query {view.query_id}'s progress up to micro-batch "
        f"{recorded} only, and its checkpoint committed up to micro-batch {view.batch_id - 1}: the markers "
        "of the batches since are in another topic (the query went back to a marker topic it used before, "
        "or this one was restored from an old copy, or previousCommitMarkerTopic carried old markers over) "
        "or under another transactionalIdPrefix. A replay judged by these stale markers could write a "
        "batch twice, so nothing is written and the query stops. Ways on: restart with "
        ".option('commitMarkerTopic', '<the topic it wrote its latest batches to>') (and the "
        "transactionalIdPrefix it used then): nothing is lost or written twice; or "
        + restart_output_here(view.batch_id, view.batch_input_records)
    )


def restart_output_here(batch_id: int, input_records: int | None) -> str:
    """The way on that starts a query's exactly-once output anew at ``batch_id``, with its cost."""
    bound = (
        ""
        if input_records is None
        else f" (at most its {input_records} input record(s), by the checkpoint's offsets)"
    )
    return (
        f"start the exactly-once output anew at this batch with .option('{EXACTLY_ONCE_FROM_OPTION}', "
        f"'{batch_id}'): nothing is lost; what an earlier run committed of micro-batch {batch_id} is "
        f"written again{bound}"
    )


def markers_lost(
    *,
    query_id: str,
    batch_id: int,
    transactional_id: str,
    marker_topic: str,
    history_found: bool,
    exactly_once_from: int | None,
    batch_input_records: int | None,
    claim_recorded: bool = False,
) -> str | None:
    """Why a run that starts at ``batch_id`` must not write, or None: the first check of step 4c of
    the protocol (sink package docstring), also applied in steps 2 and 3b. A run past the query's
    first micro-batch that finds nothing of the query in the marker topic has lost its markers
    (topic deleted or changed), or never wrote exactly-once before; either way a replay could not be
    recognised. ``claim_recorded``: the checkpoint recorded the query's claim in this topic and the
    topic lost it, which tells lost markers apart at the first micro-batch too. The driver's commit
    records even a batch without write tasks (a new query's first batch from ``latest`` or a group's
    offsets) where it could read the checkpoint, so such a query still leaves its progress record;
    where it could not, its first writing batch is refused once, and ``exactlyOnceFromBatch`` then
    costs nothing."""
    if history_found or (batch_id == 0 and not claim_recorded):
        return None
    if exactly_once_from is not None and exactly_once_from > batch_id:
        return _accepted_too_early_text(query_id, batch_id, EXACTLY_ONCE_FROM_OPTION, exactly_once_from)
    if exactly_once_from == batch_id:
        return None
    return _lost_markers(
        query_id,
        batch_id,
        transactional_id,
        marker_topic,
        batch_input_records,
        exactly_once_from,
        claim_recorded=claim_recorded,
    )


def _refuse_checkpoint_behind(view: TaskView) -> None:
    """Step 4d of the protocol (sink package docstring): markers of this query past this batch, or
    of this batch planned from other input, mean the checkpoint went back behind the output
    (restored from an older copy, newest entries lost). Writing would double what the output holds;
    skipping would drop the input that arrived since. Every task sees the same markers, so all
    refuse before writing."""
    ahead: list[Marker | Progress] = [m for m in _markers_of_this_query(view) if m.batch_id > view.batch_id]
    progress = view.progress
    if progress is not None and progress.query_id != view.query_id:
        progress = None
    if progress is not None and progress.batch_id > view.batch_id:
        ahead.append(progress)
    if ahead:
        raise ReplayRefused(_checkpoint_behind(view, max(m.batch_id for m in ahead), progress))
    if view.plan is None:
        return
    replanned: list[Marker | Progress] = [
        m
        for m in _markers_of_this_query(view)
        if m.batch_id == view.batch_id and m.plan is not None and m.plan != view.plan
    ]
    if progress is not None and progress.batch_id == view.batch_id and progress.plan not in (None, view.plan):
        replanned.append(progress)
    if replanned:
        raise ReplayRefused(_checkpoint_behind(view, view.batch_id, progress))


def _refuse_another_width(view: TaskView, ours: Marker | None) -> None:
    """Step 4g of the protocol (sink package docstring): every marker of this batch under this
    prefix that recorded its batch's number of write partitions must record the replay's. Siblings
    count as much as the own marker, so that every task of a reshaped replay refuses before any of
    them writes."""
    of_batch = [m for m in (ours, *view.sibling_markers) if m is not None and m.batch_id == view.batch_id]
    recorded = sorted({m.write_partitions for m in of_batch if m.write_partitions is not None})
    if not recorded:
        return
    now = view.write_partitions()
    if now is None:
        # The first run could tell and this one cannot (the UI turned off, or unreachable now): a
        # replay split otherwise would be found only after it wrote its rows again.
        raise ReshapedReplayRefused(_width_unknown(view, recorded), batch_id=view.batch_id)
    if recorded != [now]:
        raise ReshapedReplayRefused(_another_width(view, of_batch, now), batch_id=view.batch_id)


def partitions_beyond(
    markers: Iterable[Marker], *, query_id: str, batch_id: int, prefix: str, partitions: int
) -> list[Marker]:
    """The driver's check after the tasks (sink package docstring): markers of micro-batch
    ``batch_id`` of ``query_id`` under ``prefix`` left by write partitions the batch no longer has
    (``partitions`` is the replay's number of write tasks)."""
    return sorted(
        (
            m
            for m in markers
            if m.query_id == query_id
            and m.batch_id == batch_id
            and m.partition >= partitions
            and m.transactional_id == transactional_id(prefix, m.partition)
        ),
        key=lambda m: m.partition,
    )


def beyond_refusal(
    beyond: Sequence[Marker], skipped: Sequence[Marker], *, batch_id: int, partitions: int
) -> ReshapedReplayRefused:
    """The driver's error for :func:`partitions_beyond`: this replay already wrote, so say so.
    ``skipped``: markers of write partitions the replay has, committed by another run, by which
    the replay's tasks skipped; accepting the batch writes those partitions again."""
    listed = ", ".join(f"{m.partition} ({m.records} records)" for m in beyond)
    total = sum(m.records for m in beyond)
    missing = (
        ""
        if not skipped
        else " Write partition(s) "
        + ", ".join(f"{m.partition} ({m.records} records)" for m in skipped)
        + " of this replay wrote nothing, because the earlier run's markers show them committed as many "
        "rows as they have now: split otherwise, those can be other rows, which are then missing until "
        "the batch is accepted."
    )
    return ReshapedReplayRefused(
        f"micro-batch {batch_id} was first written by more write partitions than the {partitions} of "
        f"this replay: partition(s) {listed} committed their part of it before the query stopped, and "
        "this replay's tasks have committed the batch split otherwise, so those "
        f"{total} record(s) are now in the output twice.{missing} The query stops so that no "
        "further batch builds on it unnoticed. Likely cause: the query's partitioning changed between "
        "the crash and the restart (a REPARTITION or coalesce count, the query itself). The query of the "
        "first run cannot finish this batch any more (this replay's commit markers replaced its own). To "
        f"go on, accept the batch as written: restart with .option('{ACCEPT_RESHAPED_OPTION}', "
        f"'{batch_id}') on this sink, with this run's query and settings, and remove the option once the "
        "batch is done. What this replay's tasks committed is kept; "
        + (
            "the partitions that wrote nothing write all their rows, so no record is lost; "
            f"{written_twice([*beyond, *skipped])}, "
            if skipped
            else f"they write nothing more: {written_twice(beyond)}, "
        )
        + "which read_committed consumers of the output may need to drop",
        batch_id=batch_id,
    )


def prefix_claimed_by_another_query(query_id: str, owner: str, prefix: str, transactional_id: str) -> str:
    """Why a query refuses a prefix another query claimed first (the claim in the marker topic):
    steps 2 and 3d of the protocol (sink package docstring), and the driver before the tasks."""
    return (
        f"transactionalIdPrefix '{prefix}' is used by another query: query {owner} claimed it first "
        f"(its claim in the commit-marker topic names it), and this is query {query_id}. A second query "
        "on one prefix would overwrite the first one's commit markers, and either could then write a "
        f"micro-batch twice, so '{transactional_id}' writes nothing and this query stops; query {owner} "
        "goes on. Give each query a transactionalIdPrefix of its own. If this query replaces that one "
        f"(its checkpoint was deleted or moved) and that one no longer runs, adopt its ids deliberately "
        f"with .option('{ADOPT_OPTION}', '{owner}')"
    )


def adopted_partial_batch(
    query_id: str,
    old_query: str,
    progress: Progress,
    partial: Sequence[Marker],
    transactional_id: str,
    batch_id: int,
    gap: tuple[int, int] | None,
) -> str:
    """Why a query adopting ``old_query``'s ids refuses (``adoptTransactionalIdsFrom``; step 3c of
    the protocol, sink package docstring): the old query committed part of the batch after its last
    complete one, ``progress``, or this query starts elsewhere than where that batch's input ended
    (``gap``: records read again, records never read, from this query's start in its checkpoint;
    None when unknown)."""
    from sparkafka.connector.sink.batch_plan import starting_offsets_of

    listed = ", ".join(f"'{m.transactional_id}': {m.records}" for m in partial)
    in_part = sum(m.records for m in partial)
    again, skipped = gap if gap is not None else (0, 0)
    ended = None if progress.end_offsets is None else starting_offsets_of(progress.end_offsets)
    where = "" if ended is None else f" (its input ended at {ended})"
    found = []
    if partial:
        found.append(
            f"it then committed part of micro-batch {max(m.batch_id for m in partial)} before it stopped: "
            f"{in_part} record(s) ({listed}), which this query reads again"
        )
    if again:
        found.append(
            f"this query starts {again} input record(s) before where that batch ended (a consumer "
            "group's offsets lag the output: the source publishes them for monitoring only), whose "
            "output is there already"
        )
    if skipped:
        found.append(f"this query starts {skipped} input record(s) past where that batch ended, never read")
    doubled = again + in_part
    bound = "at most " if skipped else ""
    start_there = (
        ""
        if ended is None
        else f" Or start this query on a new checkpoint with .option('startingOffsets', '{ended}'), "
        f"where the old query's output ends: {in_part} record(s) written twice."
    )
    lost = f" and {skipped} never read (lost)" if skipped else ""
    return (
        f"query {query_id} adopts the transactional ids of query {old_query} ({ADOPT_OPTION}), which "
        f"committed micro-batch {progress.batch_id} completely{where}; " + "; ".join(found) + ". "
        "Writing would lose or double records, and the old query's markers cannot tell this query's "
        f"batches apart, so '{transactional_id}' writes nothing and the query stops, before any of its "
        "ids is registered. Ways on: if the old query's checkpoint can be found again, run the old query "
        f"on it: it finishes its batch exactly once.{start_there} Or accept this start with "
        f".option('{ACCEPT_RESHAPED_OPTION}', '{batch_id}') (this query's micro-batch {batch_id}): "
        f"{bound}{doubled} record(s) written twice{lost}"
    )


def adaptive_execution_refusal(properties: Mapping[str, str | None], *, batch_write: bool) -> str | None:
    """Why an exactly-once write task must not write, given its job's Spark SQL settings, or None
    (step 0 of the protocol, sink package docstring).

    Spark hands a task the SQL settings its session set explicitly (unset ones keep Spark's
    defaults: adaptive execution on, for stateless streaming plans too since Spark 4.1). Adaptive
    execution sizes shuffle partitions by the data and the cores present at run time, so a replayed
    micro-batch can reach the write tasks split otherwise than when it was first written. A
    ``writeStream`` is safe with adaptive execution off for stateless streaming plans (stateful ones
    never use it); a ``df.write`` inside ``foreachBatch`` writes through a batch plan, which needs it
    off altogether."""
    if _is_false(properties.get(ADAPTIVE_ENABLED)):
        return None
    if not batch_write and _is_false(properties.get(ADAPTIVE_STATELESS_STREAMING)):
        return None
    if batch_write:
        value = properties.get(ADAPTIVE_ENABLED)
        return (
            "deliveryGuarantee=exactly-once in a df.write inside foreachBatch needs adaptive query execution "
            f"off, and the session has {ADAPTIVE_ENABLED}={_shown(value)}: the micro-batch is written by a "
            "batch plan, which adaptive execution may split into other write partitions when a batch is "
            "replayed (it sizes partitions by the cores present at the time), and the replay would lose and "
            f"double records. Set spark.conf.set('{ADAPTIVE_ENABLED}', 'false') before starting the query "
            "(sparkafka's own sessions do)"
        )
    value = properties.get(ADAPTIVE_STATELESS_STREAMING)
    return (
        "deliveryGuarantee=exactly-once needs adaptive query execution off for stateless streaming plans, "
        f"and the session has {ADAPTIVE_STATELESS_STREAMING}={_shown(value)}: with it on, Spark may split "
        "a replayed micro-batch into other write partitions than when it was first written (it coalesces "
        "shuffle partitions by the cores present at the time), and the replay would lose and double "
        "records. Call sparkafka.register(spark) before starting the query (it sets the option to false), "
        f"or spark.conf.set('{ADAPTIVE_STATELESS_STREAMING}', 'false')"
    )


def _is_false(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "false"


def _shown(value: str | None) -> str:
    return "unset (Spark's default: true)" if value is None else value


def _owned_by_another_query(view: TaskView) -> str:
    return (
        f"transactional id '{view.transactional_id}' belongs to query {view.registered_query} (its "
        f"registration in the commit-marker topic names it), and this is query {view.query_id}: two queries "
        "sharing a transactionalIdPrefix overwrite each other's commit markers, and a replay of either "
        "could then write a micro-batch twice, so this write refuses. Give each query a "
        "transactionalIdPrefix of its own. If this query replaces that one (its checkpoint was deleted "
        f"or moved) and that one no longer runs, adopt its ids deliberately with "
        f".option('{ADOPT_OPTION}', '{view.registered_query}')"
    )


def _written_to_another_topic(view: TaskView, marker: Marker) -> str:
    def described(topic: str) -> str:
        return f"topic '{topic}'" if topic else "the topics its rows name"

    written_to = described(marker.topic or "")
    shared_prefix = (
        "Two exactly-once writes in one foreachBatch call need a transactionalIdPrefix each: with a "
        "shared one the second looks like a replay of the first and would write nothing. If instead "
        "the query was restarted with another output topic while this batch was replayed, "
        if view.batch_write
        else "The query was restarted with another output topic while this batch was replayed: "
    )
    return (
        f"transactional id '{view.transactional_id}' already committed micro-batch {view.batch_id} of this "
        f"query for a write to {written_to}; this write goes to {described(view.topic)}. {shared_prefix}"
        f"the batch's output is already in {written_to}, and skipping would leave it out of the new one: "
        "run the query once more with that topic until this batch is done, then change the topic"
    )


def _accepted_too_early(view: TaskView, option: str, value: int) -> str:
    return _accepted_too_early_text(view.query_id, view.run_first_batch, option, value)


def _accepted_too_early_text(query_id: str, run_first_batch: int | None, option: str, value: int) -> str:
    return (
        f"option {option}={value} names a micro-batch this run of query {query_id} "
        f"has not reached: it starts at micro-batch {run_first_batch}, the only one a restart can "
        "replay. Give it the batch id the refusal named, or remove it"
    )


def _acceptance_cost(view: TaskView) -> str:
    """The way on a refusal offers, with its exact cost from the markers of the batch: accepted,
    a task skips only where this run (recorded as the refusing run) or an accepting run committed
    its partition's rows; every other partition's earlier commit is written again."""
    of_batch = [
        m
        for m in (view.own_marker, *view.sibling_markers)
        if m is not None and m.query_id == view.query_id and m.batch_id == view.batch_id
    ]
    rewritten = rewritten_when_accepted(of_batch, refusing_run=view.run_id)
    return (
        f"accept the batch as written with .option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}') and this "
        "run's query and settings: what this run's tasks commit of the batch before the query stops is "
        "kept, every other task writes all its rows, so no record of the batch is lost; what earlier "
        f"runs committed of it is written again: {written_twice(rewritten)}. "
        "Remove the option once the batch is done"
    )


def _reshaped(view: TaskView, marker: Marker, found: int) -> str:
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} is replayed in another shape than it was "
        f"first written: write partition {view.partition} (transactional id '{view.transactional_id}') "
        f"committed {marker.records} record(s) of it, and the replay gives that partition {found}. Skipping "
        "or writing would lose or double records, so this task writes nothing and the query stops. Likely "
        "causes: the query changed between the crash and the restart (a REPARTITION or coalesce count, a "
        "filter, the transform), or adaptive query execution was turned on "
        f"({ADAPTIVE_STATELESS_STREAMING}, {ADAPTIVE_ENABLED}). Restart with the query and settings of the "
        f"first run until micro-batch {view.batch_id} is done, then make the change: nothing is lost or "
        "written twice. Other tasks of this replay decide on their own and may commit their part before "
        "the query stops; then the batch holds two shapes, the first run's query refuses in turn, and "
        "accepting this run's shape is the way on. If the first run's query cannot run any more, or input "
        "records of the batch are gone (retention or DeleteRecords, read past with failOnDataLoss=false), "
        f"or a joined table changed, {_acceptance_cost(view)}"
    )


def _not_the_accepted_shape(view: TaskView, kept: Marker, now: str) -> str:
    by = "this run" if kept.run_id == view.run_id else f"run {view.refused_run}, which refused it"
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} is accepted as written "
        f"({ACCEPT_RESHAPED_OPTION}) in the shape of {by}: write partition {view.partition} committed "
        f"{kept.records} record(s) of it then"
        + ("" if kept.write_partitions is None else f", of {kept.write_partitions} write partitions")
        + f", and this run has {now}. This run is split otherwise than the shape it accepts: skipping "
        "could leave rows out and writing would double them beyond what the refusal stated, so this task "
        "writes nothing and the query stops. Restart with the query and settings of the latest run refused "
        f"for replaying this batch in another shape (the refusal that offered {ACCEPT_RESHAPED_OPTION}), "
        f"keeping .option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}'), until the batch is done; then "
        "change the query. Other tasks of this run may commit their part before it stops: this run is "
        "recorded as not in the accepted shape, and the next acceptance writes that part again (the "
        "driver's log lists it, 'failed after write partition(s) ... committed')"
    )


def _two_shapes(view: TaskView, refused: str, kept: Sequence[Marker], earlier: Sequence[Marker]) -> str:
    def listed(markers: Sequence[Marker]) -> str:
        return ", ".join(
            f"{m.partition} ({m.records} records)" for m in sorted(markers, key=lambda m: m.partition)
        )

    return (
        f"micro-batch {view.batch_id} of query {view.query_id} holds commits of two shapes: run {refused} "
        "refused to replay it as split otherwise than it was first written, and before it stopped its tasks "
        f"committed write partition(s) {listed(kept)} in its own shape, beside write partition(s) "
        f"{listed(earlier)} committed in the earlier shape. A replay in either shape would skip partitions "
        "whose rows a count cannot tell from the other shape's, so nothing is written and the query stops. "
        f"Way on: accept the batch as written in the shape of run {refused}: restart with the query and "
        "settings it ran with (those of the latest run refused for replaying this batch in another shape, "
        f"not of a refusal like this one) and .option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}'): "
        "what it committed is kept and every other task writes all its rows, so no record is lost; "
        f"{written_twice(earlier)}. Remove the option once the batch is done, then change the query as "
        "you like"
    )


def _unknown_shapes(view: TaskView, committed: Sequence[Marker]) -> str:
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} was refused as replayed in another shape by a "
        "run its refusal record names no id for (an earlier version of the sink recorded refusals so where "
        "a foreachBatch function hid Spark's run id), whose tasks may have committed their part in that "
        "shape: its commits cannot be told from "
        "the earlier ones, and a replay in either shape could skip rows by a count, so nothing is written "
        "and the query stops. Way on: accept the batch as written with "
        f".option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}') and the query of that run: no commit of the "
        f"batch is kept, every task writes all its rows, so no record is lost; {written_twice(committed)}. "
        "Remove the option once the batch is done"
    )


def _another_width(view: TaskView, of_batch: Sequence[Marker], now: int) -> str:
    committed = ", ".join(
        f"{m.partition} ({m.records} records, of {m.write_partitions} write partitions)"
        for m in sorted(of_batch, key=lambda m: m.partition)
        if m.write_partitions is not None
    )
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} is replayed split into {now} write "
        f"partitions, and it was first written split otherwise: write partition(s) {committed} committed "
        f"their part before the query stopped. Write partition {view.partition} writes nothing, and "
        "neither does any other task of this replay, so nothing is lost or doubled; the query stops. "
        "Likely causes: the query's partitioning changed between the crash and the restart (a "
        "REPARTITION or coalesce count, spark.sql.shuffle.partitions on a new checkpoint, the query "
        f"itself), or adaptive query execution was turned on ({ADAPTIVE_STATELESS_STREAMING}, "
        f"{ADAPTIVE_ENABLED}). Restart with the query and settings of the first run until micro-batch "
        f"{view.batch_id} is done, then make the change: nothing is lost or written twice. If the first "
        f"run's query cannot run any more, {_acceptance_cost(view)}"
    )


def _width_unknown(view: TaskView, recorded: Sequence[int]) -> str:
    shown = " or ".join(str(n) for n in recorded)
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} was partly committed by a run that "
        f"recorded its {shown} write partitions, and this replay cannot learn its own number: write "
        f"partition {view.partition} could not ask the driver's monitoring API (the web UI turned off "
        "with spark.ui.enabled=false, sparkafka.register(spark) not called on this session, or the "
        "UI's port closed to the executors; the executor's log says which). Without it a replay split "
        "otherwise would write records twice before anything noticed, so no task writes and the query "
        "stops. Restart with the web UI on and reachable until this batch is done: nothing is lost or "
        f"written twice. If that cannot be, {_acceptance_cost(view)}"
    )


def _lost_markers(
    query_id: str,
    batch_id: int,
    transactional_id: str,
    marker_topic: str,
    batch_input_records: int | None,
    exactly_once_from: int | None,
    *,
    claim_recorded: bool = False,
) -> str:
    topic = marker_topic or "the commit-marker topic"
    evidence = (
        "its checkpoint records that it claimed its transactional-id prefix in this topic"
        if claim_recorded
        else f"this run starts at micro-batch {batch_id}"
    )
    bound = (
        ""
        if batch_input_records is None
        else f" (at most the batch's {batch_input_records} input record(s), by the checkpoint's offsets)"
    )
    return (
        f"query {query_id} has run before ({evidence}), and the commit-marker topic '{topic}' holds "
        f"nothing of it: {'no claim, ' if claim_recorded else ''}no registration of transactional id "
        f"'{transactional_id}', no "
        "commit marker and no progress record of this query. Its markers "
        "are in another topic (option commitMarkerTopic changed), or this topic was deleted and created "
        "anew, or the query never wrote with deliveryGuarantee=exactly-once before. Without its markers "
        "a replayed micro-batch would be written a second time, so nothing is written and the query "
        "stops. Ways on: if the markers are in another topic, restart with .option('commitMarkerTopic', "
        "'<that topic>'), or keep this one and carry them over with "
        f".option('{PREVIOUS_MARKER_TOPIC_OPTION}', '<that topic>'): nothing is lost or written twice. "
        "If the query never wrote exactly-once before (it switched from Spark's kafka format or from "
        "another deliveryGuarantee), or its markers are gone for good (no backup of the topic), start "
        f"its exactly-once output here with .option('{EXACTLY_ONCE_FROM_OPTION}', '{batch_id}'): "
        f"nothing is lost; if micro-batch {batch_id} was partly written before the query stopped, "
        f"that part is written again{bound}. A query whose earlier micro-batches had no rows to write "
        "(a new query's first batch from startingOffsets latest or group) takes this way at no cost"
        + (
            ""
            if exactly_once_from is None
            else f". The option {EXACTLY_ONCE_FROM_OPTION}={exactly_once_from} given names an earlier "
            "micro-batch than this run's first and has no effect"
        )
    )


def _checkpoint_behind(view: TaskView, newest: int, progress: Progress | None) -> str:
    from sparkafka.connector.sink.batch_plan import starting_offsets_of

    topic = view.marker_topic or "the commit-marker topic"
    if newest > view.batch_id:
        what = (
            f"the checkpoint of query {view.query_id} is behind its output: it is at micro-batch "
            f"{view.batch_id}, and the commit-marker topic '{topic}' shows micro-batch {newest} of this "
            "query committed"
        )
    else:
        what = (
            f"micro-batch {view.batch_id} of query {view.query_id} was planned from other input than the "
            f"micro-batch {view.batch_id} the commit-marker topic '{topic}' shows committed: the "
            "checkpoint lost the offsets-log entry it was first written from"
        )
    ended = None if progress is None else progress.end_offsets
    resume = None if ended is None else starting_offsets_of(ended)
    if progress is None or resume is None:
        restart = (
            " The markers do not record where the output's input ended (written by an older sparkafka, "
            "the checkpoint unreadable by the sink, or more than one source), so no restart point can "
            "be offered that loses nothing."
        )
    else:
        partial = sorted(
            (m for m in _markers_of_this_query(view) if m.batch_id == progress.batch_id + 1),
            key=lambda m: m.partition,
        )
        twice = (
            f"{sum(m.records for m in partial)} record(s) — the part of micro-batch "
            f"{progress.batch_id + 1} that committed before the query stopped ("
            + ", ".join(f"'{m.transactional_id}': {m.records}" for m in partial)
            + ")"
            if partial
            else "none"
        )
        restart = (
            " Or start the query on a new checkpointLocation where its output ends, micro-batch "
            f"{progress.batch_id}: .option('startingOffsets', '{resume}') on its source (and, with a fixed "
            f"transactionalIdPrefix, a new prefix): nothing is lost, records written twice: {twice}; "
            "a stateful query's state starts empty."
        )
    return (
        f"{what} (restored from an older copy, or its newest entries lost). Writing this micro-batch "
        "would write input the output already holds a second time, and skipping it would drop input "
        "that arrived since, so nothing is written and the query stops. Restore the newest copy of the "
        f"checkpoint (one whose offsets log reaches micro-batch {newest}): nothing is lost or written "
        f"twice.{restart}"
    )


def _prefix_changed(view: TaskView, earlier: Sequence[Marker]) -> str:
    ids = ", ".join(sorted(f"'{m.transactional_id}'" for m in earlier))
    return (
        f"micro-batch {view.batch_id} of query {view.query_id} was already partly committed under "
        f"transactional id(s) {ids}, and is now replayed as '{view.transactional_id}': the "
        "transactionalIdPrefix changed between the crash and the restart, and writing would double what "
        "the old ids committed. Restart with the previous transactionalIdPrefix until this batch is done, "
        "then change it"
    )
