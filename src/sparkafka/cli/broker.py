"""`sparkafka broker` and `sparkafka dump-log`."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from sparkafka.broker.config import BrokerConfig, SaslUser, SslListener, check_socket_limits, default_data_dir
from sparkafka.broker.sasl import SASL_USERS_ENV, SaslUsersError, merge_users, parse_users, read_users_file
from sparkafka.broker.settings import SETTINGS, BrokerSetting, ConfigType


def parse_listen(value: str) -> tuple[str, int]:
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(
            f"{value!r} is not HOST:PORT (for example 127.0.0.1:9092, or port 0 for any free port)"
        )
    return host, int(port)


def settings_given(values: dict[str, Any]) -> dict[str, Any]:
    """The broker settings' option values as BrokerConfig takes them: an option left at the value
    that leaves the setting to the broker (``unset``) becomes None."""
    return {
        setting.field: None if values[setting.field] == setting.unset else values[setting.field]
        for setting in SETTINGS
    }


def _setting_option(setting: BrokerSetting) -> inspect.Parameter:
    """The ``sparkafka broker`` option of ``setting``: its name, default, bound and help from the table."""
    help_text = f"{setting.help} Kafka's {setting.kafka_name}."
    if setting.type is ConfigType.BOOLEAN:
        flag = setting.option[2:]
        option = typer.Option(setting.default, f"--{flag}/--no-{flag}", help=help_text)
        annotation: Any = bool
    else:
        default = setting.unset if setting.default is None else setting.default
        lowest = setting.minimum if setting.unset is None else min(setting.unset, setting.minimum or 0)
        option = typer.Option(default, setting.option, min=lowest, help=help_text)
        annotation = int if default is not None else int | None
    return inspect.Parameter(
        setting.field, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation
    )


def _with_setting_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with one option per broker setting (sparkafka.broker.settings) in place of its
    ``**settings``: typer reads the options from the function's signature."""
    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    generated = [_setting_option(setting) for setting in SETTINGS]
    command.__signature__ = signature.replace(parameters=[*own, *generated])  # type: ignore[attr-defined]
    command.__annotations__ = {
        **{name: value for name, value in command.__annotations__.items() if name != "settings"},
        **{p.name: p.annotation for p in generated},
    }
    return command


