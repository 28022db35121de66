"""The broker's command line tools: `sparkafka dump-log` and the `sparkafka broker` ready line."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparkafka.broker.runner import BrokerProcess
from tests.integration.kafka_clients import create_topic, transactional_producer


def _dump_log(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkafka", "dump-log", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dump_log_shows_batches_markers_and_payloads(fresh_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(fresh_broker.bootstrap_servers, topic_name)
    sender = transactional_producer(fresh_broker.bootstrap_servers, f"tx-{topic_name}")
    sender.init_transactions(30)
    sender.begin_transaction()
    sender.produce(topic_name, key=b"k1", value=b"committed-one")
    sender.produce(topic_name, key=b"k2", value=b"committed-two")
    sender.commit_transaction(30)
    sender.begin_transaction()
    sender.produce(topic_name, key=b"k3", value=b"aborted-one")
    sender.flush(10)
    sender.abort_transaction(30)

    # Appends are written before they are acknowledged, so the files are complete while the broker runs.
    result = _dump_log("--data-dir", str(fresh_broker.data_dir), "--topic", topic_name)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {fresh_broker.data_dir / f'{topic_name}-0' / '00000000000000000000.log'}"
    batches = [line for line in lines if line.startswith("baseOffset:")]
    assert len(batches) == 4  # committed data, COMMIT marker, aborted data, ABORT marker

    def field(line: str, name: str) -> str:
        found = re.search(rf"\b{name}: (\S+)", line)
        assert found, f"{name} missing from {line!r}"
        return found.group(1)

    described = [
        (
            int(field(b, "baseOffset")),
            int(field(b, "lastOffset")),
            int(field(b, "count")),
            field(b, "isTransactional"),
            field(b, "isControl"),
        )
        for b in batches
    ]
    assert described == [
        (0, 1, 2, "true", "false"),
        (2, 2, 1, "true", "true"),
        (3, 3, 1, "true", "false"),
        (4, 4, 1, "true", "true"),
    ]
    producer_ids = {field(b, "producerId") for b in batches}
    assert len(producer_ids) == 1 and int(producer_ids.pop()) >= 0
    assert all(int(field(b, "producerEpoch")) >= 0 for b in batches)
    assert all(field(b, "isvalid") == "true" for b in batches)

    records = [line for line in lines if line.startswith("| offset:")]
    assert [field(r, "offset") for r in records] == ["0", "1", "2", "3", "4"]
    assert "key: k1 payload: committed-one" in records[0]
    assert "key: k2 payload: committed-two" in records[1]
    assert "endTxnMarker: COMMIT" in records[2]
    assert "key: k3 payload: aborted-one" in records[3]
    assert "endTxnMarker: ABORT" in records[4]

    headers_only = _dump_log(
        "--data-dir", str(fresh_broker.data_dir), "--topic", topic_name, "--batches-only"
    )
    assert headers_only.returncode == 0
    assert not [line for line in headers_only.stdout.splitlines() if line.startswith("|")]

    # The same output from a stopped broker's files.
    fresh_broker.terminate()
    assert _dump_log("--data-dir", str(fresh_broker.data_dir), "--topic", topic_name).stdout == result.stdout


def test_dump_log_unknown_topic_fails_clearly(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "other-0").mkdir()
    result = _dump_log("--data-dir", str(data_dir), "--topic", "missing")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "no log for topic 'missing'" in result.stderr
    assert str(data_dir) in result.stderr
    # A prefix of another topic's name is not that topic.
    assert _dump_log("--data-dir", str(data_dir), "--topic", "oth").returncode == 1
    missing_dir = _dump_log("--data-dir", str(tmp_path / "nope"), "--topic", "missing")
    assert missing_dir.returncode == 1
    assert f"data directory {tmp_path / 'nope'} does not exist" in missing_dir.stderr


def test_broker_prints_exactly_one_ready_line(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkafka",
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "data"),
            "--log-level",
            "DEBUG",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        ready = ""
        while not ready and time.monotonic() < deadline and process.poll() is None:
            if select.select([process.stdout], [], [], 0.2)[0]:
                ready = process.stdout.readline()
        assert re.fullmatch(r"sparkafka broker ready on 127\.0\.0\.1:(\d+)\n", ready), ready
        port = int(ready.rsplit(":", 1)[1])
        assert port > 0
        create_topic(f"127.0.0.1:{port}", "ready-line")  # it really serves there
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert stdout == ""  # nothing after the ready line: logs go to stderr
    assert "created topic ready-line" in stderr
