"""The command line's error exits that need no running cluster: bad parameters of `sparkafka broker`,
`dump-log`, `run`, `verify`, `checkpoint` and the console tools, each with its exit status and the
message it prints (usage errors exit 2, refusals of what the command was given exit 1)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from sparkafka.broker.sasl import SASL_USERS_ENV
from sparkafka.cli.app import app

runner = CliRunner()
SPARKAFKA = [sys.executable, "-m", "sparkafka"]


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), env=env)


def broker_args(tmp_path: Path, *extra: str) -> list[str]:
    # A free port and a scratch directory: should a check ever let the command through, the broker
    # it starts stays out of the way (and pytest-timeout ends it).
    return ["broker", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"), *extra]


def assert_usage_error(result: Result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Error: Invalid value: " in result.stderr
    assert message in result.stderr, result.stderr


# -- sparkafka broker -------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", ":9092", "127.0.0.1:", "127.0.0.1:-1"])
def test_broker_refuses_a_listen_address_that_is_not_host_port(tmp_path: Path, listen: str) -> None:
    result = invoke(*broker_args(tmp_path), "--listen", listen)
    assert_usage_error(
        result, f"{listen!r} is not HOST:PORT (for example 127.0.0.1:9092, or port 0 for any free port)"
    )


def test_broker_refuses_a_schema_registry_address_that_is_not_host_port(tmp_path: Path) -> None:
    result = invoke(*broker_args(tmp_path, "--schema-registry", "localhost"))
    assert_usage_error(result, "'localhost' is not HOST:PORT (for example 127.0.0.1:9092")


def test_broker_refuses_an_unknown_log_level(tmp_path: Path) -> None:
    result = invoke(*broker_args(tmp_path, "--log-level", "LOUD"))
    assert_usage_error(result, "unknown log level 'LOUD'; use DEBUG, INFO, WARNING or ERROR")


def test_broker_refuses_a_request_queue_smaller_than_one_request(tmp_path: Path) -> None:
    result = invoke(
        *broker_args(tmp_path, "--socket-request-max-bytes", "1000", "--queued-max-request-bytes", "999")
    )
    assert_usage_error(
        result,
        "queued.max.request.bytes (--queued-max-request-bytes) must be larger or equal to "
        "socket.request.max.bytes (1000)",
    )


def test_broker_refuses_zero_connections(tmp_path: Path) -> None:
    result = invoke(*broker_args(tmp_path, "--max-connections", "0"))
    assert_usage_error(result, "max.connections (--max-connections) must be at least 1, got 0")


def test_broker_tls_listener_needs_a_certificate(tmp_path: Path) -> None:
    result = invoke(*broker_args(tmp_path, "--ssl-listen", "127.0.0.1:0"))
    assert_usage_error(
        result, "--ssl-listen needs --ssl-certfile (and --ssl-keyfile unless the key is in it)"
    )


@pytest.mark.parametrize(
    "option",
    [
        ("--ssl-certfile", "broker.pem"),
        ("--ssl-keyfile", "broker.key"),
        ("--ssl-cafile", "ca.pem"),
        ("--ssl-advertised-host", "kafka.example"),
        ("--ssl-client-auth", "required"),
    ],
)
def test_broker_tls_options_without_a_tls_listener_are_refused(
    tmp_path: Path, option: tuple[str, str]
) -> None:
    result = invoke(*broker_args(tmp_path, *option))
    assert_usage_error(result, "the --ssl-* options configure the TLS listener: add --ssl-listen HOST:PORT")


def test_broker_tls_listener_with_a_missing_certificate_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    result = invoke(*broker_args(tmp_path, "--ssl-listen", "127.0.0.1:0", "--ssl-certfile", str(missing)))
    assert result.exit_code == 2, result.output
    assert f"sparkafka broker: --ssl-certfile {missing}: no such file" in result.stderr


def test_broker_refuses_a_sasl_users_file_others_can_read(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("alice:pw-in-file\n")
    users.chmod(0o644)
    result = invoke(*broker_args(tmp_path, "--sasl-users-file", str(users)))
    assert result.exit_code == 2, result.output
    assert "sparkafka broker: permissions 0644 for the SASL users file" in result.stderr
    assert "are too open" in result.stderr
    assert "pw-in-file" not in result.output


def test_broker_refuses_a_sasl_user_given_on_the_command_line_and_in_the_environment(tmp_path: Path) -> None:
    result = invoke(
        *broker_args(tmp_path, "--sasl-plain-user", "alice:pw-first"),
        env={SASL_USERS_ENV: "alice:pw-second\n"},
    )
    assert result.exit_code == 2, result.output
    assert "sparkafka broker: SASL user 'alice' is given twice" in result.stderr
    assert "pw-" not in result.output, "passwords never reach the terminal"


def test_broker_refuses_a_malformed_line_of_the_sasl_users_environment_variable(tmp_path: Path) -> None:
    result = invoke(*broker_args(tmp_path), env={SASL_USERS_ENV: "bob\n"})
    assert result.exit_code == 2, result.output
    assert (
        f"sparkafka broker: ${SASL_USERS_ENV}, line 1: expected USER:PASSWORD, found no ':'" in result.stderr
    )


def test_broker_on_a_port_in_use_exits_1_with_one_line(tmp_path: Path) -> None:
    # A child process: the broker binds, fails and exits as it does for a user, not inside pytest.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SPARKAFKA, "broker", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sparkafka broker: " in done.stderr
    assert f"error while attempting to bind on address ('127.0.0.1', {port}): address already in use" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


# -- sparkafka dump-log -----------------------------------------------------------------------------


def test_dump_log_of_a_missing_data_directory_exits_1(tmp_path: Path) -> None:
    result = invoke("dump-log", "--data-dir", str(tmp_path / "nowhere"), "--topic", "in")
    assert result.exit_code == 1, result.output
    assert f"data directory {tmp_path / 'nowhere'} does not exist (or is not a directory)" in result.stderr


def test_dump_log_of_a_topic_without_a_log_exits_1(tmp_path: Path) -> None:
    result = invoke("dump-log", "--data-dir", str(tmp_path), "--topic", "in", "--partition", "3")
    assert result.exit_code == 1, result.output
    assert f"no log for topic 'in' partition 3 in {tmp_path}" in result.stderr


# -- sparkafka checkpoint ---------------------------------------------------------------------------


def test_checkpoint_rewrite_of_a_version_2_offsets_log_exits_1_and_changes_nothing(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text('{"id":"5f0c"}')
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    offsets = "\n".join(["v2", "{}", '0:{"in":{"0":5},"sparkafka:split":{"calculator":2}}'])
    (checkpoint / "offsets" / "0").write_text(offsets)
    result = invoke("checkpoint", "to-spark-kafka", str(checkpoint), "--backup", str(tmp_path / "backup"))
    assert result.exit_code == 1, result.output
    assert "sparkafka checkpoint to-spark-kafka: " in result.stderr
    assert "is an offsets file of version '2'; this command rewrites version 1 only" in result.stderr
    assert (checkpoint / "offsets" / "0").read_text() == offsets
    assert not (tmp_path / "backup").exists()


# -- sparkafka run ----------------------------------------------------------------------------------


RUN = ["run", "--bootstrap-servers", "127.0.0.1:1", "--sink-topic", "out"]


def test_run_needs_exactly_one_way_of_naming_its_input(tmp_path: Path) -> None:
    checkpoint = ["--checkpoint", str(tmp_path / "checkpoint")]
    for selection in ([], ["--source-topic", "in", "--source-pattern", "in.*"]):
        result = invoke(*RUN, *checkpoint, *selection)
        assert_usage_error(
            result, "give the input as --source-topic (repeatable) or --source-pattern, exactly one of them"
        )


def test_run_refuses_both_sql_and_a_transform(tmp_path: Path) -> None:
    result = invoke(
        *RUN,
        *("--source-topic", "in", "--checkpoint", str(tmp_path / "checkpoint")),
        *("--sql", "SELECT value FROM input", "--transform", "jobs:enrich"),
    )
    assert_usage_error(result, "give --sql or --transform, not both")


def test_run_refuses_an_unknown_output_mode(tmp_path: Path) -> None:
    result = invoke(
        *RUN, "--source-topic", "in", "--checkpoint", str(tmp_path / "checkpoint"), "--output-mode", "upsert"
    )
    assert_usage_error(result, "output mode must be append, update or complete, got 'upsert'")


def test_run_refuses_a_trigger_that_is_not_a_duration(tmp_path: Path) -> None:
    result = invoke(
        *RUN, "--source-topic", "in", "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", "often"
    )
    assert_usage_error(result, "option '--trigger' must be a duration")


# -- sparkafka verify -------------------------------------------------------------------------------


def test_verify_cannot_kill_the_broker_of_an_existing_cluster() -> None:
    result = invoke("verify", "--kill-broker", "--bootstrap-servers", "127.0.0.1:1")
    assert result.exit_code == 1, result.output
    assert (
        "sparkafka verify: --kill-broker kills the embedded broker; "
        "it cannot be used with --bootstrap-servers" in result.stderr
    )


# -- console tools ----------------------------------------------------------------------------------


def test_consume_refuses_a_partition_together_with_a_group() -> None:
    result = invoke("consume", "in", "--group", "readers", "--partition", "0", "-b", "127.0.0.1:1")
    assert_usage_error(result, "--partition reads without a group; it cannot be combined with --group")
    assert "Example: sparkafka consume out" in result.stderr


@pytest.mark.parametrize(
    ("command", "example"),
    [
        (["topics", "create", "out"], "retention.ms=86400000"),
        (["topics", "alter", "out"], "retention.ms=3600000"),
    ],
)
def test_topic_configs_that_are_not_key_value_are_refused_with_an_example(
    command: list[str], example: str
) -> None:
    result = invoke(*command, "--config", "retention.ms", "-b", "127.0.0.1:1")
    assert_usage_error(result, f"--config 'retention.ms' is not KEY=VALUE (for example --config {example})")


@pytest.mark.parametrize(
    "command",
    [["produce", "in"], ["consume", "in"], ["topics", "list"], ["groups", "list"], ["transactions", "list"]],
)
def test_a_client_property_that_is_not_key_value_is_a_usage_error(command: list[str]) -> None:
    # Refused before any connection: the address is one nothing listens on.
    result = invoke(*command, "-X", "security.protocol", "-b", "127.0.0.1:1", "--timeout", "1")
    assert_usage_error(result, "--client-property 'security.protocol' is not KEY=VALUE")
