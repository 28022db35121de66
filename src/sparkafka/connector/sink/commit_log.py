"""The commit log: the commit-marker topic, compacted, whose latest record per transactional id says
which micro-batch that id committed last (and, under ``registration/<id>``, which query owns the id;
under ``claim/``, ``progress/`` and ``refusal/<prefix>``, which query owns a prefix, the last batch it
completed, and the last run that refused a reshaped replay; under ``query/<query>/<prefix>``, that a
query claimed a prefix). Read with read_committed, so only committed markers count.

Layout (:class:`MarkerLayout`): every record of a prefix — its ids' markers and registrations, its
claim, progress and refusal records — lives in one partition, chosen by a hash of the prefix over
the topic's layout, and a query's ``query/`` records in the partition of its query id; so a write
reads only the partitions of its prefix and query, whatever other queries keep in the topic. The
layout is the partition count the topic was created with, recorded under ``layout/partitions`` in
partition 0 before anything else is written (:func:`marker_layout`): partitions added later are never
used, and a topic without that record (every topic written before layouts existed, and one created
by hand) keeps everything in partition 0.

Every record type is JSON with a ``version`` (1): a reader refuses a version it does not know,
naming the upgrade, rather than read a newer record's fields by their old meaning. Commit markers
registrations and prefix claims were written without one at first; such a record is of version 1.

This module owns the topic: its record types (encoded and decoded here only), creating and
checking it, reading the partition to its end, what one write task learns from it
(:class:`CommittedState`), and every write into it outside a task's output transaction
(registrations, progress and refusal records). Prefix claims are in :mod:`.claims`. What the
exactly-once protocol reads and writes here, and when, is told in the sink package docstring."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from sparkafka.connector.client_pool import CONSUMERS
from sparkafka.connector.kafka_admin import (
    EAGER_CONNECTIONS,
    LIBRDKAFKA_LOGGER,
    KafkaAdmin,
    partition_watermarks,
)
from sparkafka.connector.kafka_errors import (
    DAMAGED_BATCH,
    PARTITION_EOF,
    TIMED_OUT,
    TOPIC_EXISTS,
    error_code,
    error_reason,
)
from sparkafka.connector.sink.failures import sink_unreachable_error
from sparkafka.connector.sink.options import (
    CLAIM_KEY_PREFIX,
    LAYOUT_KEY_PREFIX,
    MARKER_PARTITION,
    OPERATION_TIMEOUT,
    PREVIOUS_MARKER_TOPIC_OPTION,
    PROGRESS_KEY_PREFIX,
    QUERY_KEY_PREFIX,
    REFUSAL_KEY_PREFIX,
    REGISTRATION_KEY_PREFIX,
    SinkOptions,
    is_marker_key,
)
from sparkafka.connector.sink.transactional_ids import prefix_of_any, write_partition_of
from sparkafka.errors import CommitMarkerError, SparkafkaError, SparkafkaOptionError

_Answer = TypeVar("_Answer")

log = logging.getLogger(__name__)

# How a query moves to another commit-marker topic without losing what its markers say.
MOVE_MARKERS_HINT = (
    "A new query (a new checkpoint) may name any other topic with option 'commitMarkerTopic'; a query "
    "that has written before keeps its markers by naming the new topic with 'commitMarkerTopic' and "
    f"this one with '{PREVIOUS_MARKER_TOPIC_OPTION}', which carries them over before its next micro-batch"
)

# What the sink writes to the marker topic, and what the topic must allow for it.
MARKER_TOPIC_MUST_ACCEPT = (
    "The sink commits a claim per transactional-id prefix and a registration per id before any "
    "output, and a marker after every batch: the topic must accept them (its max.message.bytes, "
    f"min.insync.replicas and ACLs for this principal). {MOVE_MARKERS_HINT}"
)


@functools.lru_cache(maxsize=64)
def may_name_query(query_id: str) -> Callable[[bytes], bool]:
    """A quick test of a record's value, false only for a record that cannot name ``query_id``: a
    query's records hold its id as JSON writes it, which for an id of plain characters (Spark's query
    ids are UUIDs) is the id itself. What passes is decoded and judged by its type and key; the test
    spares decoding the records of other queries (a topic may hold a million of them). For an id
    that JSON would escape, every record passes."""
    if json.dumps(query_id, ensure_ascii=True) != f'"{query_id}"':
        return lambda value: True
    written = query_id.encode()
    return lambda value: written in value


# -- the layout ---------------------------------------------------------------------------------------

LAYOUT_KEY = f"{LAYOUT_KEY_PREFIX}partitions"


@dataclass(frozen=True)
class MarkerLayout:
    """How many partitions of the marker topic hold records, and which one holds what."""

    partitions: int

    def partition_of(self, name: str) -> int:
        """The partition of a prefix's records (``name``: the prefix), or of a query's ``query/``
        records (``name``: the query id). A stable hash (CRC-32), the same in every process."""
        return 0 if self.partitions == 1 else zlib.crc32(name.encode()) % self.partitions

    def partition_of_key(self, key: str) -> int:
        """The partition a record of ``key`` belongs in (see :meth:`partition_of`); the layout record's
        is partition 0."""
        if key.startswith(LAYOUT_KEY_PREFIX):
            return MARKER_PARTITION
        return self.partition_of(_owner_of_key(key))

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "partitions": self.partitions}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> MarkerLayout:
        partitions = _version_1(raw, "layout").get("partitions")
        if not isinstance(partitions, int) or partitions < 1:
            raise CommitMarkerError(
                f"the layout record of the commit-marker topic names {partitions!r} partitions: it was "
                "written by hand, or damaged; the topic's records cannot be found without it"
            )
        return cls(partitions)


def _owner_of_key(key: str) -> str:
    """The prefix (or, for a ``query/`` record, the query id) whose partition holds ``key``."""
    if key.startswith(QUERY_KEY_PREFIX):
        return key[len(QUERY_KEY_PREFIX) :].split("/", 1)[0]
    for record_prefix in (CLAIM_KEY_PREFIX, PROGRESS_KEY_PREFIX, REFUSAL_KEY_PREFIX):
        if key.startswith(record_prefix):
            return key[len(record_prefix) :]
    transactional_id = key.removeprefix(REGISTRATION_KEY_PREFIX)
    prefix = prefix_of_any(transactional_id)
    if prefix is None:
        raise CommitMarkerError(
            f"the commit-marker topic holds no records under the key {key!r}: it is neither a "
            "transactional id of a write partition nor a record the sink writes"
        )
    return prefix


def marker_layout(options: SinkOptions) -> MarkerLayout:
    """The layout of the marker topic (which must exist).

    Steps of this function:
    (a) A topic of one partition: everything is in partition 0.
    (b) Otherwise read partition 0 from its start (read_uncommitted: the record is written outside
        any transaction, and no open transaction may hide it) up to the first layout record, whose
        count is the layout.
    (c) None there, and partition 0 holds nothing else: the topic was just created, by a process
        that has not written the record yet, or by hand. Write it (the topic's partition count),
        read again, and take the first one: every process racing here writes the same count, and
        all take the first written.
    (d) None there, and partition 0 holds other records: a topic written before layouts existed (or
        by hand): everything is in partition 0, as it always was.

    Invariant: no process writes a record into a topic of more than one partition before it has
    read or written the layout record, so the first record of partition 0 that any process wrote
    after (c) is a layout record.

    A layout once found is kept in this process for the topic's id (which a topic deleted and created
    again does not keep): the record is written once per topic and never changes, so a driver that
    builds writers every micro-batch asks only for the topic's description again."""
    with _dropped_on_failure(_pooled_admin(options)) as admin:
        return _layout_through(options, admin, use_kept=True)


