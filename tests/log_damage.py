"""Damage done to a stored partition log on purpose, as a disk or a filesystem might."""

from __future__ import annotations

import struct
from pathlib import Path

from sparkafka.broker import records


def flip_byte_in_batch(segment: Path, offset: int) -> int:
    """Flip the last byte of the batch holding `offset` (inside its records, so only its CRC tells);
    return the batch's position in the file."""
    data = bytearray(segment.read_bytes())
    for position, header in records.iter_batches(bytes(data)):
        if header.base_offset <= offset <= header.last_offset:
            data[position + header.size - 1] ^= 0x40
            segment.write_bytes(bytes(data))
            return position
    raise AssertionError(f"no batch holds offset {offset} in {segment}")


def overrun_file_with_batch(segment: Path, offset: int, length: int = 10_000) -> int:
    """Set the length field of the batch holding `offset` to `length`, so that the batch claims bytes
    past the end of the file, as a torn write would look; return the batch's position."""
    data = bytearray(segment.read_bytes())
    for position, header in records.iter_batches(bytes(data)):
        if header.base_offset <= offset <= header.last_offset:
            struct.pack_into(">i", data, position + 8, length)
            assert position + 12 + length > len(data), "the length should run past the end of the file"
            segment.write_bytes(bytes(data))
            return position
    raise AssertionError(f"no batch holds offset {offset} in {segment}")
