"""One query per transactional-id prefix: the claim a query commits in the commit-marker topic before
any id of the prefix is initialised, and the record of it the sink keeps in the query's checkpoint.

Why the checkpoint record. A query's markers are what tell a replayed micro-batch from a new one;
lost (the topic deleted, the query pointed at another one), a replay would be written again. From
its second micro-batch on a query finds that out by itself (it has run before and finds nothing of
its own). A replay of its *first* micro-batch cannot: nothing in Kafka says a run came before. The
checkpoint can, as Spark replays that batch from it: the driver claims the prefix before any task
of the query runs, then records the claim under ``sparkafka/claims/`` in the checkpoint. A later
run whose checkpoint holds the record and whose marker topic does not hold the claim has lost its
markers, at any batch, and refuses before writing.

Where this sits in the exactly-once protocol (sink package docstring): the driver's work before
the tasks (:func:`settle_checkpoint_claim`), step 2 (:func:`settle_prefix_owner`) and step 3d
(:func:`require_prefix_claim`).

Steps of :func:`settle_checkpoint_claim`, on the driver, for every exactly-once writer Spark creates:
(a) Read the checkpoint's records of the query. The prefix's own names this marker topic: hand it
    to the tasks, done (a ``previousCommitMarkerTopic`` left set has nothing more to carry).
(b) It names another topic: ``previousCommitMarkerTopic`` must name the recorded topic; without it,
    go on only where this topic holds the query and the recorded one nothing newer of it, else
    refuse naming the recorded topic (``exactlyOnceFromBatch`` at this batch skips this part).
(c) No record of the prefix, on a streaming write: a record of another prefix of the query in
    another topic that holds this batch, in part, or a later one means prefix and topic changed
    together in the middle of a batch: refuse. An adopting query (``adoptTransactionalIdsFrom``)
    must find the old query in this marker topic. ``exactlyOnceFromBatch`` at this batch skips this
    part too.
(d) Carry the markers over when asked (every record newer than this topic's), claim the prefix here
    (refusing when another query owns it and is not adopted), then write the record. Tasks of this
    writer know it was recorded just now.

Invariant: a record exists only after its claim committed in the topic it names, so a topic that
lost the claim lost everything the query wrote there after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_admin import KafkaAdmin
from sparkafka.connector.kafka_errors import error_code, error_reason
from sparkafka.connector.sink.batch_plan import BatchPlan, CheckpointFiles
from sparkafka.connector.sink.client_config import producer_config
from sparkafka.connector.sink.commit_log import (
    MARKER_TOPIC_MUST_ACCEPT,
    MarkerLayout,
    PrefixClaim,
    ProgressRecord,
    RefusalRecord,
    Registration,
    claim_owner,
    commit_claim,
    encode_query_claim,
    marker_layout,
    marker_of_query,
    may_name_query,
    produce_to_markers,
    query_claim_key,
    read_marker_partition,
    read_markers,
)
from sparkafka.connector.sink.failures import (
    authorization_error,
    sink_unreachable_error,
    transaction_timeout_error,
)
from sparkafka.connector.sink.marker_snapshot import MarkerSnapshot, prefix_markers, task_layout
from sparkafka.connector.sink.options import (
    CLAIM_KEY_PREFIX,
    EXACTLY_ONCE_FROM_OPTION,
    LAYOUT_KEY_PREFIX,
    OPERATION_TIMEOUT,
    PREVIOUS_MARKER_TOPIC_OPTION,
    PROGRESS_KEY_PREFIX,
    QUERY_KEY_PREFIX,
    REFUSAL_KEY_PREFIX,
    REGISTRATION_KEY_PREFIX,
    SinkOptions,
    is_marker_key,
)
from sparkafka.connector.sink.replay import markers_lost, prefix_claimed_by_another_query, restart_output_here
from sparkafka.connector.sink.task import TaskIdentity
from sparkafka.connector.sink.transactional_ids import (
    claim_transactional_id,
    effective_prefix,
    prefix_of,
    transactional_id,
    write_partition_of,
)
from sparkafka.errors import CommitMarkerError, ReplayRefused, SparkafkaError

log = logging.getLogger(__name__)

# -- the claim in the commit-marker topic ----------------------------------------------------------

# Prefixes this process saw claimed by the query writing with them: (cluster, marker topic, prefix, query).
_OWNED_PREFIXES: set[tuple[str, str, str, str]] = set()


def settle_prefix_owner(
    options: SinkOptions,
    identity: TaskIdentity,
    transactional_id: str,
    plan: BatchPlan | None,
    snapshot: MarkerSnapshot | None = None,
) -> None:
    """Step 2 of the protocol (sink package docstring), before a task initialises
    ``transactional_id`` (which would fence another query's producer of it): learn which query owns
    the prefix, claiming it for this one when nobody has, and refuse if it is another query this
    write does not adopt. A quick read to the last stable offset finds an existing claim; a claim
    hidden behind an open transaction is found by the claim itself, which reads to the end. A claim
    missing where the checkpoint recorded one (``plan.claimed_in``) means lost markers: refused
    here, before claiming anew would hide it. The quick read starts where the driver's ``snapshot``
    of the commit log ends (:mod:`.marker_snapshot`)."""
    query_id = identity.query_id
    assert query_id is not None
    prefix = prefix_of(transactional_id, identity.partition)
    owned = (options.bootstrap_servers, options.marker_topic, prefix, query_id)
    if owned in _OWNED_PREFIXES:
        return
    layout = task_layout(options, snapshot, prefix, query_id)
    found = prefix_markers(options, layout, prefix, query_id, snapshot)
    owner = claim_owner(found, prefix, query_id)
    if owner is None and not any(registration_of_prefix(key, prefix) for key in found):
        if identity.batch_id is not None and claim_missing(options, found, prefix, plan):
            # Step 2: a claim the checkpoint recorded is gone, refused by the first check of 4c.
            refuse_lost_claim(options, identity.batch_id, query_id, transactional_id, plan)
        owner = claim_prefix(options, prefix, query_id, replace=None)
    if owner is not None and owner not in (query_id, options.adopted_query):
        # Step 2: another query owns the prefix; refused before this task could fence its producers.
        raise ReplayRefused(prefix_claimed_by_another_query(query_id, owner, prefix, transactional_id))


def claim_missing(
    options: SinkOptions, found: Mapping[str, bytes], prefix: str, plan: BatchPlan | None
) -> bool:
    """Whether the checkpoint recorded a claim of ``prefix`` in this marker topic (before the writer
    of this batch was created) and ``found`` (the topic's partition) holds no claim of it at all.
    Another query's claim there is refused as such (:func:`require_prefix_claim`)."""
    if plan is None or plan.claimed_in != options.marker_topic:
        return False
    return claim_owner(found, prefix, plan.query_id or "") is None


def refuse_lost_claim(
    options: SinkOptions, batch_id: int, query_id: str, transactional_id: str, plan: BatchPlan | None
) -> None:
    refusal = markers_lost(
        query_id=query_id,
        batch_id=batch_id,
        transactional_id=transactional_id,
        marker_topic=options.marker_topic,
        history_found=False,
        exactly_once_from=options.exactly_once_from,
        batch_input_records=None if plan is None else plan.input_records,
        claim_recorded=True,
    )
    if refusal is not None:
        raise ReplayRefused(refusal)


def require_prefix_claim(
    options: SinkOptions, found: Mapping[str, bytes], prefix: str, query_id: str, transactional_id: str
) -> None:
    """Step 3d of the protocol (sink package docstring). One query per prefix, decided once for the
    whole prefix: the first query to commit its claim (``claim/<prefix>``) owns every id of it, and
    another query refuses at its first write, before it registers any id, unless it adopts the
    owner's ids. A prefix whose ids were registered before claims existed keeps the per-id check
    alone (step 4a, :func:`~sparkafka.connector.sink.replay.decide`)."""
    owner = claim_owner(found, prefix, query_id)
    if owner is None:
        if any(registration_of_prefix(key, prefix) for key in found):
            return
        owner = claim_prefix(options, prefix, query_id, replace=None)
    if owner is not None and owner == options.adopted_query and owner != query_id:
        owner = claim_prefix(options, prefix, query_id, replace=owner)
    if owner is None:
        return
    if owner != query_id:
        raise ReplayRefused(prefix_claimed_by_another_query(query_id, owner, prefix, transactional_id))
    _OWNED_PREFIXES.add((options.bootstrap_servers, options.marker_topic, prefix, query_id))


def registration_of_prefix(key: str, prefix: str) -> bool:
    return key.startswith(REGISTRATION_KEY_PREFIX) and (
        write_partition_of(key[len(REGISTRATION_KEY_PREFIX) :], prefix) is not None
    )


def record_query_claim(
    options: SinkOptions,
    layout: MarkerLayout,
    query_id: str,
    prefix: str,
    found: Mapping[str, bytes] | None = None,
) -> None:
    """Write ``query/<query_id>/<prefix>`` where it is missing, though the query owns the prefix: a
    claim an older sparkafka committed, or one carried over from a topic of one such, came without
    it, and a later prefix of the query would not find this one's markers (a batch committed in part
    under it would be written again). ``found``: what the caller read, the query id's partition
    among it (read here otherwise). Nothing to do on a topic of one partition, which is read whole."""
    if layout.partitions == 1:
        return
    key = query_claim_key(query_id, prefix)
    if found is None:
        found = read_marker_partition(options, partition=layout.partition_of(query_id))
    if key in found:
        return
    log.info("%s: recording its claim of prefix %s under %s", query_id, prefix, key)
    record = {key: encode_query_claim(query_id, prefix)}
    produce_to_markers(options, options.marker_topic, record, "the query's claim", layout)


_CLAIM_ATTEMPTS = 20
# The claim producers' own client log: racing claimers fence each other by design, which librdkafka
# reports as errors; what matters reaches claim_prefix as an exception and is raised from there.
_CLAIM_CLIENT_LOG = logging.getLogger("sparkafka.librdkafka.claim")
_CLAIM_CLIENT_LOG.setLevel(logging.CRITICAL + 1)
_CLAIM_CLIENT_LOG.propagate = False


def claim_prefix(options: SinkOptions, prefix: str, query_id: str, *, replace: str | None) -> str | None:
    """Commit ``claim/<prefix>`` naming ``query_id`` unless another claim is there (or, adopting,
    unless it names another query than ``replace``); returns the query the claim names, None for a
    prefix whose ids were registered before claims existed.

    Steps of this function, with the prefix's claim id (:func:`claim_transactional_id`):
    (a) Initialise it: Kafka fences every other producer of the id and completes whatever claim
        transaction is in flight before it answers.
    (b) Read the marker partition to its end: a claim committed before (a) is seen here.
    (c) None there: commit ours in a transaction of the claim id. It commits only if nobody
        initialised the id since (a), so of two queries racing, exactly one claim commits; the
        other's commit is fenced, and it starts again at (a), now seeing the winner's claim.
    Tasks of one query race the same way and find their own query's claim."""
    claim_id = claim_transactional_id(prefix)
    claim = PrefixClaim(prefix, query_id, int(time.time() * 1000))
    layout = marker_layout(options)
    for _ in range(_CLAIM_ATTEMPTS):
        producer = Producer({**producer_config(options, claim_id), "logger": _CLAIM_CLIENT_LOG})
        try:
            producer.init_transactions(options.operation_timeout_s)  # (a)
            found = read_markers(options, prefix, layout=layout)  # (b)
            owner = claim_owner(found, prefix, query_id)
            if owner is not None and owner != replace:
                if owner == query_id:
                    record_query_claim(options, layout, query_id, prefix)
                return owner
            if owner is None and any(registration_of_prefix(key, prefix) for key in found):
                return None  # ids registered before claims existed: the per-id check decides
            commit_claim(options, producer, claim, layout)  # (c)
            log.info("%s claimed transactional-id prefix %s", query_id, prefix)
            return query_id
        except KafkaException as error:
            code = error_code(error)
            if code == kafka_errors.TRANSACTION_TIMEOUT_REFUSED:
                raise transaction_timeout_error(options) from None
            if code in kafka_errors.NOT_ANSWERED:
                raise sink_unreachable_error(
                    options, f"claim transactional-id prefix '{prefix}'", error
                ) from None
            refused = authorization_error(
                options, f"claiming transactional-id prefix '{prefix}'", error, prefix=prefix
            )
            if refused is not None:
                raise refused from None
            if code not in kafka_errors.TRANSACTION_RACE:
                raise CommitMarkerError(
                    f"claiming transactional-id prefix '{prefix}' in the commit-marker topic "
                    f"'{options.marker_topic}' failed: {error_reason(error)}. {MARKER_TOPIC_MUST_ACCEPT}"
                ) from None
            time.sleep(random.uniform(0.02, 0.2))  # another claimer won this round; look again
        finally:
            with contextlib.suppress(KafkaException):  # a fenced producer fails even to flush
                producer.flush(0)
    raise CommitMarkerError(
        f"claiming transactional-id prefix '{prefix}' did not settle in {_CLAIM_ATTEMPTS} attempts: "
        "other writers kept initialising its claim id; Spark retries the task"
    )


# Every attempt initialises the claim id again and reads the partition to its end, so a claim that
# did commit despite a race error (kafka_errors.TRANSACTION_RACE) is found there on the next one.


# -- the record in the checkpoint ------------------------------------------------------------------

_RECORDS = "sparkafka/claims"


@dataclass(frozen=True)
class ClaimRecord:
    """The checkpoint's record that ``query_id`` claimed ``prefix`` in ``marker_topic``."""

    prefix: str
    marker_topic: str
    query_id: str

    def encode(self) -> str:
        return json.dumps({"version": 1, **dataclasses.asdict(self)}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> ClaimRecord:
        fields = json.loads(text)
        if fields.get("version") != 1:
            raise ValueError(f"claim record version {fields.get('version')!r}, this sparkafka reads 1")
        return cls(str(fields["prefix"]), str(fields["marker_topic"]), str(fields["query_id"]))


def _record_name(prefix: str) -> str:
    # Transactional ids may hold any character; a file name may not.
    return f"{_RECORDS}/{hashlib.sha256(prefix.encode()).hexdigest()[:32]}.json"


def read_claim_records(files: CheckpointFiles, query_id: str) -> dict[str, ClaimRecord]:
    """The checkpoint's claim records of ``query_id``, by prefix. A record that cannot be read stops
    the query with the way on: deleting it costs only the first micro-batch's check, until the
    driver records the claim again."""
    records: dict[str, ClaimRecord] = {}
    for name in sorted(files.names(_RECORDS)):
        if not name.endswith(".json"):
            continue  # a temporary file of a write cut short
        path = f"{_RECORDS}/{name}"
        try:
            text = files.text(path)
            if text is None:
                continue
            record = ClaimRecord.decode(text)
        except (OSError, ValueError, KeyError) as error:
            raise SparkafkaError(
                f"the exactly-once sink cannot read its claim record {path} in the checkpoint "
                f"({type(error).__name__}: {error}); nothing was written. Delete that file: the driver "
                "records the claim again at the next micro-batch. Until then a replay of the query's "
                "first micro-batch after its commit-marker topic was lost is not told from a first run"
            ) from None
        if record.query_id == query_id:
            records[record.prefix] = record
    return records


def settle_checkpoint_claim(
    options: SinkOptions,
    plan: BatchPlan | None,
    *,
    batch_write: bool,
    carry_over: Callable[[BatchPlan | None], object],
) -> BatchPlan | None:
    """The driver's work before the tasks (sink package docstring) on the prefix's claim, parts
    (a)-(d) of the module docstring, for the writer of ``plan``'s micro-batch; returns the plan the
    tasks get, with ``claimed_in`` set when the checkpoint held the record already. ``carry_over``
    copies the markers from ``previousCommitMarkerTopic``; it runs after the checks that tell
    whether that topic is the one the checkpoint recorded."""
    if plan is None or plan.query_id is None or not options.checkpoint_location:
        if options.previous_marker_topic is not None:
            carry_over(plan)
        return plan
    query_id = plan.query_id
    prefix = effective_prefix(options, query_id)
    files = CheckpointFiles(options.checkpoint_location)
    records = read_claim_records(files, query_id)  # (a)
    own = records.get(prefix)
    if own is not None and own.marker_topic == options.marker_topic:
        # Moved here already: a previousCommitMarkerTopic left set has nothing more to carry.
        return dataclasses.replace(plan, claimed_in=own.marker_topic)
    restarts_here = options.exactly_once_from == plan.batch_id
    previous = options.previous_marker_topic
    if own is not None and not restarts_here:  # (b)
        if previous is not None and previous != own.marker_topic:
            raise ReplayRefused(_carried_from_another_topic(options, own, plan))
        if previous is None:
            _refuse_unless_current_here(options, own, plan)
    if own is None and not restarts_here:  # (c)
        if not batch_write:
            for other in records.values():
                if other.marker_topic != options.marker_topic:
                    _refuse_partial_batch_elsewhere(options, other, plan)
        if options.adopted_query is not None:
            _require_adopted_query_here(options, prefix, plan)
    if previous is not None:  # (d)
        carry_over(plan)
    owner = claim_prefix(options, prefix, query_id, replace=None)
    if owner is not None and owner not in (query_id, options.adopted_query):
        raise ReplayRefused(
            prefix_claimed_by_another_query(query_id, owner, prefix, transactional_id(prefix, 0))
        )
    name = _record_name(prefix)
    try:
        files.write(name, ClaimRecord(prefix, options.marker_topic, query_id).encode())
    except OSError as error:
        raise SparkafkaError(
            f"the exactly-once sink cannot record its claim of transactional-id prefix '{prefix}' in the "
            f"checkpoint ({options.checkpoint_location}/{name}: {error}): the driver's Python must be able "
            "to write the query's checkpoint, as Spark does; nothing was written to the output"
        ) from None
    log.info("%s: recorded its claim of prefix %s in %s", query_id, prefix, options.marker_topic)
    return plan


def newest_batch(found: Mapping[str, bytes], query_id: str, prefix: str) -> int:
    """The newest micro-batch of ``query_id`` that ``found`` (a marker partition) shows committed,
    by any write partition or by the prefix's progress record; -1 for none."""
    newest = -1
    may_name = may_name_query(query_id)
    progress_key = f"{PROGRESS_KEY_PREFIX}{prefix}"
    for key, value in found.items():
        if not may_name(value):
            continue
        if key == progress_key:
            progress = ProgressRecord.decode(value)
            if progress.query_id == query_id:
                newest = max(newest, progress.batch_id)
        elif is_marker_key(key) and (marker := marker_of_query(key, value, query_id)) is not None:
            newest = max(newest, marker.batch_id)
    return newest


def _read_topic(options: SinkOptions, topic: str, prefix: str) -> dict[str, bytes]:
    """The partition of ``topic`` that holds ``prefix``'s records (nothing when the topic is gone),
    read to its stable end."""
    other = dataclasses.replace(options, marker_topic=topic)
    admin = KafkaAdmin(
        other.client_config, timeout_s=other.operation_timeout_s, timeout_option=OPERATION_TIMEOUT
    )
    if topic not in admin.topic_partitions([topic]):
        return {}
    return read_markers(other, prefix, stable_only=True)


def _refuse_unless_current_here(options: SinkOptions, own: ClaimRecord, plan: BatchPlan) -> None:
    """The checkpoint records the markers in another topic than this run names: go on only where
    this topic holds the query and nothing newer of it is in the recorded one (a checkpoint restored
    from before a move to this topic: the tasks then judge the batch by the markers here)."""
    here = read_markers(options, own.prefix, stable_only=True)
    query_id = own.query_id
    if holds_query(here, query_id, own.prefix):
        recorded = newest_batch(_read_topic(options, own.marker_topic, own.prefix), query_id, own.prefix)
        if recorded <= newest_batch(here, query_id, own.prefix):
            log.warning(
                "%s: the checkpoint recorded the markers of prefix %s in %s; %s holds them as far as %s "
                "does, so the query goes on with %s",
                query_id,
                own.prefix,
                own.marker_topic,
                options.marker_topic,
                own.marker_topic,
                options.marker_topic,
            )
            return
    raise ReplayRefused(_markers_elsewhere(options, own, plan))


def _refuse_partial_batch_elsewhere(options: SinkOptions, other: ClaimRecord, plan: BatchPlan) -> None:
    """A prefix new to the checkpoint on another marker topic than an earlier prefix of the query:
    both changed together. Fine between two batches; if the earlier prefix committed this batch
    (in part) or a later one in its topic, this one would write it again."""
    found = _read_topic(options, other.marker_topic, other.prefix)
    ahead = sorted(
        (marker.partition, marker.records, marker.batch_id)
        for key, value in found.items()
        if write_partition_of(key, other.prefix) is not None
        and (marker := marker_of_query(key, value, other.query_id)) is not None
        and marker.batch_id >= plan.batch_id
    )
    if ahead:
        raise ReplayRefused(_prefix_and_topic_changed(options, other, plan, ahead))


def _require_adopted_query_here(options: SinkOptions, prefix: str, plan: BatchPlan) -> None:
    """An adopting query reads what the old query committed from this marker topic: one that holds
    nothing of the old query (its claim, a registration or progress record of the prefix, a marker)
    is not the topic the old query wrote to, and its partial batch would go unseen."""
    adopted = options.adopted_query
    assert adopted is not None
    if shows_query(read_markers(options, prefix, stable_only=True), adopted, prefix):
        return
    raise ReplayRefused(
        f"option adoptTransactionalIdsFrom names query {adopted}, and the commit-marker topic "
        f"'{options.marker_topic}' holds nothing of it under transactional-id prefix '{prefix}': no claim, "
        "registration, progress record or commit marker. The ids would be taken over without what that "
        "query committed, and a micro-batch it committed in part would be written again; nothing is "
        "written and the query stops. Ways on: name the topic that query wrote its markers to with "
        ".option('commitMarkerTopic', '<that topic>'): nothing is lost or written twice. If its markers "
        f"are gone for good, .option('{EXACTLY_ONCE_FROM_OPTION}', '{plan.batch_id}') starts this query's "
        "exactly-once output at this batch without them: nothing is lost, and what the old query "
        "committed of the input this batch reads is written again"
        + ("" if plan.input_records is None else f" (at most its {plan.input_records} input record(s))")
    )


def shows_query(found: Mapping[str, bytes], query_id: str, prefix: str) -> bool:
    """Whether ``found`` (a marker partition) holds anything written by ``query_id`` under
    ``prefix``: its claim, a registration of one of the prefix's ids naming it, the prefix's progress
    record or a commit marker of it."""
    may_name = may_name_query(query_id)
    for key, value in found.items():
        if key.startswith(CLAIM_KEY_PREFIX):
            if key == f"{CLAIM_KEY_PREFIX}{prefix}" and claim_owner(found, prefix, query_id) == query_id:
                return True
        elif key.startswith(REGISTRATION_KEY_PREFIX):
            if registration_of_prefix(key, prefix) and Registration.decode(value).query_id == query_id:
                return True
        elif key.startswith(PROGRESS_KEY_PREFIX):
            if key == f"{PROGRESS_KEY_PREFIX}{prefix}" and ProgressRecord.decode(value).query_id == query_id:
                return True
        elif is_marker_key(key) and may_name(value) and belongs_to(key, value, query_id, prefix):
            return True
    return False


def holds_query(found: Mapping[str, bytes], query_id: str, prefix: str) -> bool:
    """Whether the query's markers are in ``found`` already: a claim alone is not (a run refused for
    want of its markers may have claimed the prefix there, and the claim's ``query/`` record with it),
    nor a refusal record."""
    return any(
        belongs_to(key, value, query_id, prefix)
        for key, value in found.items()
        if not key.startswith((CLAIM_KEY_PREFIX, REFUSAL_KEY_PREFIX, QUERY_KEY_PREFIX))
    )


def belongs_to(key: str, value: bytes, query_id: str, prefix: str) -> bool:
    """Whether a record of the marker topic is the query's under ``prefix``."""
    if key.startswith(REGISTRATION_KEY_PREFIX):
        return write_partition_of(key[len(REGISTRATION_KEY_PREFIX) :], prefix) is not None
    if key.startswith(PROGRESS_KEY_PREFIX):
        return key == f"{PROGRESS_KEY_PREFIX}{prefix}"
    if key.startswith(CLAIM_KEY_PREFIX):
        return key == f"{CLAIM_KEY_PREFIX}{prefix}"
    if key.startswith(REFUSAL_KEY_PREFIX):
        return key == f"{REFUSAL_KEY_PREFIX}{prefix}" and RefusalRecord.decode(value).query_id == query_id
    if key.startswith(QUERY_KEY_PREFIX):
        return key.startswith(f"{QUERY_KEY_PREFIX}{query_id}/")
    if key.startswith(LAYOUT_KEY_PREFIX):
        return False
    # A damaged marker of the query, or one of a newer release, is refused, not left behind.
    return marker_of_query(key, value, query_id) is not None


def _restart_cost(plan: BatchPlan) -> str:
    return restart_output_here(plan.batch_id, plan.input_records)


def _markers_elsewhere(options: SinkOptions, record: ClaimRecord, plan: BatchPlan) -> str:
    return (
        f"the checkpoint of query {record.query_id} records that its transactional-id prefix "
        f"'{record.prefix}' was claimed in the commit-marker topic '{record.marker_topic}', and this run "
        f"names '{options.marker_topic}', which holds nothing of the query or less than "
        f"'{record.marker_topic}': its markers are in '{record.marker_topic}'. Judged without them a "
        "replayed micro-batch would be written a second time, so nothing is written and the query "
        f"stops. Ways on: restart with .option('commitMarkerTopic', '{record.marker_topic}'), or keep "
        f"'{options.marker_topic}' and carry the markers over with "
        f".option('{PREVIOUS_MARKER_TOPIC_OPTION}', '{record.marker_topic}'), which copies every record "
        f"of the query newer than this topic's: nothing is lost or written twice. If "
        f"'{record.marker_topic}' is gone for good, {_restart_cost(plan)}"
    )


def _carried_from_another_topic(options: SinkOptions, record: ClaimRecord, plan: BatchPlan) -> str:
    return (
        f"option {PREVIOUS_MARKER_TOPIC_OPTION} names '{options.previous_marker_topic}', and the checkpoint "
        f"of query {record.query_id} records its markers (prefix '{record.prefix}') in "
        f"'{record.marker_topic}': carrying over the markers of another topic would judge a replay by "
        "markers that are not the newest, so nothing is copied or written and the query stops. Way on: "
        f".option('{PREVIOUS_MARKER_TOPIC_OPTION}', '{record.marker_topic}') (or no option and "
        f".option('commitMarkerTopic', '{record.marker_topic}')): nothing is lost or written twice. If "
        f"'{record.marker_topic}' is gone for good, {_restart_cost(plan)}"
    )


def _prefix_and_topic_changed(
    options: SinkOptions, other: ClaimRecord, plan: BatchPlan, ahead: Sequence[tuple[int, int, int]]
) -> str:
    listed = ", ".join(f"write partition {p}: {n} record(s) of micro-batch {b}" for p, n, b in ahead)
    return (
        f"query {other.query_id} wrote under transactional-id prefix '{other.prefix}' with its markers in "
        f"'{other.marker_topic}', and this run names another prefix and the commit-marker topic "
        f"'{options.marker_topic}': both changed while micro-batch {plan.batch_id} was partly committed "
        f"under the old ones ({listed}). Writing it under the new ones would write that part twice, so "
        "nothing is written and the query stops. Way on: restart with the prefix and marker topic of "
        f"the first run until micro-batch {plan.batch_id} is done, then change them: nothing is lost or "
        f"written twice. If that cannot be, {_restart_cost(plan)}"
    )
