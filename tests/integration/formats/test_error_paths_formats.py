"""from_confluent_avro's refusals that come from a real Schema Registry (the embedded broker's), before
any Spark job runs: a subject with no schema to decode into."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.errors import SparkafkaOptionError
from sparkafka.formats.functions import SchemaFetchError, from_confluent_avro
from tests.conftest import FAST_BROKER_ARGS


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("registry") / "data"
    with BrokerProcess(data_dir, schema_registry=True, extra_args=FAST_BROKER_ARGS) as process:
        yield process


def test_a_subject_without_a_schema_is_an_option_error_saying_what_to_do(registry: BrokerProcess) -> None:
    url = registry.schema_registry_url
    with pytest.raises(
        SparkafkaOptionError,
        match=re.escape(
            f"subject 'no-such-topic-value' has no schema in the registry at {url}; register one, "
            "or pass reader_schema="
        ),
    ):
        from_confluent_avro("value", url, subject="no-such-topic-value")


def test_a_registry_that_does_not_answer_is_not_taken_for_a_missing_subject() -> None:
    # The counterpart: only the registry's "not found" is the user's option mistake.
    with pytest.raises(
        SchemaFetchError, match=re.escape("the schema registry at http://127.0.0.1:1 did not answer (")
    ):
        from_confluent_avro("value", "http://127.0.0.1:1", subject="orders-value")
