"""Cluster metadata, offsets and consumer-group offsets through confluent-kafka's AdminClient (a
group's committed offsets through a consumer of the group, see KafkaAdmin.committed_offsets).

Shared by the source and the sink. Every call is bounded by ``timeout_s`` and turns librdkafka's
errors into the connector's exceptions with the bootstrap servers in the message, so a wrong address
or a firewall shows up as one clear sentence instead of a hang or a bare ``_TRANSPORT`` code.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from sparkafka.connector import client_log, kafka_errors
from sparkafka.connector.kafka_errors import error_code, error_reason
from sparkafka.connector.options import java_only_property_hint
from sparkafka.errors import KafkaUnavailableError, SparkafkaOptionError

TopicPartitionKey = tuple[str, int]
"""(topic, partition): hashable, sortable and picklable, unlike confluent-kafka's TopicPartition."""

PartitionOffsets = dict[TopicPartitionKey, int]

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

LIBRDKAFKA_LOGGER = logging.getLogger("sparkafka.librdkafka")
# With sparse connections librdkafka drops the bootstrap connection after the first metadata and
# retries the next lookup (transaction coordinator, producer id, partition leader, a first offset
# query) only on a 500 ms timer. The sink's and the source's clients are new often (Spark runs a task
# in whichever Python worker is idle), so each would wait that long; connecting to every broker right
# away makes it milliseconds. Every client the connector makes starts from these settings (a user's
# own kafka.* properties win).
EAGER_CONNECTIONS: dict[str, object] = {"enable.sparse.connections": False}
client_log.install(LIBRDKAFKA_LOGGER)

# Properties only a consumer understands; librdkafka warns when an admin client gets them.
_CONSUMER_ONLY_PREFIXES = (
    "group.",
    "fetch.",
    "queued.",
    "auto.",
    "enable.auto.",
    "enable.partition.eof",
    "isolation.level",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "max.partition.fetch.bytes",
    "check.crcs",
    "coordinator.query.interval.ms",
    "max.poll.interval.ms",
    "consume.callback.max.messages",
    "allow.auto.create.topics",
)

# The first slice of a wait cut by waits_until_refused; each next one is twice as long.
_FIRST_WAIT_SLICE_S = 0.5

# librdkafka's RD_KAFKA_OFFSET_INVALID: what its ListOffsets reports for a partition it did not ask.
UNANSWERED_OFFSET = -1001
# The first slice of the list-offsets wait a request may take; each next one is twice as long.
_FIRST_LIST_OFFSETS_SLICE_S = 2.0

# librdkafka's debug line (``topic`` context) for each partition of an OffsetFetch answer.
_OFFSET_FETCH_ANSWER = re.compile(
    r"OffsetFetchResponse: (?P<topic>\S+) \[(?P<partition>\d+)\] .*: (?P<error>\w+)\s*$"
)

T = TypeVar("T")


class _OffsetFetchAnswers:
    """The ``logger`` of :meth:`KafkaAdmin.committed_offsets`'s consumer: keeps the error name of
    each partition's last OffsetFetch answer (``NO_ERROR``, ``UNSTABLE_OFFSET_COMMIT``, ...) from
    librdkafka's debug lines, and passes the other lines to :data:`LIBRDKAFKA_LOGGER` (debug lines
    only when the client settings ask for them with ``debug``).

    librdkafka asks a partition answered UNSTABLE_OFFSET_COMMIT again by itself, without end, and
    committed() then reports only a timeout: these lines are what says which partitions an open
    transaction held."""

    def __init__(self, *, forward_debug: bool) -> None:
        self.forward_debug = forward_debug
        self.last_answer: dict[TopicPartitionKey, str] = {}

    def log(self, level: int, msg: str, *args: object) -> None:
        """What confluent-kafka calls for each line: ``log(level, "%s [%s] %s", facility, client
        name, text)``."""
        if len(args) == 3 and args[0] == "OFFSETFETCH":
            found = _OFFSET_FETCH_ANSWER.search(str(args[2]))
            if found is not None:
                self.last_answer[(found["topic"], int(found["partition"]))] = found["error"]
                if not self.forward_debug:
                    return
        if level > logging.DEBUG or self.forward_debug:
            LIBRDKAFKA_LOGGER.log(level, msg, *args)

    def unstable(self) -> list[TopicPartitionKey]:
        """The partitions last answered UNSTABLE_OFFSET_COMMIT, sorted."""
        return sorted(tp for tp, error in self.last_answer.items() if error == "UNSTABLE_OFFSET_COMMIT")


