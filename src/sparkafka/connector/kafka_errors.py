"""librdkafka's error codes, in the classes the connector acts on: the one table every part of it
(the source's reader and planning, the sink's writer, producers, claims and commit log, the admin
client) looks codes up in, and the two accessors of the code and text a KafkaException carries.

Which typed error (:mod:`sparkafka.errors`) each class becomes, and the fix it names, is decided
where the connector knows what it was doing: the same code means a moving leader to the source's
planning and a missing output topic to the sink's writer. The sets are the facts those decisions
share; a code joins a set only when every user of the set is to act on it the same way.

Names starting with an underscore (``_TRANSPORT``) are librdkafka's own, client-side codes; the
others are the broker's (Kafka's protocol errors), with librdkafka's names where they differ from
Kafka's (INVALID_MSG is Kafka's CORRUPT_MESSAGE, NOT_LEADER_FOR_PARTITION its NOT_LEADER_OR_FOLLOWER).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

# -- reaching the cluster -------------------------------------------------------------------------

# No broker answered: not connected, the request timed out, every broker down, a name not resolved.
UNAVAILABLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)
# A request that found no broker to answer it within its timeout: asking again may be answered.
NOT_ANSWERED = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT})
# A request that waited out its whole timeout (the node asked may be dead but still listed).
TIMED_OUT = KafkaError._TIMED_OUT
# A connection that failed, and a partition the client has no metadata for: the two causes a
# request that cannot be sent is given.
CONNECTION_FAILED = KafkaError._TRANSPORT
NO_METADATA_FOR_PARTITION = KafkaError._UNKNOWN_PARTITION
# "n/m brokers are down": the client's summary that follows the event telling why.
ALL_BROKERS_DOWN = KafkaError._ALL_BROKERS_DOWN

# -- topics and partitions ------------------------------------------------------------------------

# A topic the cluster does not know (deleted, never created, or no metadata for it yet).
UNKNOWN_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
# A partition that is not there: its topic unknown, or fewer partitions than the one asked for.
PARTITION_GONE = UNKNOWN_TOPIC | {KafkaError._UNKNOWN_PARTITION}
# The same as the admin client's answers spell it: a describe of a topic that does not exist.
UNKNOWN_PARTITION = PARTITION_GONE | {KafkaError._NOENT}
# A partition's leadership is moving (its leader died, or a new one was just elected and has not
# caught up): Kafka's own clients refresh their metadata and ask the partition's leader again.
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.KAFKA_STORAGE_ERROR,
    }
)
# What a client answers about a partition's watermarks while it cannot tell: no connection, no
# metadata (yet) for the topic, a leader moving, or a partition really gone (told apart by asking
# the cluster).
TRANSIENT_WATERMARK = (
    UNAVAILABLE | UNKNOWN_PARTITION | LEADER_MOVING | {KafkaError._DESTROY_BROKER, KafkaError._WAIT_COORD}
)

# A topic created by someone else first: fine for a creator that only needs it to exist.
TOPIC_EXISTS = KafkaError.TOPIC_ALREADY_EXISTS

# -- consumer groups ------------------------------------------------------------------------------

# A group's offsets held by an open transaction (KIP-447's require_stable): asked again until it ends.
UNSTABLE_OFFSETS = KafkaError.UNSTABLE_OFFSET_COMMIT

# A group's coordinator moving (a failover) or loading (a cluster just started): the consumer looks
# it up again, and the question can be asked again.
COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._WAIT_COORD,
    }
)

# -- reading records ------------------------------------------------------------------------------

# The end of a partition reached (with enable.partition.eof): an event, not a failure.
PARTITION_EOF = KafkaError._PARTITION_EOF
# Kafka's CORRUPT_MESSAGE: the leader found a stored batch's CRC wrong.
DAMAGED_BATCH = KafkaError.INVALID_MSG
# The offset asked for is no longer (or not yet) in the log: retention or a truncation moved it.
OFFSET_GONE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})

# -- producing and transactions -------------------------------------------------------------------

# Another producer initialised the transactional id since this one did: this one can never commit.
FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# What a claimer of a prefix sees when another one initialised the claim id since its own
# initialisation. Apache Kafka's coordinator under transactions v2 may answer a commit that races
# the fencing abort with INVALID_TXN_STATE or an unknown server error instead of PRODUCER_FENCED
# (KAFKA-20785); retrying any of them is safe where every attempt initialises the id again.
TRANSACTION_RACE = FENCED | {
    KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError.INVALID_TXN_STATE,
    KafkaError.UNKNOWN,
    KafkaError._STATE,
}
# A record or batch over the topic's (or broker's) size limit.
TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# The producer's transaction.timeout.ms above the broker's transaction.max.timeout.ms.
TRANSACTION_TIMEOUT_REFUSED = KafkaError.INVALID_TRANSACTION_TIMEOUT

# -- authorization --------------------------------------------------------------------------------

TRANSACTIONAL_ID_DENIED = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
TOPIC_DENIED = KafkaError.TOPIC_AUTHORIZATION_FAILED
CLUSTER_DENIED = KafkaError.CLUSTER_AUTHORIZATION_FAILED


def error_code(error: BaseException) -> int | None:
    """The librdkafka error code carried by a KafkaException, if any."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return int(error.args[0].code())
    return None


def error_reason(error: BaseException) -> str:
    """The text of the librdkafka error a KafkaException carries (not its ``KafkaError{...}`` repr),
    or the exception's own text."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return str(error.args[0].str())
    return str(error)
