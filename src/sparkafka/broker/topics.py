"""Topic metadata: names, ids, partition counts and per-topic configs, persisted in ``topics.json``."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.config_synonyms import inherited_topic_config, kafka_settings, static_broker_configs
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.files import write_file_atomically
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.topic_configs import INT64_MAX, TOPIC_CONFIGS

_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_TOPIC_NAME_LENGTH = 249
# Kafka's Topic.INTERNAL_TOPICS: group offsets, transaction state, share group state.
INTERNAL_TOPIC_NAMES = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def validate_topic_name(name: str) -> None:
    """INVALID_TOPIC_EXCEPTION for a name Kafka refuses, in the words of its Topic.validate."""
    if not name:
        reason = "the empty string is not allowed"
    elif name in (".", ".."):
        reason = f"'{name}' is not allowed"
    elif len(name) > _MAX_TOPIC_NAME_LENGTH:
        reason = f"the length of '{name}' is longer than the max allowed length {_MAX_TOPIC_NAME_LENGTH}"
    elif not _LEGAL_TOPIC_NAME.fullmatch(name):
        reason = f"'{name}' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"
    else:
        return
    raise BrokerError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic name is invalid: {reason}")


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        """As Kafka's Topic.isInternal: a matter of the name alone, also for a topic a client created
        under one of those names."""
        return self.name in INTERNAL_TOPIC_NAMES

    def config(self, key: str, broker: BrokerConfig) -> str:
        """The topic's value of ``key``: its override, else what it inherits from the broker's
        settings, else Kafka's default for the topic config."""
        if key in self.configs:
            return self.configs[key]
        inherited = inherited_topic_config(key, static_broker_configs(kafka_settings(broker)))
        if inherited is not None:
            return inherited
        default = TOPIC_CONFIGS[key].default
        return default if default is not None else ""

    def log_config(self, broker: BrokerConfig) -> LogConfig:
        segment_bytes = self.configs.get("internal.segment.bytes") or self.config("segment.bytes", broker)
        flush_messages = int(self.config("flush.messages", broker))
        return LogConfig(
            segment_bytes=int(segment_bytes),
            index_interval_bytes=int(self.config("index.interval.bytes", broker)),
            segment_index_bytes=int(self.config("segment.index.bytes", broker)),
            retention_ms=int(self.config("retention.ms", broker)),
            # Kafka: any negative retention.bytes is no size limit.
            retention_bytes=max(-1, int(self.config("retention.bytes", broker))),
            cleanup_policy=self.config("cleanup.policy", broker),
            delete_retention_ms=int(self.config("delete.retention.ms", broker)),
            min_compaction_lag_ms=int(self.config("min.compaction.lag.ms", broker)),
            max_compaction_lag_ms=int(self.config("max.compaction.lag.ms", broker)),
            min_cleanable_dirty_ratio=float(self.config("min.cleanable.dirty.ratio", broker)),
            max_message_bytes=int(self.config("max.message.bytes", broker)),
            log_append_time=self.config("message.timestamp.type", broker).strip() == "LogAppendTime",
            timestamp_before_max_ms=int(self.config("message.timestamp.before.max.ms", broker)),
            timestamp_after_max_ms=int(self.config("message.timestamp.after.max.ms", broker)),
            segment_ms=int(self.config("segment.ms", broker)),
            segment_jitter_ms=int(self.config("segment.jitter.ms", broker)),
            flush_messages=None if flush_messages == INT64_MAX else flush_messages,
        )


class TopicRegistry:
    """The set of topics, written atomically to ``topics.json`` on every change."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / "topics.json"
        self.topics: dict[str, Topic] = {}
        # Names whose creation is under way (their files are being made), and topics whose partitions
        # are being added or whose files are being removed; each with the event set once that is done.
        # A name being created is taken, though no request sees the topic until it is whole; other
        # changes of a name wait for the one under way, as Kafka's controller applies changes one
        # after the other.
        self.creating: dict[str, asyncio.Event] = {}
        self.changing: dict[str, asyncio.Event] = {}
        # Partitions being opened by changes under way, counted against the open file limit.
        self.partitions_in_flight = 0
        if self._path.exists():
            try:
                for entry in json.loads(self._path.read_text()):
                    topic = Topic(
                        entry["name"],
                        uuid.UUID(entry["id"]),
                        entry["partitions"],
                        entry["configs"],
                    )
                    self.topics[topic.name] = topic
            except (ValueError, TypeError, KeyError) as error:  # JSONDecodeError is a ValueError
                raise RuntimeError(
                    f"{self._path} is damaged ({type(error).__name__}: {error}), so the broker does not know "
                    "its topics and does not start. Restore the file from a backup; the records are in the "
                    "partition directories beside it (<topic>-<partition>), untouched. Starting without it "
                    "(moving it away) starts with no topics: those directories are then reported as "
                    "orphans, and a topic created again under a name replaces its old directory"
                ) from None

    def save(self) -> None:
        payload = [
            {
                "name": t.name,
                "id": str(t.topic_id),
                "partitions": t.partitions,
                "configs": t.configs,
            }
            for t in self.topics.values()
        ]
        write_file_atomically(self._path, json.dumps(payload, indent=1).encode())

    def check_collision(self, name: str) -> None:
        """Kafka refuses a name that equals an existing one once '.' and '_' are alike (Topic.hasCollision):
        both become the same name in metric names. A name being created exists already, as it does
        for Kafka's controller from the moment it accepted the creation; so does one whose files are
        being removed, until they are gone."""
        if name in self.creating or name in self.changing:
            raise BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        unified = name.replace(".", "_")
        for existing in [*self.topics, *self.creating]:
            if existing != name and existing.replace(".", "_") == unified:
                raise BrokerError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"Topic '{name}' collides with existing topic: {existing}",
                )

    def begin(self, name: str, *, creating: bool = False) -> None:
        """Mark ``name`` as being created, or its topic as changing, until :meth:`end`."""
        assert name not in self.creating and name not in self.changing, f"{name!r} is being changed"
        (self.creating if creating else self.changing)[name] = asyncio.Event()

    def end(self, name: str) -> None:
        for under_way in (self.creating, self.changing):
            event = under_way.pop(name, None)
            if event is not None:
                event.set()

    async def settled(self, names: Iterable[str]) -> None:
        """Wait until none of ``names`` is being created or changed."""
        wanted = set(names)
        while busy := [e for n in wanted for e in (self.creating.get(n), self.changing.get(n)) if e]:
            await busy[0].wait()

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)
