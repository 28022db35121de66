"""The transaction coordinator (KIP-98), for a broker that is the coordinator of every transactional id.

Per transactional id it keeps the producer id, the epoch, the timeout, the state and the partitions
and consumer groups the ongoing transaction touches. Every change is appended to a journal before
the response is sent, so a SIGKILL between two requests loses no decision.

Ending a transaction (EndTxn, InitProducerId over an open transaction, or a timeout):
1. journal ``PrepareCommit``/``PrepareAbort`` — from here on the outcome is decided;
2. write a COMMIT/ABORT control batch on every partition where the producer wrote data in it, and
   materialise or discard its transactional consumer-group offsets;
3. journal ``CompleteCommit``/``CompleteAbort``.
A crash between 1 and 3 is finished on start: the prepared outcome is written again to the
partitions that still hold the transaction open (or, if those writes fail, by the periodic task).

Once step 1 is journaled the outcome stands: EndTxn answers success even if step 2 fails (a marker
write or a journal append), and the periodic task retries steps 2-3 (:meth:`complete_prepared`), as
Kafka's marker channel does. Until then the id answers CONCURRENT_TRANSACTIONS.

State changes: a transaction's state moves only along Kafka's transitions (``_VALID_PREVIOUS_STATES``,
as Kafka's TransactionState), and every change goes one way, :meth:`TransactionStateManager.write`:
prepare the next metadata as a copy (the transition checked), journal it, and only then apply it to
the metadata in memory. Memory never holds a state the journal lacks, so nothing needs undoing when
the journal append fails.

Fencing: InitProducerId and a timeout abort bump the epoch. Markers carry the bumped epoch, so the
partitions reject later batches of the old producer (INVALID_PRODUCER_EPOCH) and the coordinator
rejects its transactional requests (PRODUCER_FENCED).

InitProducerId with the producer's current id and epoch (KIP-360: an idempotent or transactional
producer bumping its own epoch) follows Kafka's TransactionMetadata.prepareIncrementProducerEpoch:
the current epoch is bumped, and remembered as the last epoch; the last epoch again (a retry whose
answer was lost) gets the current epoch without a bump; any other epoch is PRODUCER_FENCED. A new
instance (no producer id in the request), a fence and a timeout forget the last epoch, so a fenced
producer can never bump its way back. After an exhausted epoch moves the id to a new producer id,
the previous producer id with that epoch is a retry of the rotation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.journal import Journal
from sparkafka.broker.settings import default_int

log = logging.getLogger(__name__)

# Kafka's offsets.topic.num.partitions default: a group's offsets live in partition
# abs(groupId.hashCode) % 50 of __consumer_offsets, which AddOffsetsToTxn adds to the transaction.
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS = 50


def offsets_partition_for(group_id: str) -> int:
    """Kafka's GroupCoordinator.partitionFor: Java's String.hashCode over UTF-16 code units, then
    Utils.abs (Integer.MIN_VALUE maps to 0), modulo the offsets topic's partition count."""
    hash_code = 0
    units = group_id.encode("utf-16-be")
    for index in range(0, len(units), 2):
        hash_code = (31 * hash_code + (units[index] << 8 | units[index + 1])) & 0xFFFFFFFF
    if hash_code >= 1 << 31:
        hash_code -= 1 << 32
    magnitude = 0 if hash_code == -(1 << 31) else abs(hash_code)
    return magnitude % OFFSETS_TOPIC_PARTITIONS


# Kafka bumps to a new producer id once the epoch would reach Short.MaxValue.
_MAX_EPOCH = 32767 - 1
_PRODUCER_ID_BLOCK = 1000
_JOURNAL_REWRITE_THRESHOLD = 10_000

TopicPartition = tuple[str, int]


class TxnState(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


_COMPLETED = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
_PREPARED = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})

# The states a transaction may move to each state from, as Kafka's TransactionState.validPreviousStates
# (without PrepareEpochFence and Dead, which this coordinator does not use: a fence is journaled with
# its PrepareAbort, and removed ids are forgotten by a tombstone).
_VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: _COMPLETED,
    TxnState.ONGOING: _COMPLETED | {TxnState.ONGOING},
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
}


