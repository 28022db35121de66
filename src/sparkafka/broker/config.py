"""Broker settings, named after the Kafka broker configs they mirror."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparkafka.broker.settings import SETTINGS, check_bounds, default_int, default_of


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
    """What the broker runs with. The settings Kafka has are described in
    :data:`sparkafka.broker.settings.SETTINGS` (Kafka name, default, range, meaning): their defaults
    and range checks come from there."""

    host: str = "127.0.0.1"
    port: int = 9092
    data_dir: Path = field(default_factory=default_data_dir)
    node_id: int = 1
    cluster_id: str = "sparkafka-embedded"
    transaction_max_timeout_ms: int = default_int("transaction_max_timeout_ms")
    transaction_abort_check_interval_ms: int = default_int("transaction_abort_check_interval_ms")
    transactional_id_expiration_ms: int = default_int("transactional_id_expiration_ms")
    transactional_id_expiration_check_interval_ms: int = default_int(
        "transactional_id_expiration_check_interval_ms"
    )
    auto_create_topics: bool = bool(default_of("auto_create_topics"))
    default_partitions: int = default_int("default_partitions")
    group_initial_rebalance_delay_ms: int = default_int("group_initial_rebalance_delay_ms")
    group_min_session_timeout_ms: int = default_int("group_min_session_timeout_ms")
    group_max_session_timeout_ms: int = default_int("group_max_session_timeout_ms")
    group_max_size: int = default_int("group_max_size")
    offsets_retention_minutes: int = default_int("offsets_retention_minutes")
    offsets_retention_check_interval_ms: int = default_int("offsets_retention_check_interval_ms")
    offset_metadata_max_bytes: int = default_int("offset_metadata_max_bytes")
    message_max_bytes: int = default_int("message_max_bytes")
    socket_request_max_bytes: int = default_int("socket_request_max_bytes")
    queued_max_request_bytes: int = default_int("queued_max_request_bytes")
    # None: half of the open files the broker may have once it raised its limit (broker.limits).
    max_connections: int | None = None
    max_connections_per_ip: int = default_int("max_connections_per_ip")
    connections_max_idle_ms: int = default_int("connections_max_idle_ms")
    fetch_max_bytes: int = default_int("fetch_max_bytes")
    max_incremental_fetch_session_cache_slots: int = default_int("max_incremental_fetch_session_cache_slots")
    sasl_server_max_receive_size: int = default_int("sasl_server_max_receive_size")
    segment_bytes: int = default_int("segment_bytes")
    retention_ms: int = default_int("retention_ms")
    retention_bytes: int = default_int("retention_bytes")
    # None: flushing is left to the operating system.
    flush_messages: int | None = None
    retention_check_interval_ms: int = default_int("retention_check_interval_ms")
    log_cleaner_backoff_ms: int = default_int("log_cleaner_backoff_ms")
    producer_id_expiration_ms: int = default_int("producer_id_expiration_ms")
    producer_id_expiration_check_interval_ms: int = default_int("producer_id_expiration_check_interval_ms")
    # SASL/PLAIN users; empty means no authentication (PLAINTEXT listener)
    sasl_plain_users: list[SaslUser] = field(default_factory=list)
    connection_failed_authentication_delay_ms: int = default_int("connection_failed_authentication_delay_ms")
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
        check_bounds({setting.field: getattr(self, setting.field) for setting in SETTINGS})
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError(
                f"group.min.session.timeout.ms (--group-min-session-timeout-ms) is "
                f"{self.group_min_session_timeout_ms}, above group.max.session.timeout.ms "
                f"(--group-max-session-timeout-ms) {self.group_max_session_timeout_ms}: no session timeout "
                "would be accepted; lower the first or raise the second"
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
            f"{socket_request_max_bytes}; Kafka's default is {default_of('socket_request_max_bytes')}"
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