def admin_config(client_config: Mapping[str, str]) -> dict[str, str]:
    """The client properties an AdminClient accepts without warnings (consumer-only ones removed)."""
    return {key: value for key, value in client_config.items() if not key.startswith(_CONSUMER_ONLY_PREFIXES)}


def validate_consumer_config(client_config: Mapping[str, str]) -> None:
    """Let librdkafka itself reject unknown or malformed properties, before any query starts.

    Creating a consumer connects to nothing until it is used, so this is cheap and offline."""
    for key in sorted(client_config):
        hint = java_only_property_hint(key)
        if hint is not None:
            raise SparkafkaOptionError(hint)
    config: dict[str, object] = {"group.id": "sparkafka-config-check", **client_config}
    config["logger"] = LIBRDKAFKA_LOGGER
    try:
        consumer = Consumer(config)
    except (KafkaException, ValueError, TypeError) as error:
        detail = error_reason(error)
        for key in client_config:
            if key in detail:
                raise SparkafkaOptionError(
                    f"Kafka option 'kafka.{key}' was rejected by librdkafka: {detail}"
                ) from None
        raise SparkafkaOptionError(f"the kafka.* options were rejected by librdkafka: {detail}") from None
    consumer.close()


def is_login_failure(reason: str) -> bool:
    """Whether a client's connection error says the cluster refused its credentials."""
    return "authentication" in reason.lower()


def most_telling_reason(reasons: Sequence[str | None]) -> str | None:
    """Of the reasons a client gave for not reaching the cluster, in order: the first refused login,
    else the last one. After refusing a login the server closes the connection, and what the retries
    report then (disconnects, timeouts) would hide why."""
    known = [reason for reason in reasons if reason]
    refused = [reason for reason in known if is_login_failure(reason)]
    if refused:
        return refused[0]
    return known[-1] if known else None


class LastConnectionFailure(logging.Handler):
    """Remembers the last connection failure a client logged, e.g. `Connection refused`: the part of
    each record's message that ``pattern``'s group ``reason`` matches (the most telling one, see
    :func:`most_telling_reason`)."""

    def __init__(self, pattern: str) -> None:
        super().__init__(logging.DEBUG)
        self.pattern = re.compile(pattern)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        found = self.pattern.search(record.getMessage())
        if found:
            self.last = most_telling_reason([self.last, found.group("reason")])


def quiet_librdkafka_logger(name: str) -> tuple[logging.Logger, LastConnectionFailure]:
    """A logger to give librdkafka clients (their ``logger`` setting) that prints nothing and keeps
    their last connection failure, for tools that report failures themselves, in one line: the
    clients' own log (every retry of every connection, each restart of a broker) stays off stderr."""
    logger = logging.getLogger(name)
    failures = LastConnectionFailure(r"^FAIL \[[^\]]*\] \[[^\]]*\]: (?P<reason>.*)")
    logger.addHandler(failures)
    logger.propagate = False
    logger.setLevel(logging.INFO)  # connection failures come as INFO (syslog level 6)
    return logger, failures


def waits_until_refused(timeout_s: float, client_errors: Iterable[KafkaError]) -> Iterator[float]:
    """The slices of a wait of at most ``timeout_s`` for a client: 0.5 s, then twice as long each time,
    the last one up to the deadline. The caller waits each slice and stops once what it waits for is
    done; the slices also stop as soon as ``client_errors`` (the client's error events) hold a
    refused login: no retry can fix that, and Kafka's Java client fails at once on an authentication
    error too. librdkafka reports the refusal in an error event while the request itself waits on."""
    deadline = time.monotonic() + timeout_s
    wait_s = _FIRST_WAIT_SLICE_S
    while True:
        left = deadline - time.monotonic()
        yield max(min(wait_s, left), 0.0)
        if wait_s >= left or any(is_login_failure(e.str()) for e in client_errors):
            return
        wait_s *= 2


_WATERMARK_RETRY_INTERVAL_S = 0.2


