"""Error paths of sparkafka.broker.transactions: the messages of a fenced InitProducerId and of the
produce path's verification of a transactional batch, on a coordinator over a real journal."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.journal import Journal
from sparkafka.broker.transactions import TransactionCoordinator, TransactionVerificationError

TIMEOUT_MS = 60_000


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[TransactionCoordinator]:
    markers: list[tuple[str, int, int, int, bool]] = []
    with Journal(tmp_path / "__transaction_state.journal") as journal:
        yield TransactionCoordinator(
            journal,
            max_timeout_ms=900_000,
            write_marker=lambda topic, partition, pid, epoch, commit: markers.append(
                (topic, partition, pid, epoch, commit)
            ),
            complete_offsets=lambda group, producer_id, commit: None,
            partition_exists=lambda topic, partition: True,
            now_ms=lambda: 1_000_000,
        )


def test_a_bump_by_another_producer_id_is_fenced_naming_the_owner(
    coordinator: TransactionCoordinator,
) -> None:
    pid, epoch = coordinator.init_producer_id("orders-writer", TIMEOUT_MS)
    with pytest.raises(BrokerError) as raised:
        coordinator.init_producer_id("orders-writer", TIMEOUT_MS, pid + 100, 0)
    assert raised.value.code == ErrorCode.PRODUCER_FENCED
    assert str(raised.value) == (
        f"producer {pid + 100} epoch 0 no longer owns transactional id 'orders-writer' "
        f"(now producer {pid} epoch {epoch})"
    )


def test_a_bump_from_an_epoch_already_bumped_past_is_fenced(coordinator: TransactionCoordinator) -> None:
    pid, epoch = coordinator.init_producer_id("orders-writer", TIMEOUT_MS)
    coordinator.init_producer_id("orders-writer", TIMEOUT_MS, pid, epoch)
    coordinator.init_producer_id("orders-writer", TIMEOUT_MS, pid, epoch + 1)
    with pytest.raises(
        BrokerError,
        match=re.escape(
            f"producer {pid} epoch {epoch} no longer owns transactional id 'orders-writer' "
            f"(now producer {pid} epoch {epoch + 2})"
        ),
    ) as raised:
        coordinator.init_producer_id("orders-writer", TIMEOUT_MS, pid, epoch)
    assert raised.value.code == ErrorCode.PRODUCER_FENCED


def test_a_batch_of_a_producer_that_does_not_own_the_id_fails_verification(
    coordinator: TransactionCoordinator,
) -> None:
    pid, epoch = coordinator.init_producer_id("orders-writer", TIMEOUT_MS)
    with pytest.raises(TransactionVerificationError) as raised:
        coordinator.verify_partition("orders-writer", pid + 1, epoch, "orders", 0)
    assert raised.value.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert str(raised.value) == (
        f"producer {pid + 1} is not the current producer of transactional id 'orders-writer'; "
        "call InitProducerId first"
    )


def test_a_batch_of_a_stale_epoch_fails_verification(coordinator: TransactionCoordinator) -> None:
    pid, epoch = coordinator.init_producer_id("orders-writer", TIMEOUT_MS)
    with pytest.raises(TransactionVerificationError) as raised:
        coordinator.verify_partition("orders-writer", pid, epoch + 3, "orders", 0)
    assert raised.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert str(raised.value) == (
        f"producer {pid} epoch {epoch + 3} is not the current epoch {epoch} of transactional id "
        "'orders-writer'"
    )
