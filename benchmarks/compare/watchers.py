"""Read_committed watchers of a runner's output topic: when the output became visible, when it was
complete, and whether it is correct."""

from __future__ import annotations

from array import array

from benchmarks.common import OutputWatcher
from benchmarks.compare.workload import parse_map_output
from confluent_kafka import Message


class CompletionWatcher(OutputWatcher):
    """Shared by both workloads: the first visible output, a wait for the completion time, and the
    moments at which given numbers of inputs were accounted for in the output (``milestones``)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.first_visible: float | None = None
        self.records_seen = 0
        self.reached: dict[int, float | None] = {}
        super().__init__(bootstrap, topic)

    def expect(self, accounted: int) -> None:
        """Record the time at which ``accounted`` inputs are accounted for in the output; call it before
        the inputs that get there are produced."""
        self.reached[accounted] = None

    def _accounted_for(self, accounted: int, visible_at: float) -> None:
        for milestone, at in self.reached.items():
            if at is None and accounted >= milestone:
                self.reached[milestone] = visible_at

    def sustained_rate(self, start: int, end: int) -> float | None:
        """Inputs per second between the moments ``start`` and ``end`` inputs were accounted for."""
        began, ended = self.reached.get(start), self.reached.get(end)
        if began is None or ended is None:
            return None
        return (end - start) / max(ended - began, 1e-3)

    def on_record(self, visible_at: float, message: Message) -> None:
        if self.first_visible is None:
            self.first_visible = visible_at
        self.records_seen += 1
        self.observe(visible_at, message)

    def observe(self, visible_at: float, message: Message) -> None:
        raise NotImplementedError

    def accounted_for(self) -> int:
        """How many inputs the output seen so far accounts for."""
        raise NotImplementedError

    def problems(self) -> list[str]:
        """What is wrong with the output seen so far (empty when it is correct)."""
        raise NotImplementedError


class MapWatcher(CompletionWatcher):
    """Checks that every input seq shows up once as ``EVENT(<value>)`` and records the moment the
    number of distinct outputs reaches each milestone (the bulk phase, then the steady-rate phase).
    Latencies (visible minus produce time, ms) are kept for seqs from ``latency_from`` on."""

    def __init__(self, bootstrap: str, topic: str, capacity: int, latency_from: int) -> None:
        self.seen = bytearray(capacity)
        self.distinct = 0
        self.duplicates = 0
        self.malformed = 0
        self.first_malformed: tuple[bytes | None, bytes | None] | None = None
        self.latency_from = latency_from
        self.latencies_ms = array("d")
        super().__init__(bootstrap, topic)

    def observe(self, visible_at: float, message: Message) -> None:
        parsed = parse_map_output(message)
        if parsed is None or parsed[0] >= len(self.seen):
            self.malformed += 1
            if self.first_malformed is None:
                self.first_malformed = (message.key(), message.value())
            return
        seq, produced_ms = parsed
        if self.seen[seq]:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.distinct += 1
        if seq >= self.latency_from:
            self.latencies_ms.append(visible_at * 1000 - produced_ms)
        if self.reached.get(self.distinct, 0.0) is None:
            self.reached[self.distinct] = visible_at

    def accounted_for(self) -> int:
        return self.distinct

    def problems(self) -> list[str]:
        found = []
        if self.malformed:
            found.append(f"{self.malformed} malformed outputs (first: {self.first_malformed!r})")
        if self.duplicates:
            found.append(f"{self.duplicates} duplicate outputs")
        return found

    def missing(self, expected: int) -> str | None:
        if self.distinct < expected:
            return f"{expected - self.distinct} of {expected} inputs missing from the output"
        return None


class CountWatcher(CompletionWatcher):
    """Follows each key's latest count and records when every key's latest count is its true total.
    A count above the total, or one that goes down, is an error."""

    def __init__(self, bootstrap: str, topic: str, expected: dict[bytes, int]) -> None:
        self.expected = expected
        self.latest: dict[bytes | None, int] = {}
        self.keys_at_total = 0
        self.accounted = 0  # the sum of the latest counts: inputs the output accounts for
        self.overcounts = 0
        self.regressions = 0
        self.malformed = 0
        self.first_problem: str | None = None
        self.complete_at: float | None = None
        super().__init__(bootstrap, topic)

    def _problem(self, text: str) -> None:
        if self.first_problem is None:
            self.first_problem = text

    def observe(self, visible_at: float, message: Message) -> None:
        key = message.key()
        total = self.expected.get(key or b"")
        try:
            count = int(message.value() or b"")
        except ValueError:
            count = -1
        if total is None or count <= 0:
            self.malformed += 1
            self._problem(f"unexpected record key={key!r} value={message.value()!r}")
            return
        previous = self.latest.get(key, 0)
        if count > total:
            self.overcounts += 1
            self._problem(f"key {key!r} counted {count}, its total is {total}")
        if count < previous:
            self.regressions += 1
            self._problem(f"key {key!r} went from {previous} down to {count}")
        self.latest[key] = count
        self.accounted += count - previous
        self._accounted_for(self.accounted, visible_at)
        self.keys_at_total += (count == total) - (previous == total)
        if self.keys_at_total == len(self.expected) and self.complete_at is None:
            self.complete_at = visible_at

    def accounted_for(self) -> int:
        return self.accounted

    def problems(self) -> list[str]:
        found = []
        for what, number in (
            ("records with an unknown key or a value that is not a count", self.malformed),
            ("counts above the key's total", self.overcounts),
            ("counts lower than an earlier one", self.regressions),
        ):
            if number:
                found.append(f"{number} {what}")
        if found and self.first_problem:
            found.append(f"first: {self.first_problem}")
        return found

    def missing(self) -> str | None:
        wrong = len(self.expected) - self.keys_at_total
        if wrong:
            sample = next(
                (k, self.latest.get(k), v) for k, v in self.expected.items() if self.latest.get(k) != v
            )
            return (
                f"{wrong} of {len(self.expected)} keys without their true total "
                f"(e.g. key {sample[0]!r}: latest {sample[1]}, total {sample[2]})"
            )
        return None
