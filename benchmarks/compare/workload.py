"""The input records of the comparison and what a correct output looks like.

Record ``seq`` (0, 1, 2, … across the bulk and the steady-rate phase of one run) has key ``k<seq % 1000>``
and a 100-byte ASCII value: the produce time in ms since the epoch (13 digits), ``,``, ``seq`` (9 digits),
``,``, then ``b`` padding. Runners treat the value as opaque; the sequence number lets the driver check
that every input appears exactly once in the output, and the time gives the end-to-end latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

KEYS = 1000
VALUE_BYTES = 100
_HEAD_BYTES = 13 + 1 + 9 + 1
_PADDING = b"b" * (VALUE_BYTES - _HEAD_BYTES)
MAP_PREFIX, MAP_SUFFIX = b"EVENT(", b")"


_KEY_BYTES = [b"k%d" % n for n in range(KEYS)]


def key_of(seq: int) -> bytes:
    return _KEY_BYTES[seq % KEYS]


def value_of(seq: int, produced_ms: int) -> bytes:
    return b"%013d,%09d," % (produced_ms, seq) + _PADDING


def parse_value(value: bytes) -> tuple[int, int] | None:
    """(seq, produced ms) of a well-formed input value, else None."""
    return _parse_at(value, 0) if len(value) == VALUE_BYTES else None


def _parse_at(data: bytes, start: int) -> tuple[int, int] | None:
    # Slicing and int() instead of rebuilding the value: the watcher runs this for every output and
    # must keep up with the fastest system.
    if data[start + 13] != 44 or data[start + 23] != 44:  # the two commas
        return None
    if data[start + _HEAD_BYTES : start + VALUE_BYTES] != _PADDING:
        return None
    try:
        return int(data[start + 14 : start + 23]), int(data[start : start + 13])
    except ValueError:
        return None


_MAP_OUTPUT_BYTES = len(MAP_PREFIX) + VALUE_BYTES + len(MAP_SUFFIX)


def parse_map_output(message: Message) -> tuple[int, int] | None:
    """(seq, produced ms) of a correct map output (``EVENT(<input value>)`` under the input's key)."""
    value = message.value() or b""
    if len(value) != _MAP_OUTPUT_BYTES or not value.startswith(MAP_PREFIX) or not value.endswith(MAP_SUFFIX):
        return None
    parsed = _parse_at(value, len(MAP_PREFIX))
    if parsed is None or message.key() != key_of(parsed[0]):
        return None
    return parsed


def expected_counts(records: int) -> dict[bytes, int]:
    """Each key's true total after records 0 .. records-1."""
    rounds, rest = divmod(records, KEYS)
    return {key_of(seq): rounds + (1 if seq < rest else 0) for seq in range(min(records, KEYS))}


@dataclass(frozen=True)
class Produced:
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")


class InputProducer:
    """Produces the input records of one run. One producer serves the bulk and the steady-rate phase,
    so the latter does not pay for connecting and getting a producer id (its first records would
    otherwise carry that wait as latency)."""

    def __init__(self, bootstrap: str) -> None:
        self._failures: list[KafkaError] = []
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
                "acks": "all",
                # Info-level lines (e.g. purging background events at close) are noise in the progress.
                "log_level": 4,
            }
        )

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._failures.append(error)

    def produce(self, topic: str, first_seq: int, records: int, rate: float | None = None) -> Produced:
        """Produce records ``first_seq`` .. ``first_seq + records - 1``, paced at ``rate`` records/s when
        given (as fast as possible otherwise), and wait until every one is acknowledged."""
        producer = self._producer
        started = time.monotonic()
        for i in range(records):
            seq = first_seq + i
            if rate is not None and i % 20 == 0:
                ahead = i / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            value = value_of(seq, time.time_ns() // 1_000_000)
            while True:
                try:
                    producer.produce(topic, value=value, key=key_of(seq), on_delivery=self._on_delivery)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(120)
        seconds = time.monotonic() - started
        if remaining or self._failures:
            first = self._failures[0] if self._failures else "-"
            raise RuntimeError(
                f"producing to {topic} failed: {remaining} records unacknowledged after 120 s, "
                f"{len(self._failures)} delivery errors (first: {first}); check the broker's log"
            )
        return Produced(records, seconds)
