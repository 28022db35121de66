"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, as Kafka's ConfigAdminManager answers
them for topics and this broker, and the config entries CreateTopics returns (KIP-525)."""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    AlterConfigsResponse,
    CreateTopicsResponse,
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)

from sparkafka.broker import jvm_order
from sparkafka.broker.config_synonyms import (
    SOURCE_DEFAULT,
    Synonym,
    broker_config_entries,
    broker_config_synonyms,
    kafka_settings,
    static_broker_configs,
    topic_config_synonyms,
)
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.topic_configs import DESCRIBED_TOPIC_CONFIGS, TOPIC_CONFIGS, ConfigType, described_value
from sparkafka.broker.topics import Topic, validate_topic_name

if TYPE_CHECKING:
    from sparkafka.broker.connection import RequestContext
    from sparkafka.broker.server import Broker

# DescribeConfigs resource types and config sources (Kafka's ConfigResource.Type / ConfigSource).
_RESOURCE_TOPIC = 2
_RESOURCE_BROKER = 4
# Resource types Kafka knows besides those (BROKER_LOGGER, CLIENT_METRICS, GROUP): no configs here.
_RESOURCES_WITHOUT_CONFIGS = frozenset({8, 16, 32})
# IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType).
_OP_SET, _OP_DELETE, _OP_APPEND, _OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {_OP_SET: "SET", _OP_DELETE: "DELETE", _OP_APPEND: "APPEND", _OP_SUBTRACT: "SUBTRACT"}


def _topic_config_names(topic: Topic) -> list[str]:
    """Every topic config Kafka describes, and an internal one the topic sets."""
    return sorted({*DESCRIBED_TOPIC_CONFIGS, *topic.configs})


def created_topic_config_entries(broker: Broker, topic: Topic) -> list[Any]:
    entry_class = CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs
    return [
        entry_class(name=key, value=value, read_only=False, config_source=source, is_sensitive=False)
        # Kafka's controller answers CreateTopics with the overrides as given.
        for key, value, source, *_ in _topic_config_entries(broker, topic, as_given=True)
    ]


# name, value, source, type, read only, synonyms
_ConfigEntry = tuple[str, str | None, int, int, bool, list[Synonym]]


def _config_entry(
    name: str, value: str | None, config_type: int, found: list[Synonym], *, read_only: bool = False
) -> _ConfigEntry:
    """A config's source is its first synonym's (Kafka's ConfigHelper), else the default."""
    return (name, value, found[0].source if found else SOURCE_DEFAULT, int(config_type), read_only, found)


def _topic_config_entries(broker: Broker, topic: Topic, *, as_given: bool = False) -> list[_ConfigEntry]:
    """The topic's configs; an override's value as DescribeConfigs describes it (parsed and written
    back), or ``as_given``."""
    static = static_broker_configs(kafka_settings(broker.config))
    return [
        _config_entry(
            key,
            described_value(key, topic.configs[key])
            if key in topic.configs and not as_given
            else topic.config(key, broker.config),
            TOPIC_CONFIGS[key].type,
            topic_config_synonyms(key, topic.configs, static),
        )
        for key in _topic_config_names(topic)
    ]


def _broker_config_entries(broker: Broker) -> list[_ConfigEntry]:
    # max.connections left to the broker is described as what it chose at start.
    running = {
        "max.connections": str(broker.connection_quotas.max_connections),
        **kafka_settings(broker.config),
    }
    static = static_broker_configs(running)
    return [
        _config_entry(
            entry.name,
            entry.value,
            entry.type,
            broker_config_synonyms(entry.name, static),
            read_only=entry.read_only,
        )
        for entry in broker_config_entries(static)
    ]


def names_given_twice(names: Iterable[str]) -> list[str]:
    """The names given more than once, as Kafka's ControllerApis collects them: added to a
    java.util.HashSet as each is seen again, and answered in its order (:func:`duplicate_error`,
    nothing else done for them)."""
    seen: set[str] = set()
    again: list[str] = []
    for name in names:
        if name in seen:
            again.append(name)
        seen.add(name)
    return jvm_order.java_hash_set(again)


def duplicate_error() -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def _broker_id(name: str) -> int | None:
    """The broker id a config resource names, as Java's Integer.parseInt reads it for Kafka's
    ConfigHelper.resourceNameToBrokerId (an optional sign, no spaces, 32 bits); None if it is none."""
    if not _JAVA_INT.fullmatch(name) or not -(2**31) <= int(name) < 2**31:
        return None
    return int(name)


# Config resource types Kafka 4 describes that this broker keeps no configs for.
_RESOURCE_TYPES_NOT_KEPT = {8: "BROKER_LOGGER", 16: "CLIENT_METRICS", 32: "GROUP"}


async def describe_configs(broker: Broker, request: Any, context: RequestContext) -> Any:
    """Kafka's ConfigHelper.handleDescribeConfigsRequest: a resource type Kafka does not know fails
    the whole request (every resource INVALID_REQUEST, with the error's default message); an answer
    Kafka gives no message has the empty one, the generated field's default."""
    result_class = DescribeConfigsResponse.DescribeConfigsResult
    entry_class = result_class.DescribeConfigsResourceResult
    synonym_class = entry_class.DescribeConfigsSynonym
    known_types = {_RESOURCE_TOPIC, _RESOURCE_BROKER, *_RESOURCE_TYPES_NOT_KEPT}
    if any(resource.resource_type not in known_types for resource in request.resources):
        invalid = ErrorCode.INVALID_REQUEST
        return DescribeConfigsResponse(
            throttle_time_ms=0,
            results=[
                result_class(
                    error_code=invalid,
                    error_message=invalid.kafka_message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=[],
                )
                for resource in request.resources
            ],
        )
    results = []
    for resource in request.resources:
        keys = list(resource.configuration_keys) if resource.configuration_keys is not None else None
        entries: list[_ConfigEntry] = []
        error = ErrorCode.NONE
        message: str | None = ""
        if resource.resource_type == _RESOURCE_TOPIC:
            topic = broker.topics.topics.get(resource.resource_name)
            try:
                validate_topic_name(resource.resource_name)  # Kafka: INVALID_TOPIC_EXCEPTION first
            except BrokerError as exc:
                error, message = exc.code, exc.message
            if error == ErrorCode.NONE and topic is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # with no message, as Kafka's ConfigHelper
            elif topic is not None:
                entries = _topic_config_entries(broker, topic)
        elif resource.resource_type == _RESOURCE_BROKER:
            # Kafka's ConfigHelper: "" names the cluster-wide dynamic defaults (none are set here),
            # this broker's id its own configs, and any other id is not this broker's to answer.
            name = resource.resource_name
            if name != "" and _broker_id(name) is None:
                error, message = ErrorCode.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}"
            elif name != "" and _broker_id(name) == broker.config.node_id:
                entries = _broker_config_entries(broker)
            elif name != "":
                error = ErrorCode.INVALID_REQUEST
                message = (
                    f"Unexpected broker id, expected {broker.config.node_id} or empty string, "
                    f"but received {name}"
                )
        else:
            error = ErrorCode.INVALID_REQUEST
            kind = _RESOURCE_TYPES_NOT_KEPT[resource.resource_type]
            message = (
                f"resource type {resource.resource_type} ({kind}) is not supported by this broker; "
                "use 2 (topic) or 4 (broker)"
            )
        results.append(
            result_class(
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=[
                    entry_class(
                        name=key,
                        value=value,
                        read_only=read_only,
                        config_source=source,
                        is_default=source == SOURCE_DEFAULT,
                        is_sensitive=False,
                        synonyms=[synonym_class(name=n, value=v, source=src) for n, v, src in found]
                        if request.include_synonyms
                        else [],
                        config_type=config_type,
                        documentation=None,
                    )
                    for key, value, source, config_type, read_only, found in entries
                    # Kafka's ConfigHelper: no keys, or an empty list of them, asks for every config.
                    if not keys or key in keys
                ],
            )
        )
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


