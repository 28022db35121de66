"""The exactly-once sink's replay rule: whether a write task writes, skips or refuses.

Pure functions over what a task and the driver already know; nothing here reads or writes Kafka.

Why a rule is needed at all. A write task ``p`` of micro-batch ``b`` skips when the commit marker of
its transactional id ``{prefix}-{p}`` says that ``b`` is already committed. That is right only if a
replay of ``b`` sends the same rows to the same write partition ``p`` as the first run did. The
checkpoint pins the input of ``b`` (its offsets) and ``spark.sql.shuffle.partitions``; sparkafka pins
the source's split of the offsets into input partitions (``sparkafka:split`` in the end offset) and
refuses to write exactly-once while adaptive query execution could re-partition the plan (see
:func:`adaptive_execution_refusal`). What is left — a query or setting the user changed between the
crash and the replay, another ``transactionalIdPrefix``, another query on the same ids — is
detected here as far as the markers allow, and the query fails naming the cause and the way out.

Steps of :func:`decide` for one write task (the first that applies wins):

1. The id's registration names another query, and this write did not adopt that query's ids
   (``adoptTransactionalIdsFrom``): refuse. Two queries sharing ids overwrite each other's markers,
   and either could then write a batch twice.
2. The marker holds a later batch of this query than ``b``: skip. This id committed past ``b``
   already (the checkpoint is behind its output, as after restoring an older copy of it; no row
   count is compared here).
3. A marker of ``b`` of this query under this prefix — the id's own or a sibling's — recorded the
   batch's number of write partitions, and this task's stage has another number, or this task
   cannot learn its number: refuse, unless the user accepted this batch as written
   (``acceptReshapedBatch``). Every task of the replay sees the same markers and the same number,
   so all refuse before any writes.
4. The marker holds ``b`` of this query itself — a replay of output this id already committed:
   a. a write to another topic than the marker's: refuse (two writes of one ``foreachBatch`` call
      sharing a prefix, or a topic changed in the middle of a replay) — unless the user accepted
      this batch as written (``acceptReshapedBatch``);
   b. the task's row count differs from the marker's: refuse — the replay's shape differs from the
      first run's, and skipping would lose or double records — unless the user accepted this
      batch as written (``acceptReshapedBatch``): skip;
   c. otherwise skip.
5. No marker of ``b`` of this query for this id (none at all, an earlier batch, or another query's
   marker on ids adopted deliberately). A streaming write (one sink per query) that finds ``b``
   committed by the same query under another prefix: refuse (the prefix changed in the middle of a
   replay, and writing would double what the old ids committed); one that finds ``b`` committed by
   another id of its prefix for another topic: refuse, unless accepted as written (the output topic
   changed mid-replay: every task refuses, so the batch is never split over two topics). Otherwise
   write.

Before all of these, an ``acceptReshapedBatch`` naming a batch beyond the run's first is refused: a
replay is always the first batch of a run, so such an id is a mistake that would otherwise wait to
take a later batch as written.

The driver adds one check per run, in :func:`partitions_beyond`: after a replay's tasks reported,
no marker of ``b`` may exist for a write partition the replay does not have (unless the user
accepted the batch as written).

Where the number of write partitions comes from. PySpark tells a task its partition index, not how
many partitions its stage has; the task asks the driver's monitoring API
(:mod:`sparkafka.connector.sink.stage_width`). Where that could not answer for the first run (the
web UI off, or not reachable from the executors), its markers record no number and step 3 does not
apply: a replay split into fewer partitions is then seen only after its tasks wrote (the driver's
check), and the tasks decide one by one, so one may commit while another refuses at step 4. Either
refusal says so and names the way on (``acceptReshapedBatch``).

Invariants: a task never skips unless a marker of its own id, of this query and batch, holds the
row count the task has now; a task whose view is incomplete (no registration read) never refuses
because of it. The one exception is deliberate: a replay that cannot learn its number of write
partitions where the first run recorded it refuses (step 3), because the check it would skip is
the only one that fires before a narrower replay writes. Nothing here raises a false alarm for queries
whose output values are not deterministic (``uuid()``, ``rand()``, ``current_timestamp()``): only
row counts and numbers of write partitions are compared. The
price: other rows in the same number are not seen — rows that a round-robin repartition deals out
anew because a non-deterministic column changed their order, for one (docs/guarantees.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sparkafka.errors import SparkafkaError

ADAPTIVE_ENABLED = "spark.sql.adaptive.enabled"
ADAPTIVE_STATELESS_STREAMING = "spark.sql.adaptive.streaming.stateless.enabled"
ADOPT_OPTION = "adoptTransactionalIdsFrom"
ACCEPT_RESHAPED_OPTION = "acceptReshapedBatch"


class ReplayRefused(SparkafkaError):
    """A write task, or the driver, found that writing would lose or double records."""


class Action(enum.Enum):
    WRITE = "write"
    SKIP = "skip"


class Marker(Protocol):
    """What a commit marker tells (:class:`sparkafka.connector.sink.markers.CommitMarker`)."""

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


def decide(view: TaskView, rows: Callable[[], int]) -> Action:
    """Write or skip (see the module docstring); raises :class:`ReplayRefused` where neither is
    safe. ``rows`` counts the task's input rows; it is called only when a skip has to be checked."""
    if view.registered_query is not None and view.registered_query != view.query_id:
        raise ReplayRefused(_owned_by_another_query(view))
    accepted = view.accepted_reshaped_batch
    if accepted is not None and view.run_first_batch is not None and accepted > view.run_first_batch:
        raise ReplayRefused(_accepted_too_early(view, accepted))
    taken_as_written = accepted == view.batch_id
    marker = view.own_marker
    ours = marker if marker is not None and marker.query_id == view.query_id else None
    if ours is not None and ours.batch_id > view.batch_id:
        return Action.SKIP
    if not taken_as_written:
        _refuse_another_width(view, ours)
    if ours is not None and ours.batch_id == view.batch_id:
        if ours.topic not in (None, view.topic) and not taken_as_written:
            raise ReplayRefused(_written_to_another_topic(view, ours))
        found = rows()
        if found != ours.records and not taken_as_written:
            raise ReplayRefused(_reshaped(view, ours, found))
        return Action.SKIP
    if not view.batch_write:
        earlier = [m for m in view.other_prefix_markers if m.batch_id == view.batch_id]
        if earlier:
            raise ReplayRefused(_prefix_changed(view, earlier))
        # Every task refuses together, before any writes to the new topic: the batch is not split.
        elsewhere = [
            m
            for m in view.sibling_markers
            if m.batch_id == view.batch_id and m.topic not in (None, view.topic)
        ]
        if elsewhere and not taken_as_written:
            raise ReplayRefused(_written_to_another_topic(view, elsewhere[0]))
    return Action.WRITE


