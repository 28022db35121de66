"""One partition: its log plus the idempotent-producer and transaction state that Kafka keeps beside it.

State kept per partition (rebuilt from the log itself on start; a snapshot keeps what the log can
no longer tell once retention or DeleteRecords removed batches, see :meth:`Partition._save_state`):

- per producer id: the latest epoch and the last five appended batches' sequence ranges and offsets
  (duplicate detection for idempotent retries, as Kafka's ProducerStateManager);
- per producer id with an open transaction on this partition: the offset of its first record; the
  smallest of these is the *last stable offset* (LSO) — read_committed readers never read past it;
- the aborted transactions ``(producer id, first offset, last offset)``, served to read_committed
  fetches so clients can drop aborted records.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from sparkafka.broker import log_validator, record_builder, records
from sparkafka.broker.clock import now_ms
from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.files import write_file_atomically
from sparkafka.broker.log import PartitionLog, UnreadableLogError, UnreadableRange
from sparkafka.broker.log_cleaner import CleanableRange
from sparkafka.broker.log_config import LogConfig
from sparkafka.broker.log_segment import FileRegion
from sparkafka.broker.settings import default_int

log = logging.getLogger(__name__)

# Kafka keeps the metadata of the last 5 batches per producer (max.in.flight for idempotence).
_RETAINED_BATCHES_PER_PRODUCER = 5
_MAX_SEQUENCE = 2**31 - 1
# Kafka's producer-state snapshot files: {offset:020d}.snapshot, the state as of that log offset.
_SNAPSHOT_SUFFIX = ".snapshot"
# DeleteRecords' offset that means "up to the high watermark" (DeleteRecordsRequest.HIGH_WATERMARK).
DELETE_UP_TO_HIGH_WATERMARK = -1

# Raises BrokerError when a producer may not write transactionally to (topic, partition): the
# transaction coordinator's KIP-890 partition verification.
TransactionVerifier = Callable[[int, int, str, int], None]


@dataclass(slots=True)
class _BatchSeqs:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    # The batch's maxTimestamp as stored: a duplicate of it is answered with this as its log append
    # time, whatever the topic's timestamp type (Kafka's UnifiedLog.append, BatchMetadata.timestamp).
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    recent: deque[_BatchSeqs] = field(default_factory=lambda: deque(maxlen=_RETAINED_BATCHES_PER_PRODUCER))
    last_timestamp: int = -1
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        return self.recent[-1].last_seq if self.recent else -1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int


def _in_aborted(aborted: Sequence[AbortedTxn], producer_id: int, offset: int) -> bool:
    return any(t.producer_id == producer_id and t.first_offset <= offset <= t.last_offset for t in aborted)


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int
    duplicate: bool


def _next_sequence(seq: int) -> int:
    return 0 if seq == _MAX_SEQUENCE else seq + 1


class Partition:
    """A topic partition on this (single, always leader) broker."""

    def __init__(
        self,
        topic: str,
        index: int,
        directory: Path,
        config: LogConfig,
        *,
        producer_id_expiration_ms: int = default_int("producer_id_expiration_ms"),
    ) -> None:
        self.topic = topic
        self.index = index
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.log = PartitionLog(directory, config)
        self.producers: dict[int, ProducerEntry] = {}
        self.open_txn_first_offset: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []
        self._rebuild_state()

    # -- recovery ---------------------------------------------------------------------------------

    def _rebuild_state(self) -> None:
        """Recover producer and transaction state (what Kafka's producer-state snapshots and .txnindex
        files hold), so a SIGKILL loses none of it.

        Steps, as Kafka's ProducerStateManager.truncateAndReload and loadFromSnapshot:
          1. delete snapshots past the log end (the log they described was cut) and those at or
             below the log start (they describe no record still stored: once a whole log expired,
             Kafka forgets its producers at the next start, and so does this broker);
          2. load the newest remaining snapshot, leaving out producers that expired meanwhile; an
             unreadable one is deleted and the next older one tried;
          3. replay every batch from the snapshot's offset (or the log start, without one) to the
             log end; drop aborted transactions that end before the log start.

        Invariant: the partition opens whatever damage its log kept (see `PartitionLog`): bytes
        that do not read as batches are left out of the replay, which goes on with the next
        segment, with an ERROR naming the offsets (`_report_unreplayed`), never an error out of
        the start. Fetches refuse the damage itself with CORRUPT_MESSAGE."""
        replay_from = self.log.log_start_offset
        restored = self._load_state()
        if restored is not None:
            replay_from = max(replay_from, restored)
        while True:
            try:
                self._replay(replay_from)
                break
            except UnreadableLogError as exc:
                self._report_unreplayed(exc.damage)
                # The damaged segment's end: iter_batches takes only the segments that end past
                # where it starts, so every round starts past the damage the last one met.
                replay_from = exc.damage.end_offset
        self._prune_aborted()
        if self.open_txn_first_offset:
            log.info(
                "%s-%d: %d transaction(s) still open after recovery, awaiting their coordinator",
                self.topic,
                self.index,
                len(self.open_txn_first_offset),
            )

    def _replay(self, replay_from: int) -> None:
        """Apply the log's batches from offset `replay_from` on to the producer and transaction state."""
        for header, batch in self.log.iter_batches(replay_from):
            if header.producer_id < 0:
                continue
            if header.is_control:
                marker = records.control_marker(batch)
                entry = self._marker_epoch(header.producer_id, header.producer_epoch, header.max_timestamp)
                if marker is not None:
                    self._complete_txn(header.producer_id, header.base_offset, marker[0] == "COMMIT")
                    entry.coordinator_epoch = marker[1]
                continue
            self._record_batch(header, header.base_offset, header.max_timestamp)

    def _report_unreplayed(self, damage: UnreadableRange) -> None:
        """Log what the producer-state replay left out (see :meth:`_rebuild_state`) at ERROR: the
        partition, the file and byte, the offsets, and what their absence from the state means."""
        if damage.first_offset < damage.end_offset:
            left_out = f"offsets {damage.first_offset} to {damage.end_offset - 1} there are left out of it"
        else:
            left_out = "no offset of the log lies there"
        log.error(
            "%s-%d: rebuilding the producer state from the log, %s does not read as batches from byte %d "
            "(%s): %s, and the replay goes on with the next segment. Producers that wrote there may "
            "have a retry of those batches stored again or be refused with OUT_OF_ORDER_SEQUENCE_NUMBER, "
            "and a transaction begun or ended there is not known; fetches of the damaged batch answer "
            "CORRUPT_MESSAGE. Restore the partition directory from a backup",
            self.topic,
            self.index,
            damage.path,
            damage.position,
            damage.reason,
            left_out,
        )

    def _save_state(self) -> None:
        """Snapshot the producer and transaction state as of the log end, before batches are removed.

        Invariant: a snapshot at offset S holds exactly what replaying the log up to S gave, so
        recovery replays only from S: the removed batches' producers (their epochs and last sequences,
        which fence zombies and detect duplicate retries), transactions still open whose first
        records are gone, and aborted transactions whose records remain are all kept.

        Steps: fsync the log first (a snapshot past a log end lost in a power failure would be
        deleted at the next start, taking the removed batches' state with it); write the snapshot
        atomically (its directory fsynced too); only then delete the older snapshots but the newest
        of them."""
        self.log.flush()
        offset = self.log.log_end_offset
        state = {
            "producers": {
                str(producer_id): {
                    "epoch": entry.epoch,
                    "coordinator_epoch": entry.coordinator_epoch,
                    "last_timestamp": entry.last_timestamp,
                    "batches": [
                        [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp]
                        for b in entry.recent
                    ],
                }
                for producer_id, entry in self.producers.items()
            },
            "open_transactions": {str(pid): first for pid, first in self.open_txn_first_offset.items()},
            "aborted": [[t.producer_id, t.first_offset, t.last_offset] for t in self.aborted],
        }
        path = self._snapshot_path(offset)
        write_file_atomically(path, json.dumps(state).encode())
        # The one before stays, in case this one cannot be read at the next start.
        kept = sorted(self.log.directory.glob(f"*{_SNAPSHOT_SUFFIX}"))
        for older in kept[:-2]:
            older.unlink(missing_ok=True)

    def _load_state(self) -> int | None:
        """Restore the newest usable snapshot (see :meth:`_rebuild_state`); its offset, or None."""
        snapshots = sorted(
            (int(path.stem), path)
            for path in self.log.directory.glob(f"*{_SNAPSHOT_SUFFIX}")
            if path.stem.isdigit()
        )
        usable = []
        for offset, path in snapshots:
            if offset > self.log.log_end_offset:
                log.warning("%s is past the log end %d; deleting it", path, self.log.log_end_offset)
                path.unlink()
            elif offset <= self.log.log_start_offset:
                path.unlink()
            else:
                usable.append((offset, path))
        for offset, path in reversed(usable):
            try:
                state = json.loads(path.read_text())
                entries = {
                    int(pid): ProducerEntry(
                        entry["epoch"],
                        deque(
                            (_BatchSeqs(*batch) for batch in entry["batches"]),
                            maxlen=_RETAINED_BATCHES_PER_PRODUCER,
                        ),
                        entry["last_timestamp"],
                        entry["coordinator_epoch"],
                    )
                    for pid, entry in state["producers"].items()
                }
                open_transactions = {
                    int(pid): int(first) for pid, first in state["open_transactions"].items()
                }
                aborted = [AbortedTxn(*map(int, entry)) for entry in state["aborted"]]
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "%s is unreadable (%s); deleting it and recovering without it, which loses the "
                    "state of producers whose batches retention or DeleteRecords removed",
                    path,
                    exc,
                )
                path.unlink()
                continue
            self.producers, self.open_txn_first_offset, self.aborted = entries, open_transactions, aborted
            # Kafka's loader leaves out producers that expired while the broker was down.
            self.expire_producers(now_ms())
            return offset
        return None

    # -- offsets ----------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def high_watermark(self) -> int:
        # A single replica: everything appended is replicated to the whole ISR (itself).
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        if self.open_txn_first_offset:
            # Retention or DeleteRecords may remove an open transaction's first records; Kafka's first
            # unstable offset never falls below the log start (UnifiedLog.maybeIncrementFirstUnstableOffset).
            return max(min(self.open_txn_first_offset.values()), self.log_start_offset)
        return self.high_watermark

    # -- produce ----------------------------------------------------------------------------------

    def append_from_client(
        self,
        payload: records.Buffer,
        *,
        now_ms: int,
        max_message_bytes: int,
        verify_transaction: TransactionVerifier,
        produce_version: int | None = None,
    ) -> AppendResult:
        """Validate and append the batches of one Produce partition entry.

        Steps, in Kafka's order (KafkaApis, ReplicaManager.appendRecords, UnifiedLog.append):
        1. one v2 batch per produce (ProduceRequest.validateRecords);
        2. a transactional batch of a producer without a transaction open here at that epoch: the
           coordinator must have this partition in the ongoing transaction of the request's
           transactional id (KIP-890 verification; UnifiedLog.maybeStartTransactionVerification), so
           even a retry of a batch whose transaction has ended is refused;
        3. validate the batch (CRC32C, record counts, size, keys on compacted topics, timestamps);
        4. for a batch with a producer id: fence an older epoch, detect a duplicate retry (answer with
           the offset it was first written at, append nothing), reject a sequence gap; a
           transactional batch opens the transaction here, a non-transactional one may not come
           while one is open;
        5. assign offsets from the log end offset; stamp each batch's maxTimestamp: ``now_ms`` on a
           LogAppendTime topic (the produce response reports it, -1 otherwise), the largest record
           timestamp on a CreateTime topic; append.
        """
        # The one copy of the records: validated where it is, then its offsets are patched in place (the
        # payload may be a view into the request frame).
        batch = bytearray(payload)
        config = self.log.config
        transactional = records.transactional_producer(batch)
        if transactional is not None and not self._has_ongoing_transaction(*transactional):
            # Step 1 comes before the coordinator is asked; validate_produce_payload repeats it for
            # every other batch, so only this path checks it separately.
            records.check_produce_request_records(batch, produce_version)
            verify_transaction(*transactional, self.topic, self.index)
        accepted = log_validator.validate_produce_payload(
            batch,
            max_batch_bytes=max_message_bytes,
            topic_partition=f"{self.topic}-{self.index}",
            produce_version=produce_version,
            require_keys=config.compacts,
            now_ms=now_ms,
            timestamps=log_validator.TimestampRules(
                config.log_append_time, config.timestamp_before_max_ms, config.timestamp_after_max_ms
            ),
        )
        idempotent = [a.header for a in accepted if a.header.producer_id >= 0]
        if idempotent:
            header = idempotent[0]
            duplicate = self._check_sequence(header)
            if duplicate is not None:
                return AppendResult(duplicate.first_offset, duplicate.max_timestamp, True)
            if not header.is_transactional and header.producer_id in self.open_txn_first_offset:
                raise BrokerError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"producer {header.producer_id} sent a non-transactional batch during its transaction",
                )
        log_append_time = now_ms if config.log_append_time else records.NO_TIMESTAMP
        base = self.log.log_end_offset
        position = 0
        assigned: list[bytearray] = []
        producer_batches: list[tuple[records.BatchHeader, int, int]] = []
        offset = base
        for one in accepted:
            header = one.header
            piece = batch if header.size == len(batch) else batch[position : position + header.size]
            records.assign_offset_in_place(piece, offset)
            if config.log_append_time:
                max_timestamp = now_ms
                records.set_max_timestamp_in_place(piece, records.LOG_APPEND_TIME, now_ms)
            else:
                max_timestamp = one.max_record_timestamp
                records.set_max_timestamp_in_place(piece, records.CREATE_TIME, max_timestamp)
            assigned.append(piece)
            if header.producer_id >= 0:
                producer_batches.append((header, offset, max_timestamp))
            position += header.size
            offset += header.last_offset_delta + 1

        def record() -> None:
            for header, first_offset, max_timestamp in producer_batches:
                self._record_batch(header, first_offset, max_timestamp)

        # Only once the batch is in the log (Kafka's UnifiedLog.append updates the producer state
        # after LocalLog.append): a failed write must leave no trace, or the client's retry of the
        # same sequence would be answered as a duplicate of records that were never written.
        self._append_to_log(assigned, now_ms, record)
        return AppendResult(base, log_append_time, False)

    def _append_to_log(
        self, batches: Sequence[bytes | bytearray], now_ms: int, record: Callable[[], None]
    ) -> None:
        """Append to the log, then ``record`` the batches' state: whenever they landed in the log,
        even if the append then failed (a flush.messages fsync), since they are there to be read
        and replayed. Snapshot the state if the log rolled."""
        end, rolls = self.log.log_end_offset, self.log.rolls
        try:
            self.log.append(batches, now_ms=now_ms)
        finally:
            if self.log.log_end_offset > end:
                record()
        if self.log.rolls != rolls:
            self._snapshot_after_roll()

    def _snapshot_after_roll(self) -> None:
        """Kafka takes a producer-state snapshot whenever the log rolls, so a start after a crash
        replays only the batches since. It is only that: a failed write is logged, not raised (the
        batch is written and its state recorded)."""
        try:
            self._save_state()
        except OSError as exc:
            log.warning(
                "%s-%d: could not snapshot the producer state after a roll: %s", self.topic, self.index, exc
            )

    def _has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Kafka's UnifiedLog.hasOngoingTransaction: the producer's transaction is open here at this epoch."""
        entry = self.producers.get(producer_id)
        return (
            producer_id in self.open_txn_first_offset and entry is not None and entry.epoch == producer_epoch
        )

    def _check_sequence(self, header: records.BatchHeader) -> _BatchSeqs | None:
        """Idempotence rules of Kafka's ProducerAppendInfo; returns the batch this one duplicates."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            # Kafka accepts any sequence from a producer it has no state for (never seen, or its
            # state was removed with the log it described).
            return None
        if header.producer_epoch < entry.epoch:
            raise BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than the current "
                f"epoch {entry.epoch}: it has been fenced by a newer instance",
            )
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                raise BrokerError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {header.producer_id} started epoch {header.producer_epoch} at sequence "
                    f"{header.base_sequence}; a new epoch starts at 0",
                )
            return None
        for seen in entry.recent:
            if seen.first_seq == header.base_sequence and seen.last_seq == header.last_sequence:
                return seen
        # With no batch of this epoch retained (its state came from a transaction marker) the last
        # sequence is -1, so the epoch's first batch must start at 0, as in Kafka.
        if header.base_sequence != _next_sequence(entry.last_sequence):
            raise BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {header.producer_id} sent sequence {header.base_sequence} to "
                f"{self.topic}-{self.index}; expected {_next_sequence(entry.last_sequence)}",
            )
        return None

    def _record_batch(self, header: records.BatchHeader, base_offset: int, max_timestamp: int) -> None:
        entry = self.producers.get(header.producer_id)
        if entry is None:
            entry = ProducerEntry(header.producer_epoch)
            self.producers[header.producer_id] = entry
        elif header.producer_epoch > entry.epoch:
            # Kafka's ProducerStateEntry.maybeUpdateProducerEpoch: the batches of the older epoch go,
            # the coordinator epoch of the last marker stays (DescribeProducers reports it).
            entry.epoch = header.producer_epoch
            entry.recent.clear()
        if header.base_sequence >= 0:
            entry.recent.append(
                _BatchSeqs(
                    header.base_sequence,
                    header.last_sequence,
                    base_offset,
                    base_offset + header.last_offset_delta,
                    max_timestamp,
                )
            )
        entry.last_timestamp = max_timestamp
        if header.is_transactional:
            self.open_txn_first_offset.setdefault(header.producer_id, base_offset)

    # -- transaction markers ----------------------------------------------------------------------

    def write_txn_marker(
        self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int
    ) -> int:
        """Append a COMMIT or ABORT control batch for the producer and close its transaction here.

        Invariants: the marker carries the coordinator's (possibly bumped) epoch, which becomes the
        producer's epoch on this partition, so a fenced producer's later batches are rejected; an
        ABORT over data records adds an aborted-transaction entry covering [first data offset,
        marker offset]; the LSO advances past the marker immediately."""
        offset = self.log.log_end_offset
        batch = record_builder.build_control_batch(
            offset=offset,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            commit=commit,
            coordinator_epoch=coordinator_epoch,
            timestamp_ms=now_ms,
        )

        def record() -> None:
            self._marker_epoch(producer_id, producer_epoch, now_ms).coordinator_epoch = coordinator_epoch
            self._complete_txn(producer_id, offset, commit)

        self._append_to_log([batch], now_ms, record)
        return offset

    def _marker_epoch(self, producer_id: int, producer_epoch: int, timestamp_ms: int) -> ProducerEntry:
        """A transaction marker's epoch becomes the producer's (Kafka's maybeUpdateProducerEpoch): a
        newer one forgets the batches of the older epoch, whose sequences say nothing about the new.
        Its timestamp becomes the producer's last timestamp (ProducerAppendInfo.appendEndTxnMarker),
        which DescribeProducers reports."""
        entry = self.producers.setdefault(producer_id, ProducerEntry(producer_epoch))
        if producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.recent.clear()
        entry.last_timestamp = timestamp_ms
        return entry

    def _complete_txn(self, producer_id: int, marker_offset: int, commit: bool) -> None:
        first = self.open_txn_first_offset.pop(producer_id, None)
        if first is not None and not commit:
            self.aborted.append(AbortedTxn(producer_id, first, marker_offset))

    def expire_producers(self, now_ms: int) -> None:
        """Forget producers without an open transaction here whose last batch's timestamp is at
        least ``producer_id_expiration_ms`` old (Kafka's ProducerStateManager.removeExpiredProducers):
        their next batch is taken at any sequence, as from a producer never seen."""
        expired = [
            producer_id
            for producer_id, entry in self.producers.items()
            if producer_id not in self.open_txn_first_offset
            and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms
        ]
        for producer_id in expired:
            del self.producers[producer_id]

    def has_open_txn(self, producer_id: int) -> bool:
        return producer_id in self.open_txn_first_offset

    # -- fetch ------------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, *, read_committed: bool, min_one_batch: bool = True
    ) -> tuple[bytes, list[AbortedTxn]]:
        """Whole batches from ``offset`` up to the HW (read_uncommitted) or the LSO (read_committed), and
        for read_committed the aborted transactions overlapping the returned range."""
        chunks, _, aborted = self.read_chunks(
            offset, max_bytes, read_committed=read_committed, min_one_batch=min_one_batch
        )
        return b"".join(cast(list[bytes], chunks)), aborted

    def read_chunks(
        self,
        offset: int,
        max_bytes: int,
        *,
        read_committed: bool,
        min_one_batch: bool = True,
        region_min_bytes: int | None = None,
    ) -> tuple[list[bytes | FileRegion], int, list[AbortedTxn]]:
        """What read() returns, as PartitionLog.read_chunks chunks (bytes or file regions to close) with
        their total size, and the aborted transactions."""
        upper = self.last_stable_offset if read_committed else self.high_watermark
        if offset < self.log_start_offset or offset > self.high_watermark:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside [{self.log_start_offset}, {self.high_watermark}] "
                f"of {self.topic}-{self.index}",
            )
        if offset >= upper:
            return [], 0, []
        chunks, size, last_offset = self.log.read_chunks(
            offset,
            max_bytes,
            upper_bound=upper,
            min_one_batch=min_one_batch,
            region_min_bytes=region_min_bytes,
        )
        if not read_committed or not size:
            return chunks, size, []
        aborted = [t for t in self.aborted if t.last_offset >= offset and t.first_offset <= last_offset]
        return chunks, size, aborted

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords on this partition, as Kafka's Partition.deleteRecordsOnLeader, in its order:
        1. a compacted topic that does not also delete keeps its records (POLICY_VIOLATION); an empty
           cleanup.policy allows deletion (records are then removed only this way);
        2. -1 means the high watermark;
        3. the offset must lie in [0, high watermark] (OFFSET_OUT_OF_RANGE), whatever the policy said.
        Returns the new log start offset (never lower than before)."""
        config = self.log.config
        if config.compacts and not config.deletes:
            raise BrokerError(
                ErrorCode.POLICY_VIOLATION,
                f"Records of partition {self.topic}-{self.index} can not be deleted due to the configured "
                f"policy (cleanup.policy={config.cleanup_policy})",
            )
        if offset == DELETE_UP_TO_HIGH_WATERMARK:
            offset = self.high_watermark
        start = self.log.delete_records_before(offset, before_deleting=self._save_state)
        self._prune_aborted()
        return start

    def enforce_retention(self, now_ms: int) -> None:
        # A no-op unless cleanup.policy includes delete (LogConfig.deletes).
        if self.log.enforce_retention(now_ms, before_deleting=self._save_state):
            self._prune_aborted()

    def cleanable_range(self, now_ms: int) -> CleanableRange | None:
        """How dirty the log is, for the cleaner's choice; None unless the topic is compacted."""
        return self.log.cleanable_range(now_ms, self.last_stable_offset)

    def compaction(self, now_ms: int, weighed: CleanableRange | None = None) -> Callable[[], int]:
        """A cleaning pass (PartitionLog.compact) to run off the event loop, with the transaction
        state it needs taken now: appends and markers written meanwhile lie at or past this last
        stable offset, which the pass does not touch. With `weighed` (what the cleaner chose the log
        by), the pass cleans up to its first uncleanable offset."""
        return functools.partial(
            self.log.compact,
            now_ms=now_ms,
            is_aborted=functools.partial(_in_aborted, tuple(self.aborted)),
            last_stable_offset=self.last_stable_offset,
            up_to=None if weighed is None else weighed.first_uncleanable_offset,
        )

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return _in_aborted(self.aborted, producer_id, offset)

    def _prune_aborted(self) -> None:
        start = self.log.log_start_offset
        self.aborted = [t for t in self.aborted if t.last_offset >= start]

    def close(self, *, keep_state: bool = True) -> None:
        """Close the log. Unless the partition is being deleted (``keep_state=False``), first snapshot
        the producer state at the log end, as Kafka's UnifiedLog.close does, so that the next start
        loads it instead of replaying the whole log."""
        # No new snapshot when one at the log end exists: nothing was appended since it was written.
        if keep_state and not self.log.closed and not self._snapshot_path(self.log.log_end_offset).exists():
            self._save_state()
        self.log.close()

    def _snapshot_path(self, offset: int) -> Path:
        return self.log.directory / f"{offset:020d}{_SNAPSHOT_SUFFIX}"