def _alter_configs(
    broker: Broker,
    resources: Sequence[Any],
    validate_only: bool,
    null_allowed: Callable[[Any], bool],
    new_overrides: Callable[[Any, dict[str, str]], dict[str, str]],
) -> list[tuple[Any, ErrorCode, str | None]]:
    """(resource, error, message) for each resource of an AlterConfigs or IncrementalAlterConfigs
    request, in request order, checked as Kafka's ConfigAdminManager.preprocess and then its controller:

    1. a resource given more than once: INVALID_REQUEST for each of its entries;
    2. a config named twice in one resource: INVALID_REQUEST; a null value (where the operation is
       not DELETE): INVALID_REQUEST naming the keys;
    3. a topic: its new overrides from ``new_overrides(resource, current overrides)``, then
       :meth:`TopicController.alter_topic_configs` (name, configs, existence; stored unless validate only);
    4. a broker (this one, or "" for the cluster): this broker's configs are fixed at start, so any
       change is INVALID_REQUEST, as Kafka refuses a change of a config it cannot make dynamically;
       other resource types INVALID_REQUEST."""
    counts = collections.Counter((r.resource_type, r.resource_name) for r in resources)
    results: list[tuple[Any, ErrorCode, str | None]] = []
    for resource in resources:
        try:
            if counts[(resource.resource_type, resource.resource_name)] > 1:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")
            if len({c.name for c in resource.configs}) < len(resource.configs):
                raise BrokerError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
            nulls = [c.name for c in resource.configs if c.value is None and not null_allowed(c)]
            if nulls:
                raise BrokerError(
                    ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}"
                )
            if resource.resource_type == _RESOURCE_TOPIC:
                topic = broker.topics.topics.get(resource.resource_name)
                current = dict(topic.configs) if topic is not None else {}
                broker.topic_controller.alter_topic_configs(
                    resource.resource_name, new_overrides(resource, current), validate_only=validate_only
                )
            elif resource.resource_type == _RESOURCE_BROKER:
                _check_broker_resource_name(resource.resource_name, broker.config.node_id)
                if resource.configs:
                    # As Kafka refuses a config it cannot change while running; here that is every one.
                    keys = ", ".join(sorted(c.name for c in resource.configs))
                    raise BrokerError(
                        ErrorCode.INVALID_REQUEST, f"Cannot update these configs dynamically: [{keys}]"
                    )
            elif resource.resource_type in _RESOURCES_WITHOUT_CONFIGS:
                raise BrokerError(
                    ErrorCode.INVALID_REQUEST,
                    f"resource type {resource.resource_type} has no configs on this broker; use 2 (topic)",
                )
            else:
                raise BrokerError(
                    ErrorCode.INVALID_REQUEST, f"Unknown resource type {resource.resource_type}"
                )
            results.append((resource, ErrorCode.NONE, None))
        except BrokerError as exc:
            results.append((resource, exc.code, exc.message))
    return results