class IllegalStateTransition(Exception):
    """A change the state machine does not allow: a bug of the coordinator, never a client's error."""


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    # KIP-360: the epoch before the last bump a producer asked for itself (-1: none to retry), and the
    # producer id before the last rotation to a new one.
    last_producer_epoch: int = -1
    previous_producer_id: int = -1
    # Not journaled: the partitions (and groups) whose part of the decided outcome is already
    # written, so a retry writes only the rest (after a restart it writes them all again; a marker
    # for a transaction a partition already ended changes nothing there).
    outcome_written: set[TopicPartition | str] = field(default_factory=set, compare=False)

    def to_entry(self) -> dict[str, Any]:
        return {
            "type": "txn",
            "id": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
            "start": self.start_ms,
            "updated": self.last_update_ms,
            "last_epoch": self.last_producer_epoch,
            "previous_pid": self.previous_producer_id,
        }

    def _moved_to(self, state: TxnState, **changes: Any) -> TransactionMetadata:
        """The metadata after moving to ``state`` with ``changes``, as a copy: this one is left as it
        is until the copy is journaled (:meth:`TransactionStateManager.write`). Raises
        :class:`IllegalStateTransition` for a move Kafka's state machine does not allow."""
        if self.state not in _VALID_PREVIOUS_STATES[state]:
            raise IllegalStateTransition(
                f"transactional id {self.transactional_id!r}: {self.state.value} -> {state.value} is not a "
                "valid transition"
            )
        copied = {name: getattr(self, name) for name in _JOURNALED_FIELDS}
        copied.update(partitions=set(self.partitions), groups=set(self.groups))
        return TransactionMetadata(**{**copied, **changes, "state": state})

    # -- Kafka's transitions, each a checked copy --------------------------------------------------

    def prepare_epoch_bump(
        self, *, timeout_ms: int, producer_id: int, producer_epoch: int, new_producer_id: Callable[[], int]
    ) -> TransactionMetadata:
        """InitProducerId for an id without an open transaction (Kafka's prepareIncrementProducerEpoch
        and prepareProducerIdRotation), back to Empty with ``timeout_ms``:

        - a new instance (``producer_id`` -1) gets the epoch bumped, and no last epoch to retry;
        - the producer's own current id and epoch (KIP-360) get the epoch bumped, the current one
          remembered as the last;
        - the last epoch again (a retry whose answer was lost) gets the current epoch, not bumped;
        - any other epoch is PRODUCER_FENCED;
        - an exhausted epoch (a new instance, or the producer's current one) moves the id to a new
          producer id at epoch 0, remembering the previous id."""
        bumping_own_epoch = producer_id >= 0
        own_current_epoch = (producer_id, producer_epoch) == (self.producer_id, self.producer_epoch)
        identity: dict[str, int] = {}
        if self.producer_epoch >= _MAX_EPOCH and (not bumping_own_epoch or own_current_epoch):
            identity = {
                "previous_producer_id": self.producer_id,
                "last_producer_epoch": self.producer_epoch if bumping_own_epoch else -1,
                "producer_id": new_producer_id(),
                "producer_epoch": 0,
            }
        elif not bumping_own_epoch:
            identity = {"producer_epoch": self.producer_epoch + 1, "last_producer_epoch": -1}
        elif own_current_epoch:
            identity = {"producer_epoch": self.producer_epoch + 1, "last_producer_epoch": self.producer_epoch}
        elif producer_epoch != self.last_producer_epoch:
            raise producer_fenced(self, producer_id, producer_epoch)
        # else: the last bump again, its answer lost: the current epoch, not bumped twice.
        return self._moved_to(
            TxnState.EMPTY, **identity, timeout_ms=timeout_ms, partitions=set(), groups=set(), start_ms=-1
        )

    def prepare_add(
        self, *, partitions: Iterable[TopicPartition] = (), groups: Iterable[str] = (), now_ms: int
    ) -> TransactionMetadata:
        """Partitions and groups added to the ongoing transaction (Kafka's prepareAddPartitions),
        beginning one at ``now_ms`` after a completed transaction (or none)."""
        if self.state is TxnState.ONGOING:
            return self._moved_to(
                TxnState.ONGOING,
                partitions=self.partitions | set(partitions),
                groups=self.groups | set(groups),
            )
        return self._moved_to(
            TxnState.ONGOING, partitions=set(partitions), groups=set(groups), start_ms=now_ms
        )

    def prepare_decision(self, *, commit: bool) -> TransactionMetadata:
        """The ongoing transaction's outcome decided (Kafka's prepareAbortOrCommit): PrepareCommit or
        PrepareAbort."""
        return self._moved_to(TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)

    def prepare_fence_and_abort(self) -> TransactionMetadata:
        """The ongoing transaction aborted and its producer fenced (Kafka's prepareFenceProducerEpoch
        with the abort, one journal entry here): the epoch bumped, and no last epoch, so the fenced
        producer's epoch is no retry of anything."""
        return self._moved_to(
            TxnState.PREPARE_ABORT, producer_epoch=self.producer_epoch + 1, last_producer_epoch=-1
        )

    def prepare_complete(self) -> TransactionMetadata:
        """The decided outcome written everywhere (Kafka's prepareComplete): CompleteCommit or
        CompleteAbort, listing no partitions (DescribeTransactions); the start time stays."""
        completed = (
            TxnState.COMPLETE_COMMIT if self.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        )
        return self._moved_to(completed, partitions=set(), groups=set())

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> TransactionMetadata:
        return cls(
            transactional_id=entry["id"],
            producer_id=entry["pid"],
            producer_epoch=entry["epoch"],
            timeout_ms=entry["timeout"],
            state=TxnState(entry["state"]),
            partitions={(t, p) for t, p in entry["partitions"]},
            groups=set(entry["groups"]),
            start_ms=entry["start"],
            last_update_ms=entry["updated"],
            # Journals written before these fields existed: nothing to retry.
            last_producer_epoch=entry.get("last_epoch", -1),
            previous_producer_id=entry.get("previous_pid", -1),
        )


