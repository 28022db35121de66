"""Console tools for any Kafka cluster: `produce`, `consume`, `topics`, `groups` and `transactions`.

They are the tools of seed 001's experiment (a console producer, a read_uncommitted and a
read_committed reader) plus what that experiment had to read out of logs: open transactions, committed
offsets and lag, log start/end and last stable offsets. They speak only Kafka's client protocol
(confluent-kafka, and kafka-python for the transaction admin APIs librdkafka lacks), so they work
against `sparkafka broker` and a production cluster alike. Every wait on the network is bounded by
`--timeout`: an unreachable cluster is one line on stderr and exit status 1, never a hang.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka import IsolationLevel as AdminIsolationLevel
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from typer.core import TyperCommand

from sparkafka.cli.command_config import read_command_config
from sparkafka.cli.common import format_table, parse_key_values
from sparkafka.connector.api import (
    PARTITION_GONE,
    UNANSWERED_OFFSET,
    UNAVAILABLE,
    LastConnectionFailure,
    is_login_failure,
    kafka_python_settings,
    most_telling_reason,
    quiet_librdkafka_logger,
)
from sparkafka.errors import SparkafkaOptionError

T = TypeVar("T")


# librdkafka hands its log to this logger (unless the user asks for it on stderr with -X debug=...).
_LIBRDKAFKA_LOGGER, _LIBRDKAFKA_FAILURES = quiet_librdkafka_logger("sparkafka.console.librdkafka")

# The connector's classes of librdkafka's codes: no broker answered, and a topic or partition gone.
_UNREACHABLE_CODES = UNAVAILABLE
_MISSING_TOPIC_CODES = PARTITION_GONE
_GROUP_STATE_NAMES = {
    ConsumerGroupState.STABLE: "Stable",
    ConsumerGroupState.EMPTY: "Empty",
    ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
    ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
    ConsumerGroupState.DEAD: "Dead",
    ConsumerGroupState.UNKNOWN: "Unknown",
}
# Transactions in these states still hold back read_committed readers (their markers are not written).
_OPEN_TRANSACTION_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})

# kafka-python (used by `transactions list`) names its settings differently from librdkafka.

# -- options every tool shares ----------------------------------------------------------------------

BOOTSTRAP_SERVERS_OPTION = typer.Option(
    "localhost:9092",
    "--bootstrap-server",
    "--bootstrap-servers",
    "-b",
    help="HOST:PORT[,HOST:PORT...] of the Kafka cluster (`sparkafka broker` listens on localhost:9092).",
)
TIMEOUT_OPTION = typer.Option(
    10.0,
    "--timeout",
    min=0.1,
    help="Seconds to wait for the cluster to answer before giving up with exit status 1.",
)
COMMAND_CONFIG_OPTION = typer.Option(
    None,
    "--command-config",
    dir_okay=False,
    help="A Kafka client properties file, as Kafka's tools take it (security.protocol, sasl.mechanism, "
    "sasl.jaas.config, ssl.truststore.location with ssl.truststore.type=PEM, ...); -X properties win.",
)
CLIENT_PROPERTY_OPTION = typer.Option(
    [],
    "--client-property",
    "-X",
    help="KEY=VALUE librdkafka client property (repeatable), e.g. -X security.protocol=SASL_PLAINTEXT "
    "-X sasl.mechanism=PLAIN -X sasl.username=USER -X sasl.password=SECRET.",
)


class _CommandWithExample(TyperCommand):
    """A command whose usage line is followed by an example, in --help and in every usage error."""

    example = ""

    def format_usage(self, ctx: Any, formatter: Any) -> None:
        super().format_usage(ctx, formatter)
        if self.example:
            formatter.write(f"Example: {self.example}\n")


def command_with_example(example: str) -> type[TyperCommand]:
    return type("CommandWithExample", (_CommandWithExample,), {"example": example})


ProduceCommand = command_with_example(
    "printf 'k1:aa,bb\\nk2:cc,dd\\n' | sparkafka produce in --key-separator :"
)
ConsumeCommand = command_with_example(
    "sparkafka consume out --from-beginning --isolation-level read_uncommitted --print-time"
)


def _sub_app(help_text: str) -> typer.Typer:
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


topics_app = _sub_app("Create, list, describe, alter and delete topics.")
groups_app = _sub_app("Consumer groups: their members, committed offsets and lag.")
transactions_app = _sub_app("Transactions: which ones are open and hold read_committed readers back.")


# -- errors -----------------------------------------------------------------------------------------


class ConsoleError(Exception):
    """A failure explained in one line for the person at the console; the tool exits with status 1."""


@contextmanager
def reporting_errors(command: str) -> Iterator[None]:
    """Turn the failures a tool expects into `sparkafka COMMAND: message` on stderr and exit status 1."""
    from kafka.errors import KafkaError as KafkaPythonError

    try:
        yield
    except ConsoleError as error:
        _fail(command, str(error))
    except KafkaException as error:
        _fail(command, kafka_error_text(error))
    except KafkaPythonError as error:
        _fail(command, f"{type(error).__name__}: {error}")


def _fail(command: str, message: str) -> None:
    typer.echo(f"sparkafka {command}: {message}", err=True)
    raise typer.Exit(1)


def cannot_reach(bootstrap_servers: str, timeout_s: float, reason: str | None) -> ConsoleError:
    if reason and is_login_failure(reason):
        return ConsoleError(f"authentication with Kafka at {bootstrap_servers} failed: {reason}")
    detail = f" ({reason})" if reason else ""
    return ConsoleError(f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g} s{detail}")


def _error_code(error: KafkaException) -> int | None:
    if error.args and isinstance(error.args[0], KafkaError):
        return int(error.args[0].code())
    return None


def kafka_error_text(error: BaseException | KafkaError) -> str:
    """`topic 'x' already exists (TOPIC_ALREADY_EXISTS)` rather than `KafkaError{code=...,val=...}`."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.str()} ({error.name()})"
    return str(error)


