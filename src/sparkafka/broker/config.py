"""Broker settings, named after the Kafka broker configs they mirror."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def default_data_dir() -> Path:
    """Per-user data directory: $XDG_DATA_HOME/sparkafka/broker, else ~/.local/share/sparkafka/broker."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sparkafka" / "broker"


@dataclass
class SaslUser:
    username: str
    password: str


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    data_dir: Path = field(default_factory=default_data_dir)
    node_id: int = 1
    cluster_id: str = "sparkafka-embedded"
    # transaction.max.timeout.ms
    transaction_max_timeout_ms: int = 900_000
    # How often timed-out transactions are looked for
    # (Kafka: transaction.abort.timed.out.transaction.cleanup.interval.ms)
    transaction_abort_check_interval_ms: int = 10_000
    # transactional.id.expiration.ms and transaction.remove.expired.transaction.cleanup.interval.ms:
    # the coordinator forgets a transactional id with no open transaction once it has not changed
    # for this long.
    transactional_id_expiration_ms: int = 604_800_000
    transactional_id_expiration_check_interval_ms: int = 3_600_000
    # auto.create.topics.enable / num.partitions
    auto_create_topics: bool = True
    default_partitions: int = 1
    # group.initial.rebalance.delay.ms
    group_initial_rebalance_delay_ms: int = 3000
    # message.max.bytes: the largest record batch accepted
    message_max_bytes: int = 1_048_588
    # socket.request.max.bytes
    socket_request_max_bytes: int = 100 * 1024 * 1024
    # log.segment.bytes, log.retention.ms, log.retention.bytes, log.flush.interval.messages
    segment_bytes: int = 1 << 30
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int | None = None
    # log.retention.check.interval.ms
    retention_check_interval_ms: int = 300_000
    # log.cleaner.backoff.ms: how long the log cleaner waits when no compacted log is due
    log_cleaner_backoff_ms: int = 15_000
    # producer.id.expiration.ms and producer.id.expiration.check.interval.ms: a partition forgets a
    # producer without an open transaction once its last batch's timestamp is this old.
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    # SASL/PLAIN users; empty means no authentication (PLAINTEXT listener)
    sasl_plain_users: list[SaslUser] = field(default_factory=list)
    # connection.failed.authentication.delay.ms: how long a connection that failed authentication
    # stays open, unread, before it closes, so one connection guesses at most a password per delay
    connection_failed_authentication_delay_ms: int = 100

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.default_partitions < 1:
            raise ValueError(f"default partitions must be at least 1, got {self.default_partitions}")
        if self.transactional_id_expiration_ms < 1:
            raise ValueError(
                f"transactional.id.expiration.ms must be positive, got {self.transactional_id_expiration_ms}"
            )
        if self.connection_failed_authentication_delay_ms < 0:
            raise ValueError(
                "connection.failed.authentication.delay.ms must not be negative, "
                f"got {self.connection_failed_authentication_delay_ms}"
            )
        if self.transaction_max_timeout_ms < 1:
            raise ValueError(
                f"transaction.max.timeout.ms must be positive, got {self.transaction_max_timeout_ms}"
            )