# The fields to_entry journals (outcome_written is not one of them).
_JOURNALED_FIELDS = tuple(
    f.name for f in dataclasses.fields(TransactionMetadata) if f.name != "outcome_written"
)


def producer_fenced(txn: TransactionMetadata, producer_id: int, producer_epoch: int) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_FENCED,
        f"producer {producer_id} epoch {producer_epoch} no longer owns transactional id "
        f"{txn.transactional_id!r} (now producer {txn.producer_id} epoch {txn.producer_epoch})",
    )


class TransactionVerificationError(BrokerError):
    """A transactional batch the coordinator's verification refused. Kafka answers these before the
    log is involved (no log start offset in the Produce response); ``kafka_text`` is the error message
    Kafka's response carries (ReplicaManager's custom messages), None where it sends none."""

    def __init__(self, code: ErrorCode, message: str, *, kafka_text: str | None = None) -> None:
        super().__init__(code, message)
        self.kafka_text = kafka_text


# (topic, partition, producer id, epoch, commit) -> writes the marker to the partition (again, after
# a restart: a marker for a transaction the partition already ended changes nothing there, as with
# Kafka's markers after a coordinator failover).
MarkerWriter = Callable[[str, int, int, int, bool], None]
# (group, producer id, commit) -> materialise or discard pending transactional offsets.
OffsetCompleter = Callable[[str, int, bool], None]
# (topic, partition) -> whether it exists.
PartitionExists = Callable[[str, int], bool]


