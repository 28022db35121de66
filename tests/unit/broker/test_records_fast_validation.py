"""The produce path validates records with a fast walk (record_scan.scan_records) instead of decoding them; it
must accept exactly what the full decoder accepts, report the same keyless records and timestamp extremes,
and raise the same errors otherwise."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sparkafka.broker import record_scan, records
from sparkafka.broker.record_builder import encode_batch
from sparkafka.broker.record_scan import scan_records
from sparkafka.broker.records import HEADER_SIZE, InvalidRecordError, Record, parse_header


def _random_record(rng: random.Random, offset: int) -> Record:
    def blob() -> bytes | None:
        return None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 1, 5, 63, 64, 200, 5000]))

    headers = tuple(
        (rng.choice(["h", "", "header-key" * 10]), blob()) for _ in range(rng.choice([0, 0, 1, 3]))
    )
    timestamp = 1_700_000_000_000 + rng.choice([0, 1, 63, 64, 10_000, 2**40])
    return Record(offset, timestamp, blob(), blob(), headers)


def _random_batch(rng: random.Random) -> bytes:
    count = rng.choice([1, 2, 7, 50])
    base = 1_700_000_000_000
    recs = [_random_record(rng, i) for i in range(count)]
    recs[0] = dataclasses.replace(recs[0], timestamp=base)
    return encode_batch(recs, base_offset=0, compression=rng.choice([0, 0, 0, 1]))


Scan = tuple[list[int], int, int]


def _full(batch: bytes, header: records.BatchHeader) -> Scan | str:
    """The reference: keyless indexes and the extremes of the timestamp deltas (the fast walk's empty
    extremes for no records) from the full decoder, or its error message."""
    blob = bytes(batch[HEADER_SIZE : header.size])
    if header.compression:
        blob = records.decompress(header, blob)
    try:
        decoded = records.decode_record_bytes(header, blob)
    except InvalidRecordError as exc:
        return str(exc)
    deltas = [r.timestamp - header.base_timestamp for r in decoded]
    keyless = [i for i, r in enumerate(decoded) if r.key is None]
    return keyless, min(deltas, default=records.INT64_MAX), max(deltas, default=records.INT64_MIN)


def _public(full: Scan | str, header: records.BatchHeader) -> Scan | str:
    """What scan_records reports for the full decoder's result: timestamps, not deltas."""
    if isinstance(full, str):
        return full
    keyless, low, high = full
    if header.record_count <= 0:
        return keyless, records.NO_TIMESTAMP, records.NO_TIMESTAMP
    return keyless, header.base_timestamp + low, header.base_timestamp + high


def _fast(batch: bytes, header: records.BatchHeader) -> Scan | str:
    try:
        scan = scan_records(batch, header)
    except InvalidRecordError as exc:
        return str(exc)
    return scan.keyless, scan.min_timestamp, scan.max_timestamp


def test_well_formed_batches_take_the_fast_path() -> None:
    rng = random.Random(7)
    for _ in range(300):
        batch = _random_batch(rng)
        header = parse_header(batch)
        blob = bytes(batch[HEADER_SIZE:])
        if not header.compression:
            assert record_scan._scan_fast(blob, header.record_count) is not None
        assert _fast(batch, header) == _public(_full(batch, header), header)


@pytest.mark.parametrize("seed", range(4))
def test_damaged_batches_are_judged_like_the_full_decoder(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(700):
        batch = bytearray(_random_batch(rng))
        header = parse_header(batch)
        if header.compression:
            continue  # damage inside a compressed blob is a decompression error, not a record error
        for _ in range(rng.choice([1, 1, 2, 4])):
            position = rng.randrange(HEADER_SIZE, len(batch))
            batch[position] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        if rng.random() < 0.2:
            cut = rng.randrange(HEADER_SIZE, len(batch))
            batch = batch[:cut]
            header = dataclasses.replace(header, batch_length=len(batch) - records.LOG_OVERHEAD)
        if rng.random() < 0.2:
            header = dataclasses.replace(
                header, record_count=max(0, header.record_count + rng.choice([-1, 1]))
            )
        data = bytes(batch)
        blob = data[HEADER_SIZE : header.size]
        fast = record_scan._scan_fast(blob, header.record_count)
        full = _full(data, header)
        if fast is not None:
            assert fast == full  # the fast walk never accepts what the full decoder rejects
        assert _fast(data, header) == _public(full, header)  # and the public function reports the same
