"""The produce path's record walk checks runs of same-sized records column by column
(record_scan._uniform_run); it must accept exactly what the full decoder accepts, report the same keyless
records and timestamp extremes, and leave every other judgement to the full decoder."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sparkafka.broker import record_scan, records
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.records import HEADER_SIZE, InvalidRecordError, Record, parse_header


def _uniform_batch(rng: random.Random) -> bytes:
    """Many records of one size, as fixed-size producers send: null, fixed or mixed keys, optional
    headers, timestamp and offset deltas that change varint width inside the batch."""
    count = rng.choice([17, 64, 65, 200, 700])
    value = rng.randbytes(rng.choice([0, 1, 60, 100, 1024]))
    key_kind = rng.choice(["null", "fixed", "mixed"])
    headers = tuple((rng.choice(["h", "trace"]), rng.randbytes(4)) for _ in range(rng.choice([0, 0, 1, 2])))
    step = rng.choice([0, 1, 3, 50, -1, -50])  # negative: records stamped earlier than the first
    recs = []
    for offset in range(count):
        key: bytes | None = None
        if key_kind == "fixed" or (key_kind == "mixed" and rng.random() < 0.5):
            key = b"k%07d" % offset
        recs.append(Record(offset, 1_700_000_000_000 + offset * step, key, value, headers))
    return encode_batch(recs, base_offset=0, producer_id=3, producer_epoch=0, base_sequence=0)


def _full(blob: bytes, header: records.BatchHeader) -> tuple[list[int], int, int] | str:
    """The reference: keyless indexes and the extremes of the timestamp deltas from the full decoder,
    or its error message."""
    try:
        decoded = records.decode_record_bytes(header, blob)
    except InvalidRecordError as exc:
        return str(exc)
    deltas = [r.timestamp - header.base_timestamp for r in decoded]
    return [i for i, r in enumerate(decoded) if r.key is None], min(deltas), max(deltas)


def test_uniform_batches_are_walked_in_runs_with_the_full_decoders_result() -> None:
    rng = random.Random(11)
    for _ in range(200):
        batch = _uniform_batch(rng)
        header = parse_header(batch)
        blob = batch[HEADER_SIZE:]
        fast = record_scan._scan_fast(blob, header.record_count)
        assert fast is not None
        assert fast == _full(blob, header)


def test_a_run_stops_at_the_first_record_of_another_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    value = b"v" * 100
    recs = [Record(i, 1_700_000_000_000, None, value) for i in range(300)]
    recs[150] = Record(150, 1_700_000_000_000, b"key", b"v" * 96)  # same size, different shape
    batch = encode_batch(recs, base_offset=0)
    header = parse_header(batch)
    blob = batch[HEADER_SIZE:]
    runs: list[int] = []
    uniform_run = record_scan._uniform_run

    def recording_run(*args: object) -> record_scan._Run:
        found = uniform_run(*args)  # type: ignore[arg-type]
        runs.append(found.count)
        return found

    monkeypatch.setattr(record_scan, "_uniform_run", recording_run)
    expected = ([i for i in range(300) if i != 150], 0, 0)
    assert record_scan._scan_fast(blob, 300) == expected == _full(blob, header)
    assert max(runs) >= 80  # the bulk was checked in runs, not record by record


@pytest.mark.parametrize("seed", range(6))
def test_damaged_uniform_batches_are_judged_like_the_full_decoder(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(150):
        batch = bytearray(_uniform_batch(rng))
        header = parse_header(batch)
        for _ in range(rng.choice([1, 1, 2, 3])):
            position = rng.randrange(HEADER_SIZE, len(batch))
            batch[position] = rng.choice([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        blob = bytes(batch[HEADER_SIZE:])
        count = header.record_count + rng.choice([0, 0, 0, -1, 1])
        fast = record_scan._scan_fast(blob, count)
        full = _full(blob, dataclasses.replace(header, record_count=count))
        if fast is not None:
            assert fast == full  # the fast walk never accepts what the full decoder rejects
        elif not isinstance(full, str):
            # The walk may pass a valid batch to the full decoder only for its rare shapes
            # (varints longer than two bytes where it decodes inline).
            assert _has_long_varint_field(blob)


def _has_long_varint_field(blob: bytes) -> bool:
    return any(blob[i] >= 0x80 and blob[i + 1] >= 0x80 for i in range(len(blob) - 1))


def test_runs_do_not_read_past_the_records_they_were_given() -> None:
    recs = [Record(i, 1_700_000_000_000, None, b"x" * 20) for i in range(100)]
    batch = encode_batch(recs, base_offset=0)
    blob = batch[HEADER_SIZE:]
    # Fewer records declared than present: bytes are left over, which only the full decoder may judge.
    assert record_scan._scan_fast(blob, 99) is None
    # More declared than present.
    assert record_scan._scan_fast(blob, 101) is None
    # A truncated last record.
    assert record_scan._scan_fast(blob[:-1], 100) is None


@pytest.mark.parametrize("seed", range(3))
def test_walking_a_batch_in_place_equals_walking_its_records_copied_out(seed: int) -> None:
    rng = random.Random(500 + seed)
    for _ in range(150):
        batch = bytearray(_uniform_batch(rng))
        for _ in range(rng.choice([0, 1, 2])):
            batch[rng.randrange(HEADER_SIZE, len(batch))] = rng.randrange(256)
        count = parse_header(batch).record_count
        in_place = record_scan._scan_fast(batch, count, HEADER_SIZE)
        assert in_place == record_scan._scan_fast(bytes(batch[HEADER_SIZE:]), count)


def test_byte_extremes_equal_min_and_max() -> None:
    rng = random.Random(3)
    for _ in range(300):
        column = rng.randbytes(rng.choice([1, 2, 17, 500]))
        if rng.random() < 0.3:
            column = bytes(b % 8 + rng.choice([0, 120, 248]) for b in column)  # clustered values
        assert record_scan._byte_extremes(column) == (min(column), max(column))