def _layout_through(options: SinkOptions, admin: KafkaAdmin, *, use_kept: bool) -> MarkerLayout:
    """:func:`marker_layout`, asking through ``admin``; ``use_kept``: a layout kept for the topic's
    id may answer (not for a topic this process just created, whose layout record it must write)."""
    partitions = _until_known(
        options, lambda: len(admin.topic_partitions([options.marker_topic]).get(options.marker_topic, []))
    )
    if partitions <= 1:
        return MarkerLayout(1)
    topic_id = admin.known_topic_ids.get(options.marker_topic)
    known_as = None if topic_id is None else (options.bootstrap_servers, options.marker_topic, topic_id)
    if use_kept and known_as is not None and (kept := _LAYOUTS.get(known_as)) is not None:
        return kept
    for attempt in range(2):
        found, anything_else = _first_layout_record(options)
        if found is not None:
            if found.partitions > partitions:
                raise CommitMarkerError(
                    f"the commit-marker topic '{options.marker_topic}' was laid out over {found.partitions} "
                    f"partitions and has {partitions}: it was deleted and created again with fewer, and its "
                    f"markers are gone. {MOVE_MARKERS_HINT}"
                )
            if known_as is not None:
                _LAYOUTS[known_as] = found
            return found
        if anything_else and not attempt and known_as is not None:
            _LAYOUTS[known_as] = MarkerLayout(1)  # written before layouts existed, for good
        if anything_else or attempt:
            return MarkerLayout(1)
        record = {LAYOUT_KEY: MarkerLayout(partitions).encode()}
        produce_to_markers(
            options, options.marker_topic, record, "the layout record", MarkerLayout(partitions)
        )
    return MarkerLayout(1)  # not reached


# The layouts found, by (bootstrap servers, marker topic, topic id): see marker_layout.
_LAYOUTS: dict[tuple[str, str, tuple[int, int]], MarkerLayout] = {}
# One admin client per cluster configuration and process, kept: the driver asks about the marker
# topic for every writer Spark builds (twice a micro-batch), and a new client connects anew each time.
# Keyed by process id too: a client's threads do not survive a fork. The least recently used go
# beyond a few configurations (a long-lived driver may serve many queries over its life).
_ADMINS: collections.OrderedDict[tuple[int, tuple[tuple[str, str], ...], float], KafkaAdmin] = (
    collections.OrderedDict()
)
_ADMINS_KEPT = 8
_ADMINS_LOCK = threading.Lock()


def _pooled_admin(options: SinkOptions) -> KafkaAdmin:
    """This process's admin client for ``options``' cluster configuration. Every question asks the
    cluster anew (KafkaAdmin keeps no answers but the topic ids it last saw, which each description
    replaces); after a failed question its user drops the client (:func:`_dropped_on_failure`), and
    the next use connects anew, as a new client per question did."""
    config = tuple(sorted((name, str(value)) for name, value in options.client_config.items()))
    key = (os.getpid(), config, options.operation_timeout_s)
    with _ADMINS_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = KafkaAdmin(
                options.client_config, timeout_s=options.operation_timeout_s, timeout_option=OPERATION_TIMEOUT
            )
            while len(_ADMINS) > _ADMINS_KEPT:
                _ADMINS.popitem(last=False)[1].close()
        _ADMINS.move_to_end(key)
        return admin


@contextlib.contextmanager
def _dropped_on_failure(admin: KafkaAdmin) -> Iterator[KafkaAdmin]:
    try:
        yield admin
    except BaseException:
        admin.close()
        raise


def _first_layout_record(options: SinkOptions) -> tuple[MarkerLayout | None, bool]:
    """The first layout record of partition 0, and whether it holds records before it (or, with none,
    at all)."""
    partition = TopicPartition(options.marker_topic, MARKER_PARTITION)
    low, high = _watermarks(options, partition, "read_uncommitted")
    if high <= low:
        return None, False
    # Not held back by a transaction open in partition 0: the record is written outside any.
    config = _marker_consumer_config(options, {**_READING_TO_THE_END, "isolation.level": "read_uncommitted"})
    anything_else = False
    with CONSUMERS.borrow(config) as consumer:
        consumer.assign([TopicPartition(options.marker_topic, MARKER_PARTITION, low)])
        deadline = time.monotonic() + options.operation_timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            failure = message.error()
            if failure is not None:
                if failure.code() != PARTITION_EOF:
                    raise _unreadable_markers(options, partition, message.offset(), failure)
                if (message.offset() or 0) >= high:
                    return None, anything_else
                continue
            if (message.key() or b"") == LAYOUT_KEY.encode():
                return MarkerLayout.decode(message.value() or b""), anything_else
            anything_else = True
            if (message.offset() or 0) + 1 >= high:
                return None, True
    raise sink_unreachable_error(options, f"read the layout record of {options.marker_topic}", "timed out")


# -- commit markers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitMarker:
    transactional_id: str
    query_id: str
    batch_id: int
    partition: int
    records: int
    time_ms: int
    # The write's 'topic' option ("" when every row names its topic); None in markers written before
    # the field existed. Tells two writes of one micro-batch that share transactional ids apart.
    topic: str | None = None
    # How many write partitions the batch had when this task committed (Spark's numTasks of the
    # write stage); None when the driver's status API could not say, and in older markers.
    write_partitions: int | None = None
    # The digest of the input the batch was planned from (batch_plan.BatchPlan.digest); None when
    # the checkpoint could not be read, and in older markers.
    plan: str | None = None
    # The query run that committed it (StreamingQuery.runId); None in older markers.
    run_id: str | None = None
    # Committed by a run that accepted this batch as written (acceptReshapedBatch) in the shape of the
    # run that refused it, whose id this is: a later acceptance of that same refusal keeps it.
    accepted_run: str | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "transactional_id": self.transactional_id,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "partition": self.partition,
                "records": self.records,
                "time_ms": self.time_ms,
                "topic": self.topic,
                "write_partitions": self.write_partitions,
                "plan": self.plan,
                "run_id": self.run_id,
                "accepted_run": self.accepted_run,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> CommitMarker:
        return cls._from_fields(json.loads(raw))

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> CommitMarker:
        _version_1_or_older(data, "commit marker")
        return cls(
            data["transactional_id"],
            data["query_id"],
            int(data["batch_id"]),
            int(data["partition"]),
            int(data["records"]),
            int(data["time_ms"]),
            data.get("topic"),
            _optional_int(data.get("write_partitions")),
            data.get("plan"),
            data.get("run_id"),
            data.get("accepted_run"),
        )


