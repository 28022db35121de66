"""The driver JVM's collector and compiler choice of sparkafka's own sessions, and whose zygote they use."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from sparkafka.errors import SparkafkaError
from sparkafka.runtime.python_exec import ZYGOTE_ENV, ZYGOTE_OWNER_ENV, launcher_path
from sparkafka.runtime.session import JIT_ENV, driver_java_options, is_local_master, own_zygote
from sparkafka.tools.pipeline_process import quick_start_environment

BASE = "-Dlog4j.configurationFile=x"


@pytest.mark.parametrize("master", ["local", "local[1]", "local[2]", "local[*]", "local[4,3]", " local[2] "])
def test_local_masters(master: str) -> None:
    assert is_local_master(master)


@pytest.mark.parametrize(
    "master", ["yarn", "spark://host:7077", "local-cluster[2,1,1024]", "k8s://h", "local[x]"]
)
def test_cluster_masters(master: str) -> None:
    assert not is_local_master(master)


def test_serial_collector_for_a_local_master_on_two_cores() -> None:
    assert driver_java_options("local[2]", BASE, cores=2, environ={}) == f"{BASE} -XX:+UseSerialGC"
    assert driver_java_options("local[*]", BASE, cores=1, environ={}) == f"{BASE} -XX:+UseSerialGC"


def test_the_jvms_choice_stands_on_more_cores_or_a_cluster() -> None:
    assert driver_java_options("local[2]", BASE, cores=3, environ={}) == BASE
    assert driver_java_options("spark://host:7077", BASE, cores=2, environ={}) == BASE


@pytest.mark.parametrize("variable", ["JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS"])
def test_a_collector_chosen_in_the_environment_is_not_contradicted(variable: str) -> None:
    environ = {variable: "-Xss4m -XX:+UseG1GC"}
    assert driver_java_options("local[2]", BASE, cores=2, environ=environ) == BASE


def test_a_collector_in_the_base_options_is_kept() -> None:
    base = f"{BASE} -XX:+UseParallelGC"
    assert driver_java_options("local[2]", base, cores=2, environ={}) == base


def test_the_quick_compiler_mode_stops_at_c1_on_any_master() -> None:
    quick = {JIT_ENV: "quick"}
    assert driver_java_options("local[2]", BASE, cores=2, environ=quick) == (
        f"{BASE} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
    assert driver_java_options("spark://host:7077", BASE, cores=8, environ={JIT_ENV: " Quick "}) == (
        f"{BASE} -XX:TieredStopAtLevel=1"
    )


def test_the_full_compiler_mode_is_the_jvms_own() -> None:
    assert driver_java_options("local[2]", BASE, cores=4, environ={JIT_ENV: "full"}) == BASE
    assert driver_java_options("local[2]", BASE, cores=4, environ={}) == BASE


@pytest.mark.parametrize(
    "flag", ["-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation", "-XX:+TieredCompilation"]
)
def test_a_compiler_chosen_elsewhere_is_not_contradicted(flag: str) -> None:
    quick = {JIT_ENV: "quick"}
    assert driver_java_options("local[2]", f"{BASE} {flag}", cores=4, environ=quick) == f"{BASE} {flag}"
    assert (
        driver_java_options("local[2]", BASE, cores=4, environ={**quick, "JAVA_TOOL_OPTIONS": flag}) == BASE
    )


def test_an_unknown_compiler_mode_is_refused_naming_the_variable_and_its_values() -> None:
    with pytest.raises(SparkafkaError, match=r"SPARKAFKA_DRIVER_JIT='fast' .* 'full' or 'quick'"):
        driver_java_options("local[2]", BASE, cores=2, environ={JIT_ENV: "fast"})


def _stop_zygote(socket_path: str) -> None:
    owner = Path(socket_path).parent / "owner"
    with contextlib.suppress(OSError, ValueError, ProcessLookupError):
        os.kill(int(owner.read_text()), signal.SIGKILL)


def test_a_session_never_uses_the_zygote_of_the_program_that_started_its_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipeline started from a program with a session inherits that program's zygote in its
    environment: its own session starts a zygote of its own, or Spark's processes of the pipeline
    would be children of the other program's, and end with it."""
    launcher = launcher_path()
    assert launcher is not None
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    monkeypatch.setenv(ZYGOTE_ENV, "/tmp/sparkafka-zygote-of-another-program/zygote.sock")
    monkeypatch.setenv(ZYGOTE_OWNER_ENV, "1")
    own_zygote(launcher)
    socket_path = os.environ[ZYGOTE_ENV]
    try:
        assert "another-program" not in socket_path
        assert os.environ[ZYGOTE_OWNER_ENV] == str(os.getpid())
        own_zygote(launcher)  # this process's own: kept
        assert os.environ[ZYGOTE_ENV] == socket_path
    finally:
        _stop_zygote(socket_path)


def test_an_inherited_zygote_is_dropped_where_no_zygote_serves_and_an_empty_setting_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    monkeypatch.setenv(ZYGOTE_ENV, "/tmp/sparkafka-zygote-of-another-program/zygote.sock")
    monkeypatch.setenv(ZYGOTE_OWNER_ENV, "1")
    own_zygote(sys.executable)  # a cluster's master: Spark's processes run the plain interpreter
    assert ZYGOTE_ENV not in os.environ and ZYGOTE_OWNER_ENV not in os.environ
    monkeypatch.setenv(ZYGOTE_ENV, "")
    launcher = launcher_path()
    assert launcher is not None
    own_zygote(launcher)
    assert os.environ[ZYGOTE_ENV] == "" and ZYGOTE_OWNER_ENV not in os.environ


def test_short_lived_pipelines_ask_for_the_quick_mode_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(JIT_ENV, raising=False)
    assert quick_start_environment() == {JIT_ENV: "quick"}
    monkeypatch.setenv(JIT_ENV, "full")
    assert quick_start_environment() == {JIT_ENV: "full"}
