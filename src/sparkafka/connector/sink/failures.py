"""The sink's failures told in terms of its options: what went wrong, and the fix."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_admin import KafkaAdmin, unreachable_error
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


# How long the failure message waits for the brokers' transaction.max.timeout.ms (see below).
_LIMIT_LOOKUP_TIMEOUT_S = 10.0


def transaction_timeout_error(options: SinkOptions) -> TransactionTimeoutError:
    """The broker refused the sink's ``kafka.transaction.timeout.ms`` (INVALID_TRANSACTION_TIMEOUT):
    the message names the brokers' ``transaction.max.timeout.ms`` as they answer it (the transaction
    coordinator may be any broker, so the lowest value is the bound), or why it could not be read."""
    limits, unread = _transaction_max_timeouts(options)
    if limits:
        values = sorted(set(limits.values()))
        if len(values) == 1:
            stated = f"is {values[0]} ms"
        else:
            stated = "is " + ", ".join(
                f"{value} ms on broker {node}" for node, value in sorted(limits.items())
            )
        fix = f"lower the sink option kafka.transaction.timeout.ms to at most {values[0]}"
    else:
        stated = unread
        fix = (
            "lower the sink option kafka.transaction.timeout.ms to at most the brokers' "
            "transaction.max.timeout.ms (kafka-configs --describe --entity-type brokers --all shows it)"
        )
    return TransactionTimeoutError(
        f"the sink's transaction timeout kafka.transaction.timeout.ms={options.transaction_timeout_ms} is "
        f"larger than the brokers' transaction.max.timeout.ms, which {stated}, so the broker refused to "
        f"start transactions (INVALID_TRANSACTION_TIMEOUT). Fix: {fix}, or raise "
        "transaction.max.timeout.ms on every broker"
    )


def _transaction_max_timeouts(options: SinkOptions) -> tuple[dict[int, int], str]:
    """Each broker's ``transaction.max.timeout.ms`` (DescribeConfigs, bounded by
    ``_LIMIT_LOOKUP_TIMEOUT_S``), and what to say when there is none."""
    admin = KafkaAdmin(
        options.client_config,
        timeout_s=min(options.operation_timeout_s, _LIMIT_LOOKUP_TIMEOUT_S),
        attempts=1,
        timeout_option=OPERATION_TIMEOUT,
    )
    try:
        answered = admin.broker_setting("transaction.max.timeout.ms")
        return {node: int(value) for node, value in answered.items() if value}, "was answered by no broker"
    except KafkaException as error:
        return {}, f"could not be read ({error_reason(error)})"
    except SparkafkaError:
        return {}, f"could not be read (no answer within {admin.timeout_s:g} s)"
    except ValueError as error:
        return {}, f"could not be read ({error})"
    finally:
        admin.close()


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
