"""A broker whose topic registry or journals are damaged does not start, and says which file, why,
and what to do — never a bare traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.server import Broker
from sparkafka.cli.app import app


def _data_dir(tmp_path: Path) -> Path:
    """A data directory of a broker that created a topic and stopped."""
    data = tmp_path / "data"
    broker = Broker(BrokerConfig(port=0, data_dir=data))
    broker.create_topic("t", 1, {})
    broker.partitions[("t", 0)].close()
    broker._lock_file.close()
    return data


@pytest.mark.parametrize("damage", ['[{"name": "t", "id": "not-a-uuid"', "[{}]", "not json"])
def test_a_damaged_topic_registry_names_the_file_and_the_way_out(tmp_path: Path, damage: str) -> None:
    data = _data_dir(tmp_path)
    (data / "topics.json").write_text(damage)
    with pytest.raises(RuntimeError, match=r"topics\.json is damaged .*Restore the file from a backup"):
        Broker(BrokerConfig(port=0, data_dir=data))


@pytest.mark.parametrize(
    ("journal", "holds"),
    [
        ("__consumer_offsets.journal", "committed offsets"),
        ("__transaction_state.journal", "sparkafka transactions list"),
    ],
)
def test_the_broker_command_reports_a_damaged_journal_without_a_traceback(
    tmp_path: Path, journal: str, holds: str
) -> None:
    data = _data_dir(tmp_path)
    (data / journal).write_bytes(b"this is not a journal at all")
    result = CliRunner().invoke(app, ["broker", "--listen", "127.0.0.1:0", "--data-dir", str(data)])
    assert result.exit_code == 1
    assert f"journal {data / journal} is corrupt at byte 0" in result.output
    assert holds in result.output and "Restore the file from a backup" in result.output
    assert "Traceback" not in result.output


def test_a_topic_registry_that_is_not_json_names_where_it_breaks(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    (data / "topics.json").write_text('[{"name": "t"} oops')
    with pytest.raises(RuntimeError, match=r"topics\.json is damaged .*line 1 column 16 \(char 15\)"):
        Broker(BrokerConfig(port=0, data_dir=data))
