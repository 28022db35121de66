"""The sink's failures told in terms of its options: what went wrong, and the fix."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException

from sparkafka.connector.kafka_admin import error_reason, unreachable_error
from sparkafka.connector.sink.options import OPERATION_TIMEOUT, SinkOptions
from sparkafka.errors import SparkafkaError, TransactionTimeoutError


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
