"""The sink's failures told in terms of its options: what went wrong, and the fix."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_admin import unreachable_error
from sparkafka.connector.kafka_errors import error_code, error_reason
from sparkafka.connector.sink.options import OPERATION_TIMEOUT, SinkOptions
from sparkafka.errors import SinkAuthorizationError, SparkafkaError, TransactionTimeoutError


def sink_unreachable_error(
    options: SinkOptions, what: str, error: KafkaException | str, client_errors: Iterable[KafkaError] = ()
) -> SparkafkaError:
    """Kafka did not answer the sink's ``what`` within its operationTimeoutMs, with the cause the
    client's error events (``client_errors``) gave, if any."""
    return unreachable_error(
        what,
        options.bootstrap_servers,
        options.operation_timeout_s,
        error_reason(error) if isinstance(error, KafkaException) else error,
        client_errors,
        timeout_option=OPERATION_TIMEOUT,
    )


def transaction_timeout_error(options: SinkOptions) -> TransactionTimeoutError:
    return TransactionTimeoutError(
        f"the sink's transaction timeout kafka.transaction.timeout.ms={options.transaction_timeout_ms} is "
        "larger than the broker's transaction.max.timeout.ms, so the broker refused to start transactions "
        "(INVALID_TRANSACTION_TIMEOUT). Fix: lower the sink option kafka.transaction.timeout.ms below the "
        "broker's transaction.max.timeout.ms (Kafka's default is 900000 ms), or raise "
        "transaction.max.timeout.ms on every broker"
    )


def kafka_exception_of(error: BaseException) -> BaseException:
    """The KafkaException behind ``error``. A producer turned fatal (fenced, say) raises it from
    poll() or flush(); with a delivery callback, as the sink's producers have, confluent-kafka raises
    a SystemError caused by it instead, which would hide the Kafka error from the explanation and
    from the abort's check of whether the producer is still usable."""
    if isinstance(error, SystemError) and isinstance(error.__cause__, KafkaException):
        return error.__cause__
    return error


def authorization_error(
    options: SinkOptions, what: str, error: KafkaException, *, prefix: str | None
) -> SinkAuthorizationError | None:
    """``error`` as the cluster's authorizer refusing the sink ``what``, naming the ACL the sink's
    principal lacks and what restarting costs; None when ``error`` is no such refusal.

    Restarting once the ACL is granted loses nothing and writes nothing twice: a task refused
    before it committed wrote nothing, and the replay skips the write partitions whose commit marker
    shows the batch committed."""
    code = error_code(error)
    if code == kafka_errors.TRANSACTIONAL_ID_DENIED:
        prefix = prefix or "<transactionalIdPrefix>"
        grant = (
            f"Write and Describe on the transactional ids prefixed '{prefix}' (the sink's ids are "
            f"'{prefix}-<write partition>' and '{prefix}.claim'): kafka-acls.sh --add --allow-principal "
            f"User:<principal> --operation Write --operation Describe --transactional-id '{prefix}' "
            "--resource-pattern-type prefixed"
        )
    elif code == kafka_errors.TOPIC_DENIED:
        output = f"the output topic '{options.topic}'" if options.topic else "every topic the rows name"
        grant = (
            f"Write and Describe on {output}, and Read, Write and Describe on the commit-marker topic "
            f"'{options.marker_topic}'"
        )
    elif code == kafka_errors.CLUSTER_DENIED:
        grant = (
            "IdempotentWrite on the cluster (brokers before Kafka 3.0 ask it of every transactional producer)"
        )
    else:
        return None
    return SinkAuthorizationError(
        f"{what} was refused by the cluster's authorizer ({error.args[0].name()}: {error_reason(error)}). "
        "Grant the sink's "
        f"principal {grant}; then restart the query: nothing is lost, and what other tasks of the batch "
        "committed is not written again"
    )
