"""Transactional ids are built and read back by one module: ``{prefix}-{write partition}``."""

from __future__ import annotations

import pytest

from sparkafka.connector.sink.transactional_ids import (
    claim_transactional_id,
    default_transactional_id_prefix,
    prefix_of,
    transactional_id,
    write_partition_of,
)


@pytest.mark.parametrize(
    ("prefix", "partition"),
    [
        ("sparkafka-q1", 0),
        ("orders-to-shipments", 17),
        ("a-1", 2),
        ("orders-2", 0),
        ("a-1-1", 1),
        ("x-0-", 10),
    ],
)
def test_an_id_reads_back_as_its_prefix_and_partition(prefix: str, partition: int) -> None:
    built = transactional_id(prefix, partition)
    assert write_partition_of(built, prefix) == partition
    assert prefix_of(built, partition) == prefix


@pytest.mark.parametrize(
    ("candidate", "prefix"),
    [
        ("orders-extra-3", "orders"),  # another prefix that starts the same
        ("orders-", "orders"),  # no partition
        ("orders-x", "orders"),  # not a number
        ("orders3", "orders"),  # no separator
        ("other-3", "orders"),
        ("orders-2-0", "orders"),  # partition 0 of prefix 'orders-2'
        ("a-1-1-1", "a-1"),
        ("orders-0", "order"),
    ],
)
def test_an_id_of_another_prefix_has_no_partition(candidate: str, prefix: str) -> None:
    assert write_partition_of(candidate, prefix) is None


def test_the_prefix_of_an_id_built_for_another_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="not the transactional id of write partition 4"):
        prefix_of(transactional_id("orders", 3), 4)


def test_an_id_of_another_write_partition_has_no_prefix_for_this_one() -> None:
    with pytest.raises(ValueError, match=r"^'orders-3' is not the transactional id of write partition 4$"):
        prefix_of("orders-3", 4)


def test_the_id_format_is_what_older_checkpoints_and_markers_hold() -> None:
    """Spelled out here on purpose: every marker, registration and checkpoint written so far names
    ids of this form, so a change to it would orphan them."""
    assert default_transactional_id_prefix("1c0ffee0-0000-4000-8000-000000000000") == (
        "sparkafka-1c0ffee0-0000-4000-8000-000000000000"
    )
    assert transactional_id("sparkafka-q", 7) == "sparkafka-q-7"
    assert claim_transactional_id("sparkafka-q") == "sparkafka-q.claim"