def marker_of_query(key: str, value: bytes, query_id: str) -> CommitMarker | None:
    """The commit marker ``value`` is, under transactional id ``key``, if it is one of ``query_id``;
    None for a marker of another query, and for a record whose ``query_id`` does not name the query
    (whatever else of it holds the query's id).

    A record that names the query there but is no whole commit marker (written by hand, or by a
    program other than sparkafka) is refused, naming its key: taken for nothing it could hide a write
    partition's last batch of the query, and a replay would then write that batch again. So is a
    record of a version this sparkafka does not read that holds the query's id anywhere (a newer
    release may name the query otherwise); one that does not is another query's."""
    try:
        data: Any = json.loads(value)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("version", 1) != 1:
        if not may_name_query(query_id)(value):
            return None
        _version_1_or_older(data, f"commit marker (key {key!r})")
    # A value that is no JSON object but holds a query_id field may be the query's marker, damaged.
    names_query = data.get("query_id") == query_id if isinstance(data, dict) else b'"query_id"' in value
    if not names_query:
        return None
    try:
        return CommitMarker._from_fields(data)
    except (KeyError, TypeError, ValueError):
        raise CommitMarkerError(
            f"the commit-marker record under key {key!r} names query {query_id} but is no commit marker "
            "sparkafka writes (written by hand, or by another program): the sink cannot tell which "
            "batch that write partition committed last. Write back the record the sink wrote there, or "
            "a tombstone for the key if no query ever wrote under that transactional id"
        ) from None


@dataclass(frozen=True)
class ProgressRecord:
    """The last micro-batch of a query that every write task and the driver committed under one
    transactional-id prefix, and where its input ended; key ``progress/<prefix>``.

    Written by the driver's commit after all of the batch's tasks committed, so it is never ahead of
    the markers. It tells a query whose checkpoint went back where its output really ends."""

    prefix: str
    query_id: str
    batch_id: int
    plan: str | None
    # The source lines of the batch's offsets-log entry (None: the checkpoint could not be read).
    end_offsets: tuple[str, ...] | None
    time_ms: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "prefix": self.prefix,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "plan": self.plan,
                "end_offsets": None if self.end_offsets is None else list(self.end_offsets),
                "time_ms": self.time_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ProgressRecord:
        data = _version_1(raw, "progress")
        end = data.get("end_offsets")
        return cls(
            data["prefix"],
            data["query_id"],
            int(data["batch_id"]),
            data.get("plan"),
            None if end is None else tuple(str(line) for line in end),
            int(data["time_ms"]),
        )


@dataclass(frozen=True)
class RefusalRecord:
    """The last query run that refused to replay a micro-batch split otherwise than it was first
    written; key ``refusal/<prefix>``.

    Written by the refusing task (or the driver) before the query stops. The markers that run
    committed of the batch hold the rows of the shape the refusal offered to accept, so a run that
    accepts the batch keeps them and writes again only what other runs committed: the cost the
    refusal stated. The query is stored under ``query``, not ``query_id``: readers of earlier releases
    found a query's commit markers by the bytes ``"query_id":"<id>"`` and must not take this record
    for one."""

    prefix: str
    query_id: str
    batch_id: int
    # The refusing write's run (KafkaStreamWriter.run_id). None in a record of an earlier version,
    # written where a foreachBatch function hid Spark's run id: its commits cannot be told apart.
    run_id: str | None
    time_ms: int
    # Runs that accepted this refusal in another shape than the refused run's (a task of theirs found
    # a kept marker it did not match): no later acceptance keeps what they committed.
    rejected_runs: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "prefix": self.prefix,
                "query": self.query_id,
                "batch": self.batch_id,
                "run": self.run_id,
                "rejected": list(self.rejected_runs),
                "time_ms": self.time_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RefusalRecord:
        data = _version_1(raw, "refusal")
        return cls(
            data["prefix"],
            data["query"],
            int(data["batch"]),
            data.get("run"),
            int(data["time_ms"]),
            tuple(str(run) for run in data.get("rejected", ())),
        )

    def names(self, query_id: str, batch_id: int) -> bool:
        """Whether this refusal is of that micro-batch of that query."""
        return self.query_id == query_id and self.batch_id == batch_id


