"""Error paths of sparkafka.broker.config's BrokerConfig: settings it refuses at construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkafka.broker.config import BrokerConfig


def test_a_negative_failed_authentication_delay_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"^connection\.failed\.authentication\.delay\.ms must not be negative, got -1$"
    ):
        BrokerConfig(data_dir=tmp_path, connection_failed_authentication_delay_ms=-1)
    # No delay at all is allowed: a failed authentication then closes the connection at once.
    assert (
        BrokerConfig(
            data_dir=tmp_path, connection_failed_authentication_delay_ms=0
        ).connection_failed_authentication_delay_ms
        == 0
    )
