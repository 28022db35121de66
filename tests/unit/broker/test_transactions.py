"""The transaction coordinator's InitProducerId epoch rules (Kafka's TransactionCoordinator and
TransactionMetadata.prepareIncrementProducerEpoch, KIP-360) and the completion of decided outcomes
whose markers could not be written, on a real journal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.journal import Journal, JournalError
from sparkafka.broker.transactions import (
    IllegalStateTransition,
    TransactionCoordinator,
    TransactionMetadata,
    TransactionVerificationError,
    TxnState,
    offsets_partition_for,
)

TIMEOUT_MS = 60_000
EXHAUSTED_EPOCH = 32766  # Short.MaxValue - 1: Kafka moves the id to a new producer id


class Markers:
    """Records the markers the coordinator writes; ``fail_next`` makes the next writes raise."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int, int, int, bool]] = []
        self.fail_next = 0
        self.failing_topics: set[str] = set()  # every write to these fails

    def __call__(self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool) -> None:
        if self.fail_next or topic in self.failing_topics:
            self.fail_next = max(0, self.fail_next - 1)
            raise OSError("disk full")
        self.written.append((topic, partition, producer_id, epoch, commit))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def markers() -> Markers:
    return Markers()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "__transaction_state.journal"


@pytest.fixture
def coordinator(journal_path: Path, markers: Markers, clock: Clock) -> Iterator[TransactionCoordinator]:
    journal = Journal(journal_path)
    yield _coordinator(journal, markers, clock)
    journal.close()


def _coordinator(journal: Journal, markers: Markers, clock: Clock) -> TransactionCoordinator:
    return TransactionCoordinator(
        journal,
        max_timeout_ms=900_000,
        write_marker=markers,
        complete_offsets=lambda group, producer_id, commit: None,
        partition_exists=lambda topic, partition: True,
        now_ms=clock,
    )


def _error(call: object, *args: object) -> ErrorCode:
    with pytest.raises(BrokerError) as raised:
        call(*args)  # type: ignore[operator]
    return raised.value.code


def test_a_fenced_instance_cannot_bump_its_way_back(coordinator: TransactionCoordinator) -> None:
    pid, zombie_epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    assert coordinator.init_producer_id("t", TIMEOUT_MS) == (pid, zombie_epoch + 1)  # a new instance
    # Its own epoch is neither the current one nor the last one a bump came from.
    assert (
        _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, zombie_epoch) == ErrorCode.PRODUCER_FENCED
    )
    # The new instance still owns the id.
    coordinator.add_partitions("t", pid, zombie_epoch + 1, [("out", 0)])


def test_own_bump_and_its_retry(coordinator: TransactionCoordinator) -> None:
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    # The answer got lost and the producer asks again: the same epoch, not a second bump.
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch + 1) == (pid, epoch + 2)
    assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, epoch) == ErrorCode.PRODUCER_FENCED
    assert (
        _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid + 1, epoch + 2) == ErrorCode.PRODUCER_FENCED
    )


def test_a_new_instance_forgets_the_last_epoch(coordinator: TransactionCoordinator) -> None:
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    assert coordinator.init_producer_id("t", TIMEOUT_MS) == (pid, epoch + 2)
    # The instance that bumped from `epoch` was fenced by the new one: no retry for it.
    assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, epoch) == ErrorCode.PRODUCER_FENCED
    assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, epoch + 1) == ErrorCode.PRODUCER_FENCED


def test_a_timed_out_producer_is_fenced_for_good(
    coordinator: TransactionCoordinator, markers: Markers, clock: Clock
) -> None:
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    coordinator.add_partitions("t", pid, epoch + 1, [("out", 0)])
    clock.now += TIMEOUT_MS + 1
    assert coordinator.abort_timed_out() == 1
    assert markers.written == [("out", 0, pid, epoch + 2, False)]
    for stale in (epoch, epoch + 1):
        assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, stale) == ErrorCode.PRODUCER_FENCED
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch + 2) == (pid, epoch + 3)


def test_an_exhausted_epoch_moves_to_a_new_producer_id(coordinator: TransactionCoordinator) -> None:
    pid, _ = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.transactions["t"].producer_epoch = EXHAUSTED_EPOCH
    new_pid, new_epoch = coordinator.init_producer_id("t", TIMEOUT_MS, pid, EXHAUSTED_EPOCH)
    assert new_pid != pid and new_epoch == 0
    # A retry with the old producer id and its exhausted epoch gets the same answer.
    assert coordinator.init_producer_id("t", TIMEOUT_MS, pid, EXHAUSTED_EPOCH) == (new_pid, 0)
    assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS, pid, 5) == ErrorCode.PRODUCER_FENCED
    assert coordinator.by_producer_id(new_pid) is coordinator.transactions["t"]
    assert coordinator.by_producer_id(pid) is None