class TransactionStateManager:
    """The transaction coordinator's state and its journal (Kafka's TransactionStateManager): every
    transactional id's metadata, indexed by producer id too, and the blocks of producer ids handed
    out. The coordinator decides; this class is the only one that writes the journal.

    Invariant: memory never holds what the journal lacks. Each change is appended first and applied
    after, so a failed append leaves memory as it was and the error reaches the coordinator."""

    def __init__(self, journal: Journal, *, now_ms: Callable[[], int]) -> None:
        self._journal = journal
        self._now_ms = now_ms
        self.transactions: dict[str, TransactionMetadata] = {}
        self.by_producer_id: dict[int, TransactionMetadata] = {}
        self._next_producer_id = 0
        self._producer_id_limit = 0
        for entry in journal.replay():
            if entry["type"] == "txn":
                self._index(TransactionMetadata.from_entry(entry))
            elif entry["type"] == "txn_removed":
                self._forget(entry["id"])
            elif entry["type"] == "pid_block":
                self._next_producer_id = self._producer_id_limit = entry["limit"]

    def allocate_producer_id(self) -> int:
        """Producer ids are handed out from blocks whose upper bound is journaled first, so an id is
        never reused after a restart (as Kafka's ProducerIdManager)."""
        if self._next_producer_id >= self._producer_id_limit:
            self._producer_id_limit = self._next_producer_id + _PRODUCER_ID_BLOCK
            self._journal.append({"type": "pid_block", "limit": self._producer_id_limit})
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    def add(self, txn: TransactionMetadata) -> None:
        """A transactional id seen for the first time, journaled before memory knows it."""
        txn.last_update_ms = self._now_ms()
        self._journal.append(txn.to_entry())
        self._index(txn)

    def write(self, txn: TransactionMetadata, prepared: TransactionMetadata) -> None:
        """Make ``prepared`` (one of :class:`TransactionMetadata`'s ``prepare_*`` copies) the state of
        ``txn``. Steps:

        1. stamp the change's time;
        2. journal it — if the append fails, ``txn`` is untouched and the error reaches the caller,
           so a retried request finds the transaction as the journal has it (a change only memory
           knew would, for example, answer a retried AddPartitionsToTxn with success and, after a
           restart, leave an open transaction no coordinator knows, holding readers back for good);
        3. apply it to ``txn`` in memory, re-indexing a new producer id;
        4. past a threshold of appends, rewrite the journal as a snapshot of the state.
        """
        prepared.last_update_ms = self._now_ms()
        self._journal.append(prepared.to_entry())
        if self.by_producer_id.get(txn.producer_id) is txn and prepared.producer_id != txn.producer_id:
            del self.by_producer_id[txn.producer_id]
        for name in _JOURNALED_FIELDS:
            setattr(txn, name, getattr(prepared, name))
        self.by_producer_id[txn.producer_id] = txn
        if self._journal.appended_since_rewrite > _JOURNAL_REWRITE_THRESHOLD:
            snapshot = [t.to_entry() for t in self.transactions.values()]
            snapshot.append({"type": "pid_block", "limit": self._producer_id_limit})
            self._journal.rewrite(snapshot)

    def remove(self, transactional_id: str) -> None:
        """Forget an id, its tombstone journaled first, so a restart does not bring it back."""
        self._journal.append({"type": "txn_removed", "id": transactional_id})
        self._forget(transactional_id)

    def _index(self, txn: TransactionMetadata) -> None:
        previous = self.transactions.get(txn.transactional_id)
        if previous is not None and self.by_producer_id.get(previous.producer_id) is previous:
            del self.by_producer_id[previous.producer_id]
        self.transactions[txn.transactional_id] = txn
        self.by_producer_id[txn.producer_id] = txn

    def _forget(self, transactional_id: str) -> None:
        txn = self.transactions.pop(transactional_id, None)
        if txn is not None and self.by_producer_id.get(txn.producer_id) is txn:
            del self.by_producer_id[txn.producer_id]


