"""The Arrow batch the source builds from the records of one offset range (``_Columns``): timestamp
and timestamp type conversion, headers, and the error for a timestamp Spark cannot hold."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from sparkafka.connector.source.reader import _Columns
from sparkafka.connector.source.schema import kafka_arrow_schema
from sparkafka.errors import KafkaReadError


def filled(include_headers: bool, records: list[tuple]) -> _Columns:
    """``records``: (key, value, offset, confluent-kafka timestamp type, ms[, headers])."""
    columns = _Columns("orders", 3, include_headers)
    for key, value, offset, timestamp_type, ms, *headers in records:
        columns.keys.append(key)
        columns.values.append(value)
        columns.offsets.append(offset)
        columns.timestamp_types.append(timestamp_type)
        columns.timestamp_ms.append(ms)
        if columns.headers is not None:
            columns.headers.append(headers[0])
    return columns


def test_a_batch_has_the_sources_schema_and_kafkas_timestamp_type_ids() -> None:
    columns = filled(
        False,
        [
            (b"k", b"v", 10, 1, 1_700_000_000_123),  # create time
            (None, b"w", 11, 2, 1_700_000_000_456),  # log append time
            (b"k", None, 13, 0, -1),  # no timestamp
        ],
    )
    batch = columns.to_batch()
    assert batch.schema == kafka_arrow_schema(False)
    rows = batch.to_pylist()
    assert [row["timestampType"] for row in rows] == [0, 1, -1]
    assert rows[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist()[2] == -1000  # Spark shows -1 ms
    assert [(row["key"], row["value"], row["offset"]) for row in rows] == [
        (b"k", b"v", 10),
        (None, b"w", 11),
        (b"k", None, 13),
    ]
    assert {(row["topic"], row["partition"]) for row in rows} == {("orders", 3)}


def test_the_lists_are_emptied_in_place_for_the_next_batch() -> None:
    columns = filled(True, [(b"k", b"v", 0, 1, 5, [("h", b"1")])])
    bound_append = columns.offsets.append
    assert columns.to_batch().num_rows == 1
    assert len(columns) == 0 and columns.headers == []
    bound_append(1)  # what the read loop holds on to keeps filling the same list
    for name in ("keys", "values", "timestamp_ms"):
        getattr(columns, name).append(None if name != "timestamp_ms" else 6)
    columns.timestamp_types.append(1)
    assert columns.headers is not None
    columns.headers.append(None)
    assert columns.to_batch().column("offset").to_pylist() == [1]


def test_headers_keep_order_and_null_values_and_no_headers_is_null() -> None:
    batch = filled(
        True,
        [
            (None, b"a", 0, 1, 1, [("trace", b"x"), ("empty", None), ("trace", b"y")]),
            (None, b"b", 1, 1, 2, None),
            (None, b"c", 2, 1, 3, []),
        ],
    ).to_batch()
    assert batch.schema == kafka_arrow_schema(True)
    assert batch.column("headers").to_pylist() == [
        [{"key": "trace", "value": b"x"}, {"key": "empty", "value": None}, {"key": "trace", "value": b"y"}],
        None,
        None,
    ]


def test_a_timestamp_beyond_sparks_range_fails_naming_the_partition_and_offsets() -> None:
    columns = filled(False, [(None, b"a", 7, 1, 1), (None, b"b", 8, 1, 2**62)])
    with pytest.raises(KafkaReadError, match=r"topic 'orders' partition 3.*offsets 7\.\.8.*TimestampType"):
        columns.to_batch()


@pytest.mark.parametrize("timestamp_type", [0, 1, 2])
def test_a_run_without_gaps_of_one_timestamp_type_gives_every_offset_and_kafkas_type_id(
    timestamp_type: int,
) -> None:
    first = 2**40  # far past what fits an int32
    columns = filled(False, [(None, b"v", first + i, timestamp_type, 1_000 + i) for i in range(5)])
    batch = columns.to_batch()
    assert batch.schema == kafka_arrow_schema(False)
    assert batch.column("offset").to_pylist() == [first + i for i in range(5)]
    assert batch.column("timestampType").to_pylist() == [timestamp_type - 1] * 5


def test_offsets_with_a_gap_and_types_that_change_are_kept_record_by_record() -> None:
    records = [(None, b"a", 100, 1, 1), (None, b"b", 102, 1, 2), (None, b"c", 103, 2, 3)]
    batch = filled(False, records).to_batch()
    assert batch.column("offset").to_pylist() == [100, 102, 103]
    assert batch.column("timestampType").to_pylist() == [0, 0, 1]
