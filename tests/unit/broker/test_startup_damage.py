"""A broker whose topic registry or journals are damaged does not start, and says which file, why,
and what to do — never a bare traceback; one whose partition logs are damaged starts and refuses
the damaged records."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparkafka.broker import record_builder
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.records import Record
from sparkafka.broker.server import Broker
from sparkafka.cli.app import app
from tests.log_damage import overrun_file_with_batch


def _data_dir(tmp_path: Path) -> Path:
    """A data directory of a broker that created a topic and stopped."""
    data = tmp_path / "data"
    broker = Broker(BrokerConfig(port=0, data_dir=data))
    broker.topic_controller.create_topic("t", 1, {})
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


def test_a_batch_length_running_past_the_end_after_a_clean_stop_is_refused_not_cut_at_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged length looks like a torn write, but a clean stop leaves none: the broker starts,
    keeps the three acknowledged records on disk, refuses them with CORRUPT_MESSAGE and appends
    after them."""
    data = tmp_path / "data"
    broker = Broker(BrokerConfig(port=0, data_dir=data))
    broker.topic_controller.create_topic("t", 1, {})
    partition = broker.partitions[("t", 0)]
    for offset in range(3):
        partition.log.append(
            [record_builder.encode_batch([Record(offset, 1_000, b"k", b"v")], base_offset=offset)], now_ms=0
        )
    partition.close()
    broker._lock_file.close()
    segment = data / "t-0" / "00000000000000000000.log"
    overrun_file_with_batch(segment, 0)
    stored = segment.read_bytes()

    with caplog.at_level(logging.WARNING, logger="sparkafka.broker"):
        restarted = Broker(BrokerConfig(port=0, data_dir=data))
    try:
        partition = restarted.partitions[("t", 0)]
        assert partition.high_watermark == 3
        assert segment.read_bytes() == stored
        with pytest.raises(BrokerError) as refused:
            partition.read(0, 1 << 20, read_committed=False)
        assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
        partition.log.append(
            [record_builder.encode_batch([Record(3, 1_000, b"k", b"v")], base_offset=3)], now_ms=0
        )
        assert len(partition.read(3, 1 << 20, read_committed=False)[0]) > 0
    finally:
        restarted.partitions[("t", 0)].close()
        restarted._lock_file.close()
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert message.startswith(f"t-0: {segment} is damaged at byte 0 (")
    assert "not cut" in message and "offsets 0 to 2" in message
    assert "truncating" not in caplog.text