class TransactionCoordinator:
    def __init__(
        self,
        journal: Journal,
        *,
        max_timeout_ms: int,
        transactional_id_expiration_ms: int = default_int("transactional_id_expiration_ms"),
        write_marker: MarkerWriter,
        complete_offsets: OffsetCompleter,
        partition_exists: PartitionExists,
        now_ms: Callable[[], int],
    ) -> None:
        self.state = TransactionStateManager(journal, now_ms=now_ms)
        self.transactions = self.state.transactions
        self.max_timeout_ms = max_timeout_ms
        self.transactional_id_expiration_ms = transactional_id_expiration_ms
        self._write_marker = write_marker
        self._complete_offsets = complete_offsets
        self._partition_exists = partition_exists
        self._now_ms = now_ms

    def recover(self) -> None:
        """Finish transactions whose outcome was journaled but whose markers may not all be written."""
        if count := self.complete_prepared():
            log.info("completed %d decided transaction(s) after restart", count)

    def remove_expired_transactional_ids(self) -> int:
        """Forget transactional ids whose state has not changed for transactional.id.expiration.ms and
        that hold no transaction (Empty, CompleteCommit, CompleteAbort), as Kafka's
        TransactionStateManager.removeExpiredTransactionalIds: each removal is journaled first (Kafka's
        tombstone), so a restart does not bring the id back. Such an id is unknown afterwards
        (ListTransactions, DescribeTransactions: TRANSACTIONAL_ID_NOT_FOUND), and InitProducerId gives
        it a new producer id at epoch 0. Returns how many were removed."""
        oldest_kept = self._now_ms() - self.transactional_id_expiration_ms
        expired = [
            txn.transactional_id
            for txn in self.transactions.values()
            if txn.state in _COMPLETED and txn.last_update_ms <= oldest_kept
        ]
        for transactional_id in expired:
            self.state.remove(transactional_id)
        if expired:
            log.info(
                "removed %d transactional id(s) unchanged for transactional.id.expiration.ms=%d",
                len(expired),
                self.transactional_id_expiration_ms,
            )
        return len(expired)

    # -- InitProducerId ---------------------------------------------------------------------------

    def init_producer_id(
        self, transactional_id: str | None, timeout_ms: int, producer_id: int = -1, producer_epoch: int = -1
    ) -> tuple[int, int]:
        """Returns (producer id, epoch). For a transactional id: validates the timeout against
        transaction.max.timeout.ms, aborts an open transaction of the previous instance and bumps the
        epoch, fencing that instance."""
        if transactional_id is None:
            return self.state.allocate_producer_id(), 0
        if not transactional_id:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the transactional id must not be empty")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise BrokerError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction.timeout.ms={timeout_ms} of transactional id {transactional_id!r} is larger "
                f"than the broker's transaction.max.timeout.ms={self.max_timeout_ms} (or not positive)",
            )
        txn = self.transactions.get(transactional_id)
        if txn is None:
            txn = TransactionMetadata(transactional_id, self.state.allocate_producer_id(), 0, timeout_ms)
            self.state.add(txn)
            return txn.producer_id, txn.producer_epoch
        if producer_id >= 0 and not (
            producer_id == txn.producer_id
            or (producer_id == txn.previous_producer_id and producer_epoch >= _MAX_EPOCH)
        ):
            raise producer_fenced(txn, producer_id, producer_epoch)
        if txn.state in _PREPARED:
            raise BrokerError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is completing")
        if txn.state is TxnState.ONGOING:
            # As Kafka: fence the previous instance, abort its transaction, and have the new instance
            # retry; the retry finds CompleteAbort and bumps the epoch once more.
            self._fence_and_abort(txn, reason="a new producer instance initialised the same transactional id")
            raise BrokerError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"aborting the open transaction of {transactional_id!r} before re-initialising it; retry",
            )
        # Journaled before it is answered: a bump only memory knew would fence the previous
        # instance until a restart brought it back.
        prepared = txn.prepare_epoch_bump(
            timeout_ms=timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            new_producer_id=self.state.allocate_producer_id,
        )
        self.state.write(txn, prepared)
        return txn.producer_id, txn.producer_epoch

    # -- validation shared by the transactional requests -------------------------------------------

    def _owned(
        self, transactional_id: str, producer_id: int, producer_epoch: int, *, ending: bool = False
    ) -> TransactionMetadata:
        """The transaction of ``transactional_id`` if this producer owns it, checked in Kafka's order:
        an empty id (INVALID_REQUEST), the producer id (INVALID_PRODUCER_ID_MAPPING), the epoch
        (PRODUCER_FENCED), then a decided transaction still completing (CONCURRENT_TRANSACTIONS; for
        EndTxn, ``ending``, the caller tells a retry from a contradiction)."""
        if not transactional_id:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the transactional id must not be empty")
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise BrokerError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"producer id {producer_id} is not the current producer of transactional id "
                f"{transactional_id!r}",
            )
        if txn.producer_epoch != producer_epoch:
            raise BrokerError(
                ErrorCode.PRODUCER_FENCED,
                f"producer {producer_id} epoch {producer_epoch} of transactional id {transactional_id!r} "
                f"was fenced by epoch {txn.producer_epoch}",
            )
        if txn.state in _PREPARED and not ending:
            raise BrokerError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is completing")
        return txn

    def _add_to_ongoing(
        self, txn: TransactionMetadata, partitions: Iterable[TopicPartition] = (), groups: Iterable[str] = ()
    ) -> None:
        """Add partitions and groups to the ongoing transaction, beginning one after a completed
        transaction (or none), journaled first."""
        self.state.write(txn, txn.prepare_add(partitions=partitions, groups=groups, now_ms=self._now_ms()))

    def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        # As Kafka's KafkaApis: partitions that do not exist fail the request before the coordinator
        # looks at the producer (the others are OPERATION_NOT_ATTEMPTED).
        unknown = [tp for tp in partitions if not self._partition_exists(*tp)]
        if unknown:
            return {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in partitions
            }
        txn = self._owned(transactional_id, producer_id, producer_epoch)
        if not set(partitions) <= txn.partitions or txn.state is not TxnState.ONGOING:
            self._add_to_ongoing(txn, partitions=partitions)
        return dict.fromkeys(partitions, ErrorCode.NONE)

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        txn = self._owned(transactional_id, producer_id, producer_epoch)
        if group_id not in txn.groups or txn.state is not TxnState.ONGOING:
            self._add_to_ongoing(txn, groups=[group_id])

    def verify_offset_commit(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        """Kafka verifies that the group's __consumer_offsets partition is in the ongoing transaction
        (KIP-890): AddOffsetsToTxn for any group with the same partition added it. Such a group then
        joins the transaction (:meth:`include_group`), since the outcome of a partition completes
        the pending offsets of every group it holds (GroupCoordinator.onTransactionCompleted)."""
        txn = self._owned(transactional_id, producer_id, producer_epoch)
        offsets_partition = offsets_partition_for(group_id)
        added = {offsets_partition_for(group) for group in txn.groups}
        if txn.state is not TxnState.ONGOING or offsets_partition not in added:
            raise BrokerError(
                ErrorCode.INVALID_TXN_STATE,
                f"TxnOffsetCommit for group {group_id!r} before AddOffsetsToTxn in this transaction "
                f"(its offsets partition {OFFSETS_TOPIC}-{offsets_partition} was not added)",
            )

    def include_group(self, transactional_id: str, group_id: str) -> None:
        """Make a verified TxnOffsetCommit's group part of the transaction, journaled first."""
        txn = self.transactions[transactional_id]
        if group_id not in txn.groups:
            self._add_to_ongoing(txn, groups=[group_id])

    def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> None:
        """KIP-890 part 1: a transactional batch is accepted only for a partition added to the ongoing
        transaction of the Produce request's transactional id, by its current producer and epoch.

        The errors are those Kafka's produce path makes of the coordinator's verification answer
        (TransactionCoordinator.handleVerifyPartitionsInTransaction, AddPartitionsToTxnManager,
        ReplicaManager.appendRecords, for Produce up to v10): an empty id INVALID_REQUEST; another
        producer INVALID_PRODUCER_ID_MAPPING; another epoch INVALID_PRODUCER_EPOCH; a decided
        transaction still completing NOT_ENOUGH_REPLICAS (retriable, "Unable to verify …"); a
        partition not in an ongoing transaction INVALID_TXN_STATE ("Partition was not added to the
        transaction")."""
        if not transactional_id:
            raise TransactionVerificationError(
                ErrorCode.INVALID_REQUEST, "the transactional id must not be empty"
            )
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise TransactionVerificationError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"producer {producer_id} is not the current producer of transactional id "
                f"{transactional_id!r}; call InitProducerId first",
            )
        if txn.producer_epoch != producer_epoch:
            raise TransactionVerificationError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} epoch {producer_epoch} is not the current epoch "
                f"{txn.producer_epoch} of transactional id {transactional_id!r}",
            )
        if txn.state in _PREPARED:
            text = (
                "Unable to verify the partition has been added to the transaction. Underlying error: "
                "CONCURRENT_TRANSACTIONS"
            )
            raise TransactionVerificationError(ErrorCode.NOT_ENOUGH_REPLICAS, text, kafka_text=text)
        if txn.state is not TxnState.ONGOING or (topic, partition) not in txn.partitions:
            text = "Partition was not added to the transaction"
            raise TransactionVerificationError(
                ErrorCode.INVALID_TXN_STATE,
                f"{text}: {topic}-{partition} is not in an ongoing transaction of {transactional_id!r}; "
                "AddPartitionsToTxn must come first",
                kafka_text=text,
            )

    # -- EndTxn and aborts ------------------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """EndTxn as Kafka's TransactionCoordinator.endTransaction: Ongoing is decided; the outcome
        asked for again while it completes is CONCURRENT_TRANSACTIONS, and once complete a success;
        the other outcome, or no transaction (Empty), is INVALID_TXN_STATE."""
        txn = self._owned(transactional_id, producer_id, producer_epoch, ending=True)
        if txn.state is TxnState.ONGOING:
            self._complete(txn, commit)
            return
        if (txn.state is TxnState.PREPARE_COMMIT and commit) or (
            txn.state is TxnState.PREPARE_ABORT and not commit
        ):
            raise BrokerError(ErrorCode.CONCURRENT_TRANSACTIONS, "the transaction is completing")
        # A retried EndTxn whose first attempt completed is answered with success, as Kafka does.
        if (txn.state is TxnState.COMPLETE_COMMIT and commit) or (
            txn.state is TxnState.COMPLETE_ABORT and not commit
        ):
            return
        raise BrokerError(
            ErrorCode.INVALID_TXN_STATE,
            f"EndTxn({'commit' if commit else 'abort'}) for transactional id {transactional_id!r} "
            f"in state {txn.state.value}",
        )

    def _complete(self, txn: TransactionMetadata, commit: bool, *, fence: bool = False) -> None:
        """Decide the outcome (journal PrepareCommit/PrepareAbort; with ``fence``, an abort that fences
        the producer), then carry it out. A failure to journal the decision leaves the transaction as it
        was and reaches the caller; a failure after it is logged and left to
        :meth:`complete_prepared`, since the outcome stands."""
        self.state.write(txn, txn.prepare_fence_and_abort() if fence else txn.prepare_decision(commit=commit))
        self._carry_out(txn, commit)

    def complete_prepared(self) -> int:
        """Carry out every decided outcome whose markers or completion are not all written yet (after a
        failed write, or a restart between the decision and the completion). Returns how many were
        completed.

        Each transaction on its own, as Kafka's marker channel sends each transaction's markers: one
        whose writes fail again is logged and stays prepared for the next round, and the others are
        completed all the same. So the broker also starts with such a transaction pending."""
        prepared = [txn for txn in self.transactions.values() if txn.state in _PREPARED]
        return sum(self._carry_out(txn, txn.state is TxnState.PREPARE_COMMIT) for txn in prepared)

    def _carry_out(self, txn: TransactionMetadata, commit: bool) -> bool:
        """Steps 2-3 for a decided transaction; a failure is logged and left prepared for the
        periodic task. Returns whether the transaction is complete."""
        try:
            self._write_outcome(txn, commit)
        except Exception:
            log.exception(
                "writing the %s of transactional id %r failed; retrying periodically",
                "commit" if commit else "abort",
                txn.transactional_id,
            )
            return False
        return True

    def _write_outcome(self, txn: TransactionMetadata, commit: bool) -> None:
        """Write the outcome to every partition and group of the transaction, each on its own as
        Kafka's marker channel does: one that fails does not hold up the others, whose last stable
        offsets move on; the first failure is raised once all were tried."""
        failure: Exception | None = None
        parts: list[TopicPartition | str] = [*sorted(txn.partitions), *sorted(txn.groups)]
        for part in parts:
            if part in txn.outcome_written:
                continue
            try:
                if isinstance(part, str):
                    self._complete_offsets(part, txn.producer_id, commit)
                else:
                    self._write_marker(part[0], part[1], txn.producer_id, txn.producer_epoch, commit)
            except Exception as exc:
                failure = failure or exc
                continue
            txn.outcome_written.add(part)
        if failure is not None:
            raise failure
        self.state.write(txn, txn.prepare_complete())
        txn.outcome_written.clear()

    def _fence_and_abort(self, txn: TransactionMetadata, *, reason: str) -> None:
        log.info(
            "aborting transaction of %r (producer %d epoch %d): %s",
            txn.transactional_id,
            txn.producer_id,
            txn.producer_epoch,
            reason,
        )
        # The fence and the decision are one journal entry.
        self._complete(txn, commit=False, fence=True)

    def abort_timed_out(self) -> int:
        """Abort transactions open longer than their transaction.timeout.ms, bumping the epoch so the
        producer that opened them is fenced. Returns how many were decided. A transaction whose
        decision cannot be journaled stays open, is logged, and is tried again next round; the
        others are aborted all the same."""
        now = self._now_ms()
        expired = [
            txn
            for txn in self.transactions.values()
            if txn.state is TxnState.ONGOING and txn.start_ms + txn.timeout_ms < now
        ]
        aborted = 0
        for txn in expired:
            try:
                self._fence_and_abort(txn, reason=f"open longer than transaction.timeout.ms={txn.timeout_ms}")
            except Exception:
                log.exception("aborting the timed-out transaction of %r failed", txn.transactional_id)
                continue
            aborted += 1
        return aborted

    # -- admin views ------------------------------------------------------------------------------

    def by_producer_id(self, producer_id: int) -> TransactionMetadata | None:
        return self.state.by_producer_id.get(producer_id)
