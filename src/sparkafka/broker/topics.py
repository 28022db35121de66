"""Topic metadata: names, ids, partition counts and per-topic configs, persisted in ``topics.json``."""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.log import LogConfig

_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
_MAX_TOPIC_NAME_LENGTH = 249


def _positive_or_minus_one(name: str, value: str) -> int:
    number = int(value)
    if number < -1:
        raise ValueError(f"{name} must be -1 or non-negative")
    return number


def _cleanup_policy(value: str) -> str:
    parts = sorted(p.strip() for p in value.split(","))
    if not parts or any(p not in ("compact", "delete") for p in parts):
        raise ValueError("cleanup.policy must be 'delete', 'compact' or 'compact,delete'")
    return ",".join(parts)


# Topic configs this broker honours, with Kafka's defaults (from the broker config where one applies).
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": "1073741824",
    "max.message.bytes": "1048588",
    "delete.retention.ms": "86400000",
    "min.compaction.lag.ms": "0",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "3600000",
    # Every partition here has one replica, and Kafka requires min(min.insync.replicas, replication
    # factor) in-sync replicas for acks=all (Partition.effectiveMinIsr): one, always met.
    "min.insync.replicas": "1",
}


def validate_topic_configs(configs: dict[str, str]) -> dict[str, str]:
    """Normalised configs, or BrokerError(INVALID_CONFIG) naming the bad key and the accepted values."""
    normalised: dict[str, str] = {}
    for key, value in configs.items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG,
                f"unknown topic config {key!r}; this broker supports: "
                f"{', '.join(sorted(TOPIC_CONFIG_DEFAULTS))}",
            )
        try:
            if key == "cleanup.policy":
                value = _cleanup_policy(value)
            elif key == "message.timestamp.type":
                if value not in ("CreateTime", "LogAppendTime"):
                    raise ValueError("must be CreateTime or LogAppendTime")
            elif key in ("message.timestamp.before.max.ms", "message.timestamp.after.max.ms"):
                if not 0 <= int(value) <= 2**63 - 1:
                    raise ValueError("must be a number of milliseconds from 0 to 9223372036854775807")
            else:
                _positive_or_minus_one(key, value)
        except ValueError as exc:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG, f"invalid value {value!r} for topic config {key}: {exc}"
            ) from exc
        normalised[key] = value
    return normalised


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise BrokerError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} is illegal")
    if len(name) > _MAX_TOPIC_NAME_LENGTH:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} is longer than {_MAX_TOPIC_NAME_LENGTH} characters",
        )
    if not _LEGAL_TOPIC_NAME.match(name):
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'",
        )


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False

    def config(self, key: str, broker: BrokerConfig) -> str:
        if key in self.configs:
            return self.configs[key]
        broker_defaults = {
            "retention.ms": str(broker.retention_ms),
            "retention.bytes": str(broker.retention_bytes),
            "segment.bytes": str(broker.segment_bytes),
            "max.message.bytes": str(broker.message_max_bytes),
        }
        return broker_defaults.get(key, TOPIC_CONFIG_DEFAULTS[key])

    def log_config(self, broker: BrokerConfig) -> LogConfig:
        return LogConfig(
            segment_bytes=int(self.config("segment.bytes", broker)),
            retention_ms=int(self.config("retention.ms", broker)),
            retention_bytes=int(self.config("retention.bytes", broker)),
            cleanup_policy=self.config("cleanup.policy", broker),
            delete_retention_ms=int(self.config("delete.retention.ms", broker)),
            min_compaction_lag_ms=int(self.config("min.compaction.lag.ms", broker)),
            max_message_bytes=int(self.config("max.message.bytes", broker)),
            log_append_time=self.config("message.timestamp.type", broker) == "LogAppendTime",
            timestamp_before_max_ms=int(self.config("message.timestamp.before.max.ms", broker)),
            timestamp_after_max_ms=int(self.config("message.timestamp.after.max.ms", broker)),
            flush_messages=broker.flush_messages,
        )


class TopicRegistry:
    """The set of topics, written atomically to ``topics.json`` on every change."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / "topics.json"
        self.topics: dict[str, Topic] = {}
        if self._path.exists():
            for entry in json.loads(self._path.read_text()):
                topic = Topic(
                    entry["name"],
                    uuid.UUID(entry["id"]),
                    entry["partitions"],
                    entry["configs"],
                    entry.get("internal", False),
                )
                self.topics[topic.name] = topic

    def save(self) -> None:
        payload = [
            {
                "name": t.name,
                "id": str(t.topic_id),
                "partitions": t.partitions,
                "configs": t.configs,
                "internal": t.internal,
            }
            for t in self.topics.values()
        ]
        temporary = self._path.with_suffix(".json.tmp")
        with open(temporary, "w") as handle:
            json.dump(payload, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)
