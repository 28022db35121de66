"""Where leader epochs end in the partitions' logs now (KIP-320's OffsetForLeaderEpoch), asked on
the driver to tell a log truncated under the query's position.

Why. The checkpoint keeps offsets; an unclean leader election truncates a partition's log below
offsets the query read, and new records then take those offsets. Kafka's consumers find this out
by leader epoch: a position ``(offset, epoch)`` is intact while the epoch still ends at or past
the offset on the current leader. librdkafka does this only inside a consumer's fetch loop, and
reports the new end in text alone; so the driver asks the leaders itself, through kafka-python's
client (already a dependency), with the same ``kafka.*`` properties.

Answers (Kafka's ``LeaderEpochFileCache.endOffsetFor``): the end offset of the largest epoch at
or below the asked one, the log end offset for the current epoch, ``-1`` where the log knows no
such epoch (a topic deleted and created again). A cluster without the API (or a client setup
kafka-python cannot reproduce) leaves the check off, said once in the log.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkafka.connector.kafka_admin import TopicPartitionKey
from sparkafka.connector.kafka_python import CONNECTION_PREFIXES, kafka_python_settings

logger = logging.getLogger(__name__)

# Errors after which a leader is asked again, with fresh metadata (librdkafka's list for the same
# request: rdkafka_offset.c).
_RETRIABLE = frozenset(
    {
        "NotLeaderForPartitionError",
        "NotLeaderOrFollowerError",
        "FencedLeaderEpochError",
        "UnknownLeaderEpochError",
        "OffsetNotAvailableError",
        "KafkaStorageError",
        "LeaderNotAvailableError",
        "UnknownTopicOrPartitionError",
        "RequestTimedOutError",
        "NotCoordinatorError",
    }
)


@dataclass(frozen=True)
class EpochEnd:
    """Where ``epoch`` (the largest at or below the one asked) ends in the log: ``end_offset``;
    both -1 when the log knows no such epoch."""

    epoch: int
    end_offset: int


class LeaderEpochEnds:
    """A kafka-python admin client kept for the query run (the stream reader's driver process), not
    pickled to executors."""

    def __init__(self, client_properties: Mapping[str, str], *, timeout_s: float) -> None:
        self.client_properties = dict(client_properties)
        self.timeout_s = timeout_s
        self._admin: Any = None
        self._unavailable: str | None = None

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_admin"] = None
        return state

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            try:
                admin.close()
            except Exception:  # closing a broken client: it is dropped anyway
                logger.debug("closing the leader-epoch client", exc_info=True)

    def ends(self, positions: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, EpochEnd] | None:
        """Where each partition's epoch (``positions``: partition -> leader epoch) ends now; None
        when the check cannot be made here (said once). Partitions that keep failing are left out."""
        if not positions or self._unavailable is not None:
            return None
        answers: dict[TopicPartitionKey, EpochEnd] = {}
        pending = dict(positions)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            try:
                found, failed = self._ask(pending)
            except _CheckUnavailable as unavailable:
                self._unavailable = str(unavailable)
                _warn_unavailable_once(str(unavailable))
                return None
            answers.update(found)
            pending = {tp: pending[tp] for tp in failed}
            if pending and time.monotonic() >= deadline:
                logger.warning(
                    "leader epochs of %s not answered within %.0f s: their positions are not checked "
                    "against a truncated log this micro-batch",
                    sorted(pending),
                    self.timeout_s,
                )
                break
            if pending:
                self.close()  # fresh metadata: leaders may have moved
                time.sleep(0.5)
        return answers

    def _client(self) -> Any:
        if self._admin is None:
            from kafka import KafkaAdminClient
            from kafka.errors import KafkaError

            settings, ignored = kafka_python_settings(
                {k: v for k, v in self.client_properties.items() if k != "bootstrap.servers"}
            )
            unsupported = [key for key in ignored if key.startswith(CONNECTION_PREFIXES)]
            if unsupported:
                raise _CheckUnavailable(
                    f"the client properties {', '.join(sorted(unsupported))} have no kafka-python setting"
                )
            servers = [s.strip() for s in str(self.client_properties.get("bootstrap.servers", "")).split(",")]
            try:
                self._admin = KafkaAdminClient(
                    bootstrap_servers=[s for s in servers if s],
                    client_id="sparkafka-source-epochs",
                    request_timeout_ms=int(self.timeout_s * 1000),
                    bootstrap_timeout_ms=int(self.timeout_s * 1000),
                    **settings,
                )
            except KafkaError as error:
                raise _Retriable(str(error)) from None
        return self._admin

    def _ask(
        self, positions: Mapping[TopicPartitionKey, int]
    ) -> tuple[dict[TopicPartitionKey, EpochEnd], list[TopicPartitionKey]]:
        import kafka.errors as errors
        from kafka import TopicPartition
        from kafka.protocol.consumer import OffsetForLeaderEpochRequest

        topic_class = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
        partition_class = topic_class.OffsetForLeaderPartition
        try:
            admin = self._client()
        except _Retriable:
            return {}, list(positions)

        async def ask() -> tuple[dict[TopicPartitionKey, EpochEnd], list[TopicPartitionKey]]:
            found: dict[TopicPartitionKey, EpochEnd] = {}
            failed: list[TopicPartitionKey] = []
            wanted = {TopicPartition(topic, partition) for topic, partition in positions}
            leaders = await admin._async_get_leader_for_partitions(wanted)
            led = {(tp.topic, tp.partition) for tps in leaders.values() for tp in tps}
            failed.extend(tp for tp in positions if tp not in led)
            for node, partitions in leaders.items():
                by_topic: dict[str, list[Any]] = {}
                for tp in partitions:
                    by_topic.setdefault(tp.topic, []).append(
                        partition_class(
                            partition=tp.partition,
                            current_leader_epoch=-1,
                            leader_epoch=positions[(tp.topic, tp.partition)],
                        )
                    )
                request = OffsetForLeaderEpochRequest(
                    replica_id=-1, topics=[topic_class(topic=t, partitions=p) for t, p in by_topic.items()]
                )
                response = await admin._manager.send(request, node_id=node)
                for topic in response.topics:
                    for answer in topic.partitions:
                        key = (topic.topic, answer.partition)
                        error = errors.for_code(answer.error_code)
                        if error is errors.NoError:
                            found[key] = EpochEnd(answer.leader_epoch, answer.end_offset)
                        elif error.__name__ in _RETRIABLE:
                            failed.append(key)
                        else:
                            raise _CheckUnavailable(f"{error.__name__} for {key[0]}-{key[1]}")
            return found, failed

        try:
            return admin._manager.run(ask)
        except (errors.IncompatibleBrokerVersion, errors.UnsupportedVersionError) as error:
            raise _CheckUnavailable(f"the cluster does not offer OffsetForLeaderEpoch ({error})") from None
        except AttributeError as error:  # kafka-python's internals moved: pinned below 4
            raise _CheckUnavailable(f"kafka-python's client changed ({error})") from None
        except errors.KafkaError as error:
            logger.info("asking leader epochs failed (%s); asking again", error)
            self.close()
            return {}, list(positions)


class _CheckUnavailable(Exception):
    """The check cannot be made against this cluster or with these client properties."""


class _Retriable(Exception):
    """The client could not reach the cluster this time."""


@functools.cache
def _warn_unavailable_once(reason: str) -> None:
    logger.warning(
        "the source cannot check its positions against the leaders' epochs (%s): a log truncated below "
        "the query's position by an unclean leader election is then seen only when its end falls below "
        "the position (docs/guarantees.md)",
        reason,
    )
