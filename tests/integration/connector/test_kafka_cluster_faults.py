"""Apache Kafka failing under sparkafka: a 3-node cluster (replication factor 3,
``min.insync.replicas=2``) losing the leader of a partition and the transaction coordinator's node,
and a single broker SIGKILLed with a transaction open. Queries wait out the failover; an
exactly-once pipeline writes every record once."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer

from sparkafka.connector.kafka_admin import KafkaAdmin, partition_watermarks
from sparkafka.tools.harness import wait_until
from sparkafka.tools.pipeline_process import PipelineProcess
from tests.integration.apache_kafka import ApacheKafka
from tests.integration.kafka_clients import (
    assert_exactly_once,
    committed_ids,
    create_topic,
    producer,
)
from tests.integration.kafka_cluster import (
    PARTITIONS,
    Feeder,
    cluster_pipeline,
    committed_count,
    pipeline_failures,
    transactional_id_of,
)


def _seconds_until_output_grows(kafka: ApacheKafka, pipeline: PipelineProcess, more: int) -> float:
    """Seconds until read_committed readers see ``more`` records in output partition 0 than now:
    input keeps arriving, so the pipeline must have committed transactions written after now."""
    started = time.monotonic()
    target = committed_count(kafka, 0) + more
    process = pipeline.process
    assert process is not None
    grew = wait_until(
        lambda: committed_count(kafka, 0) >= target or process.poll() is not None, timeout_s=120
    )
    assert grew and process.poll() is None, (
        f"no more output in 120 s; failures: {pipeline_failures(pipeline)}\n{pipeline.output()[-3000:]}"
    )
    return time.monotonic() - started


def test_offsets_of_a_partition_whose_leader_died_are_asked_of_the_new_leader(cluster: ApacheKafka) -> None:
    """The source asks the latest offsets before every micro-batch: a dead leader must cost the time
    the cluster takes to elect another, not a failed query."""
    sender = producer(cluster.bootstrap_servers, acks="all")
    for i in range(10):
        sender.produce("in", value=b"x", partition=i % PARTITIONS)
    assert sender.flush(30) == 0
    admin = KafkaAdmin({"bootstrap.servers": cluster.bootstrap_servers}, timeout_s=60, retry_interval_s=0.2)
    partitions = [("in", p) for p in range(PARTITIONS)]
    try:
        assert admin.latest_offsets(partitions, read_committed=False) == {tp: 5 for tp in partitions}
        cluster.kill(cluster.leader("in", 0))
        assert admin.latest_offsets(partitions, read_committed=False) == {tp: 5 for tp in partitions}
        assert admin.latest_offsets(partitions, read_committed=True) == {tp: 5 for tp in partitions}
    finally:
        admin.close()


def test_topics_are_described_after_the_node_taken_for_controller_died(cluster: ApacheKafka) -> None:
    """The source describes its topics before every micro-batch. librdkafka sends DescribeTopics to
    the node that metadata names as controller (any live broker, under KRaft): when that node dies,
    the client must learn of another."""
    admin = KafkaAdmin({"bootstrap.servers": cluster.bootstrap_servers}, timeout_s=60, retry_interval_s=0.2)
    try:
        assert admin.topic_partitions(["in", "missing"]) == {"in": [0, 1]}
        cluster.kill(admin.client.list_topics(timeout=10).controller_id)
        assert admin.topic_partitions(["in", "missing"]) == {"in": [0, 1]}
    finally:
        admin.close()


def test_watermarks_of_a_partition_whose_leader_died_come_from_the_new_leader(cluster: ApacheKafka) -> None:
    """The sink reads a partition's watermarks before it reads the commit markers: a consumer that
    knew the old leader must find the new one."""
    sender = producer(cluster.bootstrap_servers, acks="all")
    for i in range(10):
        sender.produce("in", value=b"x", partition=i % PARTITIONS)
    assert sender.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "watermarks"})
    try:
        assert partition_watermarks(consumer, "in", 0, timeout_s=60) == (0, 5)
        cluster.kill(cluster.leader("in", 0))
        assert partition_watermarks(consumer, "in", 0, timeout_s=60) == (0, 5)
    finally:
        consumer.close()


def test_output_leader_and_transaction_coordinator_killed_under_a_running_pipeline(
    cluster: ApacheKafka, tmp_path: Path
) -> None:
    """Input keeps arriving. While the pipeline commits batch after batch, the node leading output
    partition 0 is SIGKILLed, then restarted once the pipeline commits again without it; then the
    node coordinating write partition 0's transactional id, likewise; then input stops. Every input
    record comes out once for read_committed readers, and the pipeline never restarts."""
    feeder = Feeder(cluster.bootstrap_servers)
    feeder.start()
    pipeline = cluster_pipeline(cluster, tmp_path).start()
    try:
        assert wait_until(lambda: committed_count(cluster) > 0, timeout_s=180), pipeline.output()[-3000:]
        leader = cluster.leader("out", 0)
        cluster.kill(leader)
        without_leader_s = _seconds_until_output_grows(cluster, pipeline, more=100)
        cluster.start(leader)

        coordinator = cluster.transaction_coordinator(transactional_id_of(tmp_path, 0))
        cluster.kill(coordinator)
        without_coordinator_s = _seconds_until_output_grows(cluster, pipeline, more=100)
        cluster.start(coordinator)

        ids = feeder.finish()
        output = committed_ids(
            cluster.bootstrap_servers, "out", expect=len(ids), partitions=PARTITIONS, stop=pipeline.terminate
        )
    finally:
        feeder.finish()
        pipeline.terminate()
    assert_exactly_once(output, ids)
    failures = pipeline_failures(pipeline)
    assert not failures, f"the pipeline failed where it should have waited out the failover: {failures}"
    print(
        f"output partition 0 grew by 100 records {without_leader_s:.1f} s after its leader (node {leader}) "
        f"was killed, {without_coordinator_s:.1f} s after the coordinator (node {coordinator}) was"
    )


def test_a_single_broker_killed_with_a_transaction_open_and_restarted(tmp_path: Path) -> None:
    """Write partition 1 holds its transaction open (records written, commit pending) while the only
    broker is SIGKILLed and restarted on the same storage; the pipeline carries on, and input sent
    after the restart comes out too. Every record once for read_committed readers."""
    with ApacheKafka(tmp_path / "kafka") as kafka:
        for topic in ("in", "out"):
            create_topic(kafka.bootstrap_servers, topic, partitions=PARTITIONS)
        ids = _send(kafka, range(0, 200))
        held = ("debug.pauseAt=beforeCommit", "debug.pausePartitions=1", "debug.pauseMs=15s")
        pipeline = cluster_pipeline(kafka, tmp_path, sink_options=held).start()
        try:
            pipeline.wait_for("sparkafka debug pause: beforeCommit partition=1 batch=0", timeout_s=180)
            # Write partition 0 commits meanwhile. A lone Apache Kafka 4.1+ killed between its
            # PrepareCommit and its COMMIT markers skips the markers after the restart (KAFKA-20734),
            # leaving a hanging transaction: a Kafka bug, not the fault under test here.
            _wait_until_partition_0_committed(kafka)
            kafka.kill()
            kafka.start()
            ids |= _send(kafka, range(200, 400))
            bootstrap, stop = kafka.bootstrap_servers, pipeline.terminate
            output = committed_ids(bootstrap, "out", expect=len(ids), partitions=PARTITIONS, stop=stop)
        finally:
            pipeline.terminate()
    assert_exactly_once(output, ids)
    restarts = pipeline.output().count("restarting from checkpoint")
    print(f"single broker killed mid-transaction; pipeline restarts: {restarts}")


def _wait_until_partition_0_committed(kafka: ApacheKafka) -> None:
    """Until ``out``-0 holds records and no transaction is open on it nor on the marker partition:
    each one's last stable offset has reached its end."""
    partitions = [("out", 0), ("_sparkafka_commit_markers", 0)]
    admin = KafkaAdmin({"bootstrap.servers": kafka.bootstrap_servers}, timeout_s=30)

    def settled() -> bool:
        stable = admin.latest_offsets(partitions, read_committed=True)
        ends = admin.latest_offsets(partitions, read_committed=False)
        return stable == ends and ends[("out", 0)] > 0

    try:
        assert wait_until(settled, timeout_s=10), "write partition 0 did not commit while partition 1 waited"
    finally:
        admin.close()


def _send(kafka: ApacheKafka, numbers: range) -> set[str]:
    sender = producer(kafka.bootstrap_servers, acks="all")
    for i in numbers:
        sender.produce("in", value=f"r{i:05d}|{'v' * 100}", partition=i % PARTITIONS)
    assert sender.flush(60) == 0
    return {f"r{i:05d}" for i in numbers}