@dataclass(frozen=True)
class Registration:
    """That a transactional id exists and which query owns it; key ``registration/<id>``. Committed
    in a transaction of its own before the id's first output (:func:`register`), so that a restart
    with fewer write partitions finds every id it no longer uses and fences it."""

    transactional_id: str
    query_id: str | None
    partition: int

    @property
    def key(self) -> str:
        return f"{REGISTRATION_KEY_PREFIX}{self.transactional_id}"

    def encode(self) -> bytes:
        # Default separators, as registrations have always been written: the space after each colon
        # keeps the bytes by which readers of earlier releases found commit markers from matching.
        return json.dumps(
            {
                "version": 1,
                "transactional_id": self.transactional_id,
                "query_id": self.query_id,
                "partition": self.partition,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Registration:
        """Only ``query_id`` is ever read back, and a record without one (damaged, or edited by hand)
        counts as no registration: the id is registered again, as it always was."""
        data = json.loads(raw)
        _version_1_or_older(data, "registration")
        partition = data.get("partition")
        return cls(
            str(data.get("transactional_id", "")),
            data.get("query_id"),
            partition if isinstance(partition, int) else -1,
        )


@dataclass(frozen=True)
class PrefixClaim:
    """That query ``query_id`` owns transactional-id prefix ``prefix``; key ``claim/<prefix>``, in the
    prefix's partition. Committed by :func:`commit_claim` (for :func:`~.claims.claim_prefix`) in a
    transaction of the prefix's claim id, so that of two queries racing for a prefix exactly one
    claim commits."""

    prefix: str
    query_id: str | None
    time_ms: int = 0

    @property
    def key(self) -> str:
        return f"{CLAIM_KEY_PREFIX}{self.prefix}"

    def encode(self) -> bytes:
        # Default separators, as claims have always been written: readers of earlier releases found
        # commit markers by the bytes '"query_id":"<id>"', which a claim's '"query_id": ' (with its
        # space) never matches.
        fields = {"version": 1, "prefix": self.prefix, "query_id": self.query_id, "time_ms": self.time_ms}
        return json.dumps(fields).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PrefixClaim:
        """A claim without a query (damaged, or edited by hand) names no owner."""
        data = json.loads(raw)
        _version_1_or_older(data, "prefix claim")
        owner = data.get("query_id")
        stamp = data.get("time_ms")
        return cls(
            str(data.get("prefix", "")), str(owner) if owner else None, stamp if isinstance(stamp, int) else 0
        )


def query_claim_key(query_id: str, prefix: str) -> str:
    """The key of the record that ``query_id`` claimed ``prefix``, in the partition of the query's id,
    where a write of the query finds every prefix it ever wrote under (:func:`claimed_prefixes`)."""
    return f"{QUERY_KEY_PREFIX}{query_id}/{prefix}"


def encode_query_claim(query_id: str, prefix: str) -> bytes:
    # The query is stored under "query", not "query_id": readers of earlier releases found commit
    # markers by the bytes '"query_id":"<id>"', and must not take this record for one.
    return json.dumps(
        {"version": 1, "query": query_id, "prefix": prefix, "time_ms": int(time.time() * 1000)},
        separators=(",", ":"),
    ).encode()


def claimed_prefixes(found: Mapping[str, bytes], query_id: str) -> set[str]:
    """Every prefix ``found`` (the partitions read) records ``query_id`` to have claimed."""
    head = f"{QUERY_KEY_PREFIX}{query_id}/"
    return {key[len(head) :] for key in found if key.startswith(head)}


def claim_owner(found: Mapping[str, bytes], prefix: str, query_id: str) -> str | None:
    """The query the prefix's claim in ``found`` (the marker partition as read) names, if any. A claim
    of a version this sparkafka does not read is refused where it holds ``query_id`` (this query's
    own claim, written by a newer release), and otherwise names its owner as that release wrote it:
    another query's, refused as such by the callers."""
    raw = found.get(f"{CLAIM_KEY_PREFIX}{prefix}")
    if raw is None:
        return None
    data = json.loads(raw)
    if isinstance(data, dict) and data.get("version", 1) != 1 and not may_name_query(query_id)(raw):
        return str(data.get("query_id") or "a query of a newer sparkafka")
    return PrefixClaim.decode(raw).query_id


def registered_query(found: Mapping[str, bytes], transactional_id: str) -> str | None:
    """The query ``found`` (the marker partition as read) registers ``transactional_id`` to, if any."""
    recorded = found.get(f"{REGISTRATION_KEY_PREFIX}{transactional_id}")
    return None if recorded is None else Registration.decode(recorded).query_id


def refusal_record(found: Mapping[str, bytes], prefix: str) -> RefusalRecord | None:
    """The prefix's refusal record in ``found`` (the marker partition as read), if it holds one."""
    recorded = found.get(f"{REFUSAL_KEY_PREFIX}{prefix}")
    return None if recorded is None else RefusalRecord.decode(recorded)


def _version_1(raw: bytes, what: str) -> dict[str, Any]:
    """The fields of a record of version 1, or the error saying a newer sparkafka wrote it."""
    data: dict[str, Any] = json.loads(raw)
    _require_version_1(data.get("version"), what)
    return data


def _version_1_or_older(data: Any, what: str) -> None:
    """Refuse a record of a version this sparkafka does not read. Commit markers, registrations and
    prefix claims were written without a version before version 1: a record without one is of
    version 1 (a release that reads only some of its fields would otherwise take a newer record's for
    the same meaning, and a replay could write a committed batch again)."""
    _require_version_1(data.get("version", 1) if isinstance(data, dict) else 1, what)


def _require_version_1(version: Any, what: str) -> None:
    if version != 1:
        raise CommitMarkerError(
            f"a {what} record of the commit-marker topic has version {version!r}, and this sparkafka "
            "reads version 1: it was written by a newer sparkafka; upgrade this one"
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def ensure_marker_topic(options: SinkOptions) -> tuple[int, int] | None:
    """Create the compacted commit-marker topic unless it exists (racing creators are fine), with
    ``commitMarkerTopicPartitions`` partitions and its layout record (:func:`marker_layout`); refuse
    one that exists with a cleanup policy that deletes markers (:func:`_require_compacted`). Returns
    the topic's id (most and least significant bits; None where the cluster names none), which tells
    it from a topic of the same name deleted and created again."""
    with _dropped_on_failure(_pooled_admin(options)) as admin:
        return _ensure_through(options, admin)


def _ensure_through(options: SinkOptions, admin: KafkaAdmin) -> tuple[int, int] | None:
    """:func:`ensure_marker_topic`, asking through ``admin``."""
    if options.marker_topic in admin.topic_partitions([options.marker_topic]):
        _require_compacted(options, admin)
        return admin.known_topic_ids.get(options.marker_topic)
    topic = NewTopic(
        options.marker_topic,
        options.marker_partitions,
        -1,
        config={"cleanup.policy": "compact", "segment.bytes": "16777216"},
    )
    try:
        admin.client.create_topics([topic], operation_timeout=options.operation_timeout_s)[
            options.marker_topic
        ].result(options.operation_timeout_s)
        log.info("created commit-marker topic %s", options.marker_topic)
        _layout_through(options, admin, use_kept=False)  # writes the new topic's layout record
    except KafkaException as error:
        if error_code(error) != TOPIC_EXISTS:
            raise CommitMarkerError(
                f"cannot create the commit-marker topic '{options.marker_topic}' on "
                f"{options.bootstrap_servers}: {error_reason(error)}. Create it yourself with "
                f"cleanup.policy=compact. {MOVE_MARKERS_HINT}"
            ) from None
    admin.topic_partitions([options.marker_topic])
    return admin.known_topic_ids.get(options.marker_topic)


# A node that has not learnt of a topic yet answers as if it did not exist: Kafka's controller
# acknowledges CreateTopics once it committed the topic, and each broker learns of it a moment later
# (longer on a loaded machine). So "no such topic or partition" is believed only once it held this
# long (at most the operation timeout), asked again every _UNKNOWN_POLL_S.
_UNKNOWN_CONFIRM_S = 10.0
_UNKNOWN_POLL_S = 0.2
# How long one attempt of describing the marker topic waits (see _require_compacted).
_DESCRIBE_ATTEMPT_S = 15.0


def _require_compacted(options: SinkOptions, admin: KafkaAdmin) -> None:
    """A marker is what makes a replayed batch skip output already committed: a marker topic whose
    ``cleanup.policy`` deletes old records (``delete``, ``compact,delete``) would, after its
    retention, let a replay write its batch a second time."""
    resource = ConfigResource(ResourceType.TOPIC, options.marker_topic)
    deadline = time.monotonic() + options.operation_timeout_s
    while True:
        # librdkafka sends a topic's DescribeConfigs to the node its metadata names the controller.
        # A node killed moments ago is still named there until the cluster fences it (KRaft's broker
        # session timeout), and a request to it waits out its whole timeout: so each attempt waits
        # a bounded while, and the next one asks through a new client, with fresh metadata.
        wait_s = max(0.1, min(_DESCRIBE_ATTEMPT_S, deadline - time.monotonic()))
        try:
            described = admin.client.describe_configs([resource], request_timeout=wait_s)
            entries = described[resource].result(wait_s + 1)
            break
        except KafkaException as error:
            if error_code(error) != TIMED_OUT or time.monotonic() >= deadline:
                what = f"describe the commit-marker topic '{options.marker_topic}'"
                raise sink_unreachable_error(options, what, error) from None
            admin.close()
    entry = entries.get("cleanup.policy")
    policy = (entry.value if entry is not None and entry.value is not None else "delete").replace(" ", "")
    if policy != "compact":
        raise SparkafkaOptionError(
            f"the commit-marker topic '{options.marker_topic}' has cleanup.policy={policy}: the broker "
            "deletes its records after retention.ms, and a micro-batch replayed after its marker is gone "
            "would be written a second time. Set cleanup.policy=compact on it (kafka-configs --alter "
            f"--entity-type topics --entity-name {options.marker_topic} --add-config "
            f"cleanup.policy=compact). {MOVE_MARKERS_HINT} (a topic it creates is compacted). If the "
            "marker topic was deleted, this may be a topic a client created again by naming it (a broker "
            "with auto.create.topics.enable creates a topic any producer's metadata names, with the "
            "broker's defaults): the markers it held are gone then. Restore the topic from a backup; "
            "without one, compact this topic and the query's next run refuses for the lost markers, "
            "naming its ways on and what each costs"
        )


_MARKER_READ_CHUNK = 10_000


def read_markers(
    options: SinkOptions, *names: str, stable_only: bool = False, layout: MarkerLayout | None = None
) -> dict[str, bytes]:
    """Latest committed value per key of the partitions that hold the records of ``names`` (prefixes,
    and query ids for their ``query/`` records; see :class:`MarkerLayout`), each read as
    :func:`read_marker_partition` reads one. Every key lives in one partition, so the partitions'
    values never overlap."""
    layout = layout or marker_layout(options)
    return _read_partitions(options, {layout.partition_of(name) for name in names}, stable_only)


def read_query_markers(
    options: SinkOptions, layout: MarkerLayout, prefix: str, query_id: str
) -> dict[str, bytes]:
    """What the marker topic holds of ``prefix`` and of every prefix ``query_id`` claimed: the
    partitions of the prefix and of the query's ``query/`` records, then the partitions of the other
    prefixes those records name (each partition read once)."""
    return read_in_query_order(
        layout, prefix, query_id, lambda partition: read_marker_partition(options, partition=partition)
    )


def read_in_query_order(
    layout: MarkerLayout, prefix: str, query_id: str, read: Callable[[int], Mapping[str, bytes]]
) -> dict[str, bytes]:
    """``read`` the partitions :func:`read_query_markers` reads, each once and in its order, laying
    each over the ones before: those of the prefix and of the query id, then those of the other
    prefixes the query's ``query/`` records name."""
    first = {layout.partition_of(prefix), layout.partition_of(query_id)}
    found: dict[str, bytes] = {}
    for partition in sorted(first):
        found.update(read(partition))
    others = {layout.partition_of(other) for other in claimed_prefixes(found, query_id)} - first
    for partition in sorted(others):
        found.update(read(partition))
    return found


def _read_partitions(options: SinkOptions, partitions: set[int], stable_only: bool) -> dict[str, bytes]:
    latest: dict[str, bytes] = {}
    for partition in sorted(partitions):
        latest.update(read_marker_partition(options, partition=partition, stable_only=stable_only))
    return latest


def read_marker_partition(
    options: SinkOptions,
    *,
    partition: int = MARKER_PARTITION,
    want: set[str] | None = None,
    stable_only: bool = False,
) -> dict[str, bytes]:
    """Latest committed value per key of one partition of the marker topic (restricted to ``want``
    when given), read from its start as :func:`read_marker_partition_from` reads."""
    read = read_marker_partition_from(options, partition, None, want=want, stable_only=stable_only)
    assert read is not None, "a read from the log's start always has its start"
    return read.latest


@dataclass(frozen=True)
class RecordAnchor:
    """The last committed record a read of a marker partition returned: where a later read goes on
    from, and how that read tells the log still holds it there (a digest of its key, value and
    timestamp)."""

    offset: int
    digest: str


def _digest(message: Any) -> str:
    """A record's digest: its key, value, timestamp and the leader epoch it was written in (a record
    written after an unclean election carries a later one, however alike it is otherwise)."""
    stamp = f"{message.timestamp()[1]}/{message.leader_epoch()}".encode()
    body = (message.key() or b"") + b"\0" + (message.value() or b"") + b"\0" + stamp
    return hashlib.blake2b(body, digest_size=12).hexdigest()


@dataclass(frozen=True)
class PartitionRead:
    """What one read of a marker partition found: the latest committed value per key it read, the
    position it reached (every record before it was read, or skipped as aborted), and the last
    committed record it returned (None: none)."""

    latest: dict[str, bytes]
    position: int
    last: RecordAnchor | None = None


def read_marker_partition_from(
    options: SinkOptions,
    partition: int,
    start: RecordAnchor | None,
    *,
    want: set[str] | None = None,
    stable_only: bool = False,
) -> PartitionRead | None:
    """Latest committed value per key of one partition of the marker topic (restricted to ``want``
    when given), read from the log's start, or from ``start``, the last record an earlier read
    returned, on. None where the log does not hold that very record at its offset any more: the log
    went back (the topic deleted and created again, or truncated by an unclean leader election),
    perhaps to be written past it again, or compaction removed the record; the caller reads from the
    start then. A read that goes on from a record re-reads what followed it, aborted records and
    transaction markers included, so whatever the log holds after the record is read.

    ``stable_only``: read to the last stable offset seen at the start instead, never waiting for an
    open transaction: a quick look that may miss what was committed after one still open. What it
    reads is exact all the same: every record before the last stable offset belongs to a decided
    transaction, so read_committed returns it or skips it for good.

    Otherwise reads with read_committed up to the high watermark seen at the start. Until every
    transaction open on the partition ends, read_committed stops at the first one (the LSO), and a
    marker this id committed after it would be missed; so this waits — bounded by the transaction
    timeout, after which the broker aborts a crashed writer's transaction — rather than answer from a
    partial view."""
    topic_partition = TopicPartition(options.marker_topic, partition)
    # The watermarks come first: a consumer assigned a while after it was created (here: after
    # another client's round trips) waited up to a second for the partition's leader.
    low, high = _watermarks(options, topic_partition, "read_committed" if stable_only else "read_uncommitted")
    if start is not None:
        # The anchor was committed, so below the last stable offset, when it was read, and that
        # offset never goes back but with the log: an anchor at or past it now (a stable read's
        # end) or past the end is not the record it was.
        end = high if stable_only else _watermarks(options, topic_partition, "read_committed")[1]
        if not low <= start.offset < end:
            return None
    position = low if start is None else start.offset
    if high <= position:
        return PartitionRead({}, position)
    config = _marker_consumer_config(options, {**_READING_TO_THE_END, "isolation.level": "read_committed"})
    with CONSUMERS.borrow(config) as consumer:
        consumer.assign([TopicPartition(options.marker_topic, partition, position)])
        return _read_until(options, consumer, topic_partition, (position, high), want, start)


def _read_until(
    options: SinkOptions,
    consumer: Consumer,
    partition: TopicPartition,
    offsets: tuple[int, int],
    want: set[str] | None,
    start: RecordAnchor | None,
) -> PartitionRead | None:
    """Read with ``consumer`` (assigned to ``partition`` at the first of ``offsets``) until its
    position, or the end of the partition it reports, reaches the second, within the transaction
    timeout; why it could not otherwise (:func:`_markers_held_back`). None where ``start`` is not the
    first record read."""
    position, high = offsets
    latest: dict[str, bytes] = {}
    last = start
    deadline = time.monotonic() + options.transaction_timeout_ms / 1000 + options.operation_timeout_s
    while time.monotonic() < deadline:
        # The partition holds a marker per committed batch per id until compaction runs, so it is
        # read in chunks rather than with a poll() and a position() per record (100,000 markers:
        # 0.2 s instead of 0.3-0.5 s). consume(n, timeout) would wait out the timeout for n
        # records; poll() returns with the first, consume(n, 0) takes what is already fetched.
        first = consumer.poll(0.5)
        chunk = [] if first is None else [first, *consumer.consume(_MARKER_READ_CHUNK, 0)]
        reached_end = False
        for message in chunk:
            failure = message.error()
            if failure is not None:
                if failure.code() != PARTITION_EOF:
                    raise _unreadable_markers(options, partition, message.offset(), failure)
                # The end for this reader: read_committed's is the last stable offset, and the
                # position stays before a trailing aborted record until the next fetch.
                reached_end = reached_end or (message.offset() or 0) >= high
                continue
            offset = message.offset() or 0
            if (
                start is not None
                and last is start
                and (offset, _digest(message)) != (start.offset, start.digest)
            ):
                return None  # the anchor is not the first record read: the log is another now
            last = RecordAnchor(offset, _digest(message))
            key = (message.key() or b"").decode("utf-8", "replace")
            if want is None or key in want:
                latest[key] = message.value() or b""
        position = consumer.position([partition])[0].offset
        if position >= high or reached_end:
            if start is not None and last is start:
                return None  # the anchor was not there to read
            return PartitionRead(latest, max(position, high if reached_end else position), last)
    raise _markers_held_back(options, partition, high, position)


def _markers_held_back(
    options: SinkOptions, partition: TopicPartition, high: int, position: int
) -> Exception:
    """Why :func:`read_marker_partition` stopped at ``position`` short of ``high``, the end the
    partition had when the read began, told by the partition's offsets now:

    1. its end is before ``high``: the log went back under the read (the topic deleted and created
       again, or truncated by an unclean leader election);
    2. its last stable offset is before ``high``: a transaction still open holds read_committed
       readers back;
    3. neither: the broker did not serve the reads.
    A topic gone, or a cluster not answering, is the error of asking."""
    _, end_now = _watermarks(options, partition, "read_uncommitted")
    _, stable_now = _watermarks(options, partition, "read_committed")
    waited_ms = options.transaction_timeout_ms + options.operation_timeout_s * 1000
    where = f"reading commit markers from {options.marker_topic}-{partition.partition}"
    if end_now < high:
        return CommitMarkerError(
            f"{where} did not reach offset {high}, the partition's end when the read began: its end is "
            f"{end_now} now. The partition's log went back while it was read: the topic was deleted and "
            "created again, or an unclean leader election truncated it, and markers it held are gone. "
            "Spark retries the task, which judges the micro-batch by what the topic holds then (a query "
            "that finds its markers gone refuses, naming the ways on)"
        )
    if stable_now >= high:
        return CommitMarkerError(
            f"{where} stopped at offset {max(position, 0)} within {waited_ms:.0f} ms (this sink's "
            f"kafka.transaction.timeout.ms plus operationTimeoutMs), short of offset {high}, though no "
            "transaction holds readers back there (the last stable offset is "
            f"{stable_now}): the partition's leader did not serve the reads. Spark retries the task; if "
            "this persists, the broker's log says why it does not answer fetches of that partition"
        )
    return CommitMarkerError(
        f"{where} did not reach offset "
        f"{high} within {waited_ms:.0f} ms "
        "(this sink's kafka.transaction.timeout.ms plus operationTimeoutMs): an open transaction holds "
        f"read_committed readers of that partition back at offset {stable_now} and was not aborted by "
        "the broker. Every "
        "exactly-once sink writing markers to this topic shares the partition, so a crashed writer of "
        "another query with a longer kafka.transaction.timeout.ms holds it until its own timeout. "
        "'sparkafka transactions list' shows the open transactions; restarting that query ends the "
        f"wait. {MOVE_MARKERS_HINT}. If it lists none, the partition "
        "holds a hanging transaction whose COMMIT or ABORT marker was never written (a lone broker "
        "killed mid-commit, or an unclean leader election): Apache Kafka's 'kafka-transactions.sh "
        "find-hanging' finds it and 'kafka-transactions.sh abort' ends it"
    )


def _unreadable_markers(
    options: SinkOptions, partition: TopicPartition, offset: int | None, failure: KafkaError
) -> CommitMarkerError:
    at = "" if offset is None or offset < 0 else f" at offset {offset}"
    if failure.code() == DAMAGED_BATCH:
        way_out = (
            "The broker found its stored copy damaged: on a replicated topic, make a replica with an "
            "intact copy the leader (stop the broker holding the damaged one, or reassign the "
            "partition). If no copy is intact, the query can only start over: a new checkpoint with a "
            "new transactionalIdPrefix, knowing that a batch the old run committed may then be written "
            "again"
        )
    else:
        way_out = "Spark retries the task; if this persists, the broker's log says why it refuses the read"
    return CommitMarkerError(
        f"reading commit markers from {options.marker_topic}-{partition.partition} failed{at}: "
        f"{failure.str()}. The markers say which micro-batches each transactional id already "
        f"committed; without them a replay could write a batch twice, so this write stops. {way_out}"
    )


def marker_partition_end(options: SinkOptions, partition: int) -> int:
    """The high watermark of one partition of the marker topic."""
    return _watermarks(options, TopicPartition(options.marker_topic, partition), "read_uncommitted")[1]


def _watermarks(options: SinkOptions, partition: TopicPartition, isolation: str) -> tuple[int, int]:
    """The low watermark, and the high watermark (read_uncommitted) or last stable offset
    (read_committed: Kafka answers a read_committed ListOffsets for the end with it)."""
    marks = _until_known(options, lambda: _watermarks_if_any(options, partition, isolation))
    if marks is None:
        raise CommitMarkerError(
            f"the commit-marker topic '{options.marker_topic}' has no partition {partition.partition} any "
            "more (deleted while the query ran?). The markers are what makes a replayed batch skip "
            "output it already committed: restore the topic from a backup, or start the query again "
            "with a new checkpoint"
        )
    return marks


def _until_known(options: SinkOptions, ask: Callable[[], _Answer]) -> _Answer:
    """``ask()``'s answer once it is not "unknown" (None or 0), or "unknown" once it held for
    :data:`_UNKNOWN_CONFIRM_S` (at most ``operationTimeoutMs``): a node may not have learnt of a
    topic created a moment ago."""
    deadline = time.monotonic() + min(_UNKNOWN_CONFIRM_S, options.operation_timeout_s)
    answer = ask()
    while not answer and time.monotonic() < deadline:
        time.sleep(_UNKNOWN_POLL_S)
        answer = ask()
    return answer


def _watermarks_if_any(
    options: SinkOptions, partition: TopicPartition, isolation: str
) -> tuple[int, int] | None:
    """:func:`_watermarks`, or None where the cluster's metadata lists no such partition."""
    config = _marker_consumer_config(options, {"isolation.level": isolation})
    with CONSUMERS.borrow(config) as probe:
        try:
            return partition_watermarks(
                probe, partition.topic, partition.partition, options.operation_timeout_s
            )
        except KafkaException as error:
            raise sink_unreachable_error(
                options, f"read the offsets of {options.marker_topic}", error
            ) from None


# A consumer reading a marker partition to its end: told when it gets there, committing nothing.
_READING_TO_THE_END = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    # The position passes a trailing COMMIT marker only with the next fetch, which the broker holds
    # for fetch.wait.max.ms when no data follows (500 ms by default).
    "fetch.wait.max.ms": 10,
}


def _marker_consumer_config(options: SinkOptions, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A marker-partition consumer's configuration: assign-only, pooled, ``settings`` on top."""
    return {
        **EAGER_CONNECTIONS,
        **options.client_config,
        "group.id": "sparkafka-marker-reader",
        "logger": LIBRDKAFKA_LOGGER,
        **settings,
    }


# -- what one write task learns from the topic ---------------------------------------------------------


@dataclass
class CommittedState:
    """What the marker partition said at a transactional id's first write of a query run, then kept
    up to date by the id's own commits (:attr:`marker`). The inputs of :func:`~.replay.decide`."""

    # The id's latest commit marker.
    marker: CommitMarker | None = None
    registered_query: str | None = None
    # Markers of this query under other prefixes, and under this id's prefix for the other write
    # partitions (streaming writes only for the former).
    other_prefix_markers: tuple[CommitMarker, ...] = ()
    sibling_markers: tuple[CommitMarker, ...] = ()
    # The last batch of this query every task and the driver committed under this id's prefix.
    progress: ProgressRecord | None = None
    # The topic held anything of this query (replay.TaskView.history_found).
    history_found: bool = True
    # The checkpoint recorded a claim the topic no longer holds (replay.TaskView).
    claim_missing: bool = False
    # The prefix's refusal record (replay.TaskView.refused_run).
    refusal: RefusalRecord | None = None
    # Where the topic keeps the id's records: its own commit goes to the prefix's partition.
    layout: MarkerLayout = MarkerLayout(1)


def committed_state(
    found: Mapping[str, bytes], transactional_id: str, prefix: str, query_id: str, *, other_prefixes: bool
) -> CommittedState:
    """What ``found`` (the marker partition as read) holds for ``transactional_id`` of ``prefix``
    written by ``query_id``: its marker and registration, the query's markers under the prefix and
    (``other_prefixes``) under others, the prefix's progress and refusal records. ``claim_missing``
    is left to the caller (:func:`~.claims.claim_missing`)."""
    may_name = may_name_query(query_id)
    of_this_query = [
        (key, decoded)
        for key, value in found.items()
        if is_marker_key(key)
        and key != transactional_id
        and may_name(value)
        and (decoded := marker_of_query(key, value, query_id)) is not None
    ]
    siblings = {key for key, _ in of_this_query if write_partition_of(key, prefix) is not None}
    others = tuple(m for key, m in of_this_query if key not in siblings)
    own_marker = CommitMarker.decode(found[transactional_id]) if transactional_id in found else None
    registered = registered_query(found, transactional_id)
    progress_key = f"{PROGRESS_KEY_PREFIX}{prefix}"
    progress = ProgressRecord.decode(found[progress_key]) if progress_key in found else None
    return CommittedState(
        marker=own_marker,
        registered_query=registered,
        other_prefix_markers=others if other_prefixes else (),
        sibling_markers=tuple(m for key, m in of_this_query if key in siblings),
        progress=progress,
        history_found=(
            registered is not None
            or bool(of_this_query)
            or (own_marker is not None and own_marker.query_id == query_id)
            or (progress is not None and progress.query_id == query_id)
        ),
        refusal=refusal_record(found, prefix),
    )


# -- writes into the topic outside a task's output transaction ----------------------------------------


def register(
    options: SinkOptions, producer: Producer, registration: Registration, layout: MarkerLayout
) -> None:
    """Step 3e of the protocol (sink package docstring). Commit, in a transaction of its own and
    before any output, that this id exists: a restart with fewer write partitions finds the ids it
    no longer uses through these records and fences them. Committed first so that even an id whose
    very first output transaction was cut short is found."""
    key, value = registration.key, registration.encode()
    try:
        producer.begin_transaction()
        producer.produce(options.marker_topic, key=key, value=value, partition=layout.partition_of_key(key))
        producer.commit_transaction(options.operation_timeout_s)
    except KafkaException as error:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(options.operation_timeout_s)
        raise CommitMarkerError(
            f"registering {key} in the commit-marker topic '{options.marker_topic}' failed: "
            f"{error_reason(error)}. The sink commits this record before its first output. "
            f"{MARKER_TOPIC_MUST_ACCEPT}"
        ) from None


def commit_claim(options: SinkOptions, producer: Producer, claim: PrefixClaim, layout: MarkerLayout) -> None:
    """Commit ``claim`` in a transaction of ``producer`` (initialised with the prefix's claim id, and
    which read the partition to its end after that): the claim in the prefix's partition and, on a
    topic of several partitions, ``query/<query>/<prefix>`` in the query's, in the same transaction, so
    that every write of the query finds the prefix through it (a topic of one partition is read whole,
    and has no such records, as none ever had). Kafka's errors reach the caller as raised: a fenced
    commit means another claimer initialised the id since, and the caller starts again."""
    assert claim.query_id is not None, "a claim names the query that owns the prefix"
    producer.begin_transaction()
    producer.produce(
        options.marker_topic, key=claim.key, value=claim.encode(), partition=layout.partition_of(claim.prefix)
    )
    if layout.partitions > 1:
        producer.produce(
            options.marker_topic,
            key=query_claim_key(claim.query_id, claim.prefix),
            value=encode_query_claim(claim.query_id, claim.prefix),
            partition=layout.partition_of(claim.query_id),
        )
    producer.commit_transaction(options.operation_timeout_s)


# One idempotent producer per cluster configuration and process, kept from one write to the next:
# the driver writes a progress record every micro-batch, and a new producer would first connect and
# ask the cluster for a producer id each time. One left unused this long (its query stopped, or runs
# with a long trigger) is dropped: the next write makes a new one, as every write once did.
MARKER_PRODUCER_IDLE_S = 300.0
_MARKER_PRODUCERS: dict[tuple[tuple[str, str], ...], tuple[Producer, float]] = {}
_MARKER_PRODUCERS_LOCK = threading.Lock()


def marker_producer(options: SinkOptions) -> Producer:
    """An idempotent producer of records into the marker partition outside any transaction (progress
    records, refusal records, markers carried over): committed as soon as acknowledged, never holding
    readers back. Shared by the process's writes with the same client settings."""
    key = tuple(sorted((name, str(value)) for name, value in options.client_config.items()))
    now = time.monotonic()
    with _MARKER_PRODUCERS_LOCK:
        for other, (_, used_at) in list(_MARKER_PRODUCERS.items()):
            if other != key and now - used_at > MARKER_PRODUCER_IDLE_S:
                del _MARKER_PRODUCERS[other]  # closed when the last reference goes
        found = _MARKER_PRODUCERS.get(key)
        if found is not None and now - found[1] <= MARKER_PRODUCER_IDLE_S:
            producer = found[0]
        else:
            config = {
                **EAGER_CONNECTIONS,
                **options.client_config,
                "logger": LIBRDKAFKA_LOGGER,
                "enable.idempotence": True,
                "acks": "all",
                # A producer asks the cluster about the topics it knows, and a broker with
                # auto.create.topics.enable (Kafka's default) creates one it lacks on such a request:
                # a marker topic deleted while this producer lives would come back with one
                # partition and cleanup.policy=delete. ensure_marker_topic creates it, or refuses.
                "allow.auto.create.topics": False,
            }
            producer = Producer(config)
        _MARKER_PRODUCERS[key] = (producer, now)
        return producer


def _discard_marker_producer(producer: Producer) -> None:
    """Forget a producer whose write failed: the next write starts a new one (an idempotent producer
    can be left in a state it does not leave, e.g. after a fatal sequence error)."""
    with _MARKER_PRODUCERS_LOCK:
        for key, (cached, _) in list(_MARKER_PRODUCERS.items()):
            if cached is producer:
                del _MARKER_PRODUCERS[key]


def produce_to_markers(
    options: SinkOptions,
    topic: str,
    records: Mapping[str, bytes],
    what: str,
    layout: MarkerLayout | None = None,
) -> None:
    """Write ``records`` (key -> value) to the marker topic ``topic``, each into its partition under
    ``layout`` (the topic's; looked up when not given), and acknowledged by all in-sync replicas
    before this returns; otherwise fail naming the cause.

    The producer may be shared with another thread's write: this waits for the delivery reports of
    its own records only (not a flush, which would wait for the other's too and count them), and
    judges the write by them alone."""
    if layout is None:
        try:
            layout = marker_layout(dataclasses.replace(options, marker_topic=topic))
        except SparkafkaError as error:
            raise _marker_write_failed(what, topic, str(error)) from None
    producer = marker_producer(options)
    failures: list[KafkaError] = []
    acknowledged: list[bool] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)
        else:
            acknowledged.append(True)

    deadline = time.monotonic() + options.operation_timeout_s
    try:
        for key, value in records.items():
            partition = layout.partition_of_key(key)
            producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
        while len(acknowledged) + len(failures) < len(records) and (left := deadline - time.monotonic()) > 0:
            producer.poll(min(left, 0.1))
    except BaseException:
        _discard_marker_producer(producer)
        raise
    remaining = len(records) - len(acknowledged) - len(failures)
    if remaining or failures:
        _discard_marker_producer(producer)
        reason = failures[0].str() if failures else f"{remaining} record(s) not acknowledged in time"
        raise _marker_write_failed(what, topic, reason)


def _marker_write_failed(what: str, topic: str, reason: str) -> CommitMarkerError:
    return CommitMarkerError(
        f"writing {what} to the commit-marker topic '{topic}' failed: {reason}. The sink needs it "
        f"to tell a replay from new output; the batch fails, and Spark retries it. {MOVE_MARKERS_HINT}"
    )


def write_progress(options: SinkOptions, record: ProgressRecord) -> None:
    """Record that every task of ``record.batch_id`` committed (the driver's commit, after the tasks:
    sink package docstring)."""
    key = f"{PROGRESS_KEY_PREFIX}{record.prefix}"
    produce_to_markers(options, options.marker_topic, {key: record.encode()}, "the progress record")


def write_refusal(options: SinkOptions, record: RefusalRecord) -> None:
    """Record that this query run refused to replay ``record.batch_id`` in its shape, or that it is
    a rejected acceptance (step 4 of the protocol, sink package docstring; see
    :class:`~.commit_log.RefusalRecord`)."""
    key = f"{REFUSAL_KEY_PREFIX}{record.prefix}"
    produce_to_markers(options, options.marker_topic, {key: record.encode()}, "the refusal record")


def registered_transactional_ids(
    options: SinkOptions, prefix: str, markers: Mapping[str, bytes] | None = None
) -> dict[int, str]:
    """Write partition -> transactional id, for every id of ``prefix`` that ever wrote a registration
    (in ``markers``, the marker partition's latest values, read when not given)."""
    found: dict[int, str] = {}
    for key in read_markers(options, prefix) if markers is None else markers:
        if key.startswith(REGISTRATION_KEY_PREFIX):
            registered = key[len(REGISTRATION_KEY_PREFIX) :]
            partition = write_partition_of(registered, prefix)
            if partition is not None:
                found[partition] = registered
    return found
