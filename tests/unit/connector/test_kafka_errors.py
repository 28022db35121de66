"""The connector looks librdkafka's error codes up in one table (sparkafka.connector.kafka_errors):
no other module of it names a code, alone or grouped into a set of its own, where the next code
Kafka adds would be classified in one place and not the other."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

from sparkafka.connector import kafka_errors

CONNECTOR = Path(kafka_errors.__file__).parent


def _kafka_error_attributes(node: ast.AST) -> int:
    return sum(
        isinstance(inner, ast.Attribute)
        and isinstance(inner.value, ast.Name)
        and inner.value.id == "KafkaError"
        for inner in ast.walk(node)
    )


def _code_groups(source: str) -> list[int]:
    """Line numbers of every set, tuple or list literal naming two or more KafkaError codes."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Set | ast.Tuple | ast.List) and _kafka_error_attributes(node) >= 2
    ]


def _outside_the_table(check: Callable[[str], list[int]]) -> list[str]:
    """``module:line`` of every place ``check`` finds in a connector module but the table."""
    return [
        f"{path.relative_to(CONNECTOR)}:{line}"
        for path in sorted(CONNECTOR.rglob("*.py"))
        if path.name != "kafka_errors.py"
        for line in check(path.read_text())
    ]


def test_no_connector_module_but_the_table_groups_error_codes() -> None:
    offences = _outside_the_table(_code_groups)
    assert offences == [], f"error codes grouped outside kafka_errors.py: {offences}"


def _named_codes(source: str) -> list[int]:
    """Line numbers of every KafkaError code named (``KafkaError.X``), alone or not."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "KafkaError"
        and node.attr.lstrip("_").isupper()
    ]


def test_no_connector_module_but_the_table_names_an_error_code() -> None:
    offences = _outside_the_table(_named_codes)
    assert offences == [], f"error codes named outside kafka_errors.py: {offences}"
    assert _named_codes("if code == KafkaError._TIMED_OUT:\n    pass\n") == [1]
    assert _named_codes("error = KafkaError(code, 'reason')\n") == []


def test_the_check_finds_a_group_spelled_inline() -> None:
    assert _code_groups("if code in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):\n    pass\n") == [1]
    assert _code_groups("if code == KafkaError._TIMED_OUT:\n    pass\n") == []


def test_the_classes_that_widen_one_another_do() -> None:
    """A partition gone is also a topic unknown; the admin client's answers add no-entry; a race
    of claimers includes being fenced: each wider class acts on everything the narrower one does."""
    assert kafka_errors.UNKNOWN_TOPIC < kafka_errors.PARTITION_GONE < kafka_errors.UNKNOWN_PARTITION
    assert kafka_errors.FENCED < kafka_errors.TRANSACTION_RACE
    assert kafka_errors.NOT_ANSWERED < kafka_errors.UNAVAILABLE
    assert kafka_errors.LEADER_MOVING | kafka_errors.UNAVAILABLE < kafka_errors.TRANSIENT_WATERMARK
    # A moving leader is worth asking again; a fenced producer never is.
    assert not kafka_errors.FENCED & kafka_errors.TRANSIENT_WATERMARK


def test_code_and_reason_come_from_the_kafka_error_a_kafka_exception_carries() -> None:
    failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer from the broker"))
    assert kafka_errors.error_code(failure) == KafkaError._TIMED_OUT
    assert kafka_errors.error_reason(failure) == "no answer from the broker"
    assert kafka_errors.error_code(ValueError("x")) is None
    assert kafka_errors.error_reason(ValueError("plain")) == "plain"
