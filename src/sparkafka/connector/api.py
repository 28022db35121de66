"""What sparkafka's own tools, command line and package root use of the connector: its one door.

Everything else in the connector may move or change between releases; the tools (``sparkafka
verify``, ``demo``, ``run``, the checkpoint and marker commands), the CLI and ``sparkafka.register``
reach it only through the names below (``tests/unit/test_layout.py`` holds them to that). Spark
itself reaches the connector through the data source (:mod:`sparkafka.connector.datasource`).

Each name is imported on first use, not with this module: the console must not pay for importing
PySpark (which the sink's options need) to list topics, nor a pipeline for the console's admin
helpers. The imports under ``TYPE_CHECKING`` name the same modules for the type checker and for the
layering test's import graph.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkafka.connector.kafka_admin import (
        UNANSWERED_OFFSET,
        LastConnectionFailure,
        is_login_failure,
        most_telling_reason,
        quiet_librdkafka_logger,
    )
    from sparkafka.connector.kafka_errors import PARTITION_GONE, UNAVAILABLE, error_reason
    from sparkafka.connector.kafka_python import kafka_python_settings
    from sparkafka.connector.options import parse_duration_ms
    from sparkafka.connector.sink.fencing import fence_query_transactions
    from sparkafka.connector.sink.options import EXACTLY_ONCE, SinkOptions
    from sparkafka.connector.sink.stage_width import STATUS_URL_SETTING, warm_up
    from sparkafka.connector.sink.task import ADAPTIVE_STATELESS_STREAMING
    from sparkafka.connector.sink.transactional_ids import default_transactional_id_prefix, effective_prefix
    from sparkafka.connector.source.offsets import OWN_ENTRY_PREFIX
    from sparkafka.connector.source.options import SourceOptions

# Public name -> the connector module that defines it.
_WHERE = {
    "UNANSWERED_OFFSET": "kafka_admin",
    "LastConnectionFailure": "kafka_admin",
    "is_login_failure": "kafka_admin",
    "most_telling_reason": "kafka_admin",
    "quiet_librdkafka_logger": "kafka_admin",
    "error_reason": "kafka_errors",
    "PARTITION_GONE": "kafka_errors",
    "UNAVAILABLE": "kafka_errors",
    "kafka_python_settings": "kafka_python",
    "parse_duration_ms": "options",
    "fence_query_transactions": "sink.fencing",
    "EXACTLY_ONCE": "sink.options",
    "SinkOptions": "sink.options",
    "ADAPTIVE_STATELESS_STREAMING": "sink.task",
    "STATUS_URL_SETTING": "sink.stage_width",
    "warm_up": "sink.stage_width",
    "default_transactional_id_prefix": "sink.transactional_ids",
    "effective_prefix": "sink.transactional_ids",
    "OWN_ENTRY_PREFIX": "source.offsets",
    "SourceOptions": "source.options",
}

# Spelled out (not taken from _WHERE) so that linters and type checkers see what is exported.
__all__ = [
    "ADAPTIVE_STATELESS_STREAMING",
    "EXACTLY_ONCE",
    "OWN_ENTRY_PREFIX",
    "PARTITION_GONE",
    "STATUS_URL_SETTING",
    "UNANSWERED_OFFSET",
    "UNAVAILABLE",
    "LastConnectionFailure",
    "SinkOptions",
    "SourceOptions",
    "default_transactional_id_prefix",
    "effective_prefix",
    "error_reason",
    "fence_query_transactions",
    "is_login_failure",
    "kafka_python_settings",
    "most_telling_reason",
    "parse_duration_ms",
    "quiet_librdkafka_logger",
    "warm_up",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sparkafka.connector.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
