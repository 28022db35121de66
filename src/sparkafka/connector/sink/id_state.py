"""Steps 2 and 3 of the exactly-once protocol (sink package docstring,
:mod:`sparkafka.connector.sink`) for one transactional id: the task's producer of the id, from the
pool or initialised anew, and what the id committed, read from the commit log through that producer
at the id's first write of a run, with the refusals and the registration that reading decides."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Producer

from sparkafka.connector.sink.batch_plan import BatchPlan, offsets_gap
from sparkafka.connector.sink.claims import (
    claim_missing,
    record_query_claim,
    require_prefix_claim,
    settle_prefix_owner,
)
from sparkafka.connector.sink.commit_log import (
    CommittedState,
    ProgressRecord,
    Registration,
    committed_state,
    marker_of_query,
    may_name_query,
    register,
)
from sparkafka.connector.sink.marker_snapshot import MarkerSnapshot, query_markers, task_layout
from sparkafka.connector.sink.options import ADOPT_OPTION, PROGRESS_KEY_PREFIX, SinkOptions, is_marker_key
from sparkafka.connector.sink.ownership import (
    first_batch_of_run,
    initialised_here_last,
    record_first_batch_of_run,
)
from sparkafka.connector.sink.producers import (
    PRODUCERS,
    CachedProducer,
    cache_key,
    discard_producer,
    init_transactions,
    initialised_elsewhere,
    learn_marker_partition_leaders,
    new_cached_producer,
)
from sparkafka.connector.sink.replay import adopted_partial_batch, markers_lost
from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY
from sparkafka.connector.sink.task import TaskIdentity
from sparkafka.connector.sink.transactional_ids import prefix_of, write_partition_of
from sparkafka.errors import ReplayRefused

log = logging.getLogger(__name__)


@dataclass
class IdRun:
    """What a producer of a transactional id read of the id's commits at the id's first write of a
    query run (step 3), and the id's own commits since.

    Invariant: it belongs to the producer that read it, whose epoch fenced every earlier writer of
    the id: it is kept beside that producer only (:data:`_READ_THROUGH`, keyed weakly by it), so a
    producer discarded after a failure takes its reading with it, and a new one reads again."""

    query_id: str | None
    spark_run_id: str | None
    # The run's first micro-batch as far as this machine saw the id (run_first_batch): every task of
    # it, retries included, reports itself to the driver as the first batch of the run
    # (SinkCommitMessage.run_first_batch); a producer made later in the run keeps it.
    first_batch: int | None
    state: CommittedState


# Each pooled producer's reading of its id, gone with the producer. Unlocked: only a write task's own
# thread calls task_producer, and a Python worker runs one task at a time.
_READ_THROUGH: weakref.WeakKeyDictionary[CachedProducer, IdRun] = weakref.WeakKeyDictionary()


def task_producer(
    options: SinkOptions,
    identity: TaskIdentity,
    transactional_id: str,
    *,
    other_prefixes: bool,
    plan: BatchPlan | None = None,
    snapshot: MarkerSnapshot | None = None,
) -> tuple[CachedProducer, IdRun]:
    """The producer of ``transactional_id`` for this task, with what the id committed: steps 2 and 3
    of the protocol (sink package docstring).

    Steps of this function:
    (a) A pooled producer this worker initialised last is reused (step 2). Within one query run its
        reading is up to date; at the id's first write of a run — a restart, possibly in the same
        application, where the first batch may be a replay — what the id committed is read again
        (step 3).
    (b) Otherwise the prefix's owner is settled, and a new producer initialises the id, which aborts
        and fences whatever an earlier attempt left open (step 2).
    (c) The new producer reads what the id committed and registers the id (step 3,
        :func:`read_committed_state`). ``other_prefixes``: read this query's markers under other
        prefixes too (streaming writes); ``plan``, the batch's entry of the checkpoint when the
        writer read it, counts what ways on cost and where an adopting query starts; ``snapshot``,
        what the driver read of the commit log, spares reading what it holds
        (:mod:`.marker_snapshot`)."""

    def read(cached: CachedProducer) -> IdRun:
        # Step 3: what the id committed, read at its first write of a run.
        state = read_committed_state(
            options,
            cached.producer,
            transactional_id,
            identity,
            other_prefixes=other_prefixes,
            plan=plan,
            snapshot=snapshot,
        )
        first_batch = run_first_batch(identity, transactional_id)
        run = IdRun(identity.query_id, identity.spark_run_id, first_batch, state)
        _READ_THROUGH[cached] = run
        known_run = _known_run(identity)
        if known_run is not None and first_batch is not None:
            record_first_batch_of_run(transactional_id, *known_run, first_batch)
        return run

    # Step 2: the producer.
    key = cache_key(options, transactional_id)
    # Producers of other ids that moved to another worker are closed now rather than when idle for
    # PRODUCER_IDLE_TIMEOUT_S: a session that ran many queries kept hundreds of connections so.
    PRODUCERS.discard_where(lambda other: other != key and initialised_elsewhere(other))
    cached = PRODUCERS.get(key)
    if cached is not None and initialised_here_last(transactional_id):
        run = _READ_THROUGH.get(cached)
        if (
            run is not None
            and identity.spark_run_id is not None
            and run.spark_run_id == identity.spark_run_id
            and run.query_id == identity.query_id
        ):
            return cached, run
        run = read(cached)  # Step 3: a new run on a reused producer.
        # Its marker topic may be new to it (carried over to another topic between the runs).
        learn_marker_partition_leaders(cached.producer, options.marker_topic, options.operation_timeout_s)
        return cached, run
    if cached is not None:
        # Another Python worker of this machine initialised the id since: this producer is fenced.
        discard_producer(options, transactional_id)
    # Step 2 for a new producer: the prefix's owner settled, then the id initialised.
    settle_prefix_owner(options, identity, transactional_id, plan, snapshot)
    cached = new_cached_producer(options, transactional_id)
    init_transactions(options, cached, transactional_id, identity.partition)
    run = read(cached)  # Step 3
    # After step 3's read, which fails on a marker topic deleted meanwhile: see the function.
    learn_marker_partition_leaders(cached.producer, options.marker_topic, options.operation_timeout_s)
    PRODUCERS.put(key, cached)
    return cached, run


def run_first_batch(identity: TaskIdentity, transactional_id: str) -> int | None:
    """The micro-batch a step-3 read at ``identity``'s batch takes for its run's first: an earlier
    batch of the same query run where a worker of this machine read the id already (a task that
    landed in another worker than the id's last, the usual case), else the task's own batch (also
    where the run or the Spark application is not known: a ``foreachBatch`` that set its own job
    description).

    Only a run's first batch can be a replay, so this one number decides where a task's checks of
    a run's first batch run (4b, 4c) and whether the driver's check after the tasks runs: once per
    run and id on each machine, not at every batch a new producer happens to serve."""
    batch_id, known_run = identity.batch_id, _known_run(identity)
    if batch_id is None or known_run is None:
        return batch_id
    recorded = first_batch_of_run(transactional_id, *known_run)
    return recorded if recorded is not None and recorded <= batch_id else batch_id


def _known_run(identity: TaskIdentity) -> tuple[str, str, str] | None:
    """The query, Spark run and Spark application a task's run record is kept under; None where
    one of them is not known."""
    application_id = identity.properties.get(APP_ID_PROPERTY)
    if identity.query_id is None or identity.spark_run_id is None or application_id is None:
        return None
    return identity.query_id, identity.spark_run_id, application_id


def read_committed_state(
    options: SinkOptions,
    producer: Producer,
    transactional_id: str,
    identity: TaskIdentity,
    *,
    other_prefixes: bool,
    plan: BatchPlan | None,
    snapshot: MarkerSnapshot | None = None,
) -> CommittedState:
    """What ``transactional_id`` committed, for the task of ``identity`` whose ``producer`` has
    initialised the id, or reuses it in a new run: step 3 of the protocol (sink package docstring),
    whose parts 3a-3e run here in order:

    3a. Read, to their ends (read_committed), the partitions of the marker topic that hold the id's
        prefix and the query's ``query/`` records, then those of every other prefix the query
        claimed (:func:`~.commit_log.read_query_markers`): from where the driver's ``snapshot`` of
        them ends, laid over it (:func:`~.marker_snapshot.query_markers`).
    3b. Refuse a run past the query's first batch that finds nothing of the query (its markers
        lost), before it registers anything: a refused run must leave no trace to pass by.
    3c. Refuse adopting the ids of a query that committed its last batch in part
        (``adoptTransactionalIdsFrom``), counting what it would read twice or never.
    3d. Check the prefix's claim, and that the query's record of it is there (a claim an older
        sparkafka committed has none).
    3e. Register the id where it has no registration, or where this query adopts it, in a
        transaction of ``producer``."""
    query_id = identity.query_id
    assert query_id is not None, "exactly-once writes only"
    own_prefix = prefix_of(transactional_id, identity.partition)
    # Step 3a: what the commit log holds of the id, its prefix and its query.
    layout = task_layout(options, snapshot, own_prefix, query_id)
    found = query_markers(options, layout, own_prefix, query_id, snapshot)
    state = committed_state(found, transactional_id, own_prefix, query_id, other_prefixes=other_prefixes)
    state.layout = layout
    state.claim_missing = claim_missing(options, found, own_prefix, plan)
    if identity.batch_id is not None:  # Step 3b: markers lost.
        refusal = markers_lost(
            query_id=query_id,
            batch_id=identity.batch_id,
            transactional_id=transactional_id,
            marker_topic=options.marker_topic,
            history_found=state.history_found,
            exactly_once_from=options.exactly_once_from,
            batch_input_records=None if plan is None else plan.input_records,
            claim_recorded=state.claim_missing,
        )
        if refusal is not None:  # before registering: a refused run must leave no trace to pass by
            raise ReplayRefused(refusal)
    # Step 3c: adopting another query's ids.
    registered = state.registered_query
    adopting = registered is not None and registered != query_id and registered == options.adopted_query
    if adopting and options.accepted_reshaped_batch != identity.batch_id:
        assert registered is not None
        _refuse_adopting_a_partial_batch(found, own_prefix, transactional_id, registered, identity, plan)
    # Step 3d: the prefix's claim.
    require_prefix_claim(options, found, own_prefix, query_id, transactional_id)
    record_query_claim(options, layout, query_id, own_prefix, found)
    if registered is None or adopting:  # Step 3e: the registration.
        if registered is not None:
            log.warning(
                "%s: adopting transactional id %s from query %s (option %s)",
                query_id,
                transactional_id,
                registered,
                ADOPT_OPTION,
            )
        register(options, producer, Registration(transactional_id, query_id, identity.partition), layout)
        state.registered_query = query_id
    return state


def _refuse_adopting_a_partial_batch(
    found: Mapping[str, bytes],
    prefix: str,
    transactional_id: str,
    old_query: str,
    identity: TaskIdentity,
    plan: BatchPlan | None,
) -> None:
    """Step 3c of the protocol (sink package docstring), before this query takes over
    ``old_query``'s ids: the old query's markers past its last complete batch (its progress record)
    are a batch it committed in part before it stopped, and this query reads that input again; and
    where this query's checkpoint says where it starts (``plan``), any distance from where the old
    query's last complete batch ended is input read twice or never. Refuse, counting them, before
    registering anything, so that every task of the adopting run sees the same and refuses too."""
    progress_key = f"{PROGRESS_KEY_PREFIX}{prefix}"
    progress = ProgressRecord.decode(found[progress_key]) if progress_key in found else None
    if progress is None or progress.query_id != old_query:
        log.warning(
            "%s: adopting the ids of %s, which left no progress record (an older sparkafka): whether its "
            "last micro-batch was committed in part cannot be told",
            identity.query_id,
            old_query,
        )
        return
    may_name = may_name_query(old_query)
    partial = sorted(
        (
            marker
            for key, value in found.items()
            if is_marker_key(key)
            and write_partition_of(key, prefix) is not None
            and may_name(value)
            and (marker := marker_of_query(key, value, old_query)) is not None
            and marker.batch_id > progress.batch_id
        ),
        key=lambda m: m.partition,
    )
    starts_at = None if plan is None or plan.batch_id != identity.batch_id else plan.start_offsets
    gap = (
        None
        if starts_at is None or progress.end_offsets is None
        else offsets_gap(starts_at, progress.end_offsets)
    )
    if gap is None and starts_at is not None:
        log.warning(
            "%s: cannot compare where this query starts with where query %s's output ends; records "
            "between the two are not counted",
            identity.query_id,
            old_query,
        )
    if partial or (gap is not None and any(gap)):
        assert identity.query_id is not None and identity.batch_id is not None
        raise ReplayRefused(
            adopted_partial_batch(
                identity.query_id, old_query, progress, partial, transactional_id, identity.batch_id, gap
            )
        )
