"""The console tools' error exits that need a cluster to get that far: a line `produce` cannot split
into key and value, with and without a transaction (real embedded broker, tools run in-process)."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from sparkafka.broker.runner import BrokerProcess
from sparkafka.cli.app import app
from tests.integration.kafka_clients import create_topic, read_to_end, values

runner = CliRunner()


def produce(broker: BrokerProcess, topic: str, lines: str, *extra: str) -> Result:
    return runner.invoke(
        app,
        ["produce", topic, "-b", broker.bootstrap_servers, "--key-separator", ":", "--timeout", "10", *extra],
        input=lines,
    )


def test_a_line_without_the_key_separator_stops_produce_after_the_lines_before_it(
    broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    result = produce(broker, topic_name, "k1:first\nk2:second\nno separator here\nk3:never\n")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "sparkafka produce: line 3 has no key separator ':': b'no separator here'; "
        "2 records before it were written"
    )
    written = read_to_end(broker.bootstrap_servers, topic_name)
    assert values(written) == [b"first", b"second"], "what came before the bad line is written, no more"


def test_a_line_without_the_key_separator_aborts_the_whole_transaction(
    broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    result = produce(broker, topic_name, "k1:first\nno separator\n", "--transactional-id", f"tx-{topic_name}")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "sparkafka produce: line 2 has no key separator ':': b'no separator'; "
        f"transaction tx-{topic_name} aborted, no records written"
    )
    assert read_to_end(broker.bootstrap_servers, topic_name) == []
