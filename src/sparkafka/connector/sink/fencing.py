"""Ending what a transactional id left open: initialising the id once aborts its open transaction
and fences every producer that initialised it before (KIP-98), so none of them can commit any more.

Used by the driver on a narrower replay (the write partitions the run no longer has) and on a
failed write task's id, and by ``sparkafka run`` when it stops a pipeline."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Producer

from sparkafka.connector.sink.client_config import producer_config
from sparkafka.connector.sink.commit_log import registered_transactional_ids
from sparkafka.connector.sink.options import SinkOptions
from sparkafka.connector.sink.ownership import record_initialised_here
from sparkafka.connector.sink.producers import discard_producer

log = logging.getLogger(__name__)


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
    discard_producer(options, transactional_id)
    producer = Producer(producer_config(options, transactional_id))
    try:
        producer.init_transactions(options.operation_timeout_s)
        record_initialised_here(transactional_id)
    finally:
        producer.flush(0)