def _check_broker_resource_name(name: str, node_id: int) -> None:
    """Kafka's ConfigAdminManager.validateResourceNameIsCurrentNodeId: "" is the whole cluster,
    otherwise the name must be an integer naming this broker."""
    if not name:
        return
    named = _broker_id(name)
    if named is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}")
    if named != node_id:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {node_id}, but received {name}"
        )


def _java_split(value: str) -> list[str]:
    """``value.split(",")`` as Java splits: trailing empty parts are dropped, so "compact," is one
    item, while a value without a comma is itself the one item (even "")."""
    if "," not in value:
        return [value]
    parts = value.split(",")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _incremental_overrides(resource: Any, current: dict[str, str]) -> dict[str, str]:
    """Kafka's ConfigurationControlManager.incrementalAlterConfigResource: SET and DELETE replace or
    drop an override; APPEND and SUBTRACT edit a LIST config's items (its default when not set),
    and refuse any other config with INVALID_CONFIG."""
    overrides = dict(current)
    for change in resource.configs:
        key, operation = change.name, change.config_operation
        if operation == _OP_SET:
            overrides[key] = change.value
        elif operation == _OP_DELETE:
            overrides.pop(key, None)
        elif operation in (_OP_APPEND, _OP_SUBTRACT):
            definition = TOPIC_CONFIGS.get(key)
            if definition is None or definition.type is not ConfigType.LIST:
                raise BrokerError(
                    ErrorCode.INVALID_CONFIG,
                    f"Can't {_OP_NAMES[operation]} to key {key} because its type is not LIST.",
                )
            present = overrides.get(key, definition.default or "")
            items = [item for item in present.split(",") if item]
            for item in _java_split(change.value):
                if operation == _OP_APPEND and item not in items:
                    items.append(item)
                elif operation == _OP_SUBTRACT and item in items:
                    items.remove(item)
            overrides[key] = ",".join(items)
        else:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"Unknown config operation {operation}")
    return overrides


def _alter_configs_response(response_class: Any, results: list[tuple[Any, ErrorCode, str | None]]) -> Any:
    """AlterConfigs' and IncrementalAlterConfigs' responses have the same shape."""
    entry_class = response_class.AlterConfigsResourceResponse
    return response_class(
        throttle_time_ms=0,
        responses=[
            entry_class(
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for resource, error, message in results
        ],
    )


async def incremental_alter_configs(broker: Broker, request: Any, context: RequestContext) -> Any:
    results = _alter_configs(
        broker,
        request.resources,
        bool(request.validate_only),
        null_allowed=lambda change: change.config_operation == _OP_DELETE,
        new_overrides=_incremental_overrides,
    )
    return _alter_configs_response(IncrementalAlterConfigsResponse, results)


async def alter_configs(broker: Broker, request: Any, context: RequestContext) -> Any:
    """The legacy AlterConfigs: the given configs become the resource's whole set of overrides."""
    results = _alter_configs(
        broker,
        request.resources,
        bool(request.validate_only),
        null_allowed=lambda change: False,
        new_overrides=lambda resource, current: {c.name: c.value for c in resource.configs},
    )
    return _alter_configs_response(AlterConfigsResponse, results)