def partition_watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float
) -> tuple[int, int] | None:
    """(log start offset, high watermark) of a partition, asked of its leader; None if the cluster
    says the partition does not exist.

    librdkafka also answers "unknown partition" while it has no metadata for the topic: during a
    broker outage, and for seconds after the cluster is back. So that answer is only believed once
    fresh metadata from a cluster that answers lists no such partition; until then, as for other
    transient errors, the query is asked again until ``timeout_s`` has passed, and then the last
    error is raised (a KafkaException, which the caller words).

    A leader that died keeps being asked: the client learns of the new leader only from new
    metadata, which it does not fetch while the request waits. So each request waits a slice of
    ``timeout_s`` (2 s, then twice as long each time), and a slice that ends unanswered is followed
    by a metadata request for the topic, as Kafka's own clients refresh metadata on such errors."""
    deadline = time.monotonic() + timeout_s
    wait_s = _FIRST_LIST_OFFSETS_SLICE_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=max(min(wait_s, remaining), 0.001), cached=False
            )
            return int(low), int(high)
        except KafkaException as error:
            code = error_code(error)
            if code not in kafka_errors.TRANSIENT_WATERMARK:
                raise
            if code in kafka_errors.UNKNOWN_PARTITION and not _partition_listed(
                consumer, topic, partition, remaining
            ):
                return None
            if deadline - time.monotonic() <= _WATERMARK_RETRY_INTERVAL_S:
                raise
            if code not in kafka_errors.UNKNOWN_PARTITION:
                # Answers with the current leaders, which the client keeps for its next request.
                with contextlib.suppress(KafkaException):
                    consumer.list_topics(topic, timeout=max(min(wait_s, deadline - time.monotonic()), 0.001))
        wait_s *= 2
        time.sleep(_WATERMARK_RETRY_INTERVAL_S)


