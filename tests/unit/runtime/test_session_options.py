"""The driver JVM's collector choice of sparkafka's own sessions."""

from __future__ import annotations

import pytest

from sparkafka.runtime.session import driver_java_options, is_local_master

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
