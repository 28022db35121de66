"""Repeated librdkafka log lines: once per window and kind, with the count of those held back."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from confluent_kafka import Consumer

from sparkafka.connector import client_log
from sparkafka.connector.client_log import RepeatedLines, line_kind
from sparkafka.connector.kafka_admin import LIBRDKAFKA_LOGGER

REFUSED = (
    "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: "
    "Connection refused (after 0ms in state CONNECT)"
)


def client_line(
    text: str = REFUSED,
    *,
    facility: str = "FAIL",
    client: str = "rdkafka#consumer-1",
    level: int = logging.ERROR,
) -> logging.LogRecord:
    """A record as confluent-kafka makes it from a librdkafka log line."""
    return logging.LogRecord(
        "sparkafka.librdkafka", level, __file__, 1, "%s [%s] %s", (facility, client, text), None
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_kind_passes_once_per_window_and_then_says_how_many_were_held_back() -> None:
    clock = FakeClock()
    repeated = RepeatedLines(10.0, clock=clock)
    first = client_line()
    assert repeated.filter(first)
    assert first.getMessage() == f"FAIL [rdkafka#consumer-1] {REFUSED}"
    for step in range(3):
        clock.now += 3.0
        assert not repeated.filter(client_line(client=f"rdkafka#consumer-{step + 2}"))
    clock.now += 1.5  # 10.5 s after the first
    after_window = client_line()
    assert repeated.filter(after_window)
    assert after_window.getMessage().endswith(
        "(after 0ms in state CONNECT) (3 more like it from this process's Kafka clients in the last 10 s)"
    )
    # The next window starts with the record that passed: nothing was held back in it yet.
    clock.now += 2.0
    assert not repeated.filter(client_line())
    clock.now += 10.0
    quiet_again = client_line()
    assert repeated.filter(quiet_again)
    assert "1 more like it" in quiet_again.getMessage()


def test_a_kind_seen_again_after_a_quiet_window_passes_without_a_count() -> None:
    clock = FakeClock()
    repeated = RepeatedLines(10.0, clock=clock)
    assert repeated.filter(client_line())
    clock.now += 60.0
    again = client_line()
    assert repeated.filter(again)
    assert again.getMessage() == f"FAIL [rdkafka#consumer-1] {REFUSED}"


def test_one_failing_address_under_its_connection_names_and_timings_is_one_kind() -> None:
    variants = [
        REFUSED,
        "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection "
        "refused (after 3ms in state CONNECT, 4 identical error(s) suppressed)",
        "[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: Connect to ipv4#127.0.0.1:9092 failed: "
        "Connection refused (after 0ms in state CONNECT)",
        "[thrd:[::1]:9092/bootstrap]: [::1]:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: "
        "Connection refused (after 0ms in state CONNECT)",
    ]
    kinds = {line_kind(client_line(text)) for text in variants}
    assert kinds == {(logging.ERROR, "FAIL", "Connect to ipv4#127.0.0.1:9092 failed: Connection refused")}


@pytest.mark.parametrize(
    "other",
    [
        client_line(REFUSED.replace("Connection refused", "Connection reset by peer")),
        client_line(REFUSED.replace("127.0.0.1:9092 failed", "127.0.0.2:9092 failed")),
        client_line(facility="REQTMOUT"),
        client_line(level=logging.WARNING),
    ],
    ids=["other reason", "other address", "other facility", "other level"],
)
def test_lines_of_another_kind_are_not_held_back(other: logging.LogRecord) -> None:
    repeated = RepeatedLines(10.0, clock=FakeClock())
    assert repeated.filter(client_line())
    assert repeated.filter(other)
    assert not repeated.filter(client_line())


def test_a_message_naming_a_failed_step_keeps_it_in_its_kind() -> None:
    receive = line_kind(client_line("[thrd:b:9092/1]: b:9092/1: Receive failed: Connection reset by peer"))
    send = line_kind(client_line("[thrd:b:9092/1]: b:9092/1: Send failed: Connection reset by peer"))
    assert receive is not None and send is not None and receive != send


def test_records_that_are_not_client_lines_pass_untouched() -> None:
    repeated = RepeatedLines(10.0, clock=FakeClock())
    own = logging.LogRecord(
        "sparkafka.librdkafka",
        logging.WARNING,
        __file__,
        1,
        "attempt %d to %s failed (%s); retrying",
        (1, "list offsets", "timeout"),
        None,
    )
    for _ in range(3):
        assert repeated.filter(own)
    assert own.getMessage() == "attempt 1 to list offsets failed (timeout); retrying"


def test_the_longest_unseen_kind_is_forgotten_beyond_max_kinds() -> None:
    clock = FakeClock()
    repeated = RepeatedLines(10.0, max_kinds=2, clock=clock)
    for reason in ("a", "b", "c"):
        assert repeated.filter(client_line(f"Connect failed: {reason}"))
    # "a" was forgotten, so it passes again within its window; "c" is still remembered.
    assert repeated.filter(client_line("Connect failed: a"))
    assert not repeated.filter(client_line("Connect failed: c"))


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s must be positive, got 0"):
        RepeatedLines(0)


def test_the_clients_logger_has_one_filter_however_often_it_is_installed() -> None:
    client_log.install(LIBRDKAFKA_LOGGER)
    client_log.install(LIBRDKAFKA_LOGGER)
    assert sum(isinstance(f, RepeatedLines) for f in LIBRDKAFKA_LOGGER.filters) == 1


def test_a_real_client_retrying_a_refused_address_logs_the_failure_once() -> None:
    """Two consumers retry an address nobody listens on every 10 ms for 1.5 s, one with a plain logger
    and one with a logger that has the filter: the plain one gets the line many times, the other once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logged: dict[str, list[str]] = {"plain": [], "filtered": []}

    class Keep(logging.Handler):
        def __init__(self, into: list[str]) -> None:
            super().__init__()
            self.into = into

        def emit(self, record: logging.LogRecord) -> None:
            self.into.append(record.getMessage())

    consumers = []
    for name in logged:
        logger = logging.getLogger(f"test.client_log.{name}")
        logger.handlers[:] = [Keep(logged[name])]
        logger.propagate = False
        logger.filters[:] = []
        if name == "filtered":
            client_log.install(logger)
        consumers.append(
            Consumer(
                {
                    "bootstrap.servers": f"127.0.0.1:{port}",
                    "group.id": "test-client-log",
                    "logger": logger,
                    "reconnect.backoff.ms": 10,
                    "reconnect.backoff.max.ms": 10,
                }
            )
        )
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.05)
    for consumer in consumers:
        consumer.close()
    refused = {
        name: [line for line in lines if "Connection refused" in line] for name, lines in logged.items()
    }
    assert len(refused["plain"]) >= 5, refused["plain"]
    assert len(refused["filtered"]) == 1, refused["filtered"]