def _partition_listed(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> bool:
    """False only if the cluster answered a metadata request and lists no such partition; True when
    it lists it or could not be asked (then the question stays open)."""
    try:
        metadata = consumer.list_topics(topic, timeout=max(timeout_s, 0.001))
    except KafkaException:
        return True
    found = metadata.topics.get(topic)
    if found is None or (found.error is not None and found.error.code() in kafka_errors.UNKNOWN_PARTITION):
        return False
    if found.error is not None:  # e.g. LEADER_NOT_AVAILABLE: it exists, its leader is moving
        return True
    return partition in found.partitions


class KafkaAdmin:
    """Bounded, retrying admin operations against one cluster.

    The underlying AdminClient is created on first use and never pickled, so objects holding a
    ``KafkaAdmin`` can travel to Spark workers."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        *,
        timeout_s: float,
        attempts: int = 3,
        retry_interval_s: float = 1.0,
        timeout_option: str = "kafka.default.api.timeout.ms",
    ) -> None:
        self.config = admin_config(client_config)
        self.timeout_option = timeout_option  # named in errors: the option that sets timeout_s
        self.bootstrap_servers = str(client_config.get("bootstrap.servers", ""))
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.retry_interval_s = retry_interval_s
        self._client: AdminClient | None = None
        # The client's error events during the current operation: why it cannot reach the cluster
        # (refused login, refused connection, unknown host), which a failed request reports only as a
        # transport failure.
        self._client_errors: list[KafkaError] = []
        # Topic ids (msb, lsb) seen in the last description of each topic by name (DescribeTopics):
        # they tell a topic deleted and created again from the one a position was planned in.
        self.known_topic_ids: dict[str, tuple[int, int]] = {}

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_errors"] = []
        return state

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            config: dict[str, Any] = {
                **self.config,
                "logger": LIBRDKAFKA_LOGGER,
                "error_cb": self._client_errors.append,
            }
            self._client = AdminClient(config)
        return self._client

    def close(self) -> None:
        self._client = None

    # -- metadata ---------------------------------------------------------------------------------

    def topic_partitions(self, topics: Collection[str] | None = None) -> dict[str, list[int]]:
        """Every non-internal topic with its sorted partition numbers, or, given ``topics``, those of
        them that exist.

        Reading must never create topics, and a plain metadata request naming a missing topic may
        auto-create it on clusters with ``auto.create.topics.enable``. So named topics are asked for
        as DescribeTopics does (its metadata request forbids auto-creation), which keeps the answer
        the size of the subscription on a cluster of many topics; otherwise all topics are listed."""
        if topics is not None:
            return self._with_retries("describe topics", lambda: self._described_topics(topics))

        def fetch() -> dict[str, list[int]]:
            metadata = self._metadata()
            topics: dict[str, list[int]] = {}
            for name, topic in metadata.topics.items():
                if name in INTERNAL_TOPICS or (
                    topic.error is not None and topic.error.code() in kafka_errors.UNKNOWN_PARTITION
                ):
                    continue
                topics[name] = sorted(topic.partitions)
            return topics

        return self._with_retries("list topics", fetch)

    def _described_topics(self, topics: Collection[str]) -> dict[str, list[int]]:
        """The partitions of each of ``topics`` that exists, within ``timeout_s`` (the same wait
        slices as :meth:`_metadata`); a topic the cluster does not know is left out.

        librdkafka sends DescribeTopics to the node the last metadata named controller (under KRaft,
        any live broker) and waits for that node. If it died, only new metadata names another, and
        the client does not ask for it while it waits: so a slice that ends unanswered is followed by
        a metadata request (of no topic by name, which could create it)."""
        if not topics:
            return {}
        failure: KafkaException | None = None
        deadline = time.monotonic() + self.timeout_s
        for wait_s in waits_until_refused(self.timeout_s, self._client_errors):
            futures = self.client.describe_topics(
                TopicCollection(sorted(topics)), request_timeout=max(wait_s, 0.001)
            )
            found: dict[str, list[int]] = {}
            try:
                for name, future in futures.items():
                    try:
                        description = future.result()
                    except KafkaException as error:
                        if error_code(error) not in kafka_errors.UNKNOWN_PARTITION:
                            raise
                        self.known_topic_ids.pop(name, None)  # gone: its id with it
                        continue
                    found[name] = sorted(partition.id for partition in description.partitions)
                    self._note_topic_id(name, getattr(description, "topic_id", None))
            except KafkaException as error:
                if error_code(error) not in kafka_errors.UNAVAILABLE:
                    raise
                failure = error
                self.client.poll(0)  # error events reach _client_errors on a poll
                if (refresh_s := min(wait_s, deadline - time.monotonic())) > 0:
                    with contextlib.suppress(KafkaException):
                        self.client.list_topics(timeout=refresh_s)
                continue
            return found
        assert failure is not None
        raise failure

    def _note_topic_id(self, name: str, topic_id: Any) -> None:
        """Keep the id a description gave ``name``. A cluster without topic ids (Metadata v9 and
        older: Kafka 2.7 and earlier) answers the zero UUID, which names no topic: no id is kept
        then, as for a topic the cluster does not describe."""
        ids = (
            None
            if topic_id is None
            else (topic_id.get_most_significant_bits(), topic_id.get_least_significant_bits())
        )
        if ids is None or ids == (0, 0):
            self.known_topic_ids.pop(name, None)
        else:
            self.known_topic_ids[name] = ids

    def _metadata(self) -> Any:
        """The cluster's metadata within ``timeout_s``; sooner, an error, once the cluster refused the
        client's credentials (see :func:`waits_until_refused`). A connection being set up carries on
        from one slice of the wait to the next."""
        failure: KafkaException | None = None
        for wait_s in waits_until_refused(self.timeout_s, self._client_errors):
            try:
                return self.client.list_topics(timeout=max(wait_s, 0.001))
            except KafkaException as error:
                if error_code(error) not in kafka_errors.UNAVAILABLE:
                    raise
                failure = error
                self.client.poll(0)  # error events reach _client_errors on a poll
        assert failure is not None
        raise failure

    def broker_setting(self, name: str) -> dict[int, str | None]:
        """Each live broker's value of the broker setting ``name`` (DescribeConfigs of every broker
        the cluster's metadata lists), by node id; None where a broker does not answer the setting.
        Raises KafkaException when the cluster does not answer or refuses (DescribeConfigs on the
        cluster is an ACL of its own)."""

        def describe() -> dict[int, str | None]:
            brokers = sorted(self._metadata().brokers)
            resources = [ConfigResource(ResourceType.BROKER, str(node)) for node in brokers]
            answers = self.client.describe_configs(resources, request_timeout=self.timeout_s)
            values: dict[int, str | None] = {}
            for node, resource in zip(brokers, resources, strict=True):
                entry = self._result(answers[resource]).get(name)
                values[node] = None if entry is None else entry.value
            return values

        return self._with_retries(f"describe the brokers' {name}", describe)

    # -- offsets ----------------------------------------------------------------------------------

    def earliest_offsets(self, partitions: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        """Log start offset of each partition; partitions that do not exist are left out."""
        return self._list_offsets(
            {tp: OffsetSpec.earliest() for tp in partitions}, IsolationLevel.READ_UNCOMMITTED
        )

    def latest_offsets(
        self,
        partitions: Iterable[TopicPartitionKey],
        *,
        read_committed: bool,
        epochs: dict[TopicPartitionKey, int] | None = None,
    ) -> PartitionOffsets:
        """End offset of each partition: the last stable offset with ``read_committed`` (so never past
        an open transaction), else the high watermark. Partitions that do not exist are left out.
        ``epochs`` receives the leader epoch each answer came with (Kafka answers the partition's
        current leader epoch, ListOffsets v4+), where the cluster gave one."""
        isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        return self._list_offsets({tp: OffsetSpec.latest() for tp in partitions}, isolation, epochs)

    def offsets_for_timestamps(
        self, timestamps: Mapping[TopicPartitionKey, int], *, read_committed: bool
    ) -> dict[TopicPartitionKey, int | None]:
        """The first offset whose record timestamp is >= the given one (ms), None when there is none."""
        isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        found = self._list_offsets(
            {tp: OffsetSpec.for_timestamp(ts) for tp, ts in timestamps.items()}, isolation
        )
        return {tp: (found[tp] if found.get(tp, -1) >= 0 else None) for tp in timestamps}

    def _list_offsets(
        self,
        specs: Mapping[TopicPartitionKey, OffsetSpec],
        isolation: IsolationLevel,
        epochs: dict[TopicPartitionKey, int] | None = None,
    ) -> PartitionOffsets:
        if not specs:
            return {}
        return self._with_retries("list offsets", lambda: self._fetch_offsets(specs, isolation, epochs))

    def _fetch_offsets(
        self,
        specs: Mapping[TopicPartitionKey, OffsetSpec],
        isolation: IsolationLevel,
        epochs: dict[TopicPartitionKey, int] | None,
    ) -> PartitionOffsets:
        """Only a partition the cluster's metadata no longer lists is left out: one unknown
        partition can fail the whole request, and the client calls partitions unknown while its
        metadata is stale (for seconds after a broker restart), so the others are asked again,
        as are unanswered ones, until ``timeout_s``.

        An unanswered partition's leader may be dead: librdkafka's admin client keeps the leader
        it knows and would ask the dead one until the request's timeout. So a request waits a
        slice of ``timeout_s`` (2 s, then twice as long each time), and the client is replaced
        before asking again: a new one learns the leaders from the cluster's current metadata."""
        deadline = time.monotonic() + self.timeout_s
        result: PartitionOffsets = {}
        pending: Mapping[TopicPartitionKey, OffsetSpec] = specs
        wait_s = _FIRST_LIST_OFFSETS_SLICE_S
        while True:
            slice_s = max(min(wait_s, deadline - time.monotonic()), 0.001)
            unknown, unanswered = self._ask_offsets(pending, result, slice_s, isolation, epochs)
            wait_s *= 2
            if unknown:
                existing = self.topic_partitions({topic for topic, _ in unknown})
                unknown = [tp for tp in unknown if tp[1] in existing.get(tp[0], ())]
            pending = {tp: specs[tp] for tp in [*unknown, *unanswered]}
            if not pending:
                return result
            if time.monotonic() >= deadline:
                reason = (
                    "the cluster's metadata lists them, the client still calls them unknown"
                    if unknown
                    else "their leader's ListOffsets request failed"
                )
                raise self.unavailable(
                    f"list the offsets of {sorted(pending)}",
                    KafkaException(
                        KafkaError(
                            kafka_errors.NO_METADATA_FOR_PARTITION
                            if unknown
                            else kafka_errors.CONNECTION_FAILED,
                            reason,
                        )
                    ),
                )
            if unanswered:
                self.close()
            time.sleep(self.retry_interval_s)

    def _ask_offsets(
        self,
        pending: Mapping[TopicPartitionKey, OffsetSpec],
        result: PartitionOffsets,
        wait_s: float,
        isolation: IsolationLevel,
        epochs: dict[TopicPartitionKey, int] | None,
    ) -> tuple[list[TopicPartitionKey], list[TopicPartitionKey]]:
        """Put the offsets found into ``result``; return the partitions the client called unknown
        and those it left unanswered.

        librdkafka sends one ListOffsets per leader and, when such a request fails (its broker
        went down while it was in flight, or is down), reports that leader's partitions with
        offset -1001 and no error. No broker answers -1001 (a timestamp without a record is -1),
        so it means "not asked", never an offset. A partition whose leadership is moving
        (``kafka_errors.LEADER_MOVING``), or whose request found no broker within ``wait_s``, is
        unanswered too."""
        request = {TopicPartition(topic, partition): spec for (topic, partition), spec in pending.items()}
        futures = self.client.list_offsets(request, isolation_level=isolation, request_timeout=wait_s)
        unknown = []
        unanswered = []
        for tp, future in futures.items():
            try:
                info = self._result(future)
            except KafkaException as error:
                if error_code(error) in kafka_errors.UNKNOWN_PARTITION:
                    unknown.append((tp.topic, tp.partition))
                    continue
                if error_code(error) in kafka_errors.LEADER_MOVING | kafka_errors.NOT_ANSWERED:
                    unanswered.append((tp.topic, tp.partition))
                    continue
                raise
            if info.offset == UNANSWERED_OFFSET:
                unanswered.append((tp.topic, tp.partition))
                continue
            result[(tp.topic, tp.partition)] = int(info.offset)
            if epochs is not None and info.leader_epoch is not None and info.leader_epoch >= 0:
                epochs[(tp.topic, tp.partition)] = int(info.leader_epoch)
        return unknown, unanswered

    # -- consumer groups --------------------------------------------------------------------------

    def committed_offsets(
        self, group_id: str, partitions: Iterable[TopicPartitionKey], *, require_stable: bool = False
    ) -> PartitionOffsets:
        """Offsets committed by a consumer group; partitions without a commit are left out.

        ``require_stable`` (KIP-447, what a read_committed Kafka consumer asks): a partition whose
        offset a still-open transaction is about to commit is asked again until that transaction
        ends, up to ``timeout_s``; without it the broker answers the offset committed before the
        transaction. Any other error of a partition fails the call: a partition left out would
        silently start at the fallback offset instead.

        Asked by a consumer of the group, not with the AdminClient's ListConsumerGroupOffsets: when
        the broker answers that OffsetFetch with NOT_COORDINATOR, as a freshly started Apache Kafka
        does while its group coordinator loads and any cluster does while a coordinator moves,
        librdkafka (2.4 to 2.16 at least) crashes the process with a segmentation fault. Its
        OffsetFetch handler asks the client's consumer-group handle to look the coordinator up
        again, and an admin client has none (librdkafka issue #5040). A consumer has one. Steps:

        1. a consumer with the client settings of :func:`admin_config` (so security settings carry
           over), ``group.id`` the group and ``isolation.level`` read_committed when
           ``require_stable``, else read_uncommitted: librdkafka's committed() sets OffsetFetch's
           RequireStable from it. It never subscribes, so it never joins the group and closing it
           sends no LeaveGroup; auto-commit is off, so it commits nothing. Its librdkafka ``topic``
           debug lines go to :class:`_OffsetFetchAnswers`;
        2. committed() for every partition, waiting what is left of ``timeout_s``: the consumer
           finds the group's coordinator and asks it, and asks again by itself while the
           coordinator loads, and while a partition is answered UNSTABLE_OFFSET_COMMIT;
        3. a coordinator that moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE) fails committed();
           the consumer has already started looking it up again, so the partitions are asked again
           after ``retry_interval_s``, until ``timeout_s``, then the cluster did not answer;
        4. committed() that times out while a partition's last answer was UNSTABLE_OFFSET_COMMIT
           (librdkafka reports only the timeout; its debug lines say which partitions) fails with
           the error naming them and saying how to end the transaction; any other timeout says the
           cluster did not answer;
        5. an answer in which a partition carries another error fails the call naming the group, the
           topic and the partition; else the offsets of the partitions with a commit are returned."""
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        if not wanted:
            return {}
        return self._with_retries(
            f"fetch offsets of consumer group '{group_id}'",
            lambda: self._fetch_committed(group_id, wanted, require_stable),
        )

    def _fetch_committed(
        self, group_id: str, wanted: list[TopicPartition], require_stable: bool
    ) -> PartitionOffsets:
        """Steps 1-4 of :meth:`committed_offsets`."""
        deadline = time.monotonic() + self.timeout_s
        answers = _OffsetFetchAnswers(forward_debug="debug" in self.config)
        consumer = Consumer(self._group_reader_config(group_id, require_stable, answers))
        try:
            while True:
                try:
                    answer = consumer.committed(wanted, timeout=max(deadline - time.monotonic(), 0.001))
                except KafkaException as error:
                    consumer.poll(0)  # serves the debug lines and error events queued meanwhile
                    code = error_code(error)
                    if code == kafka_errors.TIMED_OUT and (held := answers.unstable()):
                        raise self._unsettled(group_id, held) from None
                    if code not in kafka_errors.COORDINATOR_MOVING:
                        raise
                    if deadline - time.monotonic() <= self.retry_interval_s:
                        raise KafkaException(
                            KafkaError(
                                kafka_errors.TIMED_OUT,
                                f"the group's coordinator still answers {error.args[0].str()}",
                            )
                        ) from None
                    time.sleep(self.retry_interval_s)
                    continue
                unstable = _unstable_in(group_id, answer)
                if not unstable:
                    return {(tp.topic, tp.partition): int(tp.offset) for tp in answer if tp.offset >= 0}
                # librdkafka gave up asking again by itself: ask again here, as step 2 would.
                if deadline - time.monotonic() <= self.retry_interval_s:
                    raise self._unsettled(group_id, unstable)
                time.sleep(self.retry_interval_s)
        finally:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.poll(0)  # its warnings and error events, to the log and _client_errors
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()

    def _unsettled(self, group_id: str, held: Iterable[TopicPartitionKey]) -> KafkaException:
        pending = ", ".join(f"{topic}-{partition}" for topic, partition in held)
        return KafkaException(
            KafkaError(
                kafka_errors.UNSTABLE_OFFSETS,
                f"a transaction of consumer group '{group_id}' still holds uncommitted offsets "
                f"for {pending} after {self.timeout_s:g} s; it must commit or abort (see: "
                "sparkafka transactions list) before the group's offsets are stable",
            )
        )

    def _group_reader_config(
        self, group_id: str, require_stable: bool, answers: _OffsetFetchAnswers
    ) -> dict[str, Any]:
        """The configuration of :meth:`committed_offsets`'s consumer (its step 1)."""
        debug = ",".join(part for part in (self.config.get("debug"), "topic") if part)
        return {
            **self.config,
            "group.id": group_id,
            "isolation.level": "read_committed" if require_stable else "read_uncommitted",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "debug": debug,
            "logger": answers,
            "error_cb": self._client_errors.append,
        }

    def commit_offsets(
        self, group_id: str, offsets: Mapping[TopicPartitionKey, int], *, retry: bool = True
    ) -> None:
        """Store offsets for a consumer group, as a consumer's commit would (no group membership).

        ``retry=False`` makes one attempt only, for callers to whom the commit is best effort."""
        partitions = [
            TopicPartition(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())
        ]
        if not partitions:
            return

        def commit() -> None:
            futures = self.client.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id, partitions)], request_timeout=self.timeout_s
            )
            answer = self._result(futures[group_id])
            failed = [tp for tp in answer.topic_partitions if tp.error is not None]
            if failed:
                tp = failed[0]
                detail = (
                    f"consumer group '{group_id}' topic '{tp.topic}' partition {tp.partition}: "
                    f"{tp.error.str()}"
                )
                if tp.error.code() in kafka_errors.UNKNOWN_PARTITION:
                    detail += (
                        "; the cluster has no such partition (the topic was deleted, or has fewer "
                        f"partitions now): see sparkafka topics describe {tp.topic}"
                    )
                raise KafkaException(KafkaError(tp.error.code(), detail, retriable=tp.error.retriable()))

        self._with_retries(
            f"commit offsets of consumer group '{group_id}'", commit, attempts=None if retry else 1
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def _result(self, future: Future[T]) -> T:
        try:
            return future.result(timeout=self.timeout_s + 5)
        except FutureTimeoutError:
            raise KafkaException(KafkaError(kafka_errors.TIMED_OUT, "no answer")) from None
        finally:
            # Serves queued librdkafka log lines to the Python logger.
            self.client.poll(0)

    def _with_retries(self, what: str, operation: Callable[[], T], *, attempts: int | None = None) -> T:
        """Run ``operation``; retry retriable Kafka errors, never a timeout (the timeout is the bound)."""
        attempts = attempts or self.attempts
        if self._client is not None:
            self._client.poll(0)  # events of earlier operations are not about this one
        self._client_errors.clear()
        attempt = 0
        while True:
            attempt += 1
            try:
                return operation()
            except KafkaException as error:
                code = error_code(error)
                if code in kafka_errors.UNAVAILABLE:
                    raise self.unavailable(what, error) from None
                kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
                if kafka_error is None or not kafka_error.retriable() or attempt == attempts:
                    raise
                LIBRDKAFKA_LOGGER.warning("attempt %d to %s failed (%s); retrying", attempt, what, error)
                time.sleep(self.retry_interval_s)
                self.close()

    def unavailable(self, what: str, error: BaseException) -> KafkaUnavailableError:
        reason = error_reason(error)
        if self._client is not None:
            self._client.poll(0)  # error events wait for a poll to reach _client_errors
        return unreachable_error(
            what,
            self.bootstrap_servers,
            self.timeout_s,
            reason,
            self._client_errors,
            timeout_option=self.timeout_option,
        )


def unreachable_error(
    what: str,
    bootstrap_servers: str,
    timeout_s: float,
    reason: str,
    client_errors: Iterable[KafkaError],
    *,
    timeout_option: str = "kafka.default.api.timeout.ms",
) -> KafkaUnavailableError:
    """The error for a cluster that did not answer ``what`` within ``timeout_s``, with the cause the
    client's error events gave if they gave one: refused credentials get a message of their own, other
    connection errors (refused, unresolvable host) are quoted beside the request's own ``reason``."""
    # "n/m brokers are down" only follows the event that says why.
    seen = most_telling_reason([e.str() for e in client_errors if e.code() != kafka_errors.ALL_BROKERS_DOWN])
    where = f"Kafka at bootstrap servers '{bootstrap_servers}'"
    if seen is not None and is_login_failure(seen):
        return KafkaUnavailableError(
            f"could not {what}: {where} refused the client's credentials ({seen}). Check "
            "kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.username and kafka.sasl.password "
            "(kafka.sasl.oauthbearer.* for OAUTHBEARER)"
        )
    if seen is not None and seen not in reason:
        reason = f"{reason}; the client reported: {seen}"
    return KafkaUnavailableError(
        f"could not {what}: {where} did not answer within {timeout_s:g} s ({reason}). Check "
        "kafka.bootstrap.servers, that the brokers are up and reachable, and the security settings "
        "(kafka.security.protocol, kafka.sasl.*, kafka.ssl.*); the wait is set by the option "
        f"{timeout_option}"
    )


def _unstable_in(group_id: str, answer: list[TopicPartition]) -> list[TopicPartitionKey]:
    """Step 5 of :meth:`KafkaAdmin.committed_offsets`: the partitions of an OffsetFetch answer still
    held by an open transaction (UNSTABLE_OFFSET_COMMIT); any other error of a partition fails."""
    failed = [(tp, tp.error) for tp in answer if tp.error is not None]
    for tp, failure in failed:
        if failure.code() != kafka_errors.UNSTABLE_OFFSETS:
            raise KafkaException(
                KafkaError(
                    failure.code(),
                    f"consumer group '{group_id}' topic '{tp.topic}' partition "
                    f"{tp.partition}: {failure.str()}",
                    retriable=failure.retriable(),
                )
            )
    return [(tp.topic, tp.partition) for tp, _ in failed]
