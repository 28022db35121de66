"""A null where Kafka's schema allows none fails the parse, as Kafka's generated readers fail it; a
null where the schema allows one is decoded."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.admin import AlterConfigsRequest, CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.consumer import JoinGroupRequest
from kafka.protocol.metadata import MetadataRequest

from sparkafka.broker import protocol


def _decode(request: Any, version: int) -> Any:
    request.API_VERSION = version
    request.with_header(correlation_id=1, client_id="test")
    frame = bytes(request.encode(header=True, framed=False))
    return protocol.decode_request(protocol.peek_header(frame), frame)


def _alter_configs(name: str | None, value: str | None) -> AlterConfigsRequest:
    resource = AlterConfigsRequest.AlterConfigsResource
    return AlterConfigsRequest(
        resources=[
            resource(
                resource_type=2, resource_name="t", configs=[resource.AlterableConfig(name=name, value=value)]
            )
        ],
        validate_only=False,
    )


def _create_topics(name: str | None) -> CreateTopicsRequest:
    topic = CreateTopicsRequest.CreatableTopic
    return CreateTopicsRequest(
        topics=[topic(name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=1000,
        validate_only=False,
    )


@pytest.mark.parametrize(
    ("request_", "version", "field"),
    [
        (_alter_configs(None, "1"), 1, "Resources.Configs.Name"),
        (_create_topics(None), 5, "Topics.Name"),
        (MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=None)]), 4, "Topics.Name"),
        (
            JoinGroupRequest(
                group_id=None,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_id="",
                protocol_type="consumer",
                protocols=[],
            ),
            5,
            "GroupId",
        ),
    ],
)
def test_a_null_in_a_non_nullable_field_fails_the_parse(request_: Any, version: int, field: str) -> None:
    with pytest.raises(protocol.MalformedRequest, match=f"non-nullable field {field} was serialized as null"):
        _decode(request_, version)


def test_nulls_the_schema_allows_are_decoded() -> None:
    assert _decode(_alter_configs("retention.ms", None), 1).resources[0].configs[0].value is None
    assert _decode(MetadataRequest(topics=None, allow_auto_topic_creation=True), 4).topics is None
    # Metadata v10+ names a topic by id, its name null.
    topic = MetadataRequest.MetadataRequestTopic(name=None, topic_id="00000000-0000-0000-0000-000000000001")
    assert (
        _decode(MetadataRequest(topics=[topic], allow_auto_topic_creation=False), 12).topics[0].name is None
    )
    entry = DeleteTopicsRequest.DeleteTopicState(name=None, topic_id="00000000-0000-0000-0000-000000000001")
    assert _decode(DeleteTopicsRequest(topics=[entry], timeout_ms=1000), 6).topics[0].name is None


def test_a_zero_uuid_is_no_null() -> None:
    # kafka-python decodes the all-zero uuid (Metadata v12 by name: topic id zero) as None.
    topic = MetadataRequest.MetadataRequestTopic(name="t", topic_id="00000000-0000-0000-0000-000000000000")
    assert _decode(MetadataRequest(topics=[topic], allow_auto_topic_creation=False), 12).topics[0].name == "t"


@pytest.mark.parametrize(
    ("states", "types", "field"),
    [(["Stable", None], [], "StatesFilter element"), ([], ["classic", None], "TypesFilter element")],
)
def test_a_null_element_of_a_string_array_fails_the_parse(
    states: list[str | None], types: list[str | None], field: str
) -> None:
    """Found by the fuzzer: ListGroups' filters reached the handler with a None in them and the
    connection closed on an unexpected error. Kafka's generated readers refuse a null array element
    ("non-nullable field statesFilter element was serialized as null")."""
    from kafka.protocol.admin import ListGroupsRequest

    with pytest.raises(protocol.MalformedRequest, match=f"non-nullable field {field} was serialized as null"):
        _decode(ListGroupsRequest(states_filter=states, types_filter=types), 5)
