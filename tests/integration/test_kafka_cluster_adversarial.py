"""Apache Kafka failing harder under a running exactly-once pipeline than in
``test_kafka_cluster_faults.py``: a 3-node cluster (replication factor 3, ``min.insync.replicas=2``)
losing two nodes at once (no controller quorum, no in-sync quorum), and more. Pass criterion: every
input record once for read_committed readers, and the pipeline either carries on or fails loudly
and completes from its checkpoint when run again."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.harness import wait_until
from sparkafka.pipeline_process import PipelineProcess, run_arguments

from .apache_kafka import ApacheKafka
from .kafka_clients import assert_exactly_once, committed_ids, create_topic, producer, read_all

pytestmark = pytest.mark.integration

PARTITIONS = 2
SAME_PARTITION = "SELECT value, partition FROM input"


class Feeder(threading.Thread):
    """Produces ``records`` records (ids ``r00000|…``) to ``in`` over ``steps`` half seconds; the
    idempotent producer retries through outages of up to two minutes."""

    def __init__(self, bootstrap: str, records: int, steps: int = 60) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.steps = bootstrap, steps
        self.records = records // steps * steps  # what run() sends
        self.undelivered = -1

    def run(self) -> None:
        sender = producer(self.bootstrap, acks="all", message_timeout_ms=240000)
        per_step = self.records // self.steps
        for step in range(self.steps):
            for i in range(step * per_step, (step + 1) * per_step):
                sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=i % PARTITIONS)
            sender.poll(0)
            time.sleep(0.5)
        self.undelivered = sender.flush(240)

    @property
    def ids(self) -> set[str]:
        return {f"r{i:05d}" for i in range(self.records)}


def _pipeline(kafka: ApacheKafka, tmp_path: Path, sink_options: tuple[str, ...] = ()) -> PipelineProcess:
    args = run_arguments(
        kafka.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=SAME_PARTITION, trigger="500ms",
        sink_options=sink_options, extra=("--restart-attempts", "5", "--restart-delay", "2s"),
    )  # fmt: skip
    return PipelineProcess(tmp_path / "pipeline.log", args)


def _committed(kafka: ApacheKafka) -> int:
    return len(read_all(kafka.bootstrap_servers, "out", timeout_s=4, partitions=PARTITIONS))


def _transactional_id(tmp_path: Path, write_partition: int) -> str:
    query_id = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    return f"sparkafka-{query_id}-{write_partition}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ApacheKafka]:
    with ApacheKafka(tmp_path / "kafka", nodes=3) as running:
        for topic in ("in", "out"):
            create_topic(running.bootstrap_servers, topic, partitions=PARTITIONS, replicas=3)
        yield running


def _finish(kafka: ApacheKafka, pipeline: PipelineProcess, feeder: Feeder) -> tuple[object, str]:
    """Wait for the feeder, then for every record in ``out``; a pipeline that gave up (exited) is
    started again from its checkpoint. Returns the ids seen and what happened."""
    feeder.join(timeout=300)
    assert feeder.undelivered == 0, "the input producer could not deliver every record"
    process = pipeline.process
    assert process is not None
    happened = "carried on"
    if process.poll() is not None:
        happened = f"exited ({process.returncode}) and was started again:\n{pipeline.output()[-2500:]}"
        pipeline.start()
    output = committed_ids(kafka.bootstrap_servers, "out", expect=feeder.records, partitions=PARTITIONS)
    return output, happened


def test_two_of_three_nodes_killed_then_restarted(cluster: ApacheKafka, tmp_path: Path) -> None:
    """Two nodes SIGKILLed at once for 40 s: no controller quorum, and every partition below
    ``min.insync.replicas``. The pipeline waits or fails loudly; once the nodes are back every
    record comes out once."""
    feeder = Feeder(cluster.bootstrap_servers, 3000)
    feeder.start()
    pipeline = _pipeline(cluster, tmp_path).start()
    try:
        assert wait_until(lambda: _committed(cluster) > 0, timeout_s=180), pipeline.output()[-3000:]
        survivor = cluster.leader("out", 0)
        killed = [node for node in cluster.node_ids if node != survivor]
        for node in killed:
            cluster.kill(node)
        time.sleep(40)
        for node in killed:
            cluster.start(node)
        output, happened = _finish(cluster, pipeline, feeder)
    finally:
        if pipeline.process is not None:
            pipeline.terminate()
    print(f"killed nodes {killed}; pipeline {happened}")
    print("restarts:", pipeline.output().count("restarting from checkpoint"))
    assert_exactly_once(output, feeder.ids)  # type: ignore[arg-type]


def _send(kafka: ApacheKafka, numbers: range) -> set[str]:
    sender = producer(kafka.bootstrap_servers, acks="all", message_timeout_ms=120000)
    for i in numbers:
        sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=i % PARTITIONS)
    assert sender.flush(120) == 0
    return {f"r{i:05d}" for i in numbers}


def test_replay_reads_its_markers_from_a_new_leader(cluster: ApacheKafka, tmp_path: Path) -> None:
    """Batch 0's write tasks committed (output and markers), the driver has not yet written Spark's
    commit log (paused at driverCommit): the node leading the commit-marker partition is SIGKILLed,
    and so is the whole pipeline. Restarted at once, while that partition's leadership moves, the
    replay of batch 0 must find its markers on the new leader and skip; then more input, then the
    node comes back. Every record once."""
    ids = _send(cluster, range(0, 400))
    paused = ("debug.pauseAt=driverCommit", "debug.pauseMs=120s")
    pipeline = _pipeline(cluster, tmp_path, sink_options=paused).start()
    pipeline.wait_for("sparkafka debug pause: driverCommit partition=None batch=0", timeout_s=240)
    marker_leader = cluster.leader("_sparkafka_commit_markers", 0)
    cluster.kill(marker_leader)
    pipeline.kill_group()
    replay = _pipeline(cluster, tmp_path).start()
    try:
        ids |= _send(cluster, range(400, 800))
        output = committed_ids(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
        cluster.start(marker_leader)
        ids |= _send(cluster, range(800, 1000))
        output = committed_ids(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
    finally:
        if replay.process is not None:
            replay.terminate()
    log = replay.output()
    print(f"killed marker leader node {marker_leader}; restarts: {log.count('restarting from checkpoint')}")
    print("skipped replays:", log.count("is a replay"))
    assert_exactly_once(output, ids)


def test_whole_cluster_killed_with_a_transaction_open(cluster: ApacheKafka, tmp_path: Path) -> None:
    """Write partition 1 holds its transaction open (rows in the log, marker and commit pending)
    while all three nodes are SIGKILLed and restarted on their storage; the pipeline carries on,
    and input sent afterwards comes out too. Every record once."""
    ids = _send(cluster, range(0, 400))
    held = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=20s")
    pipeline = _pipeline(cluster, tmp_path, sink_options=held).start()
    try:
        pipeline.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=240)
        cluster.kill()
        cluster.start()
        ids |= _send(cluster, range(400, 800))
        output = committed_ids(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
    finally:
        if pipeline.process is not None:
            pipeline.terminate()
    print(f"restarts: {pipeline.output().count('restarting from checkpoint')}")
    assert_exactly_once(output, ids)


def test_crashed_pipeline_restarts_while_its_open_transaction_coordinator_is_down(
    cluster: ApacheKafka, tmp_path: Path
) -> None:
    """Write partition 1 holds its transaction open; the node coordinating its transactional id is
    SIGKILLed, and so is the pipeline. The pipeline is started again at once: its first batch must
    abort the open transaction through the new coordinator and write the batch once; then the node
    comes back and more input arrives. Every record once."""
    ids = _send(cluster, range(0, 400))
    held = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=120s")
    pipeline = _pipeline(cluster, tmp_path, sink_options=held).start()
    pipeline.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=240)
    coordinator = cluster.transaction_coordinator(_transactional_id(tmp_path, 1))
    cluster.kill(coordinator)
    pipeline.kill_group()
    replay = _pipeline(cluster, tmp_path).start()
    try:
        ids |= _send(cluster, range(400, 800))
        output = committed_ids(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
        cluster.start(coordinator)
        ids |= _send(cluster, range(800, 1000))
        output = committed_ids(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
    finally:
        if replay.process is not None:
            replay.terminate()
    restarts = replay.output().count("restarting from checkpoint")
    print(f"killed coordinator node {coordinator}; restarts: {restarts}")
    assert_exactly_once(output, ids)


def _fully_replicated(kafka: ApacheKafka) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    try:
        topics = admin.list_topics(timeout=5).topics
    except Exception:
        return False
    return all(len(p.isrs) == len(kafka.node_ids) for t in topics.values() for p in t.partitions.values())


def test_rolling_restart_under_load_with_default_restart_attempts(
    cluster: ApacheKafka, tmp_path: Path
) -> None:
    """A rolling restart, as operators do it: each node in turn SIGTERMed... here SIGKILLed, started
    again, and the next only once every partition is fully replicated again; input keeps arriving.
    The pipeline runs with the default ``--restart-attempts`` (0): a routine rolling restart must not
    end it. Every record once."""
    feeder = Feeder(cluster.bootstrap_servers, 3000, steps=80)
    feeder.start()
    args = run_arguments(
        cluster.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=SAME_PARTITION, trigger="500ms"
    )
    pipeline = PipelineProcess(tmp_path / "pipeline.log", args).start()
    try:
        assert wait_until(lambda: _committed(cluster) > 0, timeout_s=180), pipeline.output()[-3000:]
        for node in cluster.node_ids:
            cluster.kill(node)
            time.sleep(3)
            cluster.start(node)
            assert wait_until(lambda: _fully_replicated(cluster), timeout_s=120)
        output, happened = _finish(cluster, pipeline, feeder)
    finally:
        if pipeline.process is not None:
            pipeline.terminate()
    print(f"pipeline {happened}")
    assert_exactly_once(output, feeder.ids)  # type: ignore[arg-type]
    assert happened == "carried on", happened


def _partition_state(kafka: ApacheKafka, topic: str) -> tuple[int, list[int]]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    return int(partition.leader), sorted(partition.isrs)


def _elect_unclean(kafka: ApacheKafka, topic: str, node: int) -> bool:
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    with contextlib.suppress(Exception):  # not yet electable: asked again
        admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(topic, 0)]).result(timeout=10)
    try:
        return _partition_state(kafka, topic)[0] == node
    except Exception:
        return False


@pytest.mark.xfail(
    strict=True,
    reason="the source keeps bare offsets (no leader epochs): after an unclean leader election "
    "truncates the input log and new records refill it past the query's position, the refilled "
    "offsets below that position are skipped with no data-loss report",
)
def test_input_log_truncated_by_an_unclean_election_and_refilled(tmp_path: Path) -> None:
    """Input partition ``in``-0 has two replicas, A and B, and allows unclean leader election.
    B dies; records r100-r199 are written to A alone (in sync by itself) and the pipeline reads them.
    The pipeline stops cleanly. A stalls (SIGSTOP) and B comes back without them; the controller
    elects B uncleanly, which truncates the log to r0-r99; A is killed and restarts as B's follower.
    Producers go on: r200-r349 land at offsets 100-249. The pipeline restarts from its checkpoint,
    whose position is offset 200. Kafka's own consumer would detect the truncation by leader epoch
    (KIP-320); the source must either report data loss or read r200-r349, which the input now
    holds. It does neither: r200-r299 (offsets 100-199) are silently never read."""
    import os
    import signal

    with ApacheKafka(tmp_path / "kafka", nodes=3) as kafka:
        from confluent_kafka.admin import AdminClient, NewTopic

        a, b = 1, 2
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        topic = NewTopic(
            "in",
            num_partitions=1,
            replica_assignment=[[a, b]],
            config={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"},
        )
        admin.create_topics([topic])["in"].result(timeout=30)
        create_topic(kafka.bootstrap_servers, "out", partitions=1, replicas=3)
        assert wait_until(lambda: _partition_state(kafka, "in") == (a, [a, b]), timeout_s=60)

        args = run_arguments(
            kafka.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=SAME_PARTITION, trigger="500ms"
        )
        pipeline = PipelineProcess(tmp_path / "pipeline.log", args).start()
        try:
            _send_to(kafka, range(0, 100))
            committed_ids(kafka.bootstrap_servers, "out", expect=100, partitions=1)
            kafka.kill(b)
            assert wait_until(lambda: _partition_state(kafka, "in") == (a, [a]), timeout_s=60)
            _send_to(kafka, range(100, 200))
            committed_ids(kafka.bootstrap_servers, "out", expect=200, partitions=1)
        finally:
            assert pipeline.terminate() == 0

        os.killpg(kafka.processes[a].pid, signal.SIGSTOP)
        starting_b = threading.Thread(target=_start_quietly, args=(kafka, b), daemon=True)
        starting_b.start()
        assert wait_until(lambda: _elect_unclean(kafka, "in", b), timeout_s=120), "B was not elected"
        kafka.kill(a)
        kafka.start(a)
        starting_b.join(timeout=130)
        input_now = _send_to(kafka, range(200, 350)) | {f"r{i:05d}" for i in range(0, 100)}
        in_log = {
            m.value().decode().split("|")[0] for m in read_all(kafka.bootstrap_servers, "in", timeout_s=10)
        }
        assert in_log == input_now, "the unclean election should have left r0-r99 and r200-r349"

        pipeline.start()
        try:
            process = pipeline.process
            assert process is not None
            # 250 records when the skip happens, 350 when all is read; exiting is a loud failure.
            wait_until(lambda: _out_count(kafka) >= 250 or process.poll() is not None, timeout_s=180)
            time.sleep(5)
            output = committed_ids(kafka.bootstrap_servers, "out", expect=0, partitions=1)
        finally:
            if pipeline.process is not None and pipeline.process.poll() is None:
                pipeline.terminate()
        log = pipeline.output()
    reported = "failOnDataLoss" in log  # DataLossError and the failOnDataLoss=false warning name it
    missing = sorted(input_now - set(output))
    print(
        f"loss reported: {reported}; input records never written: {len(missing)} {missing[:1]}…{missing[-1:]}"
    )
    assert reported or not missing, f"{len(missing)} records of the input silently skipped"


def _out_count(kafka: ApacheKafka) -> int:
    return len(read_all(kafka.bootstrap_servers, "out", timeout_s=4))


def _send_to(kafka: ApacheKafka, numbers: range) -> set[str]:
    sender = producer(kafka.bootstrap_servers, acks="all", message_timeout_ms=120000)
    for i in numbers:
        sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=0)
    assert sender.flush(120) == 0
    return {f"r{i:05d}" for i in numbers}


def _start_quietly(kafka: ApacheKafka, node: int) -> None:
    with contextlib.suppress(RuntimeError):  # it waits for a node that is stopped meanwhile
        kafka.start(node)
