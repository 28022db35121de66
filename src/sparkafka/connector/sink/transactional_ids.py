"""Transactional ids: ``{prefix}-{write partition}``, built and parsed here only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkafka.errors import SparkafkaOptionError

if TYPE_CHECKING:  # for the annotations only: the ids need nothing of the options at run time
    from sparkafka.connector.sink.options import SinkOptions


def transactional_id(prefix: str, write_partition: int) -> str:
    """The transactional id of a write partition: one id per partition, stable across restarts."""
    return f"{prefix}-{write_partition}"


def claim_transactional_id(prefix: str) -> str:
    """The transactional id through which queries race for ``prefix`` (never an id of a write
    partition: those end in ``-<number>``)."""
    return f"{prefix}.claim"


def write_partition_of(transactional_id: str, prefix: str) -> int | None:
    """The write partition ``transactional_id`` was built for with ``prefix``; None when it is not an
    id of that prefix (another prefix that merely starts the same, or no partition number)."""
    head, separator, partition = transactional_id.rpartition("-")
    if head != prefix or not separator or not partition.isdigit():
        return None
    return int(partition)


def prefix_of_any(transactional_id: str) -> str | None:
    """The prefix of ``transactional_id``, whatever its write partition; None when it is not an id
    of a write partition (no ``-<number>`` at its end)."""
    head, separator, partition = transactional_id.rpartition("-")
    return head if separator and partition.isdigit() else None


def prefix_of(transactional_id: str, write_partition: int) -> str:
    """The prefix of ``transactional_id``, built for ``write_partition``."""
    suffix = f"-{write_partition}"
    if not transactional_id.endswith(suffix):
        raise ValueError(
            f"{transactional_id!r} is not the transactional id of write partition {write_partition}"
        )
    return transactional_id[: -len(suffix)]


def default_transactional_id_prefix(query_id: str) -> str:
    """The prefix of a streaming write's transactional ids when ``transactionalIdPrefix`` is not set."""
    return f"sparkafka-{query_id}"


def effective_prefix(options: SinkOptions, query_id: str) -> str:
    """The prefix of a write's transactional ids: ``transactionalIdPrefix`` when set, else the
    default of the streaming query ``query_id``."""
    return options.transactional_id_prefix or default_transactional_id_prefix(query_id)


def require_batch_write_prefix(options: SinkOptions) -> None:
    """An exactly-once ``df.write`` needs ``transactionalIdPrefix``: with the streaming sink's default
    (the query id) two writes of one ``foreachBatch`` call would share transactional ids, and the
    second, finding the first one's commit marker for the micro-batch, would take itself for a
    replay and write nothing."""
    from sparkafka.connector.sink.options import EXACTLY_ONCE

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