def test_the_last_epoch_survives_a_restart(journal_path: Path, markers: Markers, clock: Clock) -> None:
    journal = Journal(journal_path)
    first = _coordinator(journal, markers, clock)
    pid, epoch = first.init_producer_id("t", TIMEOUT_MS)
    assert first.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    journal.close()
    journal = Journal(journal_path)
    try:
        restarted = _coordinator(journal, markers, clock)
        assert restarted.init_producer_id("t", TIMEOUT_MS, pid, epoch) == (pid, epoch + 1)
    finally:
        journal.close()


def test_idle_transactional_ids_expire_for_good_and_open_ones_stay(
    journal_path: Path, markers: Markers, clock: Clock
) -> None:
    """TransactionStateManager.removeExpiredTransactionalIds: an id in Empty, CompleteCommit or
    CompleteAbort unchanged for transactional.id.expiration.ms is removed (a tombstone first, so a
    restart does not bring it back); one with an open transaction stays; a removed id starts anew."""
    expiration_ms = 60_000
    journal = Journal(journal_path)
    coordinator = _coordinator(journal, markers, clock)
    coordinator.transactional_id_expiration_ms = expiration_ms
    idle_pid, _ = coordinator.init_producer_id("idle", TIMEOUT_MS)
    done_pid, done_epoch = coordinator.init_producer_id("done", TIMEOUT_MS)
    coordinator.add_partitions("done", done_pid, done_epoch, [("out", 0)])
    coordinator.end_txn("done", done_pid, done_epoch, commit=True)
    open_pid, open_epoch = coordinator.init_producer_id("open", 10 * expiration_ms)
    coordinator.add_partitions("open", open_pid, open_epoch, [("out", 1)])
    clock.now += expiration_ms - 1
    assert coordinator.remove_expired_transactional_ids() == 0
    clock.now += 1
    assert coordinator.remove_expired_transactional_ids() == 2
    assert set(coordinator.transactions) == {"open"}
    assert coordinator.by_producer_id(idle_pid) is None and coordinator.by_producer_id(done_pid) is None
    journal.close()
    journal = Journal(journal_path)
    try:
        restarted = _coordinator(journal, markers, clock)
        assert set(restarted.transactions) == {"open"}
        new_pid, new_epoch = restarted.init_producer_id("idle", TIMEOUT_MS)
        assert new_pid not in (idle_pid, done_pid, open_pid) and new_epoch == 0
    finally:
        journal.close()


def test_an_empty_transactional_id_is_an_invalid_request(coordinator: TransactionCoordinator) -> None:
    assert _error(coordinator.init_producer_id, "", TIMEOUT_MS) == ErrorCode.INVALID_REQUEST
    # Before anything else is looked at, in every transactional request (KafkaApis, the coordinator).
    assert _error(coordinator.add_partitions, "", 0, 0, [("out", 0)]) == ErrorCode.INVALID_REQUEST
    assert _error(coordinator.add_offsets, "", 0, 0, "group") == ErrorCode.INVALID_REQUEST
    assert _error(coordinator.end_txn, "", 0, 0, True) == ErrorCode.INVALID_REQUEST
    assert _error(coordinator.verify_partition, "", 0, 0, "out", 0) == ErrorCode.INVALID_REQUEST


