"""The Kafka sink: ``writeStream.format("sparkafka")`` with ``deliveryGuarantee`` exactly-once,
at-least-once or none.

Exactly-once protocol, per write task (Spark partition ``p`` of micro-batch ``b`` of query ``q``):

1. The transactional id is ``{prefix}-{p}``; the prefix defaults to ``sparkafka-{q}``. Spark keeps
   the query id in the checkpoint, so a restarted query uses the same ids, and two queries never
   share a prefix unless a user sets the same ``transactionalIdPrefix`` for both. A ``df.write``
   inside ``foreachBatch`` has no default: a call may write several times, and each write needs ids
   of its own (:func:`require_batch_write_prefix`).
2. The Python worker keeps one producer per transactional id across micro-batches. A new producer
   calls ``init_transactions()``: the broker aborts whatever a crashed or zombie attempt with the same
   id left open and fences it (its later requests fail with PRODUCER_FENCED).
3. At the id's first write of a query run (a restart, possibly in the same application: the only
   time a batch can be a replay), the task reads, with read_committed, the id's latest commit marker
   and registration from the compacted commit-marker topic (key = transactional id), and for a
   streaming write the markers of the same query under other prefixes. It tracks its marker locally
   from then on.
4. :func:`sparkafka.connector.replay.decide` takes it from there: a marker of this query and batch ``b`` with
   the row count the task has now means ``b`` is a replay this id already committed, and the task
   writes nothing; an id registered to another query, a row count that differs, or ``b`` committed
   under another prefix fail the task (a replay of another shape would lose or double records).
   Before all this the task refuses while adaptive execution could split a replay otherwise.
5. Otherwise: begin a transaction, produce the rows, produce the new marker (id, query, batch,
   partition, record count, topic, time) in the same transaction, commit. Output and marker become
   visible together or not at all. An empty partition opens no transaction.
6. Any failure aborts the transaction when the producer still can; a fenced or failed producer is
   discarded, and the task fails so Spark retries it — the retry starts again at step 2.

The driver's ``commit`` checks every task reported; on the first batch of a run it also fences
transactional ids of partitions the query no longer has (a restart with fewer partitions), found
through the registration record each id commits to the marker topic, in a transaction of its own,
before its first output, and fails the batch if one of them committed this very batch. ``abort``
re-initialises the ids of failed tasks, so read_committed readers are not held back until the
transaction times out.
No transaction ever spans two processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from sparkafka.connector.client_pool import CONSUMERS
from sparkafka.connector.kafka_admin import (
    LIBRDKAFKA_LOGGER,
    KafkaAdmin,
    error_code,
    partition_watermarks,
    unreachable_error,
    waits_until_refused,
)
from sparkafka.connector.options import OptionReader, OptionSpec, reject_forbidden_kafka_params
from sparkafka.connector.replay import (
    ADAPTIVE_ENABLED,
    ADAPTIVE_STATELESS_STREAMING,
    ADOPT_OPTION,
    Action,
    ReplayRefused,
    TaskView,
    adaptive_execution_refusal,
    beyond_refusal,
    decide,
    partitions_beyond,
)
from sparkafka.errors import SparkafkaError, SparkafkaOptionError

log = logging.getLogger(__name__)

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
NONE = "none"
DEFAULT_MARKER_TOPIC = "_sparkafka_commit_markers"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
MARKER_PARTITION = 0
_REGISTRATION_KEY_PREFIX = "registration/"
OPERATION_TIMEOUT = "operationTimeoutMs"

SINK_OPTIONS = (
    OptionSpec("topic", "topic to write every row to (else each row's 'topic' column)"),
    OptionSpec("deliveryGuarantee", "exactly-once, at-least-once (default) or none"),
    OptionSpec(
        "transactionalIdPrefix",
        "prefix of the transactional ids (writeStream: default sparkafka-<query id>; an exactly-once "
        "df.write in foreachBatch must set one of its own)",
    ),
    OptionSpec("commitMarkerTopic", f"compacted topic of commit markers (default {DEFAULT_MARKER_TOPIC})"),
    OptionSpec(
        ADOPT_OPTION,
        "the query id whose transactional ids this query takes over (it replaces that query, whose "
        "checkpoint is gone); without it ids registered by another query are refused",
    ),
    OptionSpec("kafka.bootstrap.servers", "the Kafka cluster"),
    OptionSpec("checkpointLocation"),
    OptionSpec("path"),
    OptionSpec(
        "debug.pauseAt", "beforeProduce, beforeCommit or driverCommit: where to pause (demos, chaos tests)"
    ),
    OptionSpec("debug.pauseMs", "how long debug.pauseAt pauses (default 30s)"),
    OptionSpec("debug.pausePartitions", "comma-separated write partitions that pause (default all)"),
    OptionSpec("debug.pauseFromBatch", "only micro-batches with this id or a later one pause (default 0)"),
    OptionSpec(
        "debug.failFirstAttemptAt", "beforeCommit: fail each task's first attempt there (chaos tests)"
    ),
    OptionSpec(OPERATION_TIMEOUT, "bound on each Kafka call of the sink (default 60s)"),
)

# Producer properties the sink owns, with what to do instead (Spark's sink rejects the same keys).
_FORBIDDEN_PRODUCER_PARAMS = {
    "key.serializer": "Keys are written as binary; cast the 'key' column to string or binary.",
    "value.serializer": "Values are written as binary; cast the 'value' column to string or binary.",
    "transactional.id": "Use the sink option 'transactionalIdPrefix'; the sink appends the partition number.",
}
# What Kafka transactions need of a producer: its settings under exactly-once must not say otherwise.
_EXACTLY_ONCE_NEEDS = {"enable.idempotence": ("true",), "acks": ("all", "-1")}


@dataclass(frozen=True)
class SinkOptions:
    client_config: dict[str, str]
    topic: str | None
    delivery_guarantee: str
    transactional_id_prefix: str | None
    marker_topic: str
    transaction_timeout_ms: int
    operation_timeout_s: float
    adopted_query: str | None = None
    pause_at: str | None = None
    pause_s: float = 0.0
    pause_partitions: frozenset[int] | None = None
    pause_from_batch: int = 0
    fail_first_attempt_at: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        reader = OptionReader(options, SINK_OPTIONS, component="sink")
        params = reader.kafka_params()
        if not params.get("bootstrap.servers"):
            raise SparkafkaOptionError(
                "option 'kafka.bootstrap.servers' is required, e.g. .option('kafka.bootstrap.servers', "
                "'localhost:9092')"
            )
        reject_forbidden_kafka_params(params, _FORBIDDEN_PRODUCER_PARAMS)
        guarantee = reader.choice("deliveryGuarantee", (EXACTLY_ONCE, AT_LEAST_ONCE, NONE), AT_LEAST_ONCE)
        if guarantee == EXACTLY_ONCE:
            for key, allowed in _EXACTLY_ONCE_NEEDS.items():
                if key in params and str(params[key]).strip().lower() not in allowed:
                    raise SparkafkaOptionError(
                        f"option 'kafka.{key}={params[key]}' contradicts deliveryGuarantee 'exactly-once': "
                        f"Kafka transactions need {key}={allowed[0]}; remove the option, or choose "
                        "deliveryGuarantee 'at-least-once'"
                    )
        timeout_ms = int(params.pop("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        if timeout_ms <= 0:
            raise SparkafkaOptionError(
                f"option 'kafka.transaction.timeout.ms' must be positive, got {timeout_ms}"
            )
        prefix = reader.string("transactionalIdPrefix")
        if prefix is not None and not prefix:
            raise SparkafkaOptionError("option 'transactionalIdPrefix' must not be empty")
        return cls(
            client_config=params,
            topic=reader.string("topic") or None,
            delivery_guarantee=guarantee,
            transactional_id_prefix=prefix,
            marker_topic=reader.string("commitMarkerTopic", DEFAULT_MARKER_TOPIC) or DEFAULT_MARKER_TOPIC,
            transaction_timeout_ms=timeout_ms,
            operation_timeout_s=reader.duration_ms("operationTimeoutMs", "60s") / 1000,
            adopted_query=reader.string(ADOPT_OPTION) or None,
            pause_at=reader.choice("debug.pauseAt", PAUSE_POINTS, "") or None,
            pause_s=reader.duration_ms("debug.pauseMs", "30s") / 1000,
            pause_partitions=_parse_partitions(reader.string("debug.pausePartitions")),
            pause_from_batch=reader.integer("debug.pauseFromBatch", 0, minimum=0),
            fail_first_attempt_at=reader.choice("debug.failFirstAttemptAt", ("beforecommit",), "") or None,
        )

    @property
    def bootstrap_servers(self) -> str:
        return self.client_config["bootstrap.servers"]

    def pause(self, point: str, *, partition: int | None, batch_id: int | None) -> None:
        """Demo and chaos-test hook: hold still at a named point of the protocol so a kill lands there.
        Announced on stderr, which Spark forwards from its Python workers to the pipeline's output."""
        if self.pause_at != point.lower() or (batch_id is not None and batch_id < self.pause_from_batch):
            return
        if (
            partition is not None
            and self.pause_partitions is not None
            and partition not in self.pause_partitions
        ):
            return
        print(
            f"sparkafka debug pause: {point} partition={partition} batch={batch_id} for {self.pause_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(self.pause_s)

    def fail_first_attempt(self, point: str) -> None:
        """Chaos-test hook: fail a task's first attempt at a named point, after it wrote its rows."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if (
            self.fail_first_attempt_at == point.lower()
            and context is not None
            and context.attemptNumber() == 0
        ):
            raise RuntimeError(f"injected failure of the first attempt (debug.failFirstAttemptAt={point})")


PAUSE_POINTS = ("beforeproduce", "beforecommit", "drivercommit")


def _parse_partitions(value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        return frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise SparkafkaOptionError(
            f"option 'debug.pausePartitions' must be comma-separated partition numbers, got '{value}'"
        ) from None


def validate_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Spark's Kafka sink columns: value (required), key, topic, partition, headers; each with a clear
    message naming the column and the cast that fixes it. As in Spark's KafkaWriter, columns are
    found by their exact (lower-case) names, and with the 'topic' option a 'topic' column is not
    looked at."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise SparkafkaOptionError(
            f"the sink needs a 'value' column (string or binary); the input has {schema.simpleString()}. "
            'Select or alias one, e.g. df.selectExpr("CAST(x AS STRING) AS value")'
        )
    for column in ("key", "value"):
        if column in fields and not isinstance(fields[column], StringType | BinaryType):
            raise SparkafkaOptionError(
                f"column '{column}' must be string or binary, not {fields[column].simpleString()}; "
                f"cast it, e.g. CAST({column} AS STRING)"
            )
    if options.topic is None and "topic" in fields and not isinstance(fields["topic"], StringType):
        raise SparkafkaOptionError(f"column 'topic' must be a string, not {fields['topic'].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise SparkafkaOptionError(
            f"column 'partition' must be an int, not {fields['partition'].simpleString()}; cast it with "
            "CAST(partition AS INT)"
        )
    if "headers" in fields:
        headers_type = fields["headers"].simpleString()
        if headers_type not in (
            "array<struct<key:string,value:binary>>",
            "array<struct<key:string,value:string>>",
        ):
            raise SparkafkaOptionError(
                f"column 'headers' must be array<struct<key:string,value:binary>>, not {headers_type}"
            )
    if options.topic is None and "topic" not in fields:
        raise SparkafkaOptionError(
            "no topic to write to: set .option('topic', ...) or provide a 'topic' column in each row"
        )


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

    def encode(self) -> bytes:
        return json.dumps(
            {
                "transactional_id": self.transactional_id,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "partition": self.partition,
                "records": self.records,
                "time_ms": self.time_ms,
                "topic": self.topic,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> CommitMarker:
        data = json.loads(raw)
        return cls(
            data["transactional_id"],
            data["query_id"],
            int(data["batch_id"]),
            int(data["partition"]),
            int(data["records"]),
            int(data["time_ms"]),
            data.get("topic"),
        )


def ensure_marker_topic(options: SinkOptions) -> None:
    """Create the compacted commit-marker topic unless it exists (racing creators are fine); refuse
    one that exists with a cleanup policy that deletes markers (:func:`_require_compacted`)."""
    admin = KafkaAdmin(
        options.client_config, timeout_s=options.operation_timeout_s, timeout_option=OPERATION_TIMEOUT
    )
    if options.marker_topic in admin.topic_partitions([options.marker_topic]):
        _require_compacted(options, admin)
        return
    topic = NewTopic(
        options.marker_topic, 1, -1, config={"cleanup.policy": "compact", "segment.bytes": "16777216"}
    )
    try:
        admin.client.create_topics([topic], operation_timeout=options.operation_timeout_s)[
            options.marker_topic
        ].result(options.operation_timeout_s)
        log.info("created commit-marker topic %s", options.marker_topic)
    except KafkaException as error:
        if error_code(error) != KafkaError.TOPIC_ALREADY_EXISTS:
            raise SparkafkaError(
                f"cannot create the commit-marker topic '{options.marker_topic}' on "
                f"{options.bootstrap_servers}: {error.args[0]}. Create it yourself with "
                "cleanup.policy=compact, "
                "or name an existing one with option 'commitMarkerTopic'"
            ) from None


def _require_compacted(options: SinkOptions, admin: KafkaAdmin) -> None:
    """A marker is what makes a replayed batch skip output already committed: a marker topic whose
    ``cleanup.policy`` deletes old records (``delete``, ``compact,delete``) would, after its
    retention, let a replay write its batch a second time."""
    resource = ConfigResource(ResourceType.TOPIC, options.marker_topic)
    try:
        described = admin.client.describe_configs([resource], request_timeout=options.operation_timeout_s)
        entries = described[resource].result(options.operation_timeout_s)
    except KafkaException as error:
        what = f"describe the commit-marker topic '{options.marker_topic}'"
        raise _unreachable(options, what, error) from None
    entry = entries.get("cleanup.policy")
    policy = (entry.value if entry is not None and entry.value is not None else "delete").replace(" ", "")
    if policy != "compact":
        raise SparkafkaOptionError(
            f"the commit-marker topic '{options.marker_topic}' has cleanup.policy={policy}: the broker "
            "deletes its records after retention.ms, and a micro-batch replayed after its marker is gone "
            "would be written a second time. Set cleanup.policy=compact on it (kafka-configs --alter "
            f"--entity-type topics --entity-name {options.marker_topic} --add-config "
            "cleanup.policy=compact), or name a topic of the sink's own with option 'commitMarkerTopic' "
            "(created compacted)"
        )


_MARKER_READ_CHUNK = 10_000


def read_marker_partition(options: SinkOptions, *, want: set[str] | None = None) -> dict[str, bytes]:
    """Latest committed value per key of the marker partition (restricted to ``want`` when given).

    Reads with read_committed up to the high watermark seen at the start. Until every transaction
    open on the partition ends, read_committed stops at the first one (the LSO), and a marker this id
    committed after it would be missed; so this waits — bounded by the transaction timeout, after
    which the broker aborts a crashed writer's transaction — rather than answer from a partial view."""
    partition = TopicPartition(options.marker_topic, MARKER_PARTITION)
    # The watermarks come first: a consumer assigned a while after it was created (here: after
    # another client's round trips) waited up to a second for the partition's leader.
    low, high = _watermarks_uncommitted(options, partition)
    latest: dict[str, bytes] = {}
    if high <= low:
        return latest
    config = _marker_consumer_config(
        options,
        {
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # The position passes a trailing COMMIT marker only with the next fetch, which the
            # broker holds for fetch.wait.max.ms when no data follows (500 ms by default).
            "fetch.wait.max.ms": 10,
        },
    )
    with CONSUMERS.borrow(config) as consumer:
        consumer.assign([TopicPartition(options.marker_topic, MARKER_PARTITION, low)])
        deadline = time.monotonic() + options.transaction_timeout_ms / 1000 + options.operation_timeout_s
        while time.monotonic() < deadline:
            # The partition holds a marker per committed batch per id until compaction runs, so it is
            # read in chunks rather than with a poll() and a position() per record (100,000 markers:
            # 0.2 s instead of 0.3-0.5 s). consume(n, timeout) would wait out the timeout for n
            # records; poll() returns with the first, consume(n, 0) takes what is already fetched.
            first = consumer.poll(0.5)
            chunk = [] if first is None else [first, *consumer.consume(_MARKER_READ_CHUNK, 0)]
            for message in chunk:
                failure = message.error()
                if failure is not None:
                    if failure.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(failure)
                    continue
                key = (message.key() or b"").decode("utf-8", "replace")
                if want is None or key in want:
                    latest[key] = message.value() or b""
            position = consumer.position([partition])[0].offset
            if position >= high:
                return latest
        raise SparkafkaError(
            f"reading commit markers from {options.marker_topic}-{MARKER_PARTITION} did not reach offset "
            f"{high} within {options.transaction_timeout_ms + options.operation_timeout_s * 1000:.0f} ms "
            "(this sink's kafka.transaction.timeout.ms plus operationTimeoutMs): an open transaction holds "
            "read_committed readers of that partition back and was not aborted by the broker. Every "
            "exactly-once sink writing markers to this topic shares the partition, so a crashed writer of "
            "another query with a longer kafka.transaction.timeout.ms holds it until its own timeout. "
            "'sparkafka transactions list' shows the open transactions; restarting that query, or "
            "giving queries their own commitMarkerTopic, ends the wait"
        )


def _watermarks_uncommitted(options: SinkOptions, partition: TopicPartition) -> tuple[int, int]:
    config = _marker_consumer_config(options, {"isolation.level": "read_uncommitted"})
    with CONSUMERS.borrow(config) as probe:
        try:
            marks = partition_watermarks(
                probe, partition.topic, partition.partition, options.operation_timeout_s
            )
        except KafkaException as error:
            raise _unreachable(options, f"read the offsets of {options.marker_topic}", error) from None
    if marks is None:
        raise SparkafkaError(
            f"the commit-marker topic '{options.marker_topic}' has no partition {partition.partition} any "
            "more (deleted while the query ran?). The markers are what makes a replayed batch skip "
            "output it already committed: restore the topic from a backup, or start the query again "
            "with a new checkpoint"
        )
    return marks


def _marker_consumer_config(options: SinkOptions, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A marker-partition consumer's configuration: assign-only, pooled, ``settings`` on top."""
    return {
        "enable.sparse.connections": False,  # see _producer_config
        **options.client_config,
        "group.id": "sparkafka-marker-reader",
        "logger": LIBRDKAFKA_LOGGER,
        **settings,
    }


def _unreachable(
    options: SinkOptions, what: str, error: KafkaException | str, client_errors: Iterable[KafkaError] = ()
) -> SparkafkaError:
    """Kafka did not answer the sink's ``what`` within its operationTimeoutMs, with the cause the
    client's error events (``client_errors``) gave, if any."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        reason = error.args[0].str()
    else:
        reason = str(error)
    return unreachable_error(
        what,
        options.bootstrap_servers,
        options.operation_timeout_s,
        reason,
        client_errors,
        timeout_option=OPERATION_TIMEOUT,
    )


# -- producers cached per Python worker --------------------------------------------------------------


@dataclass
class _CachedProducer:
    producer: Producer
    transactional_id: str | None
    marker: CommitMarker | None = None
    delivery_errors: list[KafkaError] = field(default_factory=list)
    # The client's latest error events: why it cannot reach the cluster (a refused login, a refused
    # connection), which a timed-out call does not say. Bounded: a producer may live for days.
    client_errors: deque[KafkaError] = field(default_factory=lambda: deque(maxlen=_CLIENT_ERRORS_KEPT))
    # The query run whose first write of this id read the markers below (see _transactional_producer).
    query_id: str | None = None
    run_id: str | None = None
    # The micro-batch of that first write: every task of it, retries included, reports itself to the
    # driver as the first batch of the run (SinkCommitMessage.fresh_producer).
    run_first_batch: int | None = None
    registered_query: str | None = None
    # Markers of this query under other prefixes, as read at that first write (streaming writes only).
    other_prefix_markers: tuple[CommitMarker, ...] = ()


_CLIENT_ERRORS_KEPT = 16
_producers: dict[tuple[str, str | None, str], _CachedProducer] = {}
_producers_lock = threading.Lock()
_WORKER_STARTED_NS = time.time_ns()


def _producer_config(options: SinkOptions, transactional_id: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {**options.client_config, "logger": LIBRDKAFKA_LOGGER}
    config.setdefault("linger.ms", 5)
    # Spark's sink leaves the partition of a keyed row to the Java client's default partitioner,
    # murmur2 of the key (BuiltInPartitioner.partitionForKey); librdkafka's default hashes with CRC32,
    # which would put the same key on another partition than Spark or any Java producer does.
    config.setdefault("partitioner", "murmur2_random")
    # Only failed deliveries call back into Python (see _new_cached_producer): one callback per
    # successful record cost about a microsecond of the write task's time per row.
    config.setdefault("delivery.report.only.error", True)
    # With sparse connections librdkafka drops the bootstrap connection after the first metadata and
    # retries the next lookup (transaction coordinator, producer id, partition leader) only on a
    # 500 ms timer: 0.5 s for every new producer, and Spark runs a write task in whichever Python
    # worker is idle, so an exactly-once task often needs a new producer (its transactional id moved
    # to a worker whose producer for it is fenced). Connecting right away makes it milliseconds.
    config.setdefault("enable.sparse.connections", False)
    if options.delivery_guarantee == EXACTLY_ONCE:
        config["transactional.id"] = transactional_id
        config["transaction.timeout.ms"] = options.transaction_timeout_ms
        config.setdefault("message.timeout.ms", min(options.transaction_timeout_ms, 300_000))
    elif options.delivery_guarantee == AT_LEAST_ONCE:
        # The Java producer's defaults, which Spark's sink writes with; a user's own settings win,
        # as there. Like the Java producer, an explicit acks other than all turns idempotence off
        # unless it was asked for (librdkafka would refuse the combination).
        acks = str(config.setdefault("acks", "all")).strip().lower()
        config.setdefault("enable.idempotence", acks in ("all", "-1"))
    else:
        config.setdefault("acks", 0)
    return config


def _cache_key(options: SinkOptions, transactional_id: str | None) -> tuple[str, str | None, str]:
    return (options.bootstrap_servers, transactional_id, options.delivery_guarantee)


def _new_cached_producer(options: SinkOptions, transactional_id: str | None) -> _CachedProducer:
    """A producer whose failed deliveries land in its ``delivery_errors`` (producer-wide callback,
    so the per-row produce call carries no callback of its own)."""
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            errors.append(error)

    client_errors: deque[KafkaError] = deque(maxlen=_CLIENT_ERRORS_KEPT)
    config = {
        **_producer_config(options, transactional_id),
        "on_delivery": on_delivery,
        "error_cb": client_errors.append,
    }
    return _CachedProducer(
        Producer(config), transactional_id, delivery_errors=errors, client_errors=client_errors
    )


def _discard(options: SinkOptions, transactional_id: str | None) -> None:
    with _producers_lock:
        cached = _producers.pop(_cache_key(options, transactional_id), None)
    if cached is not None:
        try:
            cached.producer.flush(0)
        except Exception:  # a broken producer may fail to flush; it is being thrown away anyway
            log.debug("discarding producer %s", transactional_id, exc_info=True)


def transaction_timeout_error(options: SinkOptions) -> SparkafkaError:
    return SparkafkaError(
        f"the sink's transaction timeout kafka.transaction.timeout.ms={options.transaction_timeout_ms} is "
        "larger than the broker's transaction.max.timeout.ms, so the broker refused to start transactions "
        "(INVALID_TRANSACTION_TIMEOUT). Fix: lower the sink option kafka.transaction.timeout.ms below the "
        "broker's transaction.max.timeout.ms (Kafka's default is 900000 ms), or raise "
        "transaction.max.timeout.ms on every broker"
    )


def _transactional_producer(
    options: SinkOptions, identity: _TaskIdentity, transactional_id: str, *, other_prefixes: bool
) -> _CachedProducer:
    """The producer of ``transactional_id`` for this task, with what the id committed.

    Steps:
    1. A cached producer this worker initialised last is reused. Within one query run it is up to
       date; at the id's first write of a run — a restart, possibly in the same application, where
       the first batch may be a replay — its markers are read again (step 3).
    2. Otherwise a new producer initialises the id, which aborts and fences whatever an earlier
       attempt left open.
    3. Read, with read_committed, the id's latest marker and registration, and (``other_prefixes``)
       the markers of this query under other prefixes; register the id when it has no registration,
       or when this write adopts it from the query its registration names."""
    key = _cache_key(options, transactional_id)
    with _producers_lock:
        cached = _producers.get(key)
    if cached is not None and _initialised_here_last(transactional_id):
        if cached.run_id == identity.run_id and cached.query_id == identity.query_id:
            return cached
        _read_committed_state(options, cached, identity, other_prefixes=other_prefixes)
        return cached
    if cached is not None:
        # Another Python worker of this machine initialised the id since: this producer is fenced.
        _discard(options, transactional_id)
    cached = _new_cached_producer(options, transactional_id)
    producer = cached.producer
    try:
        producer.init_transactions(options.operation_timeout_s)
        _claim(transactional_id)
    except KafkaException as error:
        if error_code(error) == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise transaction_timeout_error(options) from None
        if error_code(error) in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
            producer.poll(0)  # error events reach client_errors on a poll
            raise _unreachable(
                options, f"initialise transactional id '{transactional_id}'", error, cached.client_errors
            ) from None
        raise SparkafkaError(
            f"init_transactions for transactional id '{transactional_id}' failed: {error.args[0]}"
        ) from None
    _read_committed_state(options, cached, identity, other_prefixes=other_prefixes)
    with _producers_lock:
        _producers[key] = cached
    return cached


def _read_committed_state(
    options: SinkOptions, cached: _CachedProducer, identity: _TaskIdentity, *, other_prefixes: bool
) -> None:
    """Step 3 of :func:`_transactional_producer`."""
    transactional_id, query_id = cached.transactional_id, identity.query_id
    assert transactional_id is not None and query_id is not None, "exactly-once writes only"
    registration_key = f"{_REGISTRATION_KEY_PREFIX}{transactional_id}"
    if other_prefixes:
        found = read_marker_partition(options)
        own_prefix = transactional_id[: -len(f"-{identity.partition}")]
        needle = f'"query_id":{json.dumps(query_id)}'.encode()
        cached.other_prefix_markers = tuple(
            marker
            for key, value in found.items()
            if not key.startswith((_REGISTRATION_KEY_PREFIX, f"{own_prefix}-"))
            and needle in value
            and (marker := CommitMarker.decode(value)).query_id == query_id
        )
    else:
        found = read_marker_partition(options, want={transactional_id, registration_key})
        cached.other_prefix_markers = ()
    cached.marker = CommitMarker.decode(found[transactional_id]) if transactional_id in found else None
    registered = json.loads(found[registration_key]).get("query_id") if registration_key in found else None
    if registered is None or (registered != query_id and registered == options.adopted_query):
        if registered is not None:
            log.warning(
                "%s: adopting transactional id %s from query %s (option %s)",
                query_id,
                transactional_id,
                registered,
                ADOPT_OPTION,
            )
        _register(options, cached.producer, registration_key, query_id, identity.partition)
        registered = query_id
    cached.registered_query = registered
    cached.query_id = query_id
    cached.run_id = identity.run_id
    cached.run_first_batch = identity.batch_id


def _register(options: SinkOptions, producer: Producer, key: str, query_id: str, partition: int) -> None:
    """Commit, in a transaction of its own and before any output, that this id exists: a restart with
    fewer write partitions finds the ids it no longer uses through these records and fences them.
    Committed first so that even an id whose very first output transaction was cut short is found."""
    value = json.dumps(
        {
            "transactional_id": key[len(_REGISTRATION_KEY_PREFIX) :],
            "query_id": query_id,
            "partition": partition,
        }
    )
    try:
        producer.begin_transaction()
        producer.produce(options.marker_topic, key=key, value=value, partition=MARKER_PARTITION)
        producer.commit_transaction(options.operation_timeout_s)
    except KafkaException as error:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(options.operation_timeout_s)
        raise SparkafkaError(f"registering {key} in {options.marker_topic} failed: {error.args[0]}") from None


def _plain_producer(options: SinkOptions) -> _CachedProducer:
    key = _cache_key(options, None)
    with _producers_lock:
        cached = _producers.get(key)
        if cached is None:
            cached = _new_cached_producer(options, None)
            _producers[key] = cached
    return cached


def registered_transactional_ids(
    options: SinkOptions, prefix: str, markers: Mapping[str, bytes] | None = None
) -> dict[int, str]:
    """Write partition -> transactional id, for every id of ``prefix`` that ever wrote a registration
    (in ``markers``, the marker partition's latest values, read when not given)."""
    found: dict[int, str] = {}
    for key in read_marker_partition(options) if markers is None else markers:
        if key.startswith(f"{_REGISTRATION_KEY_PREFIX}{prefix}-"):
            transactional_id = key[len(_REGISTRATION_KEY_PREFIX) :]
            suffix = transactional_id[len(prefix) + 1 :]
            if suffix.isdigit():
                found[int(suffix)] = transactional_id
    return found


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
    _discard(options, transactional_id)
    producer = Producer(_producer_config(options, transactional_id))
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


# -- the writer --------------------------------------------------------------------------------------


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    partition: int
    transactional_id: str | None
    records: int
    skipped_replay: bool
    fresh_producer: bool
    transactional_id_prefix: str | None
    query_id: str | None
    batch_id: int | None = None


@dataclass(frozen=True)
class _TaskIdentity:
    """Who a write task is, from Spark's TaskContext: its write partition, the streaming query, run
    and micro-batch it belongs to (None outside a streaming query), and the Spark SQL settings its
    session set explicitly, which Spark hands to every task of the job."""

    partition: int
    query_id: str | None
    batch_id: int | None
    run_id: str | None
    properties: Mapping[str, str | None]


# Settings of the job a write task reads from its TaskContext.
_TASK_SETTINGS = (ADAPTIVE_ENABLED, ADAPTIVE_STATELESS_STREAMING)


def _task_identity() -> _TaskIdentity:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SparkafkaError("the sparkafka sink's write() must run inside a Spark task")
    batch = context.getLocalProperty("streaming.sql.batchId")
    return _TaskIdentity(
        partition=context.partitionId(),
        query_id=context.getLocalProperty("sql.streaming.queryId"),
        batch_id=int(batch) if batch is not None else None,
        run_id=_run_id(
            context.getLocalProperty("spark.job.description"), context.getLocalProperty("spark.jobGroup.id")
        ),
        properties={key: context.getLocalProperty(key) for key in _TASK_SETTINGS},
    )


_RUN_ID_IN_DESCRIPTION = re.compile(r"^runId = (\S+)$", re.MULTILINE)


def _run_id(description: str | None, job_group: str | None) -> str | None:
    """The streaming query run a task belongs to. Spark describes every micro-batch's jobs with
    ``id = …``, ``runId = …``, ``batch = …`` lines, anew at each batch; it also names the run's job
    group after the run id, but once per run, so a ``foreachBatch`` function that sets a job group of
    its own replaces it for the rest of the run (and for later runs in the same application)."""
    found = _RUN_ID_IN_DESCRIPTION.search(description or "")
    return found.group(1) if found else job_group


class _RowEncoder:
    """Turns Arrow batches of the input into produce() arguments without per-row Spark Row objects.

    String columns are passed as ``str``: the client encodes them as UTF-8, as Spark's sink does."""

    def __init__(self, batch: pa.RecordBatch, default_topic: str | None) -> None:
        names = {name: i for i, name in enumerate(batch.schema.names)}
        self.length = batch.num_rows

        def column(name: str) -> list[Any] | None:
            return batch.column(names[name]).to_pylist() if name in names else None

        self.values = column("value") or [None] * self.length
        self.keys = column("key") or [None] * self.length
        # Per-row topics only where the 'topic' option does not decide for every row.
        self.topics = None if default_topic else column("topic")
        self.partitions = column("partition")
        self.headers = column("headers")
        self.default_topic = default_topic

    def topic_per_row(self) -> Iterator[str]:
        if self.default_topic:
            return itertools.repeat(self.default_topic, self.length)
        if self.topics is None or None in self.topics or "" in self.topics:
            raise SparkafkaError(
                "a row has a null 'topic' and no 'topic' option is set; every row needs a topic"
            )
        return iter(self.topics)

    def extra_arguments(self, row: int) -> dict[str, Any]:
        """The produce() keyword arguments beyond topic, value and key that ``row`` needs, if any."""
        extra: dict[str, Any] = {}
        if self.partitions is not None and self.partitions[row] is not None:
            extra["partition"] = self.partitions[row]
        if self.headers is not None and self.headers[row]:
            extra["headers"] = [(h["key"], h["value"]) for h in self.headers[row]]
        return extra


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Runs ``write`` in the executors' Python workers, ``commit``/``abort`` on the driver side.

    ``batch_write``: the write is a ``df.write`` inside ``foreachBatch``, one of possibly several
    writes of the same micro-batch (see :class:`KafkaBatchWriter`)."""

    def __init__(self, options: SinkOptions, *, batch_write: bool = False) -> None:
        self.options = options
        self.batch_write = batch_write

    # -- executor side ----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """One write task. Exactly-once steps (the protocol in the module docstring):

        1. Refuse while adaptive execution could split a replayed batch otherwise
           (:func:`~sparkafka.connector.replay.adaptive_execution_refusal`).
        2. The producer of ``{prefix}-{partition}`` and what the id committed, read at the id's first
           write of the query run (:func:`_transactional_producer`).
        3. :func:`~sparkafka.connector.replay.decide`: skip a replay whose output this id committed (same
           query, same batch, same row count), refuse where neither writing nor skipping is safe.
        4. Write the rows and the marker in one transaction; no rows, no transaction."""
        identity = _task_identity()
        partition, query_id, batch_id = identity.partition, identity.query_id, identity.batch_id
        batches = (b for b in iterator if b.num_rows)
        if self.options.delivery_guarantee != EXACTLY_ONCE:
            first = next(batches, None)
            records = 0 if first is None else self._write_without_transaction(first, batches)
            return SinkCommitMessage(partition, None, records, False, False, None, query_id, batch_id)
        if query_id is None or batch_id is None:
            raise SparkafkaError(
                "deliveryGuarantee=exactly-once needs a streaming query: writeStream, or df.write inside "
                "foreachBatch; for a plain batch write use at-least-once"
            )
        refusal = adaptive_execution_refusal(identity.properties, batch_write=self.batch_write)
        if refusal is not None:
            raise ReplayRefused(refusal)
        prefix = self.options.transactional_id_prefix or default_transactional_id_prefix(query_id)
        transactional_id = f"{prefix}-{partition}"
        # The producer comes first, before any row is awaited: Spark keeps computing and sending this
        # task's rows while the producer initialises and reads the marker. Even a task without rows
        # needs it: on a fresh worker initialising the id aborts its leftover transaction from a
        # crash now, not at the broker's timeout. No transaction is open while rows are awaited.
        cached = _transactional_producer(
            self.options, identity, transactional_id, other_prefixes=not self.batch_write
        )
        # Every task of the run's first batch of this id, a retry reusing the producer included.
        fresh = cached.run_first_batch == batch_id
        view = TaskView(
            query_id=query_id,
            batch_id=batch_id,
            partition=partition,
            transactional_id=transactional_id,
            topic=self.options.topic or "",
            batch_write=self.batch_write,
            own_marker=cached.marker,
            registered_query=cached.registered_query,
            other_prefix_markers=cached.other_prefix_markers,
        )
        first = next(batches, None)
        if decide(view, rows=lambda: _count_rows(first, batches)) is Action.SKIP:
            marker = cached.marker
            assert marker is not None
            log.info(
                "batch %d of %s is a replay: %s already committed it (marker batch %d); writing nothing",
                batch_id,
                query_id,
                transactional_id,
                marker.batch_id,
            )
            return SinkCommitMessage(partition, transactional_id, 0, True, fresh, prefix, query_id, batch_id)
        if first is None:  # no rows, no transaction
            return SinkCommitMessage(
                partition, transactional_id, 0, False, fresh, prefix, query_id, batch_id
            )
        records = self._write_transaction(
            cached, transactional_id, query_id, batch_id, partition, first, batches
        )
        return SinkCommitMessage(
            partition, transactional_id, records, False, fresh, prefix, query_id, batch_id
        )

    def _write_transaction(
        self,
        cached: _CachedProducer,
        transactional_id: str,
        query_id: str,
        batch_id: int,
        partition: int,
        first: pa.RecordBatch,
        rest: Iterator[pa.RecordBatch],
    ) -> int:
        producer = cached.producer
        cached.delivery_errors.clear()
        records = 0
        began_at: float | None = None
        try:
            self.options.pause("beforeProduce", partition=partition, batch_id=batch_id)
            producer.begin_transaction()
            began_at = time.monotonic()
            for batch in _chain(first, rest):
                records += self._produce_batch(producer, batch)
            if self.options.pause_at == "beforecommit" or self.options.fail_first_attempt_at:
                producer.flush(self.options.operation_timeout_s)  # make the open transaction visible
                self.options.pause("beforeCommit", partition=partition, batch_id=batch_id)
                self.options.fail_first_attempt("beforeCommit")
            # The marker goes last, just before the commit: the marker partition is shared by every
            # writer, and an open transaction there would hold back every reader of the markers.
            marker = CommitMarker(
                transactional_id,
                query_id,
                batch_id,
                partition,
                records,
                int(time.time() * 1000),
                self.options.topic or "",
            )
            producer.produce(
                self.options.marker_topic,
                key=transactional_id,
                value=marker.encode(),
                partition=MARKER_PARTITION,
            )
            producer.commit_transaction(self.options.operation_timeout_s)
            self._raise_delivery_errors(cached.delivery_errors)
        except BaseException as raised:
            error = _kafka_exception_of(raised)
            # Measured before the abort, which may itself wait up to operationTimeoutMs.
            open_ms = None if began_at is None else (time.monotonic() - began_at) * 1000
            self._abort_after_failure(cached, transactional_id, error)
            raise self._explain(error, transactional_id, open_ms=open_ms) from None
        cached.marker = marker
        return records

    def _produce_batch(self, producer: Producer, batch: pa.RecordBatch) -> int:
        """Queue every row of ``batch``; delivery failures reach the producer's ``delivery_errors``.

        The loop for rows with only topic, value and key is separate because it runs once per output
        record: it makes one produce() call per row and nothing else."""
        encoder = _RowEncoder(batch, self.options.topic)
        produce = producer.produce
        topics = encoder.topic_per_row()
        if encoder.partitions is None and encoder.headers is None:
            for topic, value, key in zip(topics, encoder.values, encoder.keys, strict=True):
                try:
                    produce(topic, value, key)
                except BufferError:
                    _produce_when_queue_has_room(producer, topic, value, key, {})
        else:
            for row, (topic, value, key) in enumerate(zip(topics, encoder.values, encoder.keys, strict=True)):
                extra = encoder.extra_arguments(row)
                try:
                    produce(topic, value, key, **extra)
                except BufferError:
                    _produce_when_queue_has_room(producer, topic, value, key, extra)
        producer.poll(0)  # serve delivery reports now and then, not only at flush/commit
        return encoder.length

    def _raise_delivery_errors(self, errors: list[KafkaError]) -> None:
        if errors:
            raise KafkaException(errors[0])

    def _abort_after_failure(
        self, cached: _CachedProducer, transactional_id: str, error: BaseException
    ) -> None:
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else None
        abortable = isinstance(kafka_error, KafkaError) and kafka_error.txn_requires_abort()
        if abortable or not isinstance(kafka_error, KafkaError) or not kafka_error.fatal():
            try:
                cached.producer.abort_transaction(self.options.operation_timeout_s)
            except KafkaException:
                log.warning(
                    "could not abort the transaction of %s; discarding its producer", transactional_id
                )
        # A failed producer is never reused: the retry re-initialises the id, which aborts anything
        # left open and re-reads the marker.
        _discard(self.options, transactional_id)

    def _explain(
        self, error: BaseException, transactional_id: str | None, *, open_ms: float | None = None
    ) -> BaseException:
        """The error a failed write raises: Kafka's error told in terms of this sink's options.
        ``open_ms``: how long the failed transaction had been open."""
        if not isinstance(error, KafkaException) or not error.args:
            return error
        kafka_error = error.args[0]
        code = kafka_error.code()
        fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        timeout_ms = self.options.transaction_timeout_ms
        if code in fenced and open_ms is not None and open_ms >= timeout_ms:
            # The coordinator aborts a transaction open longer than its timeout and bumps the epoch,
            # which fences this producer: no other attempt is involved, and a retry that is as slow
            # fails the same way.
            return SparkafkaError(
                f"the transaction of transactional id '{transactional_id}' was open for "
                f"{open_ms / 1000:.1f} s, longer than kafka.transaction.timeout.ms={timeout_ms}, so the "
                "broker aborted it "
                f"({kafka_error.str()}). A write task's transaction stays open while Spark computes the "
                "task's rows: raise the sink option kafka.transaction.timeout.ms (up to the brokers' "
                "transaction.max.timeout.ms), or make micro-batches smaller (maxOffsetsPerTrigger)"
            )
        if code in fenced:
            return SparkafkaError(
                f"transactional id '{transactional_id}' was fenced by a newer producer with the same id (a "
                "retried or duplicated task); this attempt's transaction was aborted and Spark retries "
                "the task"
            )
        if code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
            return SparkafkaError(
                f"a record is larger than the broker accepts ({kafka_error.str()}); raise the topic's "
                "max.message.bytes (and the sink option kafka.message.max.bytes) or write smaller values"
            )
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return SparkafkaError(
                f"the output topic does not exist on {self.options.bootstrap_servers} ({kafka_error.str()}); "
                "create it first (sparkafka topics create ...) or enable auto.create.topics.enable on the "
                "brokers"
            )
        if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            return transaction_timeout_error(self.options)
        if transactional_id is None:
            return SparkafkaError(f"writing to {self.options.bootstrap_servers} failed: {kafka_error.str()}")
        return SparkafkaError(
            f"writing with transactional id '{transactional_id}' failed: {kafka_error.str()}"
        )

    def _write_without_transaction(self, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> int:
        cached = _plain_producer(self.options)
        cached.delivery_errors.clear()
        try:
            records = sum(self._produce_batch(cached.producer, batch) for batch in _chain(first, rest))
        except KafkaException as refused:  # by the client before sending, e.g. a record too large
            raise self._explain(refused, None) from None
        remaining = _flush_unless_refused(cached, self.options.operation_timeout_s)
        # With acks=0 (none) a record counts as delivered once sent: what is still queued was never
        # sent, and a failed delivery failed in the client. Either fails the task, under both
        # guarantees, as Flink's writer fails on an asynchronous send error even with NONE.
        if remaining:
            _discard(self.options, None)
            acknowledged = self.options.delivery_guarantee == AT_LEAST_ONCE
            what, state = ("acknowledge", "acknowledged") if acknowledged else ("send", "sent")
            raise _unreachable(
                self.options,
                f"{what} {remaining} record(s) of this task, which fails so that Spark retries it",
                f"{remaining} record(s) not {state}",
                cached.client_errors,
            )
        if cached.delivery_errors:
            error = cached.delivery_errors[0]
            _discard(self.options, None)
            raise self._explain(KafkaException(error), None)
        return records

    # -- driver side ------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = [m for m in messages if isinstance(m, SinkCommitMessage)]
        if len(reports) != len(messages):
            raise SparkafkaError(
                f"batch {batchId}: {len(messages) - len(reports)} of {len(messages)} write tasks reported no "
                "result; refusing to mark the batch committed"
            )
        written = sum(r.records for r in reports)
        skipped = sum(1 for r in reports if r.skipped_replay)
        log.info(
            "batch %d committed: %d task(s) wrote %d record(s) (%s); %d replayed task(s) skipped",
            batchId,
            len(reports),
            written,
            self.options.delivery_guarantee,
            skipped,
        )
        if self.options.delivery_guarantee == EXACTLY_ONCE and any(r.fresh_producer for r in reports):
            self._check_first_batch_of_run(reports, batchId)
        self.options.pause("driverCommit", partition=None, batch_id=batchId)

    def _check_first_batch_of_run(self, reports: list[SinkCommitMessage], batch_id: int) -> None:
        """At the first batch of a query run (a restart, when the batch may be a replay):

        1. fence the registered ids of write partitions this batch does not have (a restart with
           fewer partitions), aborting what they left open;
        2. fail the batch if any of them committed this very batch: the replay was split otherwise
           than the first run, and the tasks, which cannot know the batch's number of partitions,
           could not tell (:func:`~sparkafka.connector.replay.partitions_beyond`)."""
        prefix = next((r.transactional_id_prefix for r in reports if r.transactional_id_prefix), None)
        query_id = next((r.query_id for r in reports if r.query_id), None)
        if prefix is None or query_id is None:
            return
        found = read_marker_partition(self.options)
        fence_query_transactions(self.options, prefix, from_partition=len(reports), markers=found)
        beyond = partitions_beyond(
            (CommitMarker.decode(value) for key, value in found.items() if key.startswith(f"{prefix}-")),
            query_id=query_id,
            batch_id=batch_id,
            prefix=prefix,
            partitions=len(reports),
        )
        if beyond:
            raise beyond_refusal(beyond, batch_id=batch_id, partitions=len(reports))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.delivery_guarantee != EXACTLY_ONCE:
            return
        prefix = self.options.transactional_id_prefix or next(
            (m.transactional_id_prefix for m in messages if isinstance(m, SinkCommitMessage)), None
        )
        failed = [index for index, message in enumerate(messages) if message is None]
        if prefix is None:
            log.warning(
                "batch %d aborted before any task reported its transactional id; open transactions are "
                "aborted when the ids are initialised again or after kafka.transaction.timeout.ms",
                batchId,
            )
            return
        for index in failed:
            transactional_id = f"{prefix}-{index}"
            try:
                fence_transactional_id(self.options, transactional_id)
            except KafkaException as error:
                log.warning(
                    "could not re-initialise %s after batch %d failed: %s", transactional_id, batchId, error
                )


def _kafka_exception_of(error: BaseException) -> BaseException:
    """The KafkaException behind ``error``. A producer turned fatal (fenced, say) raises it from
    poll() or flush(); with a delivery callback, as the sink's producers have, confluent-kafka raises
    a SystemError caused by it instead, which would hide the Kafka error from the explanation and
    from the abort's check of whether the producer is still usable."""
    if isinstance(error, SystemError) and isinstance(error.__cause__, KafkaException):
        return error.__cause__
    return error


def _flush_unless_refused(cached: _CachedProducer, timeout_s: float) -> int:
    """``flush()`` for at most ``timeout_s``, but no longer once the cluster refused the producer's
    credentials (:func:`~sparkafka.connector.kafka_admin.waits_until_refused`); the records still queued."""
    remaining = 0
    for wait_s in waits_until_refused(timeout_s, cached.client_errors):
        remaining = cached.producer.flush(wait_s)  # serves error_cb too
        if not remaining:
            break
    return int(remaining)


def _produce_when_queue_has_room(
    producer: Producer, topic: str, value: Any, key: Any, extra: dict[str, Any]
) -> None:
    """produce() after BufferError: the client's local queue is full, so let it send (and serve
    delivery reports) until the record fits. Nothing is dropped and nothing is queued twice: a
    BufferError means the record was not queued."""
    while True:
        producer.poll(0.1)
        try:
            producer.produce(topic, value, key, **extra)
            return
        except BufferError:
            continue


def _count_rows(first: pa.RecordBatch | None, rest: Iterator[pa.RecordBatch]) -> int:
    """The task's rows, counted (and consumed) without writing them: a replay being checked."""
    return 0 if first is None else first.num_rows + sum(batch.num_rows for batch in rest)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


class KafkaBatchWriter(DataSourceArrowWriter):
    """``df.write.format("sparkafka")``: a bounded DataFrame, or one micro-batch inside
    ``foreachBatch``.

    Inside ``foreachBatch`` Spark gives the write tasks the query id and micro-batch id, so
    exactly-once works as in the streaming sink (transactional ids, commit markers): this is how
    update- and complete-mode queries, which Python streaming sinks cannot take directly, write
    exactly once. One difference: a ``foreachBatch`` call may write several times, and nothing a
    write task sees tells those writes apart, so each exactly-once write names its own
    ``transactionalIdPrefix`` (:func:`require_batch_write_prefix`; Flink's KafkaSink likewise needs a
    transactional id prefix per sink, Delta's idempotent writes a txnAppId per write). A plain
    ``df.write`` outside a streaming query has no batch id a retry could be matched against; there
    exactly-once fails with a clear message in the tasks."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self._writer = KafkaStreamWriter(options, batch_write=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._writer.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._writer.commit(messages, _reported_batch_id(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._writer.abort(messages, _reported_batch_id(messages))


def default_transactional_id_prefix(query_id: str) -> str:
    """The prefix of a streaming write's transactional ids when ``transactionalIdPrefix`` is not set."""
    return f"sparkafka-{query_id}"


def require_batch_write_prefix(options: SinkOptions) -> None:
    """An exactly-once ``df.write`` needs ``transactionalIdPrefix``: with the streaming sink's default
    (the query id) two writes of one ``foreachBatch`` call would share transactional ids, and the
    second, finding the first one's commit marker for the micro-batch, would take itself for a
    replay and write nothing."""
    if options.delivery_guarantee == EXACTLY_ONCE and options.transactional_id_prefix is None:
        raise SparkafkaOptionError(
            "deliveryGuarantee=exactly-once in df.write (inside foreachBatch, the only place it works) needs "
            "option 'transactionalIdPrefix', one of its own for every exactly-once write of the micro-batch, "
            "kept the same across restarts, e.g. .option('transactionalIdPrefix', 'orders-to-shipments'): "
            "writes sharing transactional ids cannot be told apart, and the second would skip its rows as a "
            "replay of the first. A query whose one exactly-once write ran without it used "
            "'sparkafka-<query id>' (StreamingQuery.id, the \"id\" in the checkpoint's metadata file): "
            "set exactly that to keep its transactional ids, so that a batch it already committed is "
            "not written again when replayed"
        )


def _reported_batch_id(messages: list[WriterCommitMessage | None]) -> int:
    return next(
        (m.batch_id for m in messages if isinstance(m, SinkCommitMessage) and m.batch_id is not None), -1
    )