def _refuse_another_width(view: TaskView, ours: Marker | None) -> None:
    """Step 3 of :func:`decide`: every marker of this batch under this prefix that recorded its
    batch's number of write partitions must record the replay's. Siblings count as much as the own
    marker, so that every task of a reshaped replay refuses before any of them writes."""
    of_batch = [m for m in (ours, *view.sibling_markers) if m is not None and m.batch_id == view.batch_id]
    recorded = sorted({m.write_partitions for m in of_batch if m.write_partitions is not None})
    if not recorded:
        return
    now = view.write_partitions()
    if now is None:
        # The first run could tell and this one cannot (the UI turned off, or unreachable now): a
        # replay split otherwise would be found only after it wrote its rows again.
        raise ReplayRefused(_width_unknown(view, recorded))
    if recorded != [now]:
        raise ReplayRefused(_another_width(view, of_batch, now))


def partitions_beyond(
    markers: Iterable[Marker], *, query_id: str, batch_id: int, prefix: str, partitions: int
) -> list[Marker]:
    """Markers of micro-batch ``batch_id`` of ``query_id`` under ``prefix`` left by write partitions
    the batch no longer has (``partitions`` is the replay's number of write tasks)."""
    return sorted(
        (
            m
            for m in markers
            if m.query_id == query_id
            and m.batch_id == batch_id
            and m.partition >= partitions
            and m.transactional_id == f"{prefix}-{m.partition}"
        ),
        key=lambda m: m.partition,
    )


def beyond_refusal(beyond: Sequence[Marker], *, batch_id: int, partitions: int) -> ReplayRefused:
    """The driver's error for :func:`partitions_beyond`: this replay already wrote, so say so."""
    listed = ", ".join(f"{m.partition} ({m.records} records)" for m in beyond)
    return ReplayRefused(
        f"micro-batch {batch_id} was first written by more write partitions than the {partitions} of "
        f"this replay: partition(s) {listed} committed their part of it before the query stopped, and "
        "this replay's tasks have committed the whole batch split otherwise, so the records of those "
        "partitions are now in the output twice. The query stops so that no further batch builds on it "
        "unnoticed. Likely cause: the query's partitioning changed between the crash and the restart (a "
        "REPARTITION or coalesce count, the query itself). The query of the first run cannot finish "
        "this batch any more (this replay's commit markers replaced its own). To go on, accept the "
        f"batch as written: restart with .option('{ACCEPT_RESHAPED_OPTION}', '{batch_id}') on this sink "
        "and remove the option once the batch is done; read_committed consumers of the output may need "
        "to drop the duplicates of this batch"
    )


def adaptive_execution_refusal(properties: Mapping[str, str | None], *, batch_write: bool) -> str | None:
    """Why an exactly-once write task must not write, given its job's Spark SQL settings, or None.

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


def _accepted_too_early(view: TaskView, accepted: int) -> str:
    return (
        f"option {ACCEPT_RESHAPED_OPTION}={accepted} names a micro-batch this run of query {view.query_id} "
        f"has not reached: it starts at micro-batch {view.run_first_batch}, the only one a restart can "
        "replay. The option takes a refused replay as written; give it the batch id the refusal named, "
        "or remove it"
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
        f"first run until micro-batch {view.batch_id} is done, then make the change. Other tasks of this "
        "replay decide on their own and may have committed their part already; if so, the first run's "
        f"query now meets their markers and refuses too: accept the batch as written with "
        f".option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}') (partitions that committed keep what they "
        "committed; records may then be missing or doubled in this batch) and remove the option once "
        "the batch is done. If instead input records of the batch are gone (retention or DeleteRecords, "
        "read past with failOnDataLoss=false) or a joined table changed, the batch cannot be replayed as "
        f"it was: accept it the same way, or start a new checkpoint"
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
        f"{view.batch_id} is done, then make the change. If the first run's query cannot run any more, "
        f"accept the batch as written with .option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}'): "
        "partitions that committed keep what they committed, the others write theirs anew, so records "
        "of this batch may then be missing or doubled; remove the option once the batch is done"
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
        "stops. Restart with the web UI on and reachable until this batch is done; if that cannot be, "
        f"accept the batch as written with .option('{ACCEPT_RESHAPED_OPTION}', '{view.batch_id}') and "
        "keep the first run's query and settings for it"
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
