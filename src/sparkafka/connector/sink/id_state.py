"""Step 3 of the exactly-once protocol (sink package docstring, :mod:`sparkafka.connector.sink`)
for one transactional id: what the id committed, read from the commit log at its first write of a
run, and the refusals and the registration that reading decides."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Producer

from sparkafka.connector.sink.batch_plan import BatchPlan, offsets_gap
from sparkafka.connector.sink.claims import claim_missing, record_query_claim, require_prefix_claim
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
from sparkafka.connector.sink.replay import adopted_partial_batch, markers_lost
from sparkafka.connector.sink.task import TaskIdentity
from sparkafka.connector.sink.transactional_ids import prefix_of, write_partition_of
from sparkafka.errors import ReplayRefused

log = logging.getLogger(__name__)


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
