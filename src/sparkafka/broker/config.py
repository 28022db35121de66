"""Broker settings, named after the Kafka broker configs they mirror."""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any


def default_data_dir() -> Path:
    """Per-user data directory: $XDG_DATA_HOME/sparkafka/broker, else ~/.local/share/sparkafka/broker."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sparkafka" / "broker"


@dataclass
class SaslUser:
    username: str
    password: str


@dataclass
class SslListener:
    """Kafka's ``listeners=SSL://host:port`` with a PEM keystore (sparkafka.broker.tls)."""

    host: str
    port: int
    # ssl.keystore.certificate.chain / ssl.keystore.location (PEM): the broker's certificate, then
    # any intermediate CAs
    certfile: Path
    # ssl.keystore.key (PEM); None: the key is in certfile
    keyfile: Path | None = None
    # ssl.key.password; None: $SPARKAFKA_BROKER_SSL_KEY_PASSWORD, else an unencrypted key
    key_password: str | None = None
    # ssl.truststore.location (PEM): the CAs client certificates are checked against
    cafile: Path | None = None
    # ssl.client.auth: none, requested or required
    client_auth: str = "none"
    # advertised.listeners' host for this listener: what Metadata and FindCoordinator tell its
    # clients to connect to (the name in the certificate); None: host
    advertised_host: str | None = None

    def __post_init__(self) -> None:
        self.certfile = Path(self.certfile)
        self.keyfile = None if self.keyfile is None else Path(self.keyfile)
        self.cafile = None if self.cafile is None else Path(self.cafile)


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
    # socket.request.max.bytes: a request announcing more closes its connection
    socket_request_max_bytes: int = 104_857_600
    # queued.max.request.bytes: memory for requests received and not yet handled, across connections,
    # before reading pauses (sparkafka.broker.limits). Kafka's default is -1 (no bound); here the
    # smallest bound Kafka accepts with its default socket.request.max.bytes. -1: no bound.
    queued_max_request_bytes: int = 104_857_600
    # max.connections (Kafka: 2147483647): connections beyond it wait until one ends; None: half of
    # the open files the broker may have once it raised its limit (sparkafka.broker.limits).
    max_connections: int | None = None
    # max.connections.per.ip: connections from one address beyond it are closed (Kafka's default)
    max_connections_per_ip: int = 2_147_483_647
    # connections.max.idle.ms: a connection that neither sent nor received for this long is closed;
    # -1 never closes one.
    connections_max_idle_ms: int = 600_000
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
    # A TLS listener beside the plaintext one (Kafka's SSL, or SASL_SSL with SASL users); None: none
    ssl_listener: SslListener | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        check_socket_limits(
            socket_request_max_bytes=self.socket_request_max_bytes,
            queued_max_request_bytes=self.queued_max_request_bytes,
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            connections_max_idle_ms=self.connections_max_idle_ms,
        )
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


def check_socket_limits(
    *,
    socket_request_max_bytes: int,
    queued_max_request_bytes: int,
    max_connections: int | None,
    max_connections_per_ip: int,
    connections_max_idle_ms: int,
) -> None:
    """Kafka's checks of these settings, and refusals of values that would make the broker
    useless (no connection at all, every connection closed at once)."""
    if socket_request_max_bytes < 1:
        raise ValueError(
            f"socket.request.max.bytes (--socket-request-max-bytes) must be at least 1, got "
            f"{socket_request_max_bytes}; Kafka's default is 104857600"
        )
    if queued_max_request_bytes != -1 and queued_max_request_bytes < socket_request_max_bytes:
        raise ValueError(
            f"queued.max.request.bytes (--queued-max-request-bytes) must be larger or equal to "
            f"socket.request.max.bytes ({socket_request_max_bytes}), or -1 for no bound, got "
            f"{queued_max_request_bytes}: raise it or lower socket.request.max.bytes"
        )
    for name, value in (
        ("max.connections", max_connections),
        ("max.connections.per.ip", max_connections_per_ip),
    ):
        if value is not None and value < 1:
            raise ValueError(
                f"{name} (--{name.replace('.', '-')}) must be at least 1, got {value}: with no "
                "connection allowed no client can reach the broker"
            )
    if connections_max_idle_ms < 1 and connections_max_idle_ms != -1:
        raise ValueError(
            f"connections.max.idle.ms (--connections-max-idle-ms) must be at least 1, or -1 to "
            f"never close an idle connection, got {connections_max_idle_ms}"
        )


def default_of(setting: str) -> Any:
    """The default of a :class:`BrokerConfig` field (Kafka's default, or this broker's where it says
    so): written there once, and taken from there by the command line, DescribeConfigs and the
    parts that keep a setting of their own."""
    for candidate in fields(BrokerConfig):
        if candidate.name == setting:
            if candidate.default is MISSING:
                raise KeyError(f"BrokerConfig.{setting} has no plain default")
            return candidate.default
    raise KeyError(f"BrokerConfig has no field {setting!r}")
