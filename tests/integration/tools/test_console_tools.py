"""The console tools (`sparkafka produce|consume|topics|groups|transactions`) as a user runs them.

Each command runs as a child process (`python -m sparkafka ...`) against a real `sparkafka broker`;
records the tools must find are written with confluent-kafka, as any other client would.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from sparkafka.broker.runner import BrokerProcess
from sparkafka.cli.console import ConsoleError, iso_timestamp, open_transactions, render_bytes
from tests.integration.conftest import Kafka
from tests.integration.kafka_clients import create_topic, read_all, transactional_producer, values


@pytest.fixture(scope="module")
def broker(kafka: Kafka) -> Kafka:
    """The module's cluster: the embedded broker, then Apache Kafka (``kafka`` in conftest)."""
    return kafka


RECORD_LINE = re.compile(
    r"partition=(?P<partition>\d+) offset=(?P<offset>\d+) "
    r"timestamp=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \((?P<ms>\d+)\) key=(?P<key>\S*) value=(?P<value>.*)"
)


def sparkafka(
    *args: str, stdin: str | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkafka", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sparkafka", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_together(commands: Sequence[Sequence[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Run commands at the same time (each waits on its own timeout) and collect their results."""
    processes = [start(*command) for command in commands]
    try:
        results = []
        for command, process in zip(commands, processes, strict=True):
            stdout, stderr = process.communicate(timeout=60)
            results.append(subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr))
        return results
    finally:
        for process in processes:
            if process.poll() is None:  # only after a timeout: do not leave it behind
                process.kill()
                process.wait()


def records(stdout: str) -> list[dict[str, str]]:
    found = []
    for line in stdout.splitlines():
        match = RECORD_LINE.search(line)
        assert match, f"not a record line: {line!r}"
        found.append(match.groupdict())
    return found


def test_produce_keyed_lines_from_stdin_then_consume_them(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, partitions=2)

    produced = sparkafka(
        "produce", topic_name, "-b", bootstrap, "--key-separator", ":", "--partition", "1",
        stdin="k1:aa,bb\nk2:cc,dd:ee\n",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout.strip() == f"wrote 2 records to {topic_name}"
    written = read_all(bootstrap, topic_name, partitions=2, expect=2)
    assert [(m.partition(), m.key(), m.value()) for m in written] == [
        (1, b"k1", b"aa,bb"),
        (1, b"k2", b"cc,dd:ee"),  # split at the first separator only
    ]

    consumed = sparkafka(
        "consume", topic_name, "-b", bootstrap, "--from-beginning", "--max-messages", "2", "--print-time"
    )
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.splitlines()
    assert all(line.startswith("received=20") for line in lines)
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in records(consumed.stdout)] == [
        ("1", "0", "k1", "aa,bb"),
        ("1", "1", "k2", "cc,dd:ee"),
    ]
    assert int(records(consumed.stdout)[0]["ms"]) == written[0].timestamp()[1]
    assert "consumed 2 records" in consumed.stderr


def test_read_committed_hides_an_aborted_transaction_read_uncommitted_shows_it(
    broker: Kafka, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    sender = transactional_producer(bootstrap, f"tx-{topic_name}")
    sender.init_transactions(30)
    for value, commit in ((b"EVENT(aa,bb)", True), (b"EVENT(xx,yy)", False), (b"EVENT(cc,dd)", True)):
        sender.begin_transaction()
        sender.produce(topic_name, value=value)
        sender.flush(10)
        sender.commit_transaction(30) if commit else sender.abort_transaction(30)

    # --max-messages ends each reader as soon as it has what it should see; --timeout-ms is a safety net.
    base = ["consume", topic_name, "-b", bootstrap, "--from-beginning", "--timeout-ms", "10000"]
    committed, uncommitted = run_together(
        [
            [*base, "--isolation-level", "read_committed", "--max-messages", "2"],
            [*base, "--isolation-level", "read_uncommitted", "--max-messages", "3"],
        ]
    )
    assert committed.returncode == 0 and uncommitted.returncode == 0, committed.stderr + uncommitted.stderr
    assert [(r["offset"], r["key"], r["value"]) for r in records(committed.stdout)] == [
        ("0", "null", "EVENT(aa,bb)"),
        ("4", "null", "EVENT(cc,dd)"),
    ]
    assert [(r["offset"], r["value"]) for r in records(uncommitted.stdout)] == [
        ("0", "EVENT(aa,bb)"),
        ("2", "EVENT(xx,yy)"),  # offsets 1, 3 and 5 are the COMMIT, ABORT and COMMIT markers
        ("4", "EVENT(cc,dd)"),
    ]


def test_produce_in_a_transaction_commits_at_end_of_input_and_aborts_on_ctrl_c(
    broker: Kafka, topic_name: str
) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    committed = sparkafka(
        "produce", topic_name, "-b", bootstrap, "--transactional-id", f"tx-{topic_name}", stdin="one\ntwo\n"
    )
    assert committed.returncode == 0, committed.stderr
    assert (
        committed.stdout.strip()
        == f"wrote 2 records to {topic_name} in transaction tx-{topic_name} (committed)"
    )

    interactive = start("produce", topic_name, "-b", bootstrap, "--transactional-id", f"tx-{topic_name}",
                   stdin=subprocess.PIPE)  # fmt: skip
    assert interactive.stdin is not None
    interactive.stdin.write("typed but interrupted\n")
    interactive.stdin.flush()
    read_all(bootstrap, topic_name, isolation="read_uncommitted", expect=3)  # the record reached the log
    interactive.send_signal(signal.SIGINT)
    _, stderr = interactive.communicate(timeout=30)
    assert interactive.returncode == 130
    assert f"transaction tx-{topic_name} aborted" in stderr

    assert values(read_all(bootstrap, topic_name, expect=2, timeout_s=3)) == [b"one", b"two"]


def test_topics_create_list_describe_delete(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    created = sparkafka(
        "topics", "create", topic_name, "-b", bootstrap, "-p", "3", "-c", "retention.ms=3600000"
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"created topic {topic_name} with 3 partitions"
    assert (
        sparkafka("produce", topic_name, "-b", bootstrap, "--partition", "2", stdin="a\nb\n").returncode == 0
    )

    again, if_not_exists, listed, described, all_configs = run_together(
        [
            ["topics", "create", topic_name, "-b", bootstrap],
            ["topics", "create", topic_name, "-b", bootstrap, "--if-not-exists"],
            ["topics", "list", "-b", bootstrap],
            ["topics", "describe", topic_name, "-b", bootstrap],
            ["topics", "describe", topic_name, "-b", bootstrap, "--all-configs"],
        ]
    )
    assert again.returncode == 1 and f"topic '{topic_name}' already exists" in again.stderr
    assert if_not_exists.returncode == 0, if_not_exists.stderr
    assert topic_name in listed.stdout.splitlines()
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == f"topic={topic_name} partitions=3 replication-factor=1"
    assert lines[1].startswith("configs: retention.ms=3600000 ")
    assert lines[2].split() == [
        "PARTITION", "LEADER", "REPLICAS", "ISR", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET"
    ]  # fmt: skip
    rows = [line.split() for line in lines[3:]]
    assert [(row[0], row[4], row[5], row[6]) for row in rows] == [
        ("0", "0", "0", "0"),
        ("1", "0", "0", "0"),
        ("2", "0", "2", "2"),
    ]
    assert re.search(r"retention\.ms\s+3600000\s+DYNAMIC_TOPIC_CONFIG", all_configs.stdout)
    assert re.search(r"cleanup\.policy\s+delete\s+DEFAULT_CONFIG", all_configs.stdout)

    deleted = sparkafka("topics", "delete", topic_name, "-b", bootstrap)
    assert deleted.returncode == 0 and deleted.stdout.strip() == f"deleted topic {topic_name}"
    assert topic_name not in sparkafka("topics", "list", "-b", bootstrap).stdout.splitlines()


def test_topics_alter_sets_and_resets_configs(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    altered = sparkafka(
        "topics",
        "alter",
        topic_name,
        "-b",
        bootstrap,
        "-c",
        "retention.ms=3600000",
        "-c",
        "max.message.bytes=2000",
    )
    assert altered.returncode == 0, altered.stderr
    assert (
        altered.stdout.strip()
        == f"altered topic {topic_name}: set retention.ms=3600000; set max.message.bytes=2000"
    )
    dry, reset, bad_value, nothing, both, missing = run_together(
        [
            ["topics", "alter", topic_name, "-b", bootstrap, "-c", "retention.ms=1", "--validate-only"],
            ["topics", "alter", topic_name, "-b", bootstrap, "--delete-config", "max.message.bytes"],
            ["topics", "alter", topic_name, "-b", bootstrap, "-c", "retention.ms=soon"],
            ["topics", "alter", topic_name, "-b", bootstrap],
            ["topics", "alter", topic_name, "-b", bootstrap, "-c", "retention.ms=1", "-d", "retention.ms"],
            ["topics", "alter", f"{topic_name}-none", "-b", bootstrap, "-c", "retention.ms=1"],
        ]
    )
    assert dry.returncode == 0 and dry.stdout.startswith(
        f"would alter topic {topic_name}: set retention.ms=1"
    )
    assert reset.returncode == 0 and reset.stdout.strip().endswith("reset max.message.bytes")
    assert (
        bad_value.returncode == 1
        and "(INVALID_CONFIG)" in bad_value.stderr
        and "retention.ms" in bad_value.stderr
    )
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    assert both.returncode == 2 and "given to both --config and --delete-config" in both.stderr
    assert missing.returncode == 1 and f"topic '{topic_name}-none' does not exist" in missing.stderr
    described = sparkafka("topics", "describe", topic_name, "-b", bootstrap).stdout.splitlines()
    assert described[1].startswith(
        "configs: retention.ms=3600000 "
    )  # the dry run and the refusal changed nothing


def test_groups_describe_shows_committed_offset_end_offset_and_lag(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    group = f"group-{topic_name}"
    create_topic(bootstrap, topic_name)
    assert sparkafka("produce", topic_name, "-b", bootstrap, stdin="1\n2\n3\n4\n5\n").returncode == 0

    consumed = sparkafka(
        "consume", topic_name, "-b", bootstrap, "--group", group, "--from-beginning", "--max-messages", "2"
    )
    assert consumed.returncode == 0, consumed.stderr
    assert [r["value"] for r in records(consumed.stdout)] == ["1", "2"]

    listed = sparkafka("groups", "list", "-b", bootstrap)
    assert re.search(rf"^{group}\s+Empty$", listed.stdout, re.MULTILINE), listed.stdout
    described = sparkafka("groups", "describe", group, "-b", bootstrap)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == f"group={group} state=Empty assignor=- members=0"
    assert lines[1].split()[:5] == ["TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET", "LAG"]
    assert lines[2].split()[:6] == [topic_name, "0", "2", "5", "3", "5"]

    # The group resumes where it committed; with nothing left, lag is 0.
    rest = sparkafka("consume", topic_name, "-b", bootstrap, "--group", group, "--max-messages", "3")
    assert [r["value"] for r in records(rest.stdout)] == ["3", "4", "5"]
    after = sparkafka("groups", "describe", group, "-b", bootstrap).stdout.splitlines()
    assert after[2].split()[:5] == [topic_name, "0", "5", "5", "0"]

    missing = sparkafka("groups", "describe", f"no-such-{group}", "-b", bootstrap)
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"sparkafka groups describe: consumer group 'no-such-{group}' does not exist"
    )


def test_transactions_list_shows_an_open_transaction_until_it_commits(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    transactional_id = f"tx-{topic_name}"
    create_topic(bootstrap, topic_name)
    assert sparkafka("produce", topic_name, "-b", bootstrap, stdin="before\n").returncode == 0
    sender = transactional_producer(bootstrap, transactional_id)
    sender.init_transactions(30)
    sender.begin_transaction()
    sender.produce(topic_name, value=b"pending")
    sender.flush(10)

    listed, committed_reader, described = run_together(
        [
            ["transactions", "list", "-b", bootstrap],
            ["consume", topic_name, "-b", bootstrap, "--from-beginning", "--timeout-ms", "2500"],
            ["topics", "describe", topic_name, "-b", bootstrap],
        ]
    )
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(transactional_id))
    assert re.match(
        rf"{transactional_id}\s+Ongoing\s+\d+\s+0\s+\d+\.\ds\s+1m00s\s+{topic_name}-0 \(from offset 1\)$", row
    ), row
    # What the open transaction holds back: read_committed readers stop at its first offset.
    assert [r["value"] for r in records(committed_reader.stdout)] == ["before"]
    assert "partition 0: read_committed readers wait at offset 1 for an open transaction" in described.stdout

    sender.commit_transaction(30)
    after = sparkafka("transactions", "list", "-b", bootstrap)
    assert after.returncode == 0, after.stderr
    assert transactional_id not in after.stdout
    everything = sparkafka("transactions", "list", "-b", bootstrap, "--all")
    assert re.search(rf"^{transactional_id}\s+CompleteCommit\s", everything.stdout, re.MULTILINE)


def test_consume_stops_cleanly_on_sigterm(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    assert sparkafka("produce", topic_name, "-b", bootstrap, stdin="first\n").returncode == 0
    reader = start("consume", topic_name, "-b", bootstrap, "--from-beginning")
    assert reader.stdout is not None
    assert "value=first" in reader.stdout.readline()  # then it waits for more, until told to stop
    reader.send_signal(signal.SIGTERM)
    stdout, stderr = reader.communicate(timeout=30)
    assert reader.returncode == 0, stderr
    assert stdout == "" and stderr.strip() == "consumed 1 record"


def test_unreachable_cluster_is_one_line_and_exit_1_within_the_timeout() -> None:
    unreachable = ["-b", "127.0.0.1:1"]
    commands = [
        ["topics", "list", *unreachable],  # the default --timeout of 10 s
        ["topics", "describe", "t", *unreachable, "--timeout", "2"],
        ["consume", "t", *unreachable, "--timeout", "2"],
        ["produce", "t", *unreachable, "--timeout", "2"],
        ["groups", "list", *unreachable, "--timeout", "2"],
        ["transactions", "list", *unreachable, "--timeout", "2"],
    ]
    began = time.monotonic()
    results = run_together(commands)
    assert time.monotonic() - began < 20
    for command, result in zip(commands, results, strict=True):
        name = " ".join(command[:2]) if command[0] in ("topics", "groups", "transactions") else command[0]
        timeout = "10" if command[0] == "topics" and command[1] == "list" else "2"
        assert result.returncode == 1, (command, result.stderr)
        assert result.stderr.startswith(
            f"sparkafka {name}: cannot reach Kafka at 127.0.0.1:1 within {timeout} s ("
        ), result.stderr
        assert "refused" in result.stderr.lower() and len(result.stderr.splitlines()) == 1, result.stderr


def test_unknown_topics_and_partitions_are_clear_errors(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name)
    missing = f"missing-{topic_name}"
    results = run_together(
        [
            ["produce", missing, "-b", bootstrap],
            ["consume", missing, "-b", bootstrap],
            ["topics", "describe", missing, "-b", bootstrap],
            ["topics", "delete", missing, "-b", bootstrap],
            ["produce", topic_name, "-b", bootstrap, "--partition", "5"],
        ]
    )
    assert [r.returncode for r in results] == [1, 1, 1, 1, 1]
    hint = f"topic '{missing}' does not exist (create it with: sparkafka topics create {missing})"
    assert [r.stderr.strip() for r in results] == [
        f"sparkafka produce: {hint}",
        f"sparkafka consume: {hint}",
        f"sparkafka topics describe: {hint}",
        f"sparkafka topics delete: topic '{missing}' does not exist",
        f"sparkafka produce: topic '{topic_name}' has no partition 5; its partitions are 0..0",
    ]
    # The tools never auto-create what they were asked about.
    assert missing not in sparkafka("topics", "list", "-b", bootstrap).stdout


def test_bad_arguments_print_usage_with_an_example(broker: Kafka, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    no_equals, unknown_config, no_topic, group_and_partition, no_separator = run_together(
        [
            ["topics", "create", topic_name, "-b", bootstrap, "--config", "retention.ms"],
            ["topics", "create", topic_name, "-b", bootstrap, "--config", "retention.mss=1"],
            ["consume"],
            ["consume", topic_name, "--group", "g", "--partition", "0"],
            ["produce", topic_name, "--key-separator", ""],
        ]
    )
    assert no_equals.returncode == 2
    assert "Usage: " in no_equals.stderr
    assert (
        "Example: sparkafka topics create out --partitions 3 --config retention.ms=86400000"
        in no_equals.stderr
    )
    assert "--config 'retention.ms' is not KEY=VALUE" in no_equals.stderr

    assert unknown_config.returncode == 1  # the cluster's verdict, passed on in one line
    assert unknown_config.stderr.startswith(
        f"sparkafka topics create: creating topic '{topic_name}' failed: "
    )
    assert "retention.mss" in unknown_config.stderr and "(INVALID_CONFIG)" in unknown_config.stderr

    for result in (no_topic, group_and_partition, no_separator):
        assert result.returncode == 2, result.stderr
        assert "Example: " in result.stderr and "Traceback" not in result.stderr
    assert "Missing argument 'TOPIC'" in no_topic.stderr


def test_client_properties_reach_both_client_libraries(tmp_path: Path) -> None:
    """-X carries SASL settings to librdkafka and, translated, to kafka-python (`transactions list`)."""
    with BrokerProcess(tmp_path / "data", extra_args=["--sasl-plain-user", "alice:secret"]) as sasl_broker:
        bootstrap = sasl_broker.bootstrap_servers
        login = [
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanism=PLAIN",
            "-X",
            "sasl.username=alice",
        ]
        created, listed, wrong_password, wrong_password_transactions = run_together(
            [
                ["topics", "create", "secured", "-b", bootstrap, *login, "-X", "sasl.password=secret"],
                ["transactions", "list", "-b", bootstrap, *login, "-X", "sasl.password=secret"],
                ["topics", "list", "-b", bootstrap, *login, "-X", "sasl.password=wrong", "--timeout", "2"],
                [
                    "transactions",
                    "list",
                    "-b",
                    bootstrap,
                    *login,
                    "-X",
                    "sasl.password=wrong",
                    "--timeout",
                    "2",
                ],
            ]
        )
    assert created.returncode == 0, created.stderr
    assert listed.returncode == 0 and listed.stdout.strip() == "no open transactions", listed.stderr
    for result in (wrong_password, wrong_password_transactions):
        assert result.returncode == 1
        assert f"authentication with Kafka at {bootstrap} failed: " in result.stderr
        assert "Invalid username or password" in result.stderr


def test_records_print_on_one_line_whatever_their_bytes() -> None:
    assert iso_timestamp(1795255200123) == "2026-11-21T10:00:00.123Z"
    assert render_bytes(None) == "null"
    assert render_bytes(b"") == ""
    assert render_bytes("EVENT(é)".encode()) == "EVENT(é)"
    assert render_bytes(b"a\nb\tc\x00\xff") == "a\\nb\\tc\\x00\\xff"


def test_clusters_without_list_transactions_are_told_so() -> None:
    from kafka.errors import IncompatibleBrokerVersion

    class OldClusterAdmin:
        def list_transactions(self) -> None:
            raise IncompatibleBrokerVersion(
                "Kafka broker does not support the 'ListTransactions' Kafka protocol."
            )

    with pytest.raises(ConsoleError, match=r"does not support listing transactions .*Apache Kafka 3\.0"):
        open_transactions(OldClusterAdmin(), include_completed=False)


def test_kafkas_own_spelling_and_a_client_properties_file_work_as_in_kafkas_tools(tmp_path: Path) -> None:
    """A Kafka user's first commands: --bootstrap-server, and --command-config with the Java client's
    properties file (sasl.jaas.config and all), for librdkafka and, translated, for kafka-python;
    -X overrides the file, as a command-line property does."""
    properties = tmp_path / "client.properties"
    properties.write_text(
        "# as for kafka-topics.sh --command-config\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="alice" password="secret";\n'
    )
    with BrokerProcess(tmp_path / "data", extra_args=["--sasl-plain-user", "alice:secret"]) as sasl_broker:
        bootstrap = sasl_broker.bootstrap_servers
        file = ["--bootstrap-server", bootstrap, "--command-config", str(properties)]
        created, listed, overridden = run_together(
            [
                ["topics", "create", "secured", *file],
                ["transactions", "list", *file],
                ["topics", "list", *file, "-X", "sasl.password=wrong", "--timeout", "2"],
            ]
        )
        described = run_together([["topics", "list", *file]])[0]
    assert created.returncode == 0, created.stderr
    assert listed.returncode == 0 and listed.stdout.strip() == "no open transactions", listed.stderr
    assert "secured" in described.stdout.split(), described.stderr
    assert overridden.returncode == 1
    assert "Invalid username or password" in overridden.stderr


def test_a_client_properties_file_librdkafka_cannot_follow_is_refused_naming_the_property(
    tmp_path: Path,
) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n")
    refused = run_together([["topics", "list", "--command-config", str(properties), "--timeout", "1"]])[0]
    assert refused.returncode == 2
    assert "ssl.truststore.location is a JKS store" in refused.stderr
    assert "keytool -exportcert -rfc -keystore /etc/kafka/truststore.jks" in refused.stderr
    missing = run_together([["topics", "list", "--command-config", str(tmp_path / "none.properties")]])[0]
    assert missing.returncode == 2 and "cannot read it (No such file or directory)" in missing.stderr
