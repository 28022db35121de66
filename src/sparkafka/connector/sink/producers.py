"""Producers cached per Python worker, one per transactional id, and what each id committed.

Spark runs a task in any idle Python worker, so an id moves between workers; the cache keeps a
producer only while this worker initialised its id last (see :func:`transactional_producer`)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_errors import error_code
from sparkafka.connector.sink.batch_plan import BatchPlan, offsets_gap
from sparkafka.connector.sink.claims import (
    claim_missing,
    require_prefix_claim,
    settle_prefix_owner,
)
from sparkafka.connector.sink.client_config import producer_config
from sparkafka.connector.sink.commit_log import (
    CommitMarker,
    CommittedState,
    ProgressRecord,
    Registration,
    committed_state,
    query_needle,
    read_marker_partition,
    register,
    registered_transactional_ids,
)
from sparkafka.connector.sink.failures import (
    authorization_error,
    sink_unreachable_error,
    transaction_timeout_error,
)
from sparkafka.connector.sink.options import (
    PROGRESS_KEY_PREFIX,
    SinkOptions,
    is_marker_key,
)
from sparkafka.connector.sink.replay import (
    ADOPT_OPTION,
    adopted_partial_batch,
    markers_lost,
)
from sparkafka.connector.sink.task import TaskIdentity
from sparkafka.connector.sink.transactional_ids import prefix_of, write_partition_of
from sparkafka.errors import ReplayRefused, SparkafkaError

log = logging.getLogger(__name__)

# -- producers cached per Python worker --------------------------------------------------------------


@dataclass
class CachedProducer:
    producer: Producer
    transactional_id: str | None
    delivery_errors: list[KafkaError] = field(default_factory=list)
    # The client's latest error events: why it cannot reach the cluster (a refused login, a refused
    # connection), which a timed-out call does not say. Bounded: a producer may live for days.
    client_errors: deque[KafkaError] = field(default_factory=lambda: deque(maxlen=_CLIENT_ERRORS_KEPT))
    # The query run whose first write of this id read the commit log (see transactional_producer).
    query_id: str | None = None
    spark_run_id: str | None = None
    # The micro-batch of that first write: every task of it, retries included, reports itself to the
    # driver as the first batch of the run (SinkCommitMessage.run_first_batch).
    run_first_batch: int | None = None
    # What the commit log said at that first write, and the id's own commits since.
    state: CommittedState = field(default_factory=CommittedState)


_CLIENT_ERRORS_KEPT = 16
# A producer idle this long (its query stopped, its id moved to another worker for good) is closed at
# the next lookup. Longer than any transaction can stay open (Kafka's transaction.max.timeout.ms
# defaults to 15 minutes), so a producer in use is never taken for idle.
PRODUCER_IDLE_TIMEOUT_S = 30 * 60.0

CacheKey = tuple[str, str | None, str]


class ProducerCache:
    """Producers kept per Python worker from one write task to the next, one per (cluster,
    transactional id, delivery guarantee); thread-safe.

    Invariants: a Python worker runs one task at a time, so the producer of an id is used by one task
    at once; a cached producer is only reused while this worker initialised its id last
    (:func:`transactional_producer` checks); a producer that failed is discarded, never reused."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[CacheKey, tuple[CachedProducer, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def get(self, key: CacheKey) -> CachedProducer | None:
        """The producer cached under ``key`` (now counted as used), after closing idle ones."""
        now = self._clock()
        with self._lock:
            idle = [
                other
                for other, (_, used_at) in self._entries.items()
                if now - used_at > PRODUCER_IDLE_TIMEOUT_S
            ]
            expired = [self._entries.pop(other)[0] for other in idle]
            found = self._entries.get(key)
            if found is not None:
                self._entries[key] = (found[0], now)
        for entry in expired:
            _close(entry)
        return None if found is None else found[0]

    def put(self, key: CacheKey, cached: CachedProducer) -> None:
        with self._lock:
            self._entries[key] = (cached, self._clock())

    def get_or_create(self, key: CacheKey, create: Callable[[], CachedProducer]) -> CachedProducer:
        with self._lock:
            found = self._entries.get(key)
            cached = create() if found is None else found[0]
            self._entries[key] = (cached, self._clock())
        return cached

    def discard(self, key: CacheKey) -> None:
        """Forget and close the producer under ``key``, if any."""
        with self._lock:
            found = self._entries.pop(key, None)
        if found is not None:
            _close(found[0])


def _close(cached: CachedProducer) -> None:
    try:
        cached.producer.flush(0)
    except Exception:  # a broken producer may fail to flush; it is being thrown away anyway
        log.debug("discarding producer %s", cached.transactional_id, exc_info=True)


