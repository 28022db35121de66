"""The table of broker settings is the one source of their defaults, bounds, options and descriptions."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from sparkafka.broker import settings
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.config_synonyms import (
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    broker_config_entries,
    broker_config_synonyms,
    kafka_settings,
    static_broker_configs,
)
from sparkafka.broker.settings import SETTINGS, BrokerSetting, ConfigType
from sparkafka.cli.app import app
from sparkafka.cli.broker import settings_given

# BrokerConfig's fields that are not Kafka broker configs of one value.
NOT_SETTINGS = {"host", "port", "data_dir", "node_id", "cluster_id", "sasl_plain_users", "ssl_listener"}
NUMERIC = [setting for setting in SETTINGS if setting.type is not ConfigType.BOOLEAN]
BOUNDED_ON_THE_COMMAND_LINE = [s for s in NUMERIC if s.minimum is not None and s.unset is None]


def _parse(*args: str) -> dict[str, Any]:
    """What `sparkafka broker ARGS` would start the broker with, parsed as the command line does."""
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)
    broker = command.commands["broker"]
    with broker.make_context("broker", list(args)) as context:
        return settings_given(context.params)


def test_every_setting_is_a_field_of_broker_config_with_the_tables_default_and_type() -> None:
    fields = {field.name: field for field in dataclasses.fields(BrokerConfig)}
    hints = typing.get_type_hints(BrokerConfig)
    assert set(fields) - NOT_SETTINGS == {setting.field for setting in SETTINGS}
    for setting in SETTINGS:
        assert fields[setting.field].default == setting.default, setting.field
        expected = bool if setting.type is ConfigType.BOOLEAN else int
        assert hints[setting.field] == (expected if setting.default is not None else expected | None)


def test_each_kafka_name_and_option_is_given_once() -> None:
    assert len({setting.kafka_name for setting in SETTINGS}) == len(SETTINGS)
    assert len({setting.option for setting in SETTINGS}) == len(SETTINGS)


def test_the_command_lines_defaults_are_broker_configs_defaults() -> None:
    assert BrokerConfig(data_dir=Path("unused"), **_parse()) == BrokerConfig(data_dir=Path("unused"))


@pytest.mark.parametrize("setting", NUMERIC, ids=[setting.option for setting in NUMERIC])
def test_every_numeric_option_reaches_the_broker_config(setting: BrokerSetting) -> None:
    value = (setting.minimum or 0) + 7 if setting.default is None else int(setting.default) + 7
    if setting.field == "queued_max_request_bytes":
        value = -1  # its bound depends on socket.request.max.bytes: -1 is no bound
    if setting.field == "socket_request_max_bytes":
        value -= 14  # no more than queued.max.request.bytes
    config = BrokerConfig(data_dir=Path("unused"), **_parse(setting.option, str(value)))
    assert getattr(config, setting.field) == value
    assert kafka_settings(config).get(setting.kafka_name) == (str(value) if setting.described else None)


def test_the_value_that_leaves_a_setting_to_the_broker_is_none() -> None:
    assert _parse("--flush-messages", "0")["flush_messages"] is None
    assert _parse("--flush-messages", "1")["flush_messages"] == 1
    assert _parse()["max_connections"] is None
    assert "log.flush.interval.messages" not in kafka_settings(BrokerConfig(data_dir=Path("unused")))


def test_a_boolean_setting_has_an_option_and_its_negation() -> None:
    assert _parse("--no-auto-create-topics")["auto_create_topics"] is False
    assert _parse("--auto-create-topics")["auto_create_topics"] is True


@pytest.mark.parametrize(
    "setting", BOUNDED_ON_THE_COMMAND_LINE, ids=[setting.option for setting in BOUNDED_ON_THE_COMMAND_LINE]
)
def test_an_option_below_its_bound_is_a_usage_error_naming_the_option(setting: BrokerSetting) -> None:
    assert setting.minimum is not None
    with pytest.raises(typer.BadParameter) as refused:
        _parse(setting.option, str(setting.minimum - 1))
    assert setting.option in refused.value.format_message() or setting.option in str(
        refused.value.param_hint or ""
    )


def test_every_setting_is_described_with_its_kafka_name_type_and_read_only_flag() -> None:
    config = BrokerConfig(data_dir=Path("unused"))
    static = static_broker_configs(kafka_settings(config))
    entries = {entry.name: entry for entry in broker_config_entries(static)}
    for setting in SETTINGS:
        if not setting.described:
            assert setting.kafka_name not in entries
            continue
        entry = entries[setting.kafka_name]
        assert (entry.type, entry.read_only) == (setting.type, setting.read_only), setting.kafka_name
        running = setting.text(getattr(config, setting.field))
        if running is not None and running != setting.kafka_default_text and setting.kafka_default_text:
            # The broker runs with another value than Kafka's default: described as set statically.
            assert entry.value == running
            assert broker_config_synonyms(setting.kafka_name, static)[0].source == SOURCE_STATIC_BROKER
        elif setting.kafka_default_text is not None:
            assert entry.value == setting.kafka_default_text, setting.kafka_name
            assert broker_config_synonyms(setting.kafka_name, static)[0].source == SOURCE_DEFAULT


def test_a_value_other_than_kafkas_default_is_described_as_static_with_the_default_after_it() -> None:
    config = BrokerConfig(data_dir=Path("unused"), transactional_id_expiration_ms=60_000)
    static = static_broker_configs(kafka_settings(config))
    assert static["transactional.id.expiration.ms"] == "60000"
    synonyms = broker_config_synonyms("transactional.id.expiration.ms", static)
    assert [(s.value, s.source) for s in synonyms] == [
        ("60000", SOURCE_STATIC_BROKER),
        ("604800000", SOURCE_DEFAULT),
    ]
    # Kafka's own default for queued.max.request.bytes is no bound; this broker's is a bound.
    assert static["queued.max.request.bytes"] == "104857600"


def test_a_setting_the_table_does_not_have_is_named() -> None:
    with pytest.raises(KeyError, match="no broker setting 'log_retention_hours'"):
        settings.setting("log_retention_hours")