# -- reaching the cluster ---------------------------------------------------------------------------


class Cluster:
    """How to reach one Kafka cluster: bootstrap servers, client properties, and the bound on every wait."""

    def __init__(
        self,
        bootstrap_servers: str,
        timeout_s: float,
        client_properties: list[str],
        command_config: Path | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers.strip()
        if not self.bootstrap_servers:
            raise typer.BadParameter("--bootstrap-server must name at least one HOST:PORT")
        self.timeout_s = timeout_s
        self.command_config = command_config
        try:
            from_file = {} if command_config is None else read_command_config(command_config)
            self.client_properties = {
                **from_file,
                **parse_key_values("--client-property", client_properties),
            }
        except SparkafkaOptionError as error:
            raise typer.BadParameter(str(error)) from None
        # librdkafka reports why it cannot connect (refused, unresolvable, authentication) only here.
        self.client_errors: list[KafkaError] = []

    def client_config(
        self, defaults: dict[str, Any] | None = None, required: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The tool's defaults, overridden by the user's -X properties, overridden by what the tool needs."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "sparkafka-console",
            "error_cb": self.client_errors.append,
            "logger": _LIBRDKAFKA_LOGGER,
            **(defaults or {}),
            **self.client_properties,
            **(required or {}),
        }
        if "debug" in self.client_properties:
            del config["logger"]  # the user asked for librdkafka's own log on stderr
        return config

    def create(self, client_type: Callable[[dict[str, Any]], T], config: dict[str, Any]) -> T:
        try:
            return client_type(config)
        except (KafkaException, ValueError, TypeError) as error:
            given = "" if self.command_config is None else f" (with --command-config {self.command_config})"
            raise typer.BadParameter(
                f"the client properties{given} were rejected: {kafka_error_text(error)}"
            ) from None

    def admin(self) -> AdminClient:
        return self.create(AdminClient, self.client_config())

    def metadata(self, client: AdminClient | Producer | Consumer) -> ClusterMetadata:
        """Every topic's metadata; also the reachability check each tool starts with.

        All topics are asked for: a metadata request naming one topic may auto-create it."""
        try:
            metadata: ClusterMetadata = client.list_topics(timeout=self.timeout_s)
        except KafkaException as error:
            client.poll(0)  # serves error_cb, which knows why (a consumer has nothing assigned yet)
            raise self.failure(error, "reading cluster metadata") from None
        return metadata

    def failure(self, error: KafkaException, action: str) -> ConsoleError:
        """`cannot reach Kafka at HOST:PORT within 10 s (Connection refused)`, or what else went wrong."""
        code = _error_code(error)
        if code is None or code in _UNREACHABLE_CODES:
            return cannot_reach(self.bootstrap_servers, self.timeout_s, self._reason())
        return ConsoleError(f"{action} failed: {kafka_error_text(error)}")

    def _reason(self) -> str | None:
        reasons = [e.str() for e in self.client_errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        return most_telling_reason(reasons) or _LIBRDKAFKA_FAILURES.last

    def wait(self, future: Future[T], action: str) -> T:
        """The result of an admin call, bounded by the timeout, failures told in one line."""
        try:
            return future.result(timeout=self.timeout_s + 1.0)
        except FutureTimeoutError:
            raise ConsoleError(
                f"Kafka at {self.bootstrap_servers} did not answer within {self.timeout_s:g} s ({action})"
            ) from None
        except KafkaException as error:
            if _error_code(error) in _UNREACHABLE_CODES:
                raise ConsoleError(
                    f"Kafka at {self.bootstrap_servers} did not answer within {self.timeout_s:g} s "
                    f"({action}: {kafka_error_text(error)})"
                ) from None
            raise ConsoleError(f"{action} failed: {kafka_error_text(error)}") from None

    def request_timeouts(self) -> dict[str, float]:
        return {"request_timeout": self.timeout_s}


def topic_partitions(metadata: ClusterMetadata, topic: str) -> list[int]:
    """The topic's sorted partition numbers, or a clear error if it does not exist."""
    described = metadata.topics.get(topic)
    if described is None or (described.error is not None and described.error.code() in _MISSING_TOPIC_CODES):
        raise ConsoleError(
            f"topic {topic!r} does not exist (create it with: sparkafka topics create {topic})"
        )
    if described.error is not None:
        raise ConsoleError(f"topic {topic!r}: {kafka_error_text(described.error)}")
    return sorted(described.partitions)


def _check_partition(topic: str, partition: int | None, partitions: list[int]) -> None:
    if partition is not None and partition not in partitions:
        raise ConsoleError(
            f"topic {topic!r} has no partition {partition}; its partitions are 0..{len(partitions) - 1}"
        )


class _StopRequested:
    """Set by SIGINT/SIGTERM, so a loop can finish its current step and close its client cleanly."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    @contextmanager
    def installed(self) -> Iterator[_StopRequested]:
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


# -- produce ----------------------------------------------------------------------------------------


class _RecordWriter:
    """Sends records through a producer and counts what the cluster acknowledged."""

    def __init__(self, producer: Producer, topic: str, partition: int | None) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = -1 if partition is None else partition  # -1: librdkafka's partitioner picks one
        self.sent = 0
        self.acknowledged = 0
        self.failures: list[KafkaError] = []

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.acknowledged += 1
        else:
            self.failures.append(error)

    def send(self, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(
                    self.topic, value=value, key=key, partition=self.partition, on_delivery=self._on_delivery
                )
                break
            except BufferError:
                self.producer.poll(0.1)  # the local queue is full: serve acknowledgements until there is room
        self.sent += 1
        self.producer.poll(0)

    def flush(self, timeout_s: float) -> None:
        unacknowledged = self.producer.flush(timeout_s)
        if unacknowledged:
            raise ConsoleError(f"{unacknowledged} records were not acknowledged within {timeout_s:g} s")
        self.raise_failures()

    def raise_failures(self) -> None:
        if self.failures:
            raise ConsoleError(
                f"{len(self.failures)} of {self.sent} records were not written "
                f"({self.acknowledged} were): {kafka_error_text(self.failures[0])}"
            )


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        yield line.rstrip(b"\n").removesuffix(b"\r")


def _split_key(line: bytes, separator: bytes | None, line_number: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, found, value = line.partition(separator)
    if not found:
        raise ConsoleError(f"line {line_number} has no key separator {separator.decode()!r}: {line[:80]!r}")
    return key, value


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def produce(
    topic: str = typer.Argument(..., metavar="TOPIC", help="Topic to write; it must exist."),
    file: Path | None = typer.Option(
        None,
        "--file",
        "-f",
        exists=True,
        dir_okay=False,
        readable=True,
        help="Read records from this file, one per line [default: standard input].",
    ),
    key_separator: str | None = typer.Option(
        None,
        "--key-separator",
        help="Each line is KEY<SEP>VALUE, split at the first SEP; a line without SEP is an error "
        "[default: whole lines are values, keys are null].",
    ),
    partition: int | None = typer.Option(
        None, "--partition", min=0, help="Write every record to this partition [default: by key hash]."
    ),
    transactional_id: str | None = typer.Option(
        None,
        "--transactional-id",
        help="Write all lines in one transaction, committed at end of input (aborted on Ctrl-C), "
        "so read_committed readers see them only then.",
    ),
    transaction_timeout_ms: int = typer.Option(
        60_000,
        "--transaction-timeout-ms",
        min=1,
        help="With --transactional-id: the coordinator aborts the transaction if input takes longer.",
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Write lines from standard input or a file as records (acks=all, idempotent); print how many.

    Like Kafka's kafka-console-producer.sh: one record per line, the line without its newline is the
    value (UTF-8 bytes as given).
    """
    if key_separator == "":
        raise typer.BadParameter("--key-separator must not be empty")
    with reporting_errors("produce"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        timeout_ms = int(timeout * 1000)
        defaults: dict[str, Any] = {
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            # Java's partitioner: a key lands on the partition Kafka's Java clients (and Spark) choose.
            "partitioner": "murmur2_random",
            # A record the cluster does not take within the timeout fails instead of waiting forever.
            "message.timeout.ms": timeout_ms,
        }
        required: dict[str, Any] = {}
        if transactional_id is not None:
            # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
            defaults["message.timeout.ms"] = min(timeout_ms, transaction_timeout_ms)
            required = {
                "transactional.id": transactional_id,
                "transaction.timeout.ms": transaction_timeout_ms,
            }
        producer = cluster.create(Producer, cluster.client_config(defaults, required))
        partitions = topic_partitions(cluster.metadata(producer), topic)
        _check_partition(topic, partition, partitions)
        writer = _RecordWriter(producer, topic, partition)
        separator = None if key_separator is None else key_separator.encode()
        if sys.stdin.isatty() and file is None:
            shape = "VALUE" if key_separator is None else f"KEY{key_separator}VALUE"
            typer.echo(f"type one record per line ({shape}); Ctrl-D ends the input", err=True)
        if transactional_id is not None:
            _produce_in_transaction(cluster, producer, writer, file, separator, transactional_id)
            typer.echo(
                f"wrote {_plural(writer.acknowledged, 'record')} to {topic} "
                f"in transaction {transactional_id} (committed)"
            )
        else:
            _produce_each(cluster, writer, file, separator)
            typer.echo(f"wrote {_plural(writer.acknowledged, 'record')} to {topic}")


@contextmanager
def _open_input(file: Path | None) -> Iterator[IO[bytes]]:
    if file is None:
        yield sys.stdin.buffer
    else:
        with file.open("rb") as source:
            yield source


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, even in a blocking read of stdin.

    SIGINT too: a process started in the background by a non-interactive shell inherits it ignored."""
    previous = {s: signal.signal(s, signal.default_int_handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _produce_each(
    cluster: Cluster, writer: _RecordWriter, file: Path | None, separator: bytes | None
) -> None:
    """Without a transaction each line is sent as it is read; Ctrl-C is a normal way to stop typing."""
    with _signals_as_interrupt():
        try:
            with _open_input(file) as source:
                for line_number, line in enumerate(_lines(source), start=1):
                    writer.send(*_split_key(line, separator, line_number))
        except KeyboardInterrupt:
            pass  # like the end of input: what was sent is still flushed and counted
        except ConsoleError as error:
            writer.producer.flush(cluster.timeout_s)
            raise ConsoleError(f"{error}; {writer.acknowledged} records before it were written") from None
        try:
            writer.flush(cluster.timeout_s)
        except KeyboardInterrupt:
            raise ConsoleError(
                f"interrupted while waiting for acknowledgements: {writer.acknowledged} of "
                f"{writer.sent} records were acknowledged"
            ) from None


def _produce_in_transaction(
    cluster: Cluster,
    producer: Producer,
    writer: _RecordWriter,
    file: Path | None,
    separator: bytes | None,
    transactional_id: str,
) -> None:
    try:
        producer.init_transactions(cluster.timeout_s)
    except KafkaException as error:
        raise cluster.failure(error, f"starting transactions for {transactional_id!r}") from None
    producer.begin_transaction()
    committing = False
    with _signals_as_interrupt():
        try:
            with _open_input(file) as source:
                for line_number, line in enumerate(_lines(source), start=1):
                    writer.send(*_split_key(line, separator, line_number))
            producer.flush(cluster.timeout_s)
            writer.raise_failures()
            committing = True
            producer.commit_transaction(cluster.timeout_s)
        except KeyboardInterrupt:
            if committing:
                raise ConsoleError(
                    f"interrupted while committing transaction {transactional_id}; whether it committed "
                    "shows in: sparkafka transactions list --all"
                ) from None
            _abort(cluster, producer)
            typer.echo(f"interrupted: transaction {transactional_id} aborted, no records written", err=True)
            raise typer.Exit(130) from None
        except (ConsoleError, KafkaException) as error:
            _abort(cluster, producer)
            detail = str(error) if isinstance(error, ConsoleError) else kafka_error_text(error)
            raise ConsoleError(
                f"{detail}; transaction {transactional_id} aborted, no records written"
            ) from None


def _abort(cluster: Cluster, producer: Producer) -> None:
    """Abort the open transaction, deaf to a second Ctrl-C (the wait is bounded by the timeout)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # If this fails too, the coordinator aborts the transaction once transaction.timeout.ms has passed.
        with suppress(KafkaException):
            producer.abort_transaction(cluster.timeout_s)
    finally:
        signal.signal(signal.SIGINT, previous)


# -- consume ----------------------------------------------------------------------------------------


class IsolationLevel(StrEnum):
    read_committed = "read_committed"
    read_uncommitted = "read_uncommitted"


def iso_timestamp(epoch_ms: int) -> str:
    """1795255200123 -> 2026-11-21T10:00:00.123Z"""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_CONTROL_CHARACTERS = {code: f"\\x{code:02x}" for code in range(32)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def render_bytes(data: bytes | None) -> str:
    """A key or value on one line: UTF-8 text, undecodable bytes and control characters escaped."""
    if data is None:
        return "null"
    return data.decode("utf-8", errors="backslashreplace").translate(_CONTROL_CHARACTERS)


def format_record(message: Message, received_ms: int | None = None) -> str:
    """`partition=0 offset=3 timestamp=2026-11-21T10:00:00.123Z (1795...) key=null value=EVENT(xx,yy)`"""
    timestamp_type, timestamp_ms = message.timestamp()
    timestamp = (
        "none"
        if timestamp_type == TIMESTAMP_NOT_AVAILABLE
        else f"{iso_timestamp(timestamp_ms)} ({timestamp_ms})"
    )
    fields = [
        f"partition={message.partition()}",
        f"offset={message.offset()}",
        f"timestamp={timestamp}",
        f"key={render_bytes(message.key())}",
        f"value={render_bytes(message.value())}",
    ]
    if received_ms is not None:
        fields.insert(0, f"received={iso_timestamp(received_ms)}")
    return " ".join(fields)


def consume(
    topic: str = typer.Argument(..., metavar="TOPIC", help="Topic to read."),
    isolation_level: IsolationLevel = typer.Option(
        IsolationLevel.read_committed,
        "--isolation-level",
        case_sensitive=False,
        help="read_committed skips aborted records and waits for open transactions; "
        "read_uncommitted shows every record as soon as it is written.",
    ),
    from_beginning: bool = typer.Option(
        False,
        "--from-beginning",
        help="Start at the earliest offset [default: only records written from now on]; "
        "with --group, only when the group has no committed offset yet.",
    ),
    group: str | None = typer.Option(
        None,
        "--group",
        "-g",
        help="Join this consumer group and commit what was printed [default: read all partitions, "
        "commit nothing].",
    ),
    partition: int | None = typer.Option(
        None, "--partition", min=0, help="Read only this partition (not with --group)."
    ),
    max_messages: int | None = typer.Option(
        None, "--max-messages", min=1, help="Exit after printing this many records."
    ),
    timeout_ms: int | None = typer.Option(
        None,
        "--timeout-ms",
        min=1,
        help="Exit after this many milliseconds without a new record [default: run until Ctrl-C].",
    ),
    print_time: bool = typer.Option(
        False, "--print-time", help="Start each line with received=TIME, when the record arrived here."
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print a topic's records, one line each, until Ctrl-C/SIGTERM, --max-messages or --timeout-ms.

    Each line: partition=P offset=O timestamp=ISO (MS) key=K value=V (null for a missing key).
    """
    if group is not None and partition is not None:
        raise typer.BadParameter("--partition reads without a group; it cannot be combined with --group")
    with reporting_errors("consume"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        defaults: dict[str, Any] = {
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "enable.auto.commit": group is not None,
            "auto.commit.interval.ms": 1000,
        }
        required: dict[str, Any] = {
            # librdkafka needs a group id even for assign(); a unique one commits nothing and joins nothing.
            "group.id": group if group is not None else f"sparkafka-console-{uuid.uuid4().hex[:12]}",
            "isolation.level": isolation_level.value,
            # Commit only what was printed: positions are stored by hand once their records are out.
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
        }
        consumer = cluster.create(Consumer, cluster.client_config(defaults, required))
        try:
            partitions = topic_partitions(cluster.metadata(consumer), topic)
            _check_partition(topic, partition, partitions)
            if group is not None:
                consumer.subscribe([topic])
            else:
                start = OFFSET_BEGINNING if from_beginning else OFFSET_END
                chosen = partitions if partition is None else [partition]
                consumer.assign([TopicPartition(topic, p, start) for p in chosen])
            printed = _print_records(
                cluster, consumer, group is not None, max_messages, timeout_ms, print_time
            )
        finally:
            closed = _close_within(consumer, cluster.timeout_s)
        typer.echo(f"consumed {_plural(printed, 'record')}", err=True)
        if not closed:
            typer.echo(
                f"sparkafka consume: warning: Kafka at {cluster.bootstrap_servers} did not answer while "
                f"closing within {cluster.timeout_s:g} s; the last offsets may not be committed",
                err=True,
            )


def _close_within(consumer: Consumer, timeout_s: float) -> bool:
    """Close the consumer (with a group: commit the stored offsets, leave the group) in bounded time.

    With the coordinator gone, librdkafka's close waits up to session.timeout.ms (45 s) to leave the
    group; a console tool stopped with Ctrl-C must not, so the close runs in a thread left behind."""
    closer = threading.Thread(target=consumer.close, name="consumer-close", daemon=True)
    closer.start()
    closer.join(timeout_s)
    return not closer.is_alive()


def _print_records(
    cluster: Cluster,
    consumer: Consumer,
    store_offsets: bool,
    max_messages: int | None,
    idle_timeout_ms: int | None,
    print_time: bool,
) -> int:
    printed = 0
    last_record_at = time.monotonic()
    warned_codes: set[int] = set()
    seen_client_errors = 0
    with _StopRequested().installed() as stop:
        while stop.signal_name is None:
            wanted = 500 if max_messages is None else min(500, max_messages - printed)
            messages = consumer.consume(wanted, timeout=0.2)
            lines = []
            for message in messages:
                error = message.error()
                if error is not None:
                    _handle_record_error(error, warned_codes)
                    continue
                received_ms = time.time_ns() // 1_000_000 if print_time else None
                lines.append(format_record(message, received_ms))
            if lines:
                printed += len(lines)
                last_record_at = time.monotonic()
                if not _write_lines(lines):
                    break
            if store_offsets:
                _store_positions(consumer)
            seen_client_errors = _handle_client_errors(cluster, seen_client_errors, warned_codes)
            if max_messages is not None and printed >= max_messages:
                break
            if idle_timeout_ms is not None and time.monotonic() - last_record_at >= idle_timeout_ms / 1000:
                break
    return printed


def _store_positions(consumer: Consumer) -> None:
    """Store (for the next auto-commit) each assigned partition's position after the printed records.

    The position, not the last record's offset + 1, because it also steps over transaction markers:
    committing `last + 1` would leave a read_committed group a lag of 1 behind every commit marker."""
    with suppress(KafkaException):  # a partition revoked by a rebalance meanwhile: its owner commits
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        if positions:
            consumer.store_offsets(offsets=positions)


def _write_lines(lines: list[str]) -> bool:
    """False once stdout is gone (e.g. `| head`), which ends the tool quietly."""
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    return True


def _handle_record_error(error: KafkaError, warned_codes: set[int]) -> None:
    if error.fatal() or error.code() in _MISSING_TOPIC_CODES or "AUTHORIZATION" in error.name():
        raise ConsoleError(kafka_error_text(error))
    if error.code() not in warned_codes:  # librdkafka keeps retrying these; say so once
        warned_codes.add(error.code())
        typer.echo(f"sparkafka consume: warning: {kafka_error_text(error)}", err=True)


def _handle_client_errors(cluster: Cluster, seen: int, warned_codes: set[int]) -> int:
    for error in cluster.client_errors[seen:]:
        if error.fatal() or error.code() == KafkaError._AUTHENTICATION:
            raise ConsoleError(kafka_error_text(error))
        if error.code() == KafkaError._ALL_BROKERS_DOWN and error.code() not in warned_codes:
            warned_codes.add(error.code())
            typer.echo(
                f"sparkafka consume: warning: lost the connection to Kafka at {cluster.bootstrap_servers}; "
                "still retrying (Ctrl-C to stop)",
                err=True,
            )
    return len(cluster.client_errors)


# -- topics -----------------------------------------------------------------------------------------


def _config_option(values: list[str], example: str) -> dict[str, str]:
    """``--config KEY=VALUE`` values as a dict; a malformed one is a usage error showing ``example``."""
    try:
        return parse_key_values("--config", values)
    except SparkafkaOptionError as error:
        raise typer.BadParameter(f"{error} (for example --config {example})") from None


@topics_app.command(
    "create",
    cls=command_with_example("sparkafka topics create out --partitions 3 --config retention.ms=86400000"),
)
def topics_create(
    name: str = typer.Argument(..., metavar="NAME", help="Name of the new topic."),
    partitions: int = typer.Option(1, "--partitions", "-p", min=1, help="Number of partitions."),
    replication_factor: int | None = typer.Option(
        None, "--replication-factor", min=1, help="Copies of each partition [default: the cluster's default]."
    ),
    config: list[str] = typer.Option(
        [],
        "--config",
        "-c",
        help="KEY=VALUE topic config (repeatable), e.g. --config cleanup.policy=compact.",
    ),
    if_not_exists: bool = typer.Option(False, "--if-not-exists", help="Succeed if the topic already exists."),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Create a topic."""
    configs = _config_option(config, "retention.ms=86400000")
    with reporting_errors("topics create"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        existing = cluster.metadata(admin).topics
        if name in existing:
            if if_not_exists:
                typer.echo(f"topic {name} already exists")
                return
            raise ConsoleError(f"topic {name!r} already exists")
        # -1 asks for the cluster's default.replication.factor (CreateTopics v4+, Kafka 2.4+).
        new_topic = NewTopic(
            name, num_partitions=partitions, replication_factor=replication_factor or -1, config=configs
        )
        futures = admin.create_topics(
            [new_topic], operation_timeout=cluster.timeout_s, request_timeout=cluster.timeout_s
        )
        cluster.wait(futures[name], f"creating topic {name!r}")
        typer.echo(f"created topic {name} with {_plural(partitions, 'partition')}")


@topics_app.command("list", cls=command_with_example("sparkafka topics list --bootstrap-servers kafka:9092"))
def topics_list(
    include_internal: bool = typer.Option(
        False, "--include-internal", help="Also list internal topics such as __consumer_offsets."
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print the names of the cluster's topics, one a line."""
    with reporting_errors("topics list"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        names = sorted(cluster.metadata(cluster.admin()).topics)
        for name in names:
            if include_internal or not name.startswith("__"):
                typer.echo(name)


@topics_app.command("describe", cls=command_with_example("sparkafka topics describe out"))
def topics_describe(
    name: str = typer.Argument(..., metavar="NAME", help="Topic to describe."),
    all_configs: bool = typer.Option(
        False, "--all-configs", help="List every config with its source, not only the topic's overrides."
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print a topic's partitions (leader, replicas, log start/end and last stable offsets) and configs."""
    with reporting_errors("topics describe"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        metadata = cluster.metadata(admin)
        partitions = topic_partitions(metadata, name)
        described = metadata.topics[name]
        offsets = _log_offsets(cluster, admin, [TopicPartition(name, p) for p in partitions])
        resource = ConfigResource(ResourceType.TOPIC, name)
        entries = cluster.wait(
            admin.describe_configs([resource], **cluster.request_timeouts())[resource], "reading configs"
        )

        replication = len(described.partitions[partitions[0]].replicas) if partitions else 0
        typer.echo(f"topic={name} partitions={len(partitions)} replication-factor={replication}")
        overrides = [e for e in entries.values() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value]
        shown = sorted(entries.values() if all_configs else overrides, key=lambda e: e.name)
        if all_configs:
            typer.echo("configs:")
            for line in format_table(
                ["NAME", "VALUE", "SOURCE"],
                [(e.name, _config_value(e), ConfigSource(e.source).name) for e in shown],
            ):
                typer.echo(f"  {line}")
        else:
            listed = " ".join(f"{e.name}={_config_value(e)}" for e in shown) or "(none)"
            typer.echo(f"configs: {listed}  (topic overrides; --all-configs lists every config)")
        rows = []
        held_back = []
        for p in partitions:
            info = described.partitions[p]
            start, end, stable = offsets[(name, p)]
            rows.append((p, info.leader, _ids(info.replicas), _ids(info.isrs), start, end, stable))
            if stable < end:
                held_back.append((p, stable))
        for line in format_table(
            [
                "PARTITION",
                "LEADER",
                "REPLICAS",
                "ISR",
                "LOG-START-OFFSET",
                "LOG-END-OFFSET",
                "LAST-STABLE-OFFSET",
            ],
            rows,
        ):
            typer.echo(line)
        for p, stable in held_back:
            typer.echo(
                f"partition {p}: read_committed readers wait at offset {stable} for an open transaction "
                "(see: sparkafka transactions list)"
            )


def _config_value(entry: Any) -> str:
    return "(sensitive)" if entry.is_sensitive else str(entry.value)


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _log_offsets(
    cluster: Cluster, admin: AdminClient, partitions: list[TopicPartition]
) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(log start offset, log end offset = high watermark, last stable offset) per partition."""
    if not partitions:
        return {}
    found: dict[tuple[str, int], list[int]] = {(tp.topic, tp.partition): [] for tp in partitions}
    for spec, isolation in (
        (OffsetSpec.earliest(), AdminIsolationLevel.READ_UNCOMMITTED),
        (OffsetSpec.latest(), AdminIsolationLevel.READ_UNCOMMITTED),
        (OffsetSpec.latest(), AdminIsolationLevel.READ_COMMITTED),
    ):
        futures = admin.list_offsets(
            {tp: spec for tp in partitions}, isolation_level=isolation, **cluster.request_timeouts()
        )
        for tp, future in futures.items():
            offset = cluster.wait(future, "listing offsets").offset
            if offset == UNANSWERED_OFFSET:
                # librdkafka's report of a partition whose leader request failed, with no error
                raise ConsoleError(
                    f"{tp.topic}-{tp.partition}: its leader did not answer ListOffsets "
                    "(the connection to it failed); run the command again"
                )
            found[(tp.topic, tp.partition)].append(offset)
    return {key: (values[0], values[1], values[2]) for key, values in found.items()}


@topics_app.command(
    "alter",
    cls=command_with_example(
        "sparkafka topics alter out --config retention.ms=3600000 --delete-config max.message.bytes"
    ),
)
def topics_alter(
    name: str = typer.Argument(..., metavar="NAME", help="Topic whose configs to change."),
    config: list[str] = typer.Option(
        [], "--config", "-c", help="KEY=VALUE topic config to set (repeatable), e.g. retention.ms=3600000."
    ),
    delete_config: list[str] = typer.Option(
        [], "--delete-config", "-d", help="Topic config to reset to the cluster's default (repeatable)."
    ),
    validate_only: bool = typer.Option(
        False, "--validate-only", help="Ask the cluster to check the change without making it."
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Set or reset topic configs; the others keep their values (Kafka's IncrementalAlterConfigs)."""
    configs = _config_option(config, "retention.ms=3600000")
    if not configs and not delete_config:
        raise typer.BadParameter("nothing to change: give --config KEY=VALUE or --delete-config KEY")
    if both := sorted(set(configs) & set(delete_config)):
        raise typer.BadParameter(f"{', '.join(both)}: given to both --config and --delete-config")
    changes = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    changes += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete_config]
    with reporting_errors("topics alter"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        if name not in cluster.metadata(admin).topics:
            raise ConsoleError(f"topic {name!r} does not exist")
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=changes)
        futures = admin.incremental_alter_configs(
            [resource], validate_only=validate_only, **cluster.request_timeouts()
        )
        cluster.wait(futures[resource], f"altering the configs of topic {name!r}")
        done = [f"set {k}={v}" for k, v in configs.items()] + [f"reset {k}" for k in delete_config]
        verb = "would alter" if validate_only else "altered"
        typer.echo(f"{verb} topic {name}: {'; '.join(done)}")


@topics_app.command("delete", cls=command_with_example("sparkafka topics delete out"))
def topics_delete(
    name: str = typer.Argument(..., metavar="NAME", help="Topic to delete, with all its records."),
    if_exists: bool = typer.Option(False, "--if-exists", help="Succeed if the topic does not exist."),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Delete a topic."""
    with reporting_errors("topics delete"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        if name not in cluster.metadata(admin).topics:
            if if_exists:
                typer.echo(f"topic {name} does not exist")
                return
            raise ConsoleError(f"topic {name!r} does not exist")
        futures = admin.delete_topics(
            [name], operation_timeout=cluster.timeout_s, request_timeout=cluster.timeout_s
        )
        cluster.wait(futures[name], f"deleting topic {name!r}")
        typer.echo(f"deleted topic {name}")


# -- groups -----------------------------------------------------------------------------------------


def _group_state(state: Any) -> str:
    if isinstance(state, ConsumerGroupState):
        return _GROUP_STATE_NAMES.get(state, state.name)
    return str(state)


@groups_app.command("list", cls=command_with_example("sparkafka groups list"))
def groups_list(
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print the cluster's consumer groups and their states."""
    with reporting_errors("groups list"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        cluster.metadata(admin)
        result = cluster.wait(admin.list_consumer_groups(**cluster.request_timeouts()), "listing groups")
        for error in result.errors:
            typer.echo(f"sparkafka groups list: warning: {kafka_error_text(error)}", err=True)
        listings = sorted(result.valid, key=lambda listing: listing.group_id)
        if not listings:
            typer.echo("no consumer groups", err=True)
            return
        for line in format_table(["GROUP", "STATE"], [(g.group_id, _group_state(g.state)) for g in listings]):
            typer.echo(line)


_GROUP_OFFSET_HEADERS = [
    *("TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET", "LAG"),
    *("LAST-STABLE-OFFSET", "CONSUMER-ID", "HOST", "CLIENT-ID"),
]


@groups_app.command("describe", cls=command_with_example("sparkafka groups describe my-group"))
def groups_describe(
    group: str = typer.Argument(..., metavar="GROUP", help="Consumer group id."),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print a group's state and members, and per partition its committed offset, log end offset and lag.

    Lag is log end offset (high watermark) minus committed offset. A read_committed member cannot get
    past LAST-STABLE-OFFSET while a transaction on the partition is open.
    """
    with reporting_errors("groups describe"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        admin = cluster.admin()
        cluster.metadata(admin)
        try:
            description = cluster.wait(
                admin.describe_consumer_groups([group], **cluster.request_timeouts())[group],
                "describing group",
            )
            state, members = _group_state(description.state), list(description.members)
            assignor = description.partition_assignor
        except ConsoleError as error:
            if "GROUP_ID_NOT_FOUND" not in str(error):  # DescribeGroups v6+ says so instead of state Dead
                raise
            state, members, assignor = "Dead", [], ""
        committed = _committed_offsets(cluster, admin, group)
        if state == "Dead" and not committed:
            raise ConsoleError(f"consumer group {group!r} does not exist")
        owners = {(tp.topic, tp.partition): m for m in members for tp in m.assignment.topic_partitions}

        typer.echo(f"group={group} state={state} assignor={assignor or '-'} members={len(members)}")
        keys = sorted(set(committed) | set(owners))
        if not keys:
            typer.echo("no committed offsets and no assigned partitions")
        else:
            offsets = _log_offsets(cluster, admin, [TopicPartition(topic, p) for topic, p in keys])
            rows = []
            for key in keys:
                _, end, stable = offsets[key]
                position, owner = committed.get(key), owners.get(key)
                lag = "-" if position is None else max(0, end - position)
                member = (owner.member_id, owner.host, owner.client_id) if owner else ("-", "-", "-")
                rows.append((*key, "-" if position is None else position, end, lag, stable, *member))
            for line in format_table(_GROUP_OFFSET_HEADERS, rows):
                typer.echo(line)
        for member in members:
            if not member.assignment.topic_partitions:
                typer.echo(f"member {member.member_id} ({member.client_id}, {member.host}) has no partitions")


def _committed_offsets(cluster: Cluster, admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    request = [ConsumerGroupTopicPartitions(group)]
    result = cluster.wait(
        admin.list_consumer_group_offsets(request, **cluster.request_timeouts())[group],
        "reading committed offsets",
    )
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions or []
        if tp.error is None and tp.offset != OFFSET_INVALID
    }


# -- transactions -----------------------------------------------------------------------------------


def _kafka_python_settings(cluster: Cluster) -> dict[str, Any]:
    settings, ignored = kafka_python_settings(cluster.client_properties)
    for key in ignored:
        typer.echo(f"sparkafka transactions list: warning: ignoring client property {key}", err=True)
    return settings


@contextmanager
def _kafka_python_admin(cluster: Cluster) -> Iterator[Any]:
    """A kafka-python admin client (librdkafka has no ListTransactions), opened after librdkafka
    reached the cluster with the same properties.

    The librdkafka check comes first because it reports a refused login reliably: kafka-python
    3.0 drops the bytes it read together with the end of the stream, and a broker closes the
    connection right after its answer to a failed authentication (Apache Kafka does too), so
    kafka-python mostly reports only "socket disconnected"."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError

    cluster.metadata(cluster.admin())
    kafka_logger = logging.getLogger("kafka")
    last_failure = LastConnectionFailure(r"Connection (?:failed|lost): (?P<reason>.*)")
    kafka_logger.addHandler(last_failure)
    propagated, kafka_logger.propagate = kafka_logger.propagate, False
    timeout_ms = int(cluster.timeout_s * 1000)
    try:
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=[s.strip() for s in cluster.bootstrap_servers.split(",") if s.strip()],
                client_id="sparkafka-console",
                bootstrap_timeout_ms=timeout_ms,
                request_timeout_ms=timeout_ms,
                **_kafka_python_settings(cluster),
            )
        except KafkaTimeoutError as error:
            reason = last_failure.last or f"{type(error).__name__}: {error}"
            raise cannot_reach(cluster.bootstrap_servers, cluster.timeout_s, reason) from None
        try:
            yield admin
        finally:
            admin.close()
    finally:
        kafka_logger.removeHandler(last_failure)
        kafka_logger.propagate = propagated


def format_age(milliseconds: int) -> str:
    """1500 -> 1.5s, 125000 -> 2m05s, 7500000 -> 2h05m"""
    seconds = max(0, milliseconds) / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, second = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{second:02d}s"
    hours, minute = divmod(minutes, 60)
    return f"{hours}h{minute:02d}m"


def open_transactions(admin: Any, include_completed: bool) -> list[tuple[Any, Any]]:
    """(listing, description or None) per transaction, sorted by transactional id.

    Raises ConsoleError when the cluster predates ListTransactions (KIP-664, Apache Kafka 3.0)."""
    from kafka.errors import IncompatibleBrokerVersion, TransactionalIdNotFoundError, UnsupportedVersionError

    try:
        per_broker = admin.list_transactions()
    except (IncompatibleBrokerVersion, UnsupportedVersionError) as error:
        raise ConsoleError(
            "this cluster does not support listing transactions (ListTransactions needs Apache Kafka 3.0 "
            f"or newer): {error}"
        ) from None
    listings = sorted(
        (listing for listings in per_broker.values() for listing in listings),
        key=lambda listing: listing.transactional_id,
    )
    if not include_completed:
        listings = [x for x in listings if _state_name(x.state) in _OPEN_TRANSACTION_STATES]
    ids = [listing.transactional_id for listing in listings]
    try:
        descriptions = admin.describe_transactions(ids) if ids else {}
    except TransactionalIdNotFoundError:
        # One of them expired between the two requests; describe the others one by one.
        descriptions = {}
        for transactional_id in ids:
            with suppress(TransactionalIdNotFoundError):
                descriptions.update(admin.describe_transactions([transactional_id]))
    return [(listing, descriptions.get(listing.transactional_id)) for listing in listings]


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state))


def _first_offsets(admin: Any, rows: list[tuple[Any, Any]]) -> dict[tuple[str, int, int], int]:
    """(topic, partition, producer id) -> offset of the open transaction's first record there.

    That offset is where read_committed readers of the partition stop. Best effort: clusters without
    DescribeProducers (Kafka < 2.8) just do not show it."""
    from kafka.errors import KafkaError as KafkaPythonError

    partitions = {tp for _, description in rows if description for tp in description.topic_partitions}
    if not partitions:
        return {}
    try:
        states = admin.describe_producers(sorted(partitions))
    except KafkaPythonError:
        return {}
    return {
        (tp.topic, tp.partition, producer.producer_id): producer.current_transaction_start_offset
        for tp, state in states.items()
        for producer in state.active_producers
        if producer.current_transaction_start_offset >= 0
    }


@transactions_app.command("list", cls=command_with_example("sparkafka transactions list --all"))
def transactions_list(
    include_completed: bool = typer.Option(
        False,
        "--all",
        help="Also list transactional ids with no open transaction (CompleteCommit, Empty, ...).",
    ),
    bootstrap_servers: str = BOOTSTRAP_SERVERS_OPTION,
    timeout: float = TIMEOUT_OPTION,
    client_property: list[str] = CLIENT_PROPERTY_OPTION,
    command_config: Path | None = COMMAND_CONFIG_OPTION,
) -> None:
    """Print open transactions: producer id, state, age, timeout, and partitions with their first offset.

    An open transaction's first offset on a partition is where read_committed readers of that
    partition wait until it commits or aborts. Needs Apache Kafka 3.0+ (KIP-664's ListTransactions).
    """
    with reporting_errors("transactions list"):
        cluster = Cluster(bootstrap_servers, timeout, client_property, command_config)
        with _kafka_python_admin(cluster) as admin:
            rows = open_transactions(admin, include_completed)
            first_offsets = _first_offsets(admin, rows)
        if not rows:
            typer.echo("no open transactions" if not include_completed else "no transactional ids")
            return
        now_ms = time.time_ns() // 1_000_000
        table = []
        for listing, description in rows:
            state = _state_name(listing.state)
            is_open = state in _OPEN_TRANSACTION_STATES
            age = timeout_text = partitions = "-"
            epoch: object = "-"
            if description is not None:
                epoch = description.producer_epoch
                timeout_text = format_age(description.transaction_timeout_ms)
                if is_open and description.transaction_start_time_ms >= 0:
                    age = format_age(now_ms - description.transaction_start_time_ms)
                partitions = _partitions_text(description, first_offsets)
            table.append(
                (listing.transactional_id, state, listing.producer_id, epoch, age, timeout_text, partitions)
            )
        headers = ["TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "AGE", "TIMEOUT", "PARTITIONS"]
        for line in format_table(headers, table):
            typer.echo(line)


def _partitions_text(description: Any, first_offsets: dict[tuple[str, int, int], int]) -> str:
    parts = []
    for tp in sorted(description.topic_partitions):
        first = first_offsets.get((tp.topic, tp.partition, description.producer_id))
        parts.append(f"{tp.topic}-{tp.partition}" + ("" if first is None else f" (from offset {first})"))
    return ", ".join(parts) or "-"