PRODUCERS = ProducerCache()
_WORKER_STARTED_NS = time.time_ns()


def _cache_key(options: SinkOptions, transactional_id: str | None) -> CacheKey:
    return (options.bootstrap_servers, transactional_id, options.delivery_guarantee)


def _new_cached_producer(options: SinkOptions, transactional_id: str | None) -> CachedProducer:
    """A producer whose failed deliveries land in its ``delivery_errors`` (producer-wide callback,
    so the per-row produce call carries no callback of its own)."""
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            errors.append(error)

    client_errors: deque[KafkaError] = deque(maxlen=_CLIENT_ERRORS_KEPT)
    config = {
        **producer_config(options, transactional_id),
        "on_delivery": on_delivery,
        "error_cb": client_errors.append,
    }
    return CachedProducer(
        Producer(config), transactional_id, delivery_errors=errors, client_errors=client_errors
    )


def discard_producer(options: SinkOptions, transactional_id: str | None) -> None:
    PRODUCERS.discard(_cache_key(options, transactional_id))


def transactional_producer(
    options: SinkOptions,
    identity: TaskIdentity,
    transactional_id: str,
    *,
    other_prefixes: bool,
    plan: BatchPlan | None = None,
) -> CachedProducer:
    """The producer of ``transactional_id`` for this task, with what the id committed.

    Steps:
    1. A cached producer this worker initialised last is reused. Within one query run it is up to
       date; at the id's first write of a run — a restart, possibly in the same application, where
       the first batch may be a replay — its markers are read again (step 3).
    2. Otherwise a new producer initialises the id, which aborts and fences whatever an earlier
       attempt left open.
    3. Read, with read_committed, the id's latest marker and registration, the markers of this
       query under the id's prefix, and (``other_prefixes``) under other prefixes; register the id
       when it has no registration, or when this write adopts it from the query its registration
       names. A run past the query's first batch that finds nothing of the query is refused here,
       before it registers anything; ``plan``, the batch's entry of the checkpoint when the writer
       read it, counts what ways on cost and where an adopting query starts."""
    state = functools.partial(_read_committed_state, other_prefixes=other_prefixes, plan=plan)
    key = _cache_key(options, transactional_id)
    cached = PRODUCERS.get(key)
    if cached is not None and _initialised_here_last(transactional_id):
        same_run = identity.spark_run_id is not None and cached.spark_run_id == identity.spark_run_id
        if same_run and cached.query_id == identity.query_id:
            return cached
        state(options, cached, identity)
        return cached
    if cached is not None:
        # Another Python worker of this machine initialised the id since: this producer is fenced.
        discard_producer(options, transactional_id)
    settle_prefix_owner(options, identity, transactional_id, plan)
    cached = _new_cached_producer(options, transactional_id)
    _init_transactions(options, cached, transactional_id, identity.partition)
    state(options, cached, identity)
    PRODUCERS.put(key, cached)
    return cached


def _init_transactions(
    options: SinkOptions, cached: CachedProducer, transactional_id: str, partition: int
) -> None:
    """Step 2 of :func:`transactional_producer`: initialise the id (the broker aborts and fences
    what an earlier attempt left open), or fail naming the cause and its fix."""
    producer = cached.producer
    try:
        producer.init_transactions(options.operation_timeout_s)
        _claim(transactional_id)
    except KafkaException as error:
        if error_code(error) == kafka_errors.TRANSACTION_TIMEOUT_REFUSED:
            raise transaction_timeout_error(options) from None
        if error_code(error) in kafka_errors.NOT_ANSWERED:
            producer.poll(0)  # error events reach client_errors on a poll
            raise sink_unreachable_error(
                options, f"initialise transactional id '{transactional_id}'", error, cached.client_errors
            ) from None
        refused = authorization_error(
            options,
            f"initialising transactional id '{transactional_id}'",
            error,
            prefix=prefix_of(transactional_id, partition),
        )
        if refused is not None:
            raise refused from None
        raise SparkafkaError(
            f"init_transactions for transactional id '{transactional_id}' failed: {error.args[0]}"
        ) from None


