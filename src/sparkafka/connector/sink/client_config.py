"""The librdkafka configuration of the sink's producers, from the sink's options."""

from __future__ import annotations

from typing import Any

from sparkafka.connector.kafka_admin import EAGER_CONNECTIONS, LIBRDKAFKA_LOGGER
from sparkafka.connector.sink.options import AT_LEAST_ONCE, EXACTLY_ONCE, SinkOptions


def producer_config(options: SinkOptions, transactional_id: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {**options.client_config, "logger": LIBRDKAFKA_LOGGER}
    config.setdefault("linger.ms", 5)
    # Spark's sink leaves the partition of a keyed row to the Java client's default partitioner,
    # murmur2 of the key (BuiltInPartitioner.partitionForKey); librdkafka's default hashes with CRC32,
    # which would put the same key on another partition than Spark or any Java producer does.
    config.setdefault("partitioner", "murmur2_random")
    # Only failed deliveries call back into Python (see new_cached_producer): one callback per
    # successful record cost about a microsecond of the write task's time per row.
    config.setdefault("delivery.report.only.error", True)
    # An exactly-once task often needs a new producer (its transactional id moved to a worker whose
    # producer for it is fenced): see EAGER_CONNECTIONS.
    for key, value in EAGER_CONNECTIONS.items():
        config.setdefault(key, value)
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