def test_a_batch_is_verified_against_the_transactional_id_it_names(
    coordinator: TransactionCoordinator,
) -> None:
    """The produce path's answers to the coordinator's verification (AddPartitionsToTxnManager,
    ReplicaManager.appendRecords): another producer of the id, another epoch, a partition not added."""
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    other_pid, _ = coordinator.init_producer_id("other", TIMEOUT_MS)
    coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    coordinator.verify_partition("t", pid, epoch, "out", 0)
    assert (
        _error(coordinator.verify_partition, "other", pid, epoch, "out", 0)
        == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert (
        _error(coordinator.verify_partition, "never", pid, epoch, "out", 0)
        == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert (
        _error(coordinator.verify_partition, "t", pid, epoch + 1, "out", 0)
        == ErrorCode.INVALID_PRODUCER_EPOCH
    )
    with pytest.raises(TransactionVerificationError) as not_added:
        coordinator.verify_partition("t", pid, epoch, "out", 1)
    assert (not_added.value.code, not_added.value.kafka_text) == (
        ErrorCode.INVALID_TXN_STATE,
        "Partition was not added to the transaction",
    )
    assert other_pid != pid


def test_a_groups_offsets_partition_is_javas_string_hash() -> None:
    """GroupCoordinator.partitionFor: abs(groupId.hashCode) % 50, hashCode over UTF-16 code units."""
    assert offsets_partition_for("hello") == 99162322 % 50
    assert offsets_partition_for("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
    # "\U0001F600" is two UTF-16 units, 0xD83D 0xDE00: 31 * 0xD83D + 0xDE00 = 1772899.
    assert offsets_partition_for("\U0001f600") == 1772899 % 50


def test_offsets_of_a_group_sharing_an_added_offsets_partition_join_the_transaction(
    journal_path: Path, markers: Markers, clock: Clock
) -> None:
    """Kafka verifies a TxnOffsetCommit by the group's __consumer_offsets partition (KIP-890), and
    that partition's marker completes the pending offsets of every group it holds."""
    added = "orders"
    neighbour = next(
        f"g{i}" for i in range(10_000) if offsets_partition_for(f"g{i}") == offsets_partition_for(added)
    )
    stranger = next(
        f"g{i}" for i in range(10_000) if offsets_partition_for(f"g{i}") != offsets_partition_for(added)
    )
    completed: list[tuple[str, int, bool]] = []
    journal = Journal(journal_path)
    coordinator = _coordinator_completing(journal, markers, clock, completed)
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.add_offsets("t", pid, epoch, added)
    coordinator.verify_offset_commit("t", pid, epoch, added)
    coordinator.verify_offset_commit("t", pid, epoch, neighbour)
    coordinator.include_group("t", neighbour)
    assert _error(coordinator.verify_offset_commit, "t", pid, epoch, stranger) == ErrorCode.INVALID_TXN_STATE
    journal.close()
    journal = Journal(journal_path)  # the neighbour's part in the transaction was journaled
    coordinator = _coordinator_completing(journal, markers, clock, completed)
    coordinator.end_txn("t", pid, epoch, commit=True)
    assert sorted(completed) == sorted([(added, pid, True), (neighbour, pid, True)])
    journal.close()


def _coordinator_completing(
    journal: Journal, markers: Markers, clock: Clock, completed: list[tuple[str, int, bool]]
) -> TransactionCoordinator:
    coordinator = TransactionCoordinator(
        journal,
        max_timeout_ms=900_000,
        write_marker=markers,
        complete_offsets=lambda group, producer_id, commit: completed.append((group, producer_id, commit)),
        partition_exists=lambda topic, partition: True,
        now_ms=clock,
    )
    coordinator.recover()
    return coordinator


def test_a_decided_commit_whose_markers_failed_is_completed_later(
    coordinator: TransactionCoordinator, markers: Markers
) -> None:
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.add_partitions("t", pid, epoch, [("out", 0), ("out", 1)])
    markers.fail_next = 1
    coordinator.end_txn("t", pid, epoch, commit=True)  # decided: the producer is told it committed
    assert coordinator.transactions["t"].state is TxnState.PREPARE_COMMIT
    # The marker of out-0 failed; out-1's was written all the same, and is not written again.
    assert markers.written == [("out", 1, pid, epoch, True)]
    assert _error(coordinator.init_producer_id, "t", TIMEOUT_MS) == ErrorCode.CONCURRENT_TRANSACTIONS
    assert (
        _error(coordinator.add_partitions, "t", pid, epoch, [("out", 0)]) == ErrorCode.CONCURRENT_TRANSACTIONS
    )
    # TransactionCoordinator.endTransaction: the decided outcome again is still completing, the
    # other one contradicts it.
    assert _error(coordinator.end_txn, "t", pid, epoch, True) == ErrorCode.CONCURRENT_TRANSACTIONS
    assert _error(coordinator.end_txn, "t", pid, epoch, False) == ErrorCode.INVALID_TXN_STATE
    # A batch of the transaction meanwhile: retriable, with Kafka's text.
    with pytest.raises(TransactionVerificationError) as completing:
        coordinator.verify_partition("t", pid, epoch, "out", 0)
    assert (completing.value.code, completing.value.kafka_text) == (
        ErrorCode.NOT_ENOUGH_REPLICAS,
        "Unable to verify the partition has been added to the transaction. Underlying error: "
        "CONCURRENT_TRANSACTIONS",
    )

    assert coordinator.complete_prepared() == 1
    assert markers.written == [("out", 1, pid, epoch, True), ("out", 0, pid, epoch, True)]
    assert coordinator.transactions["t"].state is TxnState.COMPLETE_COMMIT
    coordinator.end_txn("t", pid, epoch, commit=True)  # a retried EndTxn is answered with success
    assert coordinator.complete_prepared() == 0


def test_a_transaction_whose_markers_fail_again_does_not_hold_up_the_others(
    coordinator: TransactionCoordinator, markers: Markers
) -> None:
    stuck_pid, stuck_epoch = coordinator.init_producer_id("stuck", TIMEOUT_MS)
    coordinator.add_partitions("stuck", stuck_pid, stuck_epoch, [("broken", 0)])
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    markers.failing_topics = {"broken"}
    coordinator.end_txn("stuck", stuck_pid, stuck_epoch, commit=True)
    markers.fail_next = 1
    coordinator.end_txn("t", pid, epoch, commit=False)  # its one marker write fails too
    assert coordinator.transactions["t"].state is TxnState.PREPARE_ABORT

    assert coordinator.complete_prepared() == 1  # "stuck" fails again first; "t" is completed all the same
    assert coordinator.transactions["stuck"].state is TxnState.PREPARE_COMMIT
    assert coordinator.transactions["t"].state is TxnState.COMPLETE_ABORT
    assert markers.written == [("out", 0, pid, epoch, False)]

    markers.failing_topics = set()
    assert coordinator.complete_prepared() == 1
    assert coordinator.transactions["stuck"].state is TxnState.COMPLETE_COMMIT


def test_the_broker_starts_with_a_decided_transaction_whose_markers_still_fail(
    journal_path: Path, markers: Markers, clock: Clock
) -> None:
    journal = Journal(journal_path)
    coordinator = _coordinator(journal, markers, clock)
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    markers.failing_topics = {"out"}
    coordinator.end_txn("t", pid, epoch, commit=True)
    journal.close()

    journal = Journal(journal_path)  # a restart, the disk still failing
    restarted = _coordinator(journal, markers, clock)
    restarted.recover()  # logs and leaves the outcome to the periodic task, as Kafka's marker channel
    assert restarted.transactions["t"].state is TxnState.PREPARE_COMMIT
    markers.failing_topics = set()
    assert restarted.complete_prepared() == 1
    assert restarted.transactions["t"].state is TxnState.COMPLETE_COMMIT
    assert markers.written == [("out", 0, pid, epoch, True)]
    journal.close()


def test_a_timeout_abort_that_cannot_be_journaled_does_not_hold_up_the_others(
    coordinator: TransactionCoordinator, markers: Markers, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for transactional_id in ("first", "second"):
        pid, epoch = coordinator.init_producer_id(transactional_id, TIMEOUT_MS)
        coordinator.add_partitions(transactional_id, pid, epoch, [(transactional_id, 0)])
    write = coordinator.state.write

    def write_failing_for_first(txn: Any, prepared: Any) -> None:
        if txn.transactional_id == "first":
            raise JournalError("disk full")
        write(txn, prepared)

    monkeypatch.setattr(coordinator.state, "write", write_failing_for_first)
    clock.now += TIMEOUT_MS + 1
    assert coordinator.abort_timed_out() == 1
    assert coordinator.transactions["first"].state is TxnState.ONGOING  # tried again next round
    assert coordinator.transactions["second"].state is TxnState.COMPLETE_ABORT

    monkeypatch.setattr(coordinator.state, "write", write)
    assert coordinator.abort_timed_out() == 1
    assert coordinator.transactions["first"].state is TxnState.COMPLETE_ABORT


def test_a_decision_that_cannot_be_journaled_changes_nothing(
    coordinator: TransactionCoordinator, journal_path: Path
) -> None:
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    coordinator.state._journal.close()  # every later append fails
    with pytest.raises(JournalError):
        coordinator.init_producer_id("t", TIMEOUT_MS)  # would fence and abort the open transaction
    txn = coordinator.transactions["t"]
    assert (txn.state, txn.producer_epoch) == (TxnState.ONGOING, epoch)


def test_an_epoch_bump_that_cannot_be_journaled_fences_nobody(
    coordinator: TransactionCoordinator, journal_path: Path, markers: Markers, clock: Clock
) -> None:
    """InitProducerId answers only what the journal holds: a bump only memory knew would fence the
    running instance until a restart unfenced it, and a retry would bump once more."""
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.state._journal.close()  # every later append fails
    with pytest.raises(JournalError):
        coordinator.init_producer_id("t", TIMEOUT_MS)
    with pytest.raises(JournalError):
        coordinator.init_producer_id("t", TIMEOUT_MS, pid, epoch)  # KIP-360: the producer bumps its own
    with pytest.raises(JournalError):
        coordinator.init_producer_id("new", TIMEOUT_MS)
    assert "new" not in coordinator.transactions
    txn = coordinator.transactions["t"]
    assert (txn.producer_id, txn.producer_epoch, txn.last_producer_epoch) == (pid, epoch, -1)
    # The running instance is not fenced: EndTxn without a transaction, not PRODUCER_FENCED.
    assert _error(coordinator.end_txn, "t", pid, epoch, True) == ErrorCode.INVALID_TXN_STATE
    journal = Journal(journal_path)  # the disk is back
    coordinator = _coordinator(journal, markers, clock)
    assert coordinator.init_producer_id("t", TIMEOUT_MS) == (pid, epoch + 1)
    assert coordinator.init_producer_id("new", TIMEOUT_MS)[1] == 0
    journal.close()


def test_a_move_to_a_new_producer_id_that_cannot_be_journaled_keeps_the_old_one(
    coordinator: TransactionCoordinator,
) -> None:
    pid, _ = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.transactions["t"].producer_epoch = EXHAUSTED_EPOCH
    coordinator.state._journal.close()  # every later append fails
    with pytest.raises(JournalError):
        coordinator.init_producer_id("t", TIMEOUT_MS, pid, EXHAUSTED_EPOCH)
    txn = coordinator.transactions["t"]
    assert (txn.producer_id, txn.producer_epoch, txn.previous_producer_id) == (pid, EXHAUSTED_EPOCH, -1)
    assert coordinator.by_producer_id(pid) is txn
    assert [t for p, t in coordinator.state.by_producer_id.items() if p != pid] == []


def test_a_partition_or_group_added_that_cannot_be_journaled_is_not_added(
    coordinator: TransactionCoordinator, journal_path: Path, markers: Markers, clock: Clock
) -> None:
    """A retried AddPartitionsToTxn must find the transaction as the journal has it: answered
    success for partitions only memory knew, their open transaction would outlive a restart that
    forgot them, holding read_committed readers back for good."""
    pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
    coordinator.state._journal.close()  # every later append fails
    with pytest.raises(JournalError):
        coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    with pytest.raises(JournalError):
        coordinator.add_offsets("t", pid, epoch, "group")
    txn = coordinator.transactions["t"]
    assert (txn.state, txn.partitions, txn.groups) == (TxnState.EMPTY, set(), set())
    with pytest.raises(JournalError):  # a retry is journaled too, not answered from memory
        coordinator.add_partitions("t", pid, epoch, [("out", 0)])
    journal = Journal(journal_path)  # the disk is back
    coordinator = _coordinator(journal, markers, clock)
    coordinator.recover()
    coordinator.add_partitions("t", pid, epoch, [("out", 0)])  # the retry, after a restart
    assert coordinator.transactions["t"].partitions == {("out", 0)}
    journal.close()


def test_unknown_partitions_fail_before_the_producer_is_checked(journal_path: Path, clock: Clock) -> None:
    journal = Journal(journal_path)
    try:
        coordinator = TransactionCoordinator(
            journal,
            max_timeout_ms=900_000,
            write_marker=Markers(),
            complete_offsets=lambda group, producer_id, commit: None,
            partition_exists=lambda topic, partition: topic != "gone",
            now_ms=clock,
        )
        pid, epoch = coordinator.init_producer_id("t", TIMEOUT_MS)
        coordinator.init_producer_id("t", TIMEOUT_MS)  # fences `epoch`
        # As Kafka's KafkaApis: the missing partition is named even for a fenced producer.
        assert coordinator.add_partitions("t", pid, epoch, [("gone", 0), ("out", 0)]) == {
            ("gone", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("out", 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
        }
        assert _error(coordinator.add_partitions, "t", pid, epoch, [("out", 0)]) == ErrorCode.PRODUCER_FENCED
    finally:
        journal.close()


_ALLOWED_TRANSITIONS = {
    (TxnState.EMPTY, TxnState.EMPTY),
    (TxnState.COMPLETE_COMMIT, TxnState.EMPTY),
    (TxnState.COMPLETE_ABORT, TxnState.EMPTY),
    (TxnState.EMPTY, TxnState.ONGOING),
    (TxnState.ONGOING, TxnState.ONGOING),
    (TxnState.COMPLETE_COMMIT, TxnState.ONGOING),
    (TxnState.COMPLETE_ABORT, TxnState.ONGOING),
    (TxnState.ONGOING, TxnState.PREPARE_COMMIT),
    (TxnState.ONGOING, TxnState.PREPARE_ABORT),
    (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT),
    (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT),
}


@pytest.mark.parametrize("source", list(TxnState))
@pytest.mark.parametrize("target", list(TxnState))
def test_every_transition_outside_kafkas_state_machine_is_refused(source: TxnState, target: TxnState) -> None:
    """Kafka's TransactionState transitions, and no other: a refused one leaves the metadata as it is."""
    txn = TransactionMetadata("t", producer_id=7, producer_epoch=3, timeout_ms=60_000, state=source)
    txn.partitions.add(("topic", 0))
    if (source, target) in _ALLOWED_TRANSITIONS:
        prepared = txn._moved_to(target, partitions=set())
        assert (prepared.state, prepared.partitions) == (target, set())
        assert (txn.state, txn.partitions) == (source, {("topic", 0)}), "a prepared transition changed memory"
    else:
        with pytest.raises(IllegalStateTransition, match=f"{source.value} -> {target.value}"):
            txn._moved_to(target)
        assert txn.state is source


@pytest.mark.parametrize(
    ("source", "transition"),
    [
        (TxnState.EMPTY, lambda txn: txn.prepare_decision(commit=True)),
        (TxnState.COMPLETE_ABORT, lambda txn: txn.prepare_fence_and_abort()),
        (TxnState.ONGOING, lambda txn: txn.prepare_complete()),
        (TxnState.PREPARE_COMMIT, lambda txn: txn.prepare_add(partitions=[("out", 1)], now_ms=5)),
        (
            TxnState.PREPARE_ABORT,
            lambda txn: txn.prepare_epoch_bump(
                timeout_ms=60_000, producer_id=-1, producer_epoch=-1, new_producer_id=lambda: 8
            ),
        ),
    ],
)
def test_each_named_transition_is_refused_from_a_state_kafka_does_not_allow(
    source: TxnState, transition: Any
) -> None:
    txn = TransactionMetadata("t", producer_id=7, producer_epoch=3, timeout_ms=60_000, state=source)
    with pytest.raises(IllegalStateTransition):
        transition(txn)
    assert (txn.state, txn.producer_epoch) == (source, 3)


def test_the_named_transitions_are_kafkas_changes_as_copies() -> None:
    txn = TransactionMetadata("t", producer_id=7, producer_epoch=3, timeout_ms=60_000, last_producer_epoch=2)
    ongoing = txn.prepare_add(partitions=[("out", 0)], groups=["g"], now_ms=5)
    assert (ongoing.state, ongoing.partitions, ongoing.groups, ongoing.start_ms) == (
        TxnState.ONGOING,
        {("out", 0)},
        {"g"},
        5,
    )
    assert txn.state is TxnState.EMPTY and not txn.partitions
    fenced = ongoing.prepare_fence_and_abort()
    assert (fenced.state, fenced.producer_epoch, fenced.last_producer_epoch) == (
        TxnState.PREPARE_ABORT,
        4,
        -1,
    )
    completed = fenced.prepare_complete()
    assert (completed.state, completed.partitions, completed.start_ms) == (TxnState.COMPLETE_ABORT, set(), 5)
    assert ongoing.prepare_decision(commit=True).prepare_complete().state is TxnState.COMPLETE_COMMIT
    bumped = txn.prepare_epoch_bump(
        timeout_ms=1000, producer_id=7, producer_epoch=3, new_producer_id=lambda: 9
    )
    assert (bumped.producer_id, bumped.producer_epoch, bumped.last_producer_epoch, bumped.timeout_ms) == (
        7,
        4,
        3,
        1000,
    )
    with pytest.raises(BrokerError) as fenced_out:
        txn.prepare_epoch_bump(timeout_ms=1000, producer_id=7, producer_epoch=1, new_producer_id=lambda: 9)
    assert fenced_out.value.code is ErrorCode.PRODUCER_FENCED
