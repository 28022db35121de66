"""The sink's options: what a user may set, parsed and checked once on the driver."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from sparkafka.connector.options import OptionReader, OptionSpec, reject_forbidden_kafka_params
from sparkafka.connector.sink.fault_injection import FaultInjection
from sparkafka.errors import SparkafkaOptionError

# The options of the ways on that the replay rules offer (sink package docstring, steps 2-4).
ADOPT_OPTION = "adoptTransactionalIdsFrom"
ACCEPT_RESHAPED_OPTION = "acceptReshapedBatch"
EXACTLY_ONCE_FROM_OPTION = "exactlyOnceFromBatch"
PREVIOUS_MARKER_TOPIC_OPTION = "previousCommitMarkerTopic"


class DeliveryGuarantee(StrEnum):
    """The sink option ``deliveryGuarantee``, as Flink's DeliveryGuarantee names it."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


EXACTLY_ONCE = DeliveryGuarantee.EXACTLY_ONCE
AT_LEAST_ONCE = DeliveryGuarantee.AT_LEAST_ONCE
NONE = DeliveryGuarantee.NONE
DEFAULT_MARKER_TOPIC = "_sparkafka_commit_markers"
# Kafka's Topic.validate: the characters and the length a broker accepts in a topic name.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# The partition of a marker topic that holds its layout record, and every record of a topic laid
# out over one partition (every topic before layouts existed).
MARKER_PARTITION = 0
# The partitions of a commit-marker topic the sink creates (commitMarkerTopicPartitions).
MARKER_PARTITIONS_OPTION = "commitMarkerTopicPartitions"
DEFAULT_MARKER_PARTITIONS = 16
REGISTRATION_KEY_PREFIX = "registration/"
PROGRESS_KEY_PREFIX = "progress/"
CLAIM_KEY_PREFIX = "claim/"
REFUSAL_KEY_PREFIX = "refusal/"
QUERY_KEY_PREFIX = "query/"
LAYOUT_KEY_PREFIX = "layout/"
# Every key of the marker topic that is not a transactional id (whose value is its commit marker).
RECORD_KEY_PREFIXES = (
    REGISTRATION_KEY_PREFIX,
    PROGRESS_KEY_PREFIX,
    CLAIM_KEY_PREFIX,
    REFUSAL_KEY_PREFIX,
    QUERY_KEY_PREFIX,
    LAYOUT_KEY_PREFIX,
)


def is_marker_key(key: str) -> bool:
    """Whether a key of the marker topic is a transactional id, whose value is a commit marker."""
    return not key.startswith(RECORD_KEY_PREFIXES)