@_with_setting_options
def broker(
    listen: str = typer.Option(
        "127.0.0.1:9092", "--listen", help="HOST:PORT to accept clients on; port 0 picks a free port."
    ),
    data_dir: Path = typer.Option(
        None, "--data-dir", help="Where logs and coordinator state live [default: per-user data directory]."
    ),
    sasl_users_file: Path | None = typer.Option(
        None,
        "--sasl-users-file",
        help="File of USER:PASSWORD lines accepted over SASL/PLAIN (# comments and blank lines skipped); "
        "refused unless only its owner can access it (chmod 600). The users of "
        f"${SASL_USERS_ENV} (same format) and --sasl-plain-user are accepted too; with none, no "
        "authentication is required.",
    ),
    sasl_plain_user: list[str] = typer.Option(
        [],
        "--sasl-plain-user",
        help="USER:PASSWORD accepted over SASL/PLAIN (repeatable). Every user of this machine can read "
        "it in the process list: prefer --sasl-users-file or $" + SASL_USERS_ENV + ".",
    ),
    ssl_listen: str | None = typer.Option(
        None,
        "--ssl-listen",
        help="HOST:PORT of a TLS listener beside --listen (Kafka's listeners=SSL://HOST:PORT; SASL_SSL "
        "when SASL users are given); port 0 picks a free port. Needs --ssl-certfile.",
    ),
    ssl_certfile: Path | None = typer.Option(
        None,
        "--ssl-certfile",
        help="PEM file with the broker's certificate, then any intermediate CAs (Kafka's "
        "ssl.keystore.location with ssl.keystore.type=PEM); may hold the private key too.",
    ),
    ssl_keyfile: Path | None = typer.Option(
        None,
        "--ssl-keyfile",
        help="PEM file with the private key (Kafka's ssl.keystore.key) [default: in --ssl-certfile]. An "
        "encrypted key's password is read from $SPARKAFKA_BROKER_SSL_KEY_PASSWORD (ssl.key.password).",
    ),
    ssl_cafile: Path | None = typer.Option(
        None,
        "--ssl-cafile",
        help="PEM file with the CA certificates client certificates are checked against (Kafka's "
        "ssl.truststore.location).",
    ),
    ssl_client_auth: str = typer.Option(
        "none",
        "--ssl-client-auth",
        help="Kafka's ssl.client.auth: none, requested or required (a client certificate signed by a "
        "CA of --ssl-cafile).",
    ),
    ssl_advertised_host: str | None = typer.Option(
        None,
        "--ssl-advertised-host",
        help="Host the TLS listener's clients are told to connect to (Kafka's advertised.listeners; "
        "the name in the certificate) [default: the --ssl-listen host; for 0.0.0.0 the machine's name].",
    ),
    schema_registry: str | None = typer.Option(
        None,
        "--schema-registry",
        help="HOST:PORT to also serve a Confluent-compatible Schema Registry on (Avro; schemas kept in the "
        "broker's compacted _schemas topic); port 0 picks a free port.",
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    **settings: Any,
) -> None:
    """Run the embedded single-node Kafka-protocol broker until SIGTERM/SIGINT."""
    from sparkafka.broker.errors import BrokerError
    from sparkafka.broker.journal import JournalError
    from sparkafka.broker.runner import run_forever
    from sparkafka.broker.tls import TlsConfigError, server_context

    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown log level {log_level!r}; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = parse_listen(listen)
    registry_address = parse_listen(schema_registry) if schema_registry is not None else None
    entries: list[tuple[SaslUser, str]] = []
    for entry in sasl_plain_user:
        username, separator, password = entry.partition(":")
        # The messages leave the password out: they end up in terminals and logs.
        if not separator:
            raise typer.BadParameter(f"--sasl-plain-user {entry!r} is not USER:PASSWORD (no ':')")
        if not username:
            raise typer.BadParameter("--sasl-plain-user: the user name before ':' is empty")
        if not password:
            # Kafka's PLAIN refuses an empty password, so such a user could never log in.
            raise typer.BadParameter(f"--sasl-plain-user {username}: the password after ':' is empty")
        entries.append((SaslUser(username, password), f"--sasl-plain-user {username}"))
    try:
        if sasl_users_file is not None:
            entries += read_users_file(sasl_users_file)
        if os.environ.get(SASL_USERS_ENV):
            entries += parse_users(os.environ[SASL_USERS_ENV], f"${SASL_USERS_ENV}")
        users = merge_users(entries)
    except SaslUsersError as error:
        typer.echo(f"sparkafka broker: {error}", err=True)
        raise typer.Exit(2) from None
    try:  # before anything starts, with the options' names
        check_socket_limits(
            socket_request_max_bytes=settings["socket_request_max_bytes"],
            queued_max_request_bytes=settings["queued_max_request_bytes"],
            max_connections=settings["max_connections"],
            max_connections_per_ip=settings["max_connections_per_ip"],
            connections_max_idle_ms=settings["connections_max_idle_ms"],
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    ssl_listener = None
    if ssl_listen is not None:
        if ssl_certfile is None:
            raise typer.BadParameter(
                "--ssl-listen needs --ssl-certfile (and --ssl-keyfile unless the key is in it)"
            )
        ssl_host, ssl_port = parse_listen(ssl_listen)
        ssl_listener = SslListener(
            ssl_host,
            ssl_port,
            ssl_certfile,
            ssl_keyfile,
            cafile=ssl_cafile,
            client_auth=ssl_client_auth,
            advertised_host=ssl_advertised_host,
        )
        try:  # before anything starts
            server_context(ssl_listener)
        except TlsConfigError as error:
            typer.echo(f"sparkafka broker: {error}", err=True)
            raise typer.Exit(2) from None
    elif (
        any(value is not None for value in (ssl_certfile, ssl_keyfile, ssl_cafile, ssl_advertised_host))
        or ssl_client_auth != "none"
    ):
        raise typer.BadParameter("the --ssl-* options configure the TLS listener: add --ssl-listen HOST:PORT")
    config = BrokerConfig(
        host=host,
        port=port,
        data_dir=data_dir or default_data_dir(),
        sasl_plain_users=users,
        ssl_listener=ssl_listener,
        **settings_given(settings),
    )
    try:
        run_forever(config, schema_registry=registry_address)
    except (RuntimeError, OSError, JournalError) as exc:
        typer.echo(f"sparkafka broker: {exc}", err=True)
        raise typer.Exit(1) from exc
    except BrokerError as exc:
        # What a partition or coordinator refused while the broker started or stopped (damaged
        # data on disk, most likely): a message naming it, not a traceback.
        typer.echo(f"sparkafka broker: {exc} ({exc.code.name})", err=True)
        raise typer.Exit(1) from exc


def dump_log(
    data_dir: Path = typer.Option(..., "--data-dir", help="The broker's data directory."),
    topic: str = typer.Option(..., "--topic", help="Topic whose log to print."),
    partition: int | None = typer.Option(None, "--partition", help="Only this partition [default: all]."),
    print_records: bool = typer.Option(
        True, "--print-data-log/--batches-only", help="Print each record, not only batch headers."
    ),
) -> None:
    """Print a topic's log batch by batch, as Kafka's kafka-dump-log.sh --print-data-log does."""
    from sparkafka.broker.dumplog import dump_topic

    lines = dump_topic(
        data_dir,
        topic,
        partition,
        print_records=print_records,
        report_corrupt=lambda message: typer.echo(message, err=True),
    )
    try:
        for line in lines:
            typer.echo(line)
    except FileNotFoundError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None