def _read_committed_state(
    options: SinkOptions,
    cached: CachedProducer,
    identity: TaskIdentity,
    *,
    other_prefixes: bool,
    plan: BatchPlan | None,
) -> None:
    """Step 3 of :func:`transactional_producer` (step 3 of the protocol, with the registration of
    step 2): read the commit log, refuse a run that finds its markers gone or adopts a partly
    committed batch, check the prefix's claim, and register the id where it has no registration."""
    transactional_id, query_id = cached.transactional_id, identity.query_id
    assert transactional_id is not None and query_id is not None, "exactly-once writes only"
    found = read_marker_partition(options)
    own_prefix = prefix_of(transactional_id, identity.partition)
    state = committed_state(found, transactional_id, own_prefix, query_id, other_prefixes=other_prefixes)
    state.claim_missing = claim_missing(options, found, own_prefix, plan)
    if identity.batch_id is not None:
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
    registered = state.registered_query
    adopting = registered is not None and registered != query_id and registered == options.adopted_query
    if adopting and options.accepted_reshaped_batch != identity.batch_id:
        assert registered is not None
        _refuse_adopting_a_partial_batch(found, own_prefix, transactional_id, registered, identity, plan)
    require_prefix_claim(options, found, own_prefix, query_id, transactional_id)
    if registered is None or adopting:
        if registered is not None:
            log.warning(
                "%s: adopting transactional id %s from query %s (option %s)",
                query_id,
                transactional_id,
                registered,
                ADOPT_OPTION,
            )
        register(options, cached.producer, Registration(transactional_id, query_id, identity.partition))
        state.registered_query = query_id
    cached.state = state
    cached.query_id = query_id
    cached.spark_run_id = identity.spark_run_id
    cached.run_first_batch = identity.batch_id


def _refuse_adopting_a_partial_batch(
    found: Mapping[str, bytes],
    prefix: str,
    transactional_id: str,
    old_query: str,
    identity: TaskIdentity,
    plan: BatchPlan | None,
) -> None:
    """Before this query takes over ``old_query``'s ids: the old query's markers past its last
    complete batch (its progress record) are a batch it committed in part before it stopped, and
    this query reads that input again; and where this query's checkpoint says where it starts
    (``plan``), any distance from where the old query's last complete batch ended is input read
    twice or never. Refuse, counting them, before registering anything, so that every task of the
    adopting run sees the same and refuses too."""
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
    needle = query_needle(old_query)
    partial = sorted(
        (
            marker
            for key, value in found.items()
            if is_marker_key(key)
            and write_partition_of(key, prefix) is not None
            and needle in value
            and (marker := CommitMarker.decode(value)).query_id == old_query
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


def plain_producer(options: SinkOptions) -> CachedProducer:
    return PRODUCERS.get_or_create(_cache_key(options, None), lambda: _new_cached_producer(options, None))


def fence_query_transactions(
    options: SinkOptions,
    prefix: str,
    *,
    from_partition: int = 0,
    markers: Mapping[str, bytes] | None = None,
) -> list[str]:
    """Initialise every registered id ``{prefix}-{n}`` with n >= ``from_partition`` once, aborting any
    transaction it left open. Returns the ids fenced."""
    fenced = []
    for partition, transactional_id in sorted(registered_transactional_ids(options, prefix, markers).items()):
        if partition >= from_partition:
            log.info("fencing %s (aborts a transaction it left open)", transactional_id)
            fence_transactional_id(options, transactional_id)
            fenced.append(transactional_id)
    return fenced


def fence_transactional_id(options: SinkOptions, transactional_id: str) -> None:
    """Abort whatever transaction ``transactional_id`` has open by initialising it once."""
    discard_producer(options, transactional_id)
    producer = Producer(producer_config(options, transactional_id))
    try:
        producer.init_transactions(options.operation_timeout_s)
        _claim(transactional_id)
    finally:
        producer.flush(0)


# Spark runs a task in any idle Python worker of its executor, so one transactional id moves between
# workers: whoever initialises it fences the others' cached producers. Each initialisation is
# recorded in a small file per id, shared by the workers of one machine; a worker reuses its cached
# producer only while the file still names it, and otherwise initialises the id again (which also
# makes the locally tracked commit marker stale, so it is read again). An id moving to another
# machine (a rescheduled task) is caught by the broker: the stale producer is fenced, its task
# fails, and Spark's retry initialises the id afresh.
def _ownership_file(transactional_id: str) -> Path:
    directory = Path(tempfile.gettempdir()) / f"sparkafka-producers-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / hashlib.sha256(transactional_id.encode()).hexdigest()


def _worker_identity() -> str:
    # The pid alone could be reused by a later worker; the start time makes the identity unique.
    return f"{os.getpid()}:{_WORKER_STARTED_NS}"


def _claim(transactional_id: str) -> None:
    target = _ownership_file(transactional_id)
    temporary = target.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(_worker_identity())
    os.replace(temporary, target)


def _initialised_here_last(transactional_id: str) -> bool:
    try:
        return _ownership_file(transactional_id).read_text() == _worker_identity()
    except FileNotFoundError:
        return False
