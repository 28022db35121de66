"""The broker's settings, each described once: its Kafka name, type, default, lower bound, whether
Kafka can change it while running, and the help of its ``sparkafka broker`` option.

Everything else reads this table: :class:`~sparkafka.broker.config.BrokerConfig` takes its field
defaults and its range checks from it, ``sparkafka broker`` builds one option per setting from it,
and DescribeConfigs (:mod:`sparkafka.broker.config_synonyms`) answers each setting under its Kafka
name, with Kafka's type, read-only flag and default. A default written anywhere else is a bug.

The table holds Kafka's own defaults unless a setting says otherwise (``kafka_default``): there the
broker runs with another value, and DescribeConfigs reports that value as set in the broker's
static configuration, as Kafka reports a ``server.properties`` line.

This module imports nothing of the broker: the topic configs, the config dataclass and the command
line all build on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum


class ConfigType(IntEnum):
    """DescribeConfigs' config_type ids (KIP-569)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


_SAME = "same as the default"


@dataclass(frozen=True)
class BrokerSetting:
    """One broker setting.

    ``field`` is its :class:`~sparkafka.broker.config.BrokerConfig` attribute (and, with dashes, its
    option), ``kafka_name`` the Kafka broker config it is, ``minimum`` the lowest value accepted
    (None: checked elsewhere, see ``check_socket_limits``), ``read_only`` False where Kafka can change
    it on a running broker (DynamicBrokerConfig), ``unset`` the value of the option that leaves the
    setting to the broker (its field is then None), and ``kafka_default`` Kafka's default as its
    ConfigDef prints it where this broker's differs (None: Kafka has no default)."""

    field: str
    kafka_name: str
    type: ConfigType
    default: int | bool | None
    help: str
    minimum: int | None = None
    read_only: bool = True
    unset: int | None = None
    kafka_default: str | None = _SAME
    # False for Kafka's internal configs, which its DescribeConfigs does not list either.
    described: bool = True

    @property
    def option(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def kafka_default_text(self) -> str | None:
        """Kafka's default, as DescribeConfigs lists it."""
        return self.text(self.default) if self.kafka_default == _SAME else self.kafka_default

    def text(self, value: int | bool | None) -> str | None:
        """``value`` as Kafka's DescribeConfigs writes a value of this type."""
        if value is None:
            return None
        return str(value).lower() if self.type is ConfigType.BOOLEAN else str(value)


_I, _L, _B = ConfigType.INT, ConfigType.LONG, ConfigType.BOOLEAN
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

SETTINGS: tuple[BrokerSetting, ...] = (
    # -- transactions
    BrokerSetting(
        "transaction_max_timeout_ms",
        "transaction.max.timeout.ms",
        _I,
        900_000,
        "The longest transaction.timeout.ms a producer may ask for.",
        minimum=1,
    ),
    BrokerSetting(
        "transaction_abort_check_interval_ms",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        _I,
        10_000,
        "How often transactions open past their timeout are aborted.",
        minimum=1,
    ),
    BrokerSetting(
        "transactional_id_expiration_ms",
        "transactional.id.expiration.ms",
        _I,
        604_800_000,
        "A transactional id without an open transaction is forgotten once unchanged this long.",
        minimum=1,
    ),
    BrokerSetting(
        "transactional_id_expiration_check_interval_ms",
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        _I,
        3_600_000,
        "How often expired transactional ids are removed.",
        minimum=1,
    ),
    BrokerSetting(
        "producer_id_expiration_ms",
        "producer.id.expiration.ms",
        _I,
        86_400_000,
        "A partition forgets a producer without an open transaction once its last batch is this old.",
        minimum=1,
        read_only=False,
    ),
    BrokerSetting(
        "producer_id_expiration_check_interval_ms",
        "producer.id.expiration.check.interval.ms",
        _I,
        600_000,
        "How often partitions look for expired producers.",
        minimum=1,
        described=False,
    ),
    # -- topics and their logs
    BrokerSetting(
        "auto_create_topics",
        "auto.create.topics.enable",
        _B,
        True,
        "Create a topic a client asks for that does not exist.",
    ),
    BrokerSetting(
        "default_partitions",
        "num.partitions",
        _I,
        1,
        "The partitions of an auto-created topic.",
        minimum=1,
    ),
    BrokerSetting(
        "message_max_bytes",
        "message.max.bytes",
        _I,
        1_048_588,
        "The largest record batch accepted (topics' max.message.bytes unless set).",
        minimum=0,
        read_only=False,
    ),
    BrokerSetting(
        "segment_bytes",
        "log.segment.bytes",
        _I,
        1 << 30,
        "The size of a log segment file (topics' segment.bytes unless set).",
        minimum=1024 * 1024,
        read_only=False,
    ),
    BrokerSetting(
        "retention_ms",
        "log.retention.ms",
        _L,
        7 * 24 * 3600 * 1000,
        "How long a log keeps records (topics' retention.ms unless set); -1: forever.",
        minimum=-1,
        read_only=False,
        # Kafka leaves log.retention.ms unset and keeps 168 hours through log.retention.hours.
        kafka_default=None,
    ),
    BrokerSetting(
        "retention_bytes",
        "log.retention.bytes",
        _L,
        -1,
        "How many bytes a partition's log keeps (topics' retention.bytes unless set); -1: no limit.",
        read_only=False,
    ),
    BrokerSetting(
        "flush_messages",
        "log.flush.interval.messages",
        _L,
        None,
        "fsync once N records were appended since the last fsync (1 = every append); 0 leaves "
        "flushing to the OS: safe against SIGKILL, not power loss.",
        minimum=1,
        read_only=False,
        unset=0,
        kafka_default=str(_LONG_MAX),
    ),
    BrokerSetting(
        "retention_check_interval_ms",
        "log.retention.check.interval.ms",
        _L,
        300_000,
        "How often time and size retention run.",
        minimum=1,
    ),
    BrokerSetting(
        "log_cleaner_backoff_ms",
        "log.cleaner.backoff.ms",
        _L,
        15_000,
        "How long compaction waits when no compacted log is due (dirtier than "
        "min.cleanable.dirty.ratio, or past max.compaction.lag.ms).",
        minimum=1,
        read_only=False,
    ),
    # -- groups
    BrokerSetting(
        "group_initial_rebalance_delay_ms",
        "group.initial.rebalance.delay.ms",
        _I,
        3000,
        "How long a new group waits for more members before its first rebalance.",
        minimum=0,
    ),
    BrokerSetting(
        "group_min_session_timeout_ms",
        "group.min.session.timeout.ms",
        _I,
        6000,
        "The shortest session timeout a group member may ask for (JoinGroup).",
        minimum=0,
    ),
    BrokerSetting(
        "group_max_session_timeout_ms",
        "group.max.session.timeout.ms",
        _I,
        1_800_000,
        "The longest session timeout a group member may ask for (JoinGroup).",
        minimum=0,
    ),
    BrokerSetting(
        "group_max_size",
        "group.max.size",
        _I,
        _INT_MAX,
        "The most members one group may have.",
        minimum=1,
    ),
    BrokerSetting(
        "offsets_retention_minutes",
        "offsets.retention.minutes",
        _I,
        7 * 24 * 60,
        "An empty group's committed offsets (or a standalone consumer's, from its last commit) are "
        "deleted after this long.",
        minimum=1,
    ),
    BrokerSetting(
        "offsets_retention_check_interval_ms",
        "offsets.retention.check.interval.ms",
        _L,
        600_000,
        "How often expired committed offsets are looked for.",
        minimum=1,
    ),
    BrokerSetting(
        "offset_metadata_max_bytes",
        "offset.metadata.max.bytes",
        _I,
        4096,
        "The longest metadata text an offset commit may carry.",
        minimum=0,
    ),
    # -- fetching
    BrokerSetting(
        "fetch_max_bytes",
        "fetch.max.bytes",
        _I,
        57_671_680,
        "The most record bytes one fetch response holds, whatever the request asks for.",
        minimum=1024,
    ),
    BrokerSetting(
        "max_incremental_fetch_session_cache_slots",
        "max.incremental.fetch.session.cache.slots",
        _I,
        1000,
        "The most incremental fetch sessions (KIP-227) kept at once.",
        minimum=0,
    ),
    # -- connections (their bounds are checked together: config.check_socket_limits)
    BrokerSetting(
        "sasl_server_max_receive_size",
        "sasl.server.max.receive.size",
        _I,
        524_288,
        "The largest request a connection may send before it has authenticated.",
        minimum=1,
    ),
    BrokerSetting(
        "socket_request_max_bytes",
        "socket.request.max.bytes",
        _I,
        104_857_600,
        "A request announcing more closes its connection.",
    ),
    BrokerSetting(
        "queued_max_request_bytes",
        "queued.max.request.bytes",
        _L,
        104_857_600,
        "Memory for received requests not yet handled, across connections, before the broker stops "
        "reading (at least --socket-request-max-bytes; -1: no bound, Kafka's default).",
        # Kafka's default, no bound, lets one client's requests fill the memory: here the smallest
        # bound Kafka accepts with its default socket.request.max.bytes.
        kafka_default="-1",
    ),
    BrokerSetting(
        "max_connections",
        "max.connections",
        _I,
        None,
        "Further connections wait, unanswered, until one ends. Default: half the open-file limit "
        "(ulimit -Hn), to which the broker raises its own.",
        read_only=False,
        kafka_default=str(_INT_MAX),
    ),
    BrokerSetting(
        "max_connections_per_ip",
        "max.connections.per.ip",
        _I,
        _INT_MAX,
        "Further connections from one address are closed.",
        read_only=False,
    ),
    BrokerSetting(
        "connections_max_idle_ms",
        "connections.max.idle.ms",
        _L,
        600_000,
        "Close connections idle this long; -1: never.",
    ),
    BrokerSetting(
        "connection_failed_authentication_delay_ms",
        "connection.failed.authentication.delay.ms",
        _I,
        100,
        "How long a failed authentication waits for its answer, after which the connection closes; "
        "it slows password guessing (also for the Schema Registry's wrong passwords).",
        minimum=0,
    ),
)

_BY_FIELD = {setting.field: setting for setting in SETTINGS}
BY_KAFKA_NAME = {setting.kafka_name: setting for setting in SETTINGS}
# The settings DescribeConfigs lists, under their Kafka names.
DESCRIBED = tuple(setting for setting in SETTINGS if setting.described)


def setting(field: str) -> BrokerSetting:
    try:
        return _BY_FIELD[field]
    except KeyError:
        raise KeyError(f"no broker setting {field!r}") from None


def default_of(field: str) -> int | bool | None:
    """The default of the setting kept in :class:`~sparkafka.broker.config.BrokerConfig` ``field``."""
    return setting(field).default


def default_int(field: str) -> int:
    """The default of a numeric setting that has one (for the parts that keep a setting of their own)."""
    default = setting(field).default
    assert isinstance(default, int) and not isinstance(default, bool), field
    return default


def check_bounds(values: Mapping[str, object]) -> None:
    """Refuse the first of ``values`` (setting field -> value) below its setting's lower bound, naming
    the setting, its option and the bound. None stands for a setting left to the broker."""
    for field, value in values.items():
        lowest = setting(field).minimum
        if lowest is not None and isinstance(value, int) and not isinstance(value, bool) and value < lowest:
            found = setting(field)
            raise ValueError(f"{found.kafka_name} ({found.option}) must be at least {lowest}, got {value}")
