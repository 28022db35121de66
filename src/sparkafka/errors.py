"""Exceptions raised by the sparkafka connector.

Every error carries a message meant for the person running the pipeline: it names the option, topic,
partition or server involved and, where there is one, the fix. Spark wraps exceptions raised inside
Python data sources in its own exception types, but keeps this message in their text.
"""

from __future__ import annotations


class SparkafkaError(Exception):
    """Base class of every error the connector raises on purpose."""


class SparkafkaOptionError(SparkafkaError, ValueError):
    """An option is unknown, missing, contradictory or has a value that cannot be used."""


class KafkaUnavailableError(SparkafkaError, ConnectionError):
    """The Kafka cluster did not answer within the configured time."""


class TopicNotFoundError(SparkafkaError, LookupError):
    """A topic named by `subscribe` or `assign` does not exist."""


class DataLossError(SparkafkaError, RuntimeError):
    """Offsets the query still has to read are gone (retention, deleted or recreated topic)."""


class KafkaReadError(SparkafkaError, RuntimeError):
    """Reading an offset range failed or made no progress within the poll timeout."""


class SinkError(SparkafkaError, RuntimeError):
    """A write to Kafka failed; the message says why in terms of the sink's options."""


class ProducerFencedError(SinkError):
    """A newer producer initialised the same transactional id (a retried or duplicated task): this
    attempt's transaction is aborted, and Spark retries the task."""


class TransactionTimeoutError(SinkError):
    """The broker aborted a transaction open longer than ``kafka.transaction.timeout.ms``, or refused
    a timeout above its ``transaction.max.timeout.ms``."""


class CommitMarkerError(SinkError):
    """The commit-marker topic cannot be created, read or written as exactly-once needs."""


class SinkAuthorizationError(SinkError, PermissionError):
    """The cluster's authorizer refused the sink an operation it needs (an ACL is missing)."""


class RecordTooLargeError(SinkError):
    """A record is larger than the broker or the topic accepts."""


class OutputTopicNotFoundError(SinkError, LookupError):
    """The topic a row is written to does not exist."""


class CheckpointFormatError(SparkafkaError, ValueError):
    """The checkpoint holds something sparkafka never wrote (a hand edit, a damaged file)."""


class CheckpointVersionError(SparkafkaError, ValueError):
    """The checkpoint holds what a newer sparkafka wrote, which this version cannot replay."""


class ReplayRefused(SparkafkaError):
    """A write task, or the driver, found that writing would lose or double records."""


class ShapeRefusal(ReplayRefused):
    """A refusal the writer records in the prefix's refusal record before the query stops."""

    def __init__(self, message: str, *, batch_id: int) -> None:
        super().__init__(message)
        self.batch_id = batch_id


class WrongShapeAcceptance(ShapeRefusal):
    """An acceptance of a refused batch (``acceptReshapedBatch``) run in another shape than the
    refused run's. Its sibling tasks may have written before it refused; the writer records this run
    as rejected in the refusal record, so that no later acceptance keeps what they committed."""


class ReshapedReplayRefused(ShapeRefusal):
    """A refusal of a replay split otherwise than its batch was first written, which offers to accept
    the batch as written. The refusing run records itself in the marker topic before the query stops
    (:class:`~sparkafka.connector.sink.commit_log.RefusalRecord`): accepting then keeps what it
    committed, and writes again only what the refusal counted."""
