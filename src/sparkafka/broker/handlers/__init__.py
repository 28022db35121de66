"""Request handlers, one async function per Kafka API, grouped by concern."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkafka.broker.handlers import admin, configs, data, groups, txn
from sparkafka.broker.handlers.admin import api_versions_response
from sparkafka.broker.protocol import SUPPORTED_VERSIONS, ApiKey

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

HANDLERS: dict[ApiKey, Callable[..., Awaitable[Any]]] = {
    ApiKey.API_VERSIONS: admin.api_versions,
    ApiKey.SASL_HANDSHAKE: admin.sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: admin.sasl_authenticate,
    ApiKey.METADATA: admin.metadata,
    ApiKey.CREATE_TOPICS: admin.create_topics,
    ApiKey.DELETE_TOPICS: admin.delete_topics,
    ApiKey.CREATE_PARTITIONS: admin.create_partitions,
    ApiKey.DESCRIBE_CONFIGS: configs.describe_configs,
    ApiKey.ALTER_CONFIGS: configs.alter_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.incremental_alter_configs,
    ApiKey.DESCRIBE_CLUSTER: admin.describe_cluster,
    ApiKey.DESCRIBE_LOG_DIRS: admin.describe_log_dirs,
    ApiKey.PRODUCE: data.produce,
    ApiKey.FETCH: data.fetch,
    ApiKey.LIST_OFFSETS: data.list_offsets,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: data.offset_for_leader_epoch,
    ApiKey.DELETE_RECORDS: data.delete_records,
    ApiKey.INIT_PRODUCER_ID: txn.init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: txn.add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: txn.add_offsets_to_txn,
    ApiKey.END_TXN: txn.end_txn,
    ApiKey.TXN_OFFSET_COMMIT: txn.txn_offset_commit,
    ApiKey.DESCRIBE_PRODUCERS: txn.describe_producers,
    ApiKey.LIST_TRANSACTIONS: txn.list_transactions,
    ApiKey.DESCRIBE_TRANSACTIONS: txn.describe_transactions,
    ApiKey.FIND_COORDINATOR: groups.find_coordinator,
    ApiKey.JOIN_GROUP: groups.join_group,
    ApiKey.SYNC_GROUP: groups.sync_group,
    ApiKey.HEARTBEAT: groups.heartbeat,
    ApiKey.LEAVE_GROUP: groups.leave_group,
    ApiKey.OFFSET_COMMIT: groups.offset_commit,
    ApiKey.OFFSET_FETCH: groups.offset_fetch,
    ApiKey.LIST_GROUPS: groups.list_groups,
    ApiKey.DESCRIBE_GROUPS: groups.describe_groups,
    ApiKey.DELETE_GROUPS: groups.delete_groups,
    ApiKey.OFFSET_DELETE: groups.offset_delete,
}
assert set(HANDLERS) == set(SUPPORTED_VERSIONS), "every advertised API needs a handler"

__all__ = ["HANDLERS", "api_versions_response"]