OPERATION_TIMEOUT = "operationTimeoutMs"
BATCH_ID_OPTION = "batchId"
LEASE_TIMEOUT_OPTION = "leaseTimeoutMs"
DEFAULT_LEASE_TIMEOUT_MS = 120_000

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
        MARKER_PARTITIONS_OPTION,
        f"partitions of a commit-marker topic the sink creates (default {DEFAULT_MARKER_PARTITIONS}); a "
        "topic that exists keeps the layout it has",
    ),
    OptionSpec(
        ADOPT_OPTION,
        "the query id whose transactional ids this query takes over (it replaces that query, whose "
        "checkpoint is gone); without it ids registered by another query are refused",
    ),
    OptionSpec(
        ACCEPT_RESHAPED_OPTION,
        "a micro-batch id whose replay was refused as reshaped: take that batch as it was written and "
        "go on (remove the option afterwards)",
    ),
    OptionSpec(
        PREVIOUS_MARKER_TOPIC_OPTION,
        "the commit-marker topic a running query used until now: its markers are carried over to "
        "commitMarkerTopic before the next micro-batch writes (remove the option afterwards)",
    ),
    OptionSpec(
        EXACTLY_ONCE_FROM_OPTION,
        "a micro-batch id from which a query whose markers hold nothing of it starts its exactly-once "
        "output (a switch from Spark's kafka format or another deliveryGuarantee, markers lost)",
    ),
    OptionSpec(
        BATCH_ID_OPTION,
        "an exactly-once df.write in foreachBatch from a Spark Connect client: the batch id foreachBatch "
        "gave the function (Spark Connect hands such a write neither the query nor the micro-batch)",
    ),
    OptionSpec("kafka.bootstrap.servers", "the Kafka cluster"),
    # Spark hands these to every sink: the writeStream's checkpoint, start(path) or save(path), and
    # the query's name (DataStreamWriter.queryName).
    OptionSpec("checkpointLocation"),
    OptionSpec("path"),
    OptionSpec("queryName"),
    # Fault injection of the project's own tests and demo (sink/fault_injection.py; never listed).
    OptionSpec("debug.pauseAt", "beforeProduce, beforeCommit or driverCommit", hidden=True),
    OptionSpec("debug.pauseMs", hidden=True),
    OptionSpec("debug.pausePartitions", hidden=True),
    OptionSpec("debug.pauseFromBatch", hidden=True),
    OptionSpec("debug.failFirstAttemptAt", hidden=True),
    OptionSpec(OPERATION_TIMEOUT, "bound on each Kafka call of the sink (default 60s)"),
    OptionSpec(
        LEASE_TIMEOUT_OPTION,
        "how long the driver's lease on the checkpoint outlives its last renewal, for a process on "
        "another host (default 2m; renewed every micro-batch)",
    ),
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
    delivery_guarantee: DeliveryGuarantee
    transactional_id_prefix: str | None
    marker_topic: str
    transaction_timeout_ms: int
    operation_timeout_s: float
    adopted_query: str | None = None
    accepted_reshaped_batch: int | None = None
    exactly_once_from: int | None = None
    # Option batchId: the micro-batch a foreachBatch df.write belongs to, where Spark cannot say.
    batch_id: int | None = None
    previous_marker_topic: str | None = None
    checkpoint_location: str | None = None
    lease_timeout_ms: int = DEFAULT_LEASE_TIMEOUT_MS
    marker_partitions: int = DEFAULT_MARKER_PARTITIONS
    # The project's own chaos tests and demo (debug.* options, hidden): nothing by default.
    faults: FaultInjection = field(default_factory=FaultInjection)

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
        guarantee = DeliveryGuarantee(
            reader.choice("deliveryGuarantee", tuple(DeliveryGuarantee), AT_LEAST_ONCE)
        )
        if guarantee == EXACTLY_ONCE:
            _check_transactional_params(params)
        timeout_ms = int(params.pop("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        if timeout_ms <= 0:
            raise SparkafkaOptionError(
                f"option 'kafka.transaction.timeout.ms' must be positive, got {timeout_ms}"
            )
        prefix = _transactional_id_prefix(reader)
        marker_topic = _topic_name(reader, "commitMarkerTopic") or DEFAULT_MARKER_TOPIC
        previous_marker_topic = _topic_name(reader, PREVIOUS_MARKER_TOPIC_OPTION)
        if previous_marker_topic == marker_topic:
            raise SparkafkaOptionError(
                f"option '{PREVIOUS_MARKER_TOPIC_OPTION}' names the commit-marker topic itself "
                f"('{marker_topic}'): name the topic the markers are carried over from, or remove the option"
            )
        return cls(
            client_config=params,
            topic=reader.string("topic") or None,
            delivery_guarantee=guarantee,
            transactional_id_prefix=prefix,
            marker_topic=marker_topic,
            transaction_timeout_ms=timeout_ms,
            operation_timeout_s=reader.duration_ms("operationTimeoutMs", "60s") / 1000,
            adopted_query=reader.string(ADOPT_OPTION) or None,
            accepted_reshaped_batch=reader.optional_integer(ACCEPT_RESHAPED_OPTION, minimum=0),
            exactly_once_from=reader.optional_integer(EXACTLY_ONCE_FROM_OPTION, minimum=0),
            batch_id=reader.optional_integer(BATCH_ID_OPTION, minimum=0),
            previous_marker_topic=previous_marker_topic,
            checkpoint_location=reader.string("checkpointLocation") or None,
            lease_timeout_ms=_lease_timeout_ms(reader),
            marker_partitions=reader.integer(MARKER_PARTITIONS_OPTION, DEFAULT_MARKER_PARTITIONS, minimum=1),
            faults=FaultInjection.parse(
                choice=lambda option, choices: reader.choice(option, choices, "") or None,
                duration_s=lambda option, default: reader.duration_ms(option, default) / 1000,
                string=reader.string,
                integer=lambda option: reader.integer(option, 0, minimum=0),
            ),
        )

    @property
    def bootstrap_servers(self) -> str:
        return self.client_config["bootstrap.servers"]


def _check_transactional_params(params: Mapping[str, object]) -> None:
    """Producer settings a user passed that Kafka transactions cannot work with."""
    for key, allowed in _EXACTLY_ONCE_NEEDS.items():
        if key in params and str(params[key]).strip().lower() not in allowed:
            raise SparkafkaOptionError(
                f"option 'kafka.{key}={params[key]}' contradicts deliveryGuarantee 'exactly-once': "
                f"Kafka transactions need {key}={allowed[0]}; remove the option, or choose "
                "deliveryGuarantee 'at-least-once'"
            )


def _transactional_id_prefix(reader: OptionReader) -> str | None:
    prefix = reader.string("transactionalIdPrefix")
    if prefix is not None and not prefix:
        raise SparkafkaOptionError("option 'transactionalIdPrefix' must not be empty")
    if prefix is not None and prefix.startswith(RECORD_KEY_PREFIXES):
        # A marker keyed by such an id would be taken for the record of another kind.
        taken = next(start for start in RECORD_KEY_PREFIXES if prefix.startswith(start))
        raise SparkafkaOptionError(
            f"option 'transactionalIdPrefix' is '{prefix}', which starts with '{taken}': the "
            "commit-marker topic keys records of its own so, and the commit markers of these ids "
            f"would be taken for them. Choose a prefix that starts with none of "
            f"{', '.join(repr(start) for start in RECORD_KEY_PREFIXES)}"
        )
    return prefix


def _topic_name(reader: OptionReader, option: str) -> str | None:
    """A topic-name option, checked as Kafka's Topic.validate does (else the broker's bare "Invalid
    topic" surfaces from the first metadata request)."""
    name = reader.string(option)
    if not name:
        return None
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise SparkafkaOptionError(
            f"option '{reader.name(option)}' is '{name}', not a legal Kafka topic name: up to "
            "249 characters of ASCII letters, digits, '.', '_' and '-' (and not '.' or '..')"
        )
    return name


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


def _lease_timeout_ms(reader: OptionReader) -> int:
    timeout_ms = reader.duration_ms(LEASE_TIMEOUT_OPTION, f"{DEFAULT_LEASE_TIMEOUT_MS}ms")
    if timeout_ms < 1000:
        raise SparkafkaOptionError(
            f"option '{LEASE_TIMEOUT_OPTION}' is {timeout_ms} ms: the checkpoint's lease must outlive the "
            "time between two renewals by far; give at least 1s (default 2m)"
        )
    return timeout_ms
