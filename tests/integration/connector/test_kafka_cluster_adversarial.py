"""Apache Kafka failing harder under an exactly-once pipeline than in ``test_kafka_cluster_faults.py``,
on a 3-node cluster (replication factor 3, ``min.insync.replicas=2``): two nodes lost at once (no
controller quorum, no in-sync quorum); a pipeline crash combined with the loss of the commit-marker
partition's leader, or of the coordinator of a transaction left open; and an unclean leader election
truncating the input log (the source's leader epochs show it). Pass criterion: every input record
once for read_committed readers, and the pipeline either carries on or fails loudly and completes
from its checkpoint."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path

from sparkafka.connector.sink.commit_log import MarkerLayout
from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.kafka_clients import (
    assert_exactly_once,
    committed_ids,
    create_topic,
    marker_topic_partitions,
    producer,
    read_to_end,
    wait_for_committed,
)
from tests.integration.kafka_cluster import (
    PARTITIONS,
    SAME_PARTITION,
    Feeder,
    cluster_pipeline,
    committed_count,
    transactional_id_of,
)


def _finish(kafka: ApacheKafka, pipeline: PipelineProcess, feeder: Feeder) -> tuple[object, set[str], str]:
    """Wait for the feeder, then for every record in ``out``; a pipeline that gave up (exited) is
    started again from its checkpoint. Returns the ids seen, the ids sent and what happened."""
    ids = feeder.finish()
    process = pipeline.process
    assert process is not None
    happened = "carried on"
    if process.poll() is not None:
        happened = f"exited ({process.returncode}) and was started again:\n{pipeline.output()[-2500:]}"
        pipeline.start()
    output = committed_ids(
        kafka.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=pipeline.terminate
    )
    return output, ids, happened


def test_two_of_three_nodes_killed_then_restarted(cluster: ApacheKafka, tmp_path: Path) -> None:
    """Two nodes SIGKILLed at once for 40 s: no controller quorum, and every partition below
    ``min.insync.replicas``. The pipeline waits or fails loudly; once the nodes are back every
    record comes out once."""
    feeder = Feeder(cluster.bootstrap_servers, per_step=50, steps=60)
    feeder.start()
    pipeline = cluster_pipeline(cluster, tmp_path).start()
    try:
        assert wait_until(lambda: committed_count(cluster) > 0, timeout_s=180), pipeline.output()[-3000:]
        survivor = cluster.leader("out", 0)
        killed = [node for node in cluster.node_ids if node != survivor]
        for node in killed:
            cluster.kill(node)
        time.sleep(40)
        for node in killed:
            cluster.start(node)
        output, ids, happened = _finish(cluster, pipeline, feeder)
    finally:
        if pipeline.process is not None:
            pipeline.terminate()
    print(f"killed nodes {killed}; pipeline {happened}")
    print("restarts:", pipeline.output().count("restarting from checkpoint"))
    assert_exactly_once(output, ids)  # type: ignore[arg-type]


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
    pipeline = cluster_pipeline(cluster, tmp_path, sink_options=paused).start()
    pipeline.wait_for("sparkafka debug pause: driverCommit partition=None batch=0", timeout_s=240)
    # The partition of the marker topic that holds the query's prefix (default sparkafka-<query id>).
    prefix = transactional_id_of(tmp_path, 0).removesuffix("-0")
    layout = MarkerLayout(len(marker_topic_partitions(cluster.bootstrap_servers)))
    marker_leader = cluster.leader("_sparkafka_commit_markers", layout.partition_of(prefix))
    cluster.kill(marker_leader)
    pipeline.kill_group()
    replay = cluster_pipeline(cluster, tmp_path).start()
    try:
        ids |= _send(cluster, range(400, 800))
        wait_for_committed(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
        cluster.start(marker_leader)
        ids |= _send(cluster, range(800, 1000))
        output = committed_ids(
            cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=replay.terminate
        )
    finally:
        replay.terminate()
    print(f"killed marker leader node {marker_leader}; restarts: {replay.output().count('restarting from')}")
    # Batch 0 once: a replay that had not found its markers would have written it again (or refused).
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
    pipeline = cluster_pipeline(cluster, tmp_path, sink_options=held).start()
    pipeline.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=240)
    coordinator = cluster.transaction_coordinator(transactional_id_of(tmp_path, 1))
    cluster.kill(coordinator)
    pipeline.kill_group()
    replay = cluster_pipeline(cluster, tmp_path).start()
    try:
        ids |= _send(cluster, range(400, 800))
        wait_for_committed(cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS)
        cluster.start(coordinator)
        ids |= _send(cluster, range(800, 1000))
        output = committed_ids(
            cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=replay.terminate
        )
    finally:
        replay.terminate()
    restarts = replay.output().count("restarting from checkpoint")
    print(f"killed coordinator node {coordinator}; restarts: {restarts}")
    assert_exactly_once(output, ids)


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


def _truncated_input(kafka: ApacheKafka, pipeline: PipelineProcess) -> None:
    """Input partition ``in``-0 has two replicas, A (node 1, leader) and B (node 2), and allows unclean
    leader election. The pipeline reads r0-r99 (offsets 0-99); B dies; r100-r199 are written to A
    alone (in sync by itself, ``min.insync.replicas=1``) and the pipeline reads them too, then stops
    cleanly at offset 200. A freezes (SIGSTOP) and B comes back without them; B is elected
    uncleanly, which truncates the log to r0-r99 (end offset 100); A is killed and restarts as B's
    follower. The KRaft quorum keeps two live voters throughout."""
    import os
    import signal

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
    pipeline.start()
    try:
        _send_to(kafka, range(0, 100))
        wait_for_committed(kafka.bootstrap_servers, "out", expect=100, partitions=1)
        kafka.kill(b)
        assert wait_until(lambda: _partition_state(kafka, "in") == (a, [a]), timeout_s=60)
        _send_to(kafka, range(100, 200))
        wait_for_committed(kafka.bootstrap_servers, "out", expect=200, partitions=1)
    finally:
        assert pipeline.terminate() == 0
    os.killpg(kafka.processes[a].pid, signal.SIGSTOP)
    starting_b = threading.Thread(target=_start_quietly, args=(kafka, b), daemon=True)
    starting_b.start()
    assert wait_until(lambda: _elect_unclean(kafka, "in", b), timeout_s=120), "B was not elected"
    kafka.kill(a)
    kafka.start(a)
    starting_b.join(timeout=130)
    in_log = [m.value().decode().split("|")[0] for m in read_to_end(kafka.bootstrap_servers, "in")]
    assert in_log == [f"r{i:05d}" for i in range(100)], "the unclean election should have left r0-r99"


def _rerun(
    kafka: ApacheKafka, pipeline: PipelineProcess, at_least: int, timeout_s: float = 180
) -> tuple[Counter[str], str]:
    """Start the pipeline again from its checkpoint; once it wrote ``at_least`` records or exited,
    stop it: the ids everything in ``out`` holds then, and what it printed."""
    pipeline.start()
    try:
        process = pipeline.process
        assert process is not None
        assert wait_until(
            lambda: _out_count(kafka) >= at_least or process.poll() is not None, timeout_s=timeout_s
        ), f"neither {at_least} records in out nor an exit within {timeout_s} s:\n{pipeline.output()[-3000:]}"
    finally:
        pipeline.terminate()
    return committed_ids(kafka.bootstrap_servers, "out", expect=0, partitions=1, stop=None), pipeline.output()


def _one_partition_pipeline(kafka: ApacheKafka, tmp_path: Path, *source_options: str) -> PipelineProcess:
    extra = tuple(item for option in source_options for item in ("--source-option", option))
    args = run_arguments(
        kafka.bootstrap_servers, "in", "out", tmp_path / "checkpoint", sql=SAME_PARTITION, trigger="500ms",
        extra=extra,
    )  # fmt: skip
    return PipelineProcess(tmp_path / "pipeline.log", args)


def test_input_log_truncated_by_an_unclean_election_and_refilled(tmp_path: Path) -> None:
    """After :func:`_truncated_input`, producers go on: r200-r349 land at offsets 100-249. The
    pipeline restarts from its checkpoint, whose position is offset 200 in the epoch before the
    election. Bare offsets would skip offsets 100-199 silently; the leader epoch recorded with the
    position shows the log truncated at 100 (KIP-320): with failOnDataLoss (the default) the query
    fails before planning past it, naming the partition and the offsets lost. Restarted with
    failOnDataLoss=false it reads on from the truncation: every record the input now holds, and
    r100-r199 (gone from Kafka) as written before, each exactly once."""
    with ApacheKafka(tmp_path / "kafka", nodes=3) as kafka:
        pipeline = _one_partition_pipeline(kafka, tmp_path)
        _truncated_input(kafka, pipeline)
        input_now = _send_to(kafka, range(200, 350)) | {f"r{i:05d}" for i in range(0, 100)}
        output, log = _rerun(kafka, pipeline, 350, timeout_s=120)
        assert "topic 'in' partition 0: the log was truncated below the query's position" in log, log[-3000:]
        assert "offsets 100 to 199" in log and "failOnDataLoss" in log
        assert set(output) == {f"r{i:05d}" for i in range(200)}, "nothing written past the truncation"
        going_on = _one_partition_pipeline(kafka, tmp_path, "failOnDataLoss=false")
        output, log = _rerun(kafka, going_on, 350)
    assert "Reading on from 100" in log
    assert_exactly_once(output, input_now | {f"r{i:05d}" for i in range(100, 200)})


def test_input_log_truncated_by_an_unclean_election_with_fail_on_data_loss_off(tmp_path: Path) -> None:
    """After :func:`_truncated_input` (the log ends at offset 100, the query's position is 200)
    and new records r200-r249 at offsets 100-149, the pipeline restarts with ``failOnDataLoss=false``.
    Records r100-r199 are gone from Kafka (they were written once). The recorded leader epoch shows
    where the log was truncated: the query reads on from offset 100, so r0-r99, which survived the
    truncation and were written before, are not written again, and r200-r249 are written once."""
    with ApacheKafka(tmp_path / "kafka", nodes=3) as kafka:
        pipeline = _one_partition_pipeline(kafka, tmp_path, "failOnDataLoss=false")
        _truncated_input(kafka, pipeline)
        _send_to(kafka, range(200, 250))  # offsets 100-149: the end is still below the position 200
        output, log = _rerun(kafka, pipeline, 250, timeout_s=90)
    assert "the log was truncated below the query's position: offsets 100 to 199" in log
    assert_exactly_once(output, {f"r{i:05d}" for i in range(250)})


def _out_count(kafka: ApacheKafka) -> int:
    return len(read_to_end(kafka.bootstrap_servers, "out"))


def _send_to(kafka: ApacheKafka, numbers: range) -> set[str]:
    sender = producer(kafka.bootstrap_servers, acks="all", message_timeout_ms=120000)
    for i in numbers:
        sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=0)
    assert sender.flush(120) == 0
    return {f"r{i:05d}" for i in numbers}


def _start_quietly(kafka: ApacheKafka, node: int) -> None:
    with contextlib.suppress(RuntimeError):  # it waits for a node that is stopped meanwhile
        kafka.start(node)
