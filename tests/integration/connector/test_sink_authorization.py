"""An exactly-once write that the cluster's authorizer refuses (Apache Kafka's StandardAuthorizer, an
ACL denying the sink's principal): the query fails naming the ACL to grant, and once it is granted
the restarted query writes every record exactly once, the part committed before the refusal
included."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from tests.integration.apache_kafka import ApacheKafka
from tests.integration.kafka_clients import create_topic, producer, read_to_end

RECORDS = 20
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    # Only what a test denies is denied: the nodes, and every other client, are ANONYMOUS too.
    "allow.everyone.if.no.acl.found": "true",
}


@pytest.fixture(scope="module")
def guarded_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    with ApacheKafka(tmp_path_factory.mktemp("guarded"), settings=AUTHORIZER) as kafka:
        yield kafka


def _input(kafka: ApacheKafka, name: str) -> set[str]:
    """``name`` with r0..r19 over two partitions, and ``name``-out of two partitions."""
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    sender = producer(kafka.bootstrap_servers)
    for number in range(RECORDS):
        sender.produce(name, value=f"r{number}".encode(), partition=number % 2)
    assert sender.flush(30) == 0
    return {f"r{number}" for number in range(RECORDS)}


def _run(spark: SparkSession, kafka: ApacheKafka, name: str, prefix: str, checkpoint: Path) -> None:
    """``name`` copied to ``name``-out exactly once, to the end of its input; two write tasks (one
    per input partition: ids ``prefix``-0 and ``prefix``-1)."""
    query = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", name)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", f"{name}-out")
        .option("deliveryGuarantee", "exactly-once")
        .option("transactionalIdPrefix", prefix)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _denied(
    kafka: ApacheKafka, resource: ResourceType, name: str, pattern: ResourcePatternType
) -> AclBinding:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    binding = AclBinding(
        resource, name, pattern, "User:ANONYMOUS", "*", AclOperation.ALL, AclPermissionType.DENY
    )
    admin.create_acls([binding])[binding].result(30)
    return binding


def _granted_again(kafka: ApacheKafka, binding: AclBinding) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    matching = AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )
    assert len(admin.delete_acls([matching])[matching].result(30)) == 1


def _output(kafka: ApacheKafka, name: str) -> Counter[str]:
    found = read_to_end(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    return Counter((message.value() or b"").decode() for message in found)


def test_a_write_partition_refused_its_transactional_id_names_the_acl_and_the_restart_writes_once(
    spark: SparkSession, guarded_kafka: ApacheKafka, tmp_path: Path
) -> None:
    expected = _input(guarded_kafka, "partly")
    denied = _denied(
        guarded_kafka, ResourceType.TRANSACTIONAL_ID, "partly-ids-1", ResourcePatternType.LITERAL
    )

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, guarded_kafka, "partly", "partly-ids", tmp_path / "checkpoint")

    message = str(refused.value)
    assert (
        "SinkAuthorizationError: initialising transactional id 'partly-ids-1' was refused by the " in message
    )
    assert "cluster's authorizer (TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in message
    assert (
        "--operation Write --operation Describe --transactional-id 'partly-ids' --resource-pattern-type"
        in message
    )
    assert (
        "then restart the query: nothing is lost, and what other tasks of the batch committed is not"
        in message
    )
    # Write partition 0 commits its half of the batch unless Spark cancels it first, when partition
    # 1's refusal fails the job: either way nothing else, and the restart below writes every record
    # once, partition 0's half included when it was committed here.
    half = Counter({f"r{n}": 1 for n in range(0, RECORDS, 2)})
    assert _output(guarded_kafka, "partly") in (Counter(), half)

    _granted_again(guarded_kafka, denied)
    _run(spark, guarded_kafka, "partly", "partly-ids", tmp_path / "checkpoint")

    assert _output(guarded_kafka, "partly") == Counter(dict.fromkeys(expected, 1))


def test_a_prefix_refused_is_named_before_any_output_and_the_restart_writes_once(
    spark: SparkSession, guarded_kafka: ApacheKafka, tmp_path: Path
) -> None:
    expected = _input(guarded_kafka, "whole")
    denied = _denied(guarded_kafka, ResourceType.TRANSACTIONAL_ID, "whole-ids", ResourcePatternType.PREFIXED)

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, guarded_kafka, "whole", "whole-ids", tmp_path / "checkpoint")

    message = str(refused.value)
    assert "claiming transactional-id prefix 'whole-ids' was refused by the cluster's authorizer" in message
    assert "--transactional-id 'whole-ids' --resource-pattern-type prefixed" in message
    # Not the marker topic's fault: no advice to move it.
    assert "commitMarkerTopic" not in message
    assert _output(guarded_kafka, "whole") == Counter()

    _granted_again(guarded_kafka, denied)
    _run(spark, guarded_kafka, "whole", "whole-ids", tmp_path / "checkpoint")

    assert _output(guarded_kafka, "whole") == Counter(dict.fromkeys(expected, 1))


def test_an_output_topic_refused_names_the_acl_and_the_restart_writes_once(
    spark: SparkSession, guarded_kafka: ApacheKafka, tmp_path: Path
) -> None:
    expected = _input(guarded_kafka, "topic")
    denied = _denied(guarded_kafka, ResourceType.TOPIC, "topic-out", ResourcePatternType.LITERAL)

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, guarded_kafka, "topic", "topic-ids", tmp_path / "checkpoint")

    message = str(refused.value)
    assert "SinkAuthorizationError: writing with transactional id 'topic-ids-" in message
    assert "TOPIC_AUTHORIZATION_FAILED" in message
    assert (
        "Write and Describe on the output topic 'topic-out', and Read, Write and Describe on the " in message
    )

    _granted_again(guarded_kafka, denied)
    _run(spark, guarded_kafka, "topic", "topic-ids", tmp_path / "checkpoint")

    assert _output(guarded_kafka, "topic") == Counter(dict.fromkeys(expected, 1))
