"""librdkafka's log lines in sparkafka's log: each kind of line once per interval, with a count.

Why: while a broker is down every client of a process logs each failed connection attempt, and
librdkafka's own suppression of identical errors works per client and per broker thread. A Spark
executor has a dozen clients, and a client whose bootstrap connection and learned connection point at
the same dead address can retry in a tight loop for some milliseconds: one 8 s outage gave about 240
lines, 94 of them from one client within 30 ms, all saying "Connection refused".

:class:`RepeatedLines` filters the records of the logger that sparkafka gives its clients (their
``logger`` setting). Steps for each record confluent-kafka hands that logger:

1. its kind: the level, librdkafka's facility (``FAIL``, ``REQTMOUT``, …) and the text without the
   client's name, its thread, the names of the connection (the bootstrap one, the broker's, the
   coordinator's: one address under three names) and the timings that differ from one attempt to
   the next (``after 12ms in state CONNECT``, librdkafka's own ``N identical error(s) suppressed``);
2. the first record of a kind passes, and opens a window of ``window_s``;
3. a record of the same kind within the window is held back and counted;
4. the first record of that kind after the window passes, saying how many were held back and over
   how long, and opens the next window.

Invariants: every kind reaches the log at least once per window in which it occurs; a held-back record
is always counted in the next record of its kind that passes, so the log never understates how often
something happened (the count of the last window of a kind that never recurs is not written, as with
librdkafka's own suppression); records that do not come from a client's log callback pass untouched.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

REPEAT_WINDOW_S = 10.0
# Kinds remembered at most; the longest unseen is forgotten first (its held-back count with it).
MAX_KINDS = 512

# confluent-kafka passes each librdkafka line to the logger as log(level, "%s [%s] %s", facility,
# client name, text).
_CLIENT_LINE_FORMAT = "%s [%s] %s"
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]:\s*")
# The names of the connection a line is about: "127.0.0.1:9092/1: ", "[::1]:9092/bootstrap: ",
# "GroupCoordinator: 127.0.0.1:9092: ". One failing address shows under each of them.
_CONNECTION_NAMES = re.compile(r"^(?:(?:\[[^\]]*\]|[^\s:\[]+)(?::\d+)?(?:/[\w-]+)?:\s+)+")
_ATTEMPT_DETAILS = re.compile(
    r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)"
    r"|,?\s*\d+ identical error\(s\) suppressed"
)


def line_kind(record: logging.LogRecord) -> tuple[int, str, str] | None:
    """(level, facility, text without thread and timings) of a client's log line, None for others."""
    if record.msg != _CLIENT_LINE_FORMAT or not isinstance(record.args, tuple) or len(record.args) != 3:
        return None
    facility, _client_name, text = record.args
    text = _CONNECTION_NAMES.sub("", _THREAD_PREFIX.sub("", str(text)))
    text = _ATTEMPT_DETAILS.sub("", text)
    return record.levelno, str(facility), text


@dataclass
class _Window:
    opened: float
    held_back: int = 0


class RepeatedLines(logging.Filter):
    """Lets each kind of client log line through once per ``window_s`` (the module's steps 1-4)."""

    def __init__(
        self,
        window_s: float = REPEAT_WINDOW_S,
        *,
        max_kinds: int = MAX_KINDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.max_kinds = max_kinds
        self._clock = clock
        self._windows: OrderedDict[tuple[int, str, str], _Window] = OrderedDict()
        # Clients log from whichever thread polls them, and a worker polls several.
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = line_kind(record)
        if kind is None:
            return True
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.opened < self.window_s:
                window.held_back += 1
                return False
            if window is not None and window.held_back:
                assert isinstance(record.args, tuple)
                facility, client_name, text = record.args
                record.args = (
                    facility,
                    client_name,
                    f"{text} ({window.held_back} more like it from this process's Kafka clients "
                    f"in the last {now - window.opened:.0f} s)",
                )
            self._windows[kind] = _Window(opened=now)
            self._windows.move_to_end(kind)
            while len(self._windows) > self.max_kinds:
                self._windows.popitem(last=False)
        return True


def install(logger: logging.Logger, window_s: float = REPEAT_WINDOW_S) -> None:
    """Give ``logger`` one :class:`RepeatedLines` filter (a second call changes nothing)."""
    if not any(isinstance(existing, RepeatedLines) for existing in logger.filters):
        logger.addFilter(RepeatedLines(window_s))
