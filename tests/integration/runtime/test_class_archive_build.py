"""The driver JVM's class archive built for real (sparkafka.runtime.class_archive): the JVM writes it,
a later sparkafka session maps it, and a build that cannot finish keeps nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkafka.runtime import class_archive
from tests.integration.apache_kafka import NEWEST, ApacheKafka, class_archive_of, require_apache_kafka

SESSION = """
from sparkafka.runtime.session import spark_session
spark = spark_session("class-archive-check", master="local[1]")
assert spark.range(10).count() == 10
spark.stop()
"""


def test_a_built_archive_is_mapped_by_the_next_session(tmp_path: Path) -> None:
    environ = {**os.environ, class_archive.CACHE_DIR_ENV: str(tmp_path / "cache")}
    environ.pop(class_archive.SWITCH_ENV, None)
    archive = class_archive.build(environ)

    assert archive == class_archive.archive_path(environ)
    assert json.loads(Path(str(archive) + ".json").read_text()) == {"size": archive.stat().st_size}
    assert archive.stat().st_size > 10_000_000
    kept = sorted(path.name for path in archive.parent.iterdir() if not path.name.startswith("."))
    assert kept == [archive.name, archive.name + ".json"]

    # Every JVM of the session logs where each class came from (the launcher's JVM too: one file each).
    logs = tmp_path / "class-load"
    logs.mkdir()
    java_options = f"{environ.get('JDK_JAVA_OPTIONS', '')} -Xlog:class+load=info:file={logs}/%p.log"
    subprocess.run(
        [sys.executable, "-c", SESSION],
        env={**environ, "JDK_JAVA_OPTIONS": java_options},
        check=True,
        timeout=300,
    )
    loaded = "\n".join(path.read_text() for path in logs.iterdir())
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in loaded
    assert "org.apache.spark.sql.execution.python" in loaded


def test_a_build_whose_jvm_fails_keeps_nothing(tmp_path: Path) -> None:
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    java = jdk / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'no JVM here' >&2\nexit 3\n")
    java.chmod(0o755)
    environ = {**os.environ, "JAVA_HOME": str(jdk), class_archive.CACHE_DIR_ENV: str(tmp_path / "cache")}

    with pytest.raises(class_archive.ClassArchiveError) as raised:
        class_archive.build(environ)

    assert "the driver JVM wrote no whole class archive (exit code 1); nothing was kept" in str(raised.value)
    assert "sessions start as before" in str(raised.value)
    archives = tmp_path / "cache" / "class-archives"
    assert list(archives.iterdir()) == []
    assert class_archive.driver_options(environ) == ""


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_an_apache_kafka_node_maps_its_versions_archive(tmp_path: Path) -> None:
    """scripts/install --test builds one per pinned version; CI must have it (a node without it
    only starts slower, so this is the test that notices)."""
    libs = require_apache_kafka(NEWEST)
    archive = class_archive_of(libs)
    assert archive is not None
    if not class_archive.is_whole(archive):
        message = f"no class archive at {archive}: scripts/install --test builds it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with ApacheKafka(tmp_path / "kafka") as kafka:
        assert str(archive.resolve()) in _mapped_files(kafka.processes[1].pid)
