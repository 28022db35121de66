"""Error paths of sparkafka.broker.config's BrokerConfig: settings it refuses at construction."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.settings import SETTINGS, BrokerSetting

BOUNDED = [setting for setting in SETTINGS if setting.minimum is not None]
# What a setting at its bound needs of another setting to be accepted.
AT_BOUND_NEEDS = {"group_max_session_timeout_ms": {"group_min_session_timeout_ms": 0}}


def test_a_negative_failed_authentication_delay_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"^connection\.failed\.authentication\.delay\.ms "
        r"\(--connection-failed-authentication-delay-ms\) must be at least 0, got -1$",
    ):
        BrokerConfig(data_dir=tmp_path, connection_failed_authentication_delay_ms=-1)
    # No delay at all is allowed: a failed authentication then closes the connection at once.
    assert (
        BrokerConfig(
            data_dir=tmp_path, connection_failed_authentication_delay_ms=0
        ).connection_failed_authentication_delay_ms
        == 0
    )


@pytest.mark.parametrize("setting", BOUNDED, ids=[setting.kafka_name for setting in BOUNDED])
def test_every_setting_below_its_bound_is_refused_naming_it_and_its_option(
    tmp_path: Path, setting: BrokerSetting
) -> None:
    assert setting.minimum is not None
    below = setting.minimum - 1
    expected = f"{setting.kafka_name} ({setting.option}) must be at least {setting.minimum}, got {below}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        BrokerConfig(data_dir=tmp_path, **{setting.field: below})
    at_bound = BrokerConfig(
        data_dir=tmp_path, **{setting.field: setting.minimum, **AT_BOUND_NEEDS.get(setting.field, {})}
    )
    assert getattr(at_bound, setting.field) == setting.minimum


def test_a_minimum_session_timeout_above_the_maximum_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"^group\.min\.session\.timeout\.ms \(--group-min-session-timeout-ms\) is 7000, above "
        r"group\.max\.session\.timeout\.ms \(--group-max-session-timeout-ms\) 6999: no session timeout "
        r"would be accepted; lower the first or raise the second$",
    ):
        BrokerConfig(data_dir=tmp_path, group_min_session_timeout_ms=7000, group_max_session_timeout_ms=6999)
    equal = BrokerConfig(
        data_dir=tmp_path, group_min_session_timeout_ms=7000, group_max_session_timeout_ms=7000
    )
    assert equal.group_min_session_timeout_ms == equal.group_max_session_timeout_ms == 7000
