"""The produce path validates records with a fast walk (records.keyless_record_indexes) instead of decoding
them; it must accept exactly what the full decoder accepts and raise the same errors otherwise."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sparkafka.broker import records
from sparkafka.broker.records import (
    HEADER_SIZE,
    InvalidRecordError,
    Record,
    encode_batch,
    keyless_record_indexes,
    parse_header,
)


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


def _full(batch: bytes, header: records.BatchHeader) -> list[int] | str:
    """The reference: keyless indexes from the full decoder, or its error message."""
    blob = bytes(batch[HEADER_SIZE : header.size])
    if header.compression:
        blob = records._decompress(header, blob)
    try:
        return [i for i, r in enumerate(records._decode_record_bytes(header, blob)) if r.key is None]
    except InvalidRecordError as exc:
        return str(exc)


def _fast(batch: bytes, header: records.BatchHeader) -> list[int] | str:
    try:
        return keyless_record_indexes(batch, header)
    except InvalidRecordError as exc:
        return str(exc)


def test_well_formed_batches_take_the_fast_path() -> None:
    rng = random.Random(7)
    for _ in range(300):
        batch = _random_batch(rng)
        header = parse_header(batch)
        blob = bytes(batch[HEADER_SIZE:])
        if not header.compression:
            assert records._keyless_indexes_fast(blob, header.record_count) is not None
        assert _fast(batch, header) == _full(batch, header)


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
        fast = records._keyless_indexes_fast(blob, header.record_count)
        full = _full(data, header)
        if fast is not None:
            assert fast == full  # the fast walk never accepts what the full decoder rejects
        assert _fast(data, header) == full  # and the public function reports the same outcome
