"""Error paths of sparkafka.broker.config's BrokerConfig: settings it refuses at construction."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.settings import SETTINGS, BrokerSetting

BOUNDED = [setting for setting in SETTINGS if setting.minimum is not None]


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
    at_bound = BrokerConfig(data_dir=tmp_path, **{setting.field: setting.minimum})
    assert getattr(at_bound, setting.field) == setting.minimum
