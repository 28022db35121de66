"""Exactly-once through SIGKILL of the whole pipeline at distinct points of the protocol (seed 001,
automated): real broker process, real Spark in a `sparkafka run` process group, real clients."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.conftest import ALL_APACHE_KAFKAS, APACHE_KAFKA, EMBEDDED, Kafka
from tests.integration.kafka_clients import (
    committed_markers,
    create_topic,
    producer,
    read_to_end,
    transactional_producer,
    values,
    wait_for_committed,
)

RECORDS = 40


def _send_input(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    sender = producer(bootstrap)
    lines = [f"a{i},b{i}".encode() for i in range(RECORDS)]
    for i, line in enumerate(lines):
        sender.produce(topic, value=line, partition=i % partitions)
    assert sender.flush(30) == 0
    return [b"EVENT(" + line + b")" for line in lines]


# Each write task writes to the output partition of its input partition, so one task's open
# transaction does not hide another task's committed output from read_committed readers.
SAME_PARTITION_MAP = "SELECT concat('EVENT(', CAST(value AS STRING), ')') AS value, partition FROM input"


def _pipeline(broker: Kafka, tmp_path: Path, *extra: str) -> PipelineProcess:
    if "--sql" not in extra and "--transform" not in extra:
        extra = ("--sql", SAME_PARTITION_MAP, *extra)
    args = [
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--source-topic",
        "in",
        "--sink-topic",
        "out",
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--trigger",
        "500ms",
        "--master",
        "local[2]",
        "--source-option",
        "startingOffsets=earliest",
        *extra,
    ]
    return PipelineProcess(tmp_path / "pipeline.log", args)


def _wait_committed(
    broker: Kafka, expected: int, partitions: int, stop: Callable[[], object], timeout_s: float = 120
) -> list[bytes]:
    """The values read_committed readers see in ``out`` once ``expected`` records are there and the
    pipeline is stopped (``stop``), read to the partitions' ends: a copy written after the count was
    reached is there too."""
    wait_for_committed(
        broker.bootstrap_servers, "out", expect=expected, partitions=partitions, timeout_s=timeout_s
    )
    stop()
    return values(read_to_end(broker.bootstrap_servers, "out", partitions=partitions))


def _dump_log(broker: Kafka) -> str:
    """The output topic's log with its COMMIT/ABORT markers, by the dump tool of the broker's kind."""
    if isinstance(broker, ApacheKafka):
        return broker.dump_log("out")
    assert isinstance(broker, BrokerProcess)
    return subprocess.run(
        [sys.executable, "-m", "sparkafka", "dump-log", "--data-dir", str(broker.data_dir), "--topic", "out"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def _no_open_transactions(broker: Kafka, topic: str, partitions: int) -> bool:
    """read_committed readers are not held back: on every partition the LSO equals the high watermark."""
    ends = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "lso", "isolation.level": isolation}
        )
        ends[isolation] = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)
        ]
        consumer.close()
    return ends["read_committed"] == ends["read_uncommitted"]


@pytest.fixture
def any_kafka_topics(fresh_kafka: Kafka) -> Kafka:
    """Topics in and out, two partitions each, on a Kafka of the test's own: the embedded broker,
    then the newest Apache Kafka (and each pinned one where the test asks)."""
    create_topic(fresh_kafka.bootstrap_servers, "in", partitions=2)
    create_topic(fresh_kafka.bootstrap_servers, "out", partitions=2)
    return fresh_kafka


@pytest.fixture
def topics(fresh_broker: BrokerProcess) -> BrokerProcess:
    create_topic(fresh_broker.bootstrap_servers, "in", partitions=2)
    create_topic(fresh_broker.bootstrap_servers, "out", partitions=2)
    return fresh_broker


def _count(broker: Kafka, isolation: str) -> int:
    """The records of ``out`` a reader of ``isolation`` sees now, read to the partitions' ends: zero
    means none, not a consumer still connecting."""
    return len(read_to_end(broker.bootstrap_servers, "out", isolation=isolation, partitions=2))


def _kill_when_paused(pipeline: PipelineProcess, pause_line: str) -> None:
    try:
        pipeline.wait_for(pause_line)
    except BaseException:
        pipeline.kill_group()
        raise


@pytest.mark.parametrize("fresh_kafka", [EMBEDDED, *ALL_APACHE_KAFKAS], indirect=True)
def test_sigkill_at_every_protocol_point_in_a_row_is_exactly_once(
    any_kafka_topics: Kafka, tmp_path: Path
) -> None:
    """One micro-batch is killed five times in a row, each time at another point of the protocol, each
    restart recovering from the previous crash — then the output is checked: exactly once. On the
    embedded broker and on Apache Kafka."""
    broker = any_kafka_topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)

    def paused_run(*options: str) -> PipelineProcess:
        args = [a for option in (*options, "debug.pauseMs=600s") for a in ("--sink-option", option)]
        return _pipeline(broker, tmp_path, *args).start()

    # 1. Before the tasks produce anything: nothing was written.
    run = paused_run("debug.pauseAt=beforeProduce")
    _kill_when_paused(run, "sparkafka debug pause: beforeProduce")
    run.kill_group()
    assert _count(broker, "read_uncommitted") == 0

    # 2. Mid-transaction: every row written, nothing committed (seed 001's kill -9).
    run = paused_run("debug.pauseAt=beforeCommit")
    _kill_when_paused(run, "sparkafka debug pause: beforeCommit")
    assert wait_until(lambda: _count(broker, "read_uncommitted") >= RECORDS, 60)
    run.kill_group()
    assert _count(broker, "read_committed") == 0

    # 3. After some tasks committed: partition 0's task committed its half, partition 1's is open.
    run = paused_run("debug.pauseAt=beforeCommit", "debug.pausePartitions=1")
    _kill_when_paused(run, "sparkafka debug pause: beforeCommit partition=1")
    assert wait_until(lambda: _count(broker, "read_committed") == RECORDS // 2, 60)
    run.kill_group()

    # 4. After every task committed, before Spark's commit log: task 0 skips its replay (its
    # commit marker shows batch 0 done), task 1 writes and commits its half.
    run = paused_run("debug.pauseAt=driverCommit")
    _kill_when_paused(run, "sparkafka debug pause: driverCommit")
    assert wait_until(lambda: _count(broker, "read_committed") == RECORDS, 60)
    run.kill_group()

    # 5. A clean restart replays batch 0 once more: both tasks skip it; then new input flows.
    more = [f"c{i},d{i}".encode() for i in range(10)]
    sender = producer(broker.bootstrap_servers)
    for line in more:
        sender.produce("in", value=line, partition=0)
    assert sender.flush(60) == 0, "the new input was not delivered"
    final = _pipeline(broker, tmp_path).start()
    try:
        committed = _wait_committed(broker, RECORDS + len(more), 2, final.terminate)
    finally:
        final.terminate()

    assert sorted(committed) == sorted(expected + [b"EVENT(" + line + b")" for line in more]), final.output()[
        -4000:
    ]
    uncommitted = values(
        read_to_end(broker.bootstrap_servers, "out", isolation="read_uncommitted", partitions=2)
    )
    # Aborted: run 2's 40 rows and run 3's partition-1 half.
    assert len(uncommitted) == len(committed) + RECORDS + RECORDS // 2
    dump = _dump_log(broker)
    assert "endTxnMarker: COMMIT" in dump and "endTxnMarker: ABORT" in dump
    assert _no_open_transactions(broker, "out", 2)


def test_restart_with_fewer_partitions_leaves_no_open_transaction(
    topics: BrokerProcess, tmp_path: Path
) -> None:
    """Write partitions 0 and 1 of three hold their transactions open (2 never starts on two cores)
    when the pipeline is killed; nothing of the batch is committed, so a narrower query may replay
    it. Its one task writes everything, and the driver aborts what id -1 of the wider run left open."""
    broker = topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)
    wide = "SELECT /*+ REPARTITION(3) */ concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
    first = _pipeline(
        broker,
        tmp_path,
        "--sql",
        wide,
        "--sink-option",
        "debug.pauseAt=beforeCommit",
        "--sink-option",
        "debug.pausePartitions=0,1",
        "--sink-option",
        "debug.pauseMs=600s",
        # Long enough that the broker's own timeout cannot be what aborts the transactions below.
        "--sink-option",
        "kafka.transaction.timeout.ms=600000",
    ).start()
    try:
        first.wait_for("sparkafka debug pause: beforeCommit partition=0")
        first.wait_for("sparkafka debug pause: beforeCommit partition=1")
    finally:
        first.kill_group()
    assert not _no_open_transactions(broker, "out", 2), "the killed tasks' transactions should be open"

    narrow = "SELECT /*+ REPARTITION(1) */ concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
    second = _pipeline(broker, tmp_path, "--sql", narrow).start()
    try:
        second.wait_for("batch ")
        deadline = time.monotonic() + 15
        while not _no_open_transactions(broker, "out", 2) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _no_open_transactions(broker, "out", 2), (
            "id -1 of the wider run still holds a transaction open"
        )
        committed = _wait_committed(broker, RECORDS, 2, second.terminate)
    finally:
        second.terminate()
    assert sorted(committed) == sorted(expected)


def test_zombie_with_the_same_transactional_id_cannot_commit(topics: BrokerProcess, tmp_path: Path) -> None:
    broker = topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)
    zombie = transactional_producer(broker.bootstrap_servers, "fixed-prefix-0")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce("out", value=b"zombie", partition=0)
    zombie.flush(10)

    pipeline = _pipeline(broker, tmp_path, "--sink-option", "transactionalIdPrefix=fixed-prefix").start()
    try:
        committed = _wait_committed(broker, RECORDS, 2, pipeline.terminate)
    finally:
        pipeline.terminate()
    with pytest.raises(Exception, match=r"(?i)fenc|epoch"):
        zombie.commit_transaction(10)
    assert sorted(committed) == sorted(expected)


def test_sigterm_stops_cleanly_and_keeps_the_checkpoint(topics: BrokerProcess, tmp_path: Path) -> None:
    broker = topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)
    pipeline = _pipeline(broker, tmp_path).start()
    assert len(_wait_committed(broker, RECORDS, 2, pipeline.terminate)) == RECORDS
    assert pipeline.terminate() == 0
    assert "checkpoint kept" in pipeline.output()
    assert _no_open_transactions(broker, "out", 2)

    more = [f"c{i},d{i}".encode() for i in range(10)]
    sender = producer(broker.bootstrap_servers)
    for line in more:
        sender.produce("in", value=line, partition=0)
    assert sender.flush(60) == 0
    resumed = _pipeline(broker, tmp_path).start()
    try:
        committed = _wait_committed(broker, RECORDS + 10, 2, resumed.terminate)
    finally:
        resumed.terminate()
    assert sorted(committed) == sorted(expected + [b"EVENT(" + line + b")" for line in more])


@pytest.mark.parametrize("output_mode", ["update", "append"])
def test_sigterm_under_steady_input_finishes_the_batch_writing(
    topics: BrokerProcess, tmp_path: Path, output_mode: str
) -> None:
    """Back-to-back micro-batches: a stop waits for the batch writing (here paused 3 s in its commit),
    not for an idle trigger that never comes; foreachBatch pipelines (update mode) also refuse the
    next batch before it writes and end without Spark's reports of killed tasks (an append-mode
    stop may cut the next batch short). A restart then completes the output exactly once."""
    broker = topics
    sent: list[bytes] = []
    stop_feeding = threading.Event()

    def feed() -> None:
        sender = producer(broker.bootstrap_servers)
        while not stop_feeding.is_set():
            line = f"s{len(sent)},t".encode()
            sender.produce("in", value=line, partition=len(sent) % 2)
            sent.append(line)
            assert sender.flush(60) == 0
            time.sleep(0.02)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    args = ("--output-mode", output_mode, "--trigger", "0s")
    pause = ("--sink-option", "debug.pauseAt=beforeCommit", "--sink-option", "debug.pauseMs=3s")
    pipeline = _pipeline(broker, tmp_path, *args, *pause).start()
    try:
        pipeline.wait_for("sparkafka debug pause: beforeCommit")
        # The batch paused when the stop comes; an append-mode stop may let the next batch start and
        # reach its pause too before it cuts that batch short.
        before_stop = pipeline.output()
        started = time.monotonic()
        assert pipeline.terminate() == 0
        assert time.monotonic() - started < 30  # not the one-minute bound of a write that never ends
    finally:
        stop_feeding.set()
        feeder.join()
    output = pipeline.output()
    assert "checkpoint kept" in output
    for noise in ("ERROR", "Traceback", "StackOverflowError", "TaskKilledException"):
        assert output_mode == "append" or noise not in output, output[-3000:]
    assert _no_open_transactions(broker, "out", 2)
    # The batch paused in its commit when the stop came is committed, and nothing after it: the
    # output holds exactly the records its markers and those of the batches before it count.
    pauses = re.findall(r"debug pause: beforeCommit partition=\d+ batch=(\d+)", before_stop)
    paused = max(int(b) for b in pauses)
    assert committed_markers(broker.bootstrap_servers, paused), f"batch {paused} was not committed"
    assert not committed_markers(broker.bootstrap_servers, paused + 1)
    written = sum(sum(committed_markers(broker.bootstrap_servers, b).values()) for b in range(paused + 1))
    assert len(read_to_end(broker.bootstrap_servers, "out", partitions=2)) == written > 0

    resumed = _pipeline(broker, tmp_path, *args).start()
    try:
        committed = _wait_committed(broker, len(sent), 2, resumed.terminate)
    finally:
        resumed.terminate()
    assert sorted(committed) == sorted(b"EVENT(" + line + b")" for line in sent)


def test_task_failing_on_its_first_attempt_is_retried_exactly_once(
    topics: BrokerProcess, tmp_path: Path
) -> None:
    broker = topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)
    # local[2,2]: two cores, a task may fail once and is retried (Spark's spark.task.maxFailures).
    pipeline = _pipeline(
        broker, tmp_path, "--master", "local[2,2]", "--sink-option", "debug.failFirstAttemptAt=beforeCommit"
    ).start()
    try:
        committed = _wait_committed(broker, RECORDS, 2, pipeline.terminate)
    finally:
        pipeline.terminate()
    assert "injected failure of the first attempt" in pipeline.output()
    assert sorted(committed) == sorted(expected)
    uncommitted = values(
        read_to_end(broker.bootstrap_servers, "out", isolation="read_uncommitted", partitions=2)
    )
    assert len(uncommitted) == 2 * RECORDS  # each first attempt's rows, aborted, then the retry's
    assert "endTxnMarker: ABORT" in _dump_log(broker)


def test_running_count_survives_a_crash_exactly_once(any_kafka_topics: Kafka, tmp_path: Path) -> None:
    """An update-mode running count, SIGKILLed with its first batch's transaction open, restarted
    with more input: the final counts are right and no update is committed twice."""
    broker = any_kafka_topics
    keys = [f"k{i}" for i in range(5)]
    sender = producer(broker.bootstrap_servers)
    for round_number in range(4):
        for key in keys:
            sender.produce("in", value=key.encode(), partition=round_number % 2)
    assert sender.flush(60) == 0
    running_count = (
        "SELECT CAST(value AS STRING) AS key, CAST(count(*) AS STRING) AS value "
        "FROM input GROUP BY CAST(value AS STRING)"
    )
    args = ("--sql", running_count, "--output-mode", "update")
    first = _pipeline(
        broker,
        tmp_path,
        *args,
        "--sink-option",
        "debug.pauseAt=beforeCommit",
        "--sink-option",
        "debug.pauseMs=120s",
    ).start()
    try:
        first.wait_for("sparkafka debug pause: beforeCommit")
    finally:
        first.kill_group()
    for round_number in range(4):
        for key in keys:
            sender.produce("in", value=key.encode(), partition=round_number % 2)
    assert sender.flush(60) == 0
    second = _pipeline(broker, tmp_path, *args).start()
    try:
        deadline = time.monotonic() + 120
        final: dict[str, int] = {}
        while time.monotonic() < deadline:
            updates = read_to_end(broker.bootstrap_servers, "out", partitions=2)
            final = {
                m.key().decode(): int(m.value()) for m in sorted(updates, key=lambda m: m.timestamp()[1])
            }
            if final and all(final.get(key) == 8 for key in keys):
                break
            time.sleep(1)
    finally:
        second.terminate()
    assert final == dict.fromkeys(keys, 8)
    updates = read_to_end(broker.bootstrap_servers, "out", partitions=2)
    pairs = [(m.key(), m.value()) for m in updates]
    assert len(pairs) == len(set(pairs)), "an update was committed twice"


def _failure_reasons(output: str) -> list[str]:
    """What `sparkafka run` gave as the reason of each failure: the restart warnings, then its exit
    message (the first lines of each; Spark appends the query's plan)."""
    reasons = []
    for marker in ("pipeline failed (", "sparkafka run: "):
        start = output.find(marker)
        while start >= 0:
            reasons.append(output[start : start + 1500])
            start = output.find(marker, start + 1)
    return reasons


def _strict_kafka(kind: str, directory: Path) -> BrokerProcess | ApacheKafka:
    """A Kafka whose transaction.max.timeout.ms is 30 s: the embedded broker or Apache Kafka."""
    if kind == EMBEDDED:
        return BrokerProcess(directory / "data", extra_args=["--transaction-max-timeout-ms", "30000"])
    return ApacheKafka(directory / "apache-kafka", settings={"transaction.max.timeout.ms": "30000"})


@pytest.mark.parametrize("kind", [EMBEDDED, APACHE_KAFKA])
def test_transaction_timeout_above_broker_maximum_fails_clearly(tmp_path: Path, kind: str) -> None:
    """Seed 000: a sink's transaction.timeout.ms above the broker's transaction.max.timeout.ms."""
    with _strict_kafka(kind, tmp_path) as strict:
        create_topic(strict.bootstrap_servers, "in")
        create_topic(strict.bootstrap_servers, "out")
        _send_input(strict.bootstrap_servers, "in", 1)
        # One restart, as a user would allow: a configuration error must fail the restarted query the
        # same clear way, and a one-off failure of Spark's start on a loaded machine cannot hide it.
        pipeline = _pipeline(
            strict,
            tmp_path,
            "--sink-option",
            "kafka.transaction.timeout.ms=60000",
            "--restart-attempts",
            "1",
            "--restart-delay",
            "1s",
        ).start()
        assert pipeline.process is not None
        code = pipeline.process.wait(timeout=240)
        reasons = _failure_reasons(pipeline.output())
    shown = "\n---\n".join(reasons)
    assert code == 1, shown
    assert len(reasons) == 2, shown
    final = reasons[-1]
    assert final.startswith("sparkafka run: the pipeline failed 2 time(s)"), shown
    assert "kafka.transaction.timeout.ms=60000" in final, shown
    # The brokers' limit as they answer it (DescribeConfigs), and the value to set.
    assert "transaction.max.timeout.ms, which is 30000 ms" in final, shown
    assert "Fix: lower the sink option kafka.transaction.timeout.ms to at most 30000" in final, shown
    if "kafka.transaction.timeout.ms=60000" not in reasons[0]:
        warnings.warn(f"the first attempt failed for another reason: {reasons[0]}", stacklevel=1)


@pytest.mark.parametrize("restart_attempts", [0, 1])
def test_restart_strategy_restarts_the_query_from_its_checkpoint(
    topics: BrokerProcess, tmp_path: Path, restart_attempts: int
) -> None:
    broker = topics
    expected = _send_input(broker.bootstrap_servers, "in", 2)
    flag = tmp_path / "fail-once"
    flag.touch()
    pipeline = _pipeline(
        broker,
        tmp_path,
        "--transform",
        "tests.integration.one_shot_failure:fail_once_then_map",
        "--restart-attempts",
        str(restart_attempts),
        "--restart-delay",
        "1s",
    )
    pipeline.env.update({"SPARKAFKA_TEST_FAIL_FLAG": str(flag), "PYTHONPATH": str(Path(__file__).parents[3])})
    pipeline.start()
    try:
        if restart_attempts == 0:
            assert pipeline.process is not None
            assert pipeline.process.wait(timeout=180) == 1
            assert "more than --restart-attempts=0" in pipeline.output()
            return
        pipeline.wait_for("restarting from checkpoint")
        committed = _wait_committed(broker, RECORDS, 2, pipeline.terminate)
    finally:
        pipeline.terminate()
    assert sorted(committed) == sorted(expected)


def test_many_batches_over_more_partitions_than_cores(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    """Spark runs each task in any idle Python worker, so a transactional id moves between workers
    from batch to batch; the cached producers must never write with a fenced id."""
    broker = fresh_broker
    create_topic(broker.bootstrap_servers, "in", partitions=4)
    create_topic(broker.bootstrap_servers, "out", partitions=4)
    sender = producer(broker.bootstrap_servers)
    pipeline = _pipeline(broker, tmp_path).start()
    expected = []
    try:
        for wave in range(8):
            for i in range(20):
                line = f"w{wave}-{i},x".encode()
                sender.produce("in", value=line, partition=i % 4)
                expected.append(b"EVENT(" + line + b")")
            assert sender.flush(60) == 0
            time.sleep(1.5)
        committed = _wait_committed(broker, len(expected), 4, pipeline.terminate)
    finally:
        code = pipeline.terminate()
    assert code == 0, pipeline.output()[-3000:]
    assert sorted(committed) == sorted(expected)
    assert "fenced" not in pipeline.output()
