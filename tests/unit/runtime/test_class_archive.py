"""The class archive's name, its use and its refusal of a file that is not whole
(sparkafka.runtime.class_archive), on a JDK and a Spark installation made of plain files."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparkafka.cli.app import app
from sparkafka.runtime import class_archive

MAGIC = bytes.fromhex("a8ab0bf0")


def _installation(tmp_path: Path) -> dict[str, str]:
    """A JDK (bin/java, release, libjvm.so) and a Spark (jars/) that the key reads, and a cache."""
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\nexit 0\n")
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (jdk / "lib" / "server").mkdir(parents=True)
    (jdk / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("spark-core_2.13-4.1.0.jar", "spark-sql_2.13-4.1.0.jar"):
        (jars / name).write_bytes(b"classes")
    return {
        "JAVA_HOME": str(jdk),
        "SPARK_HOME": str(tmp_path / "spark"),
        class_archive.CACHE_DIR_ENV: str(tmp_path / "cache"),
        "PATH": "",
    }


def _built(environ: dict[str, str], content: bytes = b"archive", recorded: int | None = None) -> Path:
    """An archive file as build() leaves it: the file, and its size recorded beside it."""
    archive = class_archive.archive_path(environ)
    assert archive is not None
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(content)
    Path(str(archive) + ".json").write_text(
        json.dumps({"size": len(content) if recorded is None else recorded})
    )
    return archive


def test_the_key_changes_with_the_jdk_and_with_every_jar(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    first = class_archive.archive_key(environ)
    assert first is not None and first == class_archive.archive_key(environ)

    (Path(environ["SPARK_HOME"]) / "jars" / "spark-kafka_2.13-4.1.0.jar").write_bytes(b"more")
    with_jar = class_archive.archive_key(environ)
    assert with_jar != first

    (Path(environ["JAVA_HOME"]) / "release").write_text('JAVA_VERSION="17.0.16"\n')
    assert class_archive.archive_key(environ) not in (first, with_jar)

    jar = Path(environ["SPARK_HOME"]) / "jars" / "spark-core_2.13-4.1.0.jar"
    before = class_archive.archive_key(environ)
    jar.write_bytes(b"other classes")
    assert class_archive.archive_key(environ) != before


def test_no_java_or_no_spark_jars_gives_no_archive(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    assert class_archive.archive_key({**environ, "JAVA_HOME": str(tmp_path / "nowhere")}) is None
    assert class_archive.archive_key({**environ, "SPARK_HOME": str(tmp_path / "nowhere")}) is None
    assert class_archive.driver_options({**environ, "JAVA_HOME": str(tmp_path / "nowhere")}) == ""


def test_java_is_found_on_the_path_without_java_home(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    java = Path(environ["JAVA_HOME"]) / "bin" / "java"
    java.chmod(0o755)
    on_path = {**environ, "PATH": str(java.parent)}
    del on_path["JAVA_HOME"]
    assert class_archive.java_executable(on_path) == java
    assert class_archive.archive_key(on_path) == class_archive.archive_key(environ)


def test_a_whole_archive_is_mapped_by_the_driver(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    archive = _built(environ)
    assert class_archive.usable_archive(environ) == archive
    options = shlex.split(class_archive.driver_options(environ))
    assert f"-XX:SharedArchiveFile={archive}" in options
    # A JVM that cannot use it loads its classes as usual, and says nothing on the console.
    assert "-Xshare:auto" in options
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_a_path_with_spaces_stays_one_option(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    environ[class_archive.CACHE_DIR_ENV] = str(tmp_path / "my cache")
    archive = _built(environ)
    assert f"-XX:SharedArchiveFile={archive}" in shlex.split(class_archive.driver_options(environ))


def test_an_archive_not_as_long_as_recorded_is_not_mapped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A JVM that maps a truncated archive crashes (SIGBUS): it is never handed one."""
    environ = _installation(tmp_path)
    archive = _built(environ, b"archive", recorded=1_000_000)
    assert class_archive.usable_archive(environ) is None
    assert class_archive.driver_options(environ) == ""
    assert f"ignoring the class archive {archive}: its size is not the one recorded" in caplog.text


def test_an_archive_without_its_size_record_is_not_mapped(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    archive = _built(environ)
    Path(str(archive) + ".json").unlink()
    assert class_archive.usable_archive(environ) is None
    Path(str(archive) + ".json").write_text("{not json")
    assert class_archive.usable_archive(environ) is None


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "no"])
def test_the_switch_turns_it_off(tmp_path: Path, value: str) -> None:
    environ = _installation(tmp_path)
    _built(environ)
    assert class_archive.driver_options({**environ, class_archive.SWITCH_ENV: value}) == ""


def test_an_archive_of_another_jdk_is_not_mapped(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    _built(environ)
    (Path(environ["JAVA_HOME"]) / "lib" / "server" / "libjvm.so").write_bytes(b"another jvm")
    assert class_archive.usable_archive(environ) is None


def test_the_cache_follows_xdg_then_home(tmp_path: Path) -> None:
    assert class_archive.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "sparkafka"
    assert class_archive.cache_dir({class_archive.CACHE_DIR_ENV: "/x", "XDG_CACHE_HOME": "/y"}) == Path("/x")
    assert class_archive.cache_dir({}) == Path.home() / ".cache" / "sparkafka"


def test_remove_deletes_archives_and_their_records_only(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    archive = _built(environ)
    keep = archive.parent / "notes.txt"
    keep.write_text("mine")
    removed = class_archive.remove(environ)
    assert sorted(removed) == sorted([archive, Path(str(archive) + ".json")])
    assert keep.exists() and not archive.exists()
    assert class_archive.remove(environ) == []


def test_the_command_reports_the_archive_in_use_and_its_absence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = _installation(tmp_path)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(class_archive.SWITCH_ENV, raising=False)
    runner = CliRunner()
    absent = runner.invoke(app, ["class-archive", "status"])
    assert absent.exit_code == 0
    assert "none for this JDK and Spark" in absent.output
    assert "run 'sparkafka class-archive build'" in absent.output

    archive = _built(environ)
    assert f"in use: {archive}" in runner.invoke(app, ["class-archive", "status"]).output
    monkeypatch.setenv(class_archive.SWITCH_ENV, "off")
    assert (
        "not used: SPARKAFKA_CLASS_ARCHIVE turns it off"
        in runner.invoke(app, ["class-archive", "status"]).output
    )

    # Switched off or not, an archive already there is not built again.
    built = runner.invoke(app, ["class-archive", "build", "--if-missing"])
    assert built.exit_code == 0
    assert f"class archive already built: {archive}" in built.output

    removed = runner.invoke(app, ["class-archive", "remove"])
    assert "removed 2 file(s)" in removed.output
    assert os.listdir(archive.parent) == []


def test_the_command_says_when_no_archive_can_be_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    result = CliRunner().invoke(app, ["class-archive", "status"])
    assert result.exit_code == 1
    assert "no java or no Spark jars found" in result.output


def test_a_failed_build_exits_saying_that_sessions_start_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = _installation(tmp_path)
    java = Path(environ["JAVA_HOME"]) / "bin" / "java"
    java.write_text("#!/bin/sh\nexit 3\n")
    java.chmod(0o755)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", os.environ["PATH"])
    result = CliRunner().invoke(app, ["class-archive", "build"])
    assert result.exit_code == 1
    assert "sparkafka class-archive build: the driver JVM wrote no whole class archive" in result.output
    assert "nothing was kept, and sessions start as before" in result.output


def test_keep_renames_a_whole_file_into_place_and_records_its_size(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    archive = class_archive.archive_path(environ)
    assert archive is not None
    archive.parent.mkdir(parents=True)
    old = _built(environ, b"old archive")
    written = tmp_path / "written.jsa"
    written.write_bytes(MAGIC + b"new, longer archive")
    assert class_archive.keep(written, archive) == old
    assert archive.read_bytes() == MAGIC + b"new, longer archive" and not written.exists()
    assert class_archive.usable_archive(environ) == archive

    # A JVM killed while writing leaves a file whose header (written last) is still zeros.
    for unfinished in (b"", bytes(4) + b"classes written so far"):
        partial = tmp_path / "partial.jsa"
        partial.write_bytes(unfinished)
        with pytest.raises(class_archive.ClassArchiveError, match="not a class archive the JVM finished"):
            class_archive.keep(partial, archive)
    assert archive.read_bytes() == MAGIC + b"new, longer archive"
    assert class_archive.usable_archive(environ) == archive


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("JDK_JAVA_OPTIONS", "-Xshare:off"),
        ("JAVA_TOOL_OPTIONS", "-Xshare:on"),
        ("_JAVA_OPTIONS", "-XX:SharedArchiveFile=/opt/mine.jsa"),
        ("PYSPARK_SUBMIT_ARGS", "--driver-java-options -XX:ArchiveClassesAtExit=/tmp/x.jsa pyspark-shell"),
    ],
)
def test_a_sharing_choice_of_the_users_own_is_left_alone(tmp_path: Path, variable: str, value: str) -> None:
    environ = _installation(tmp_path)
    _built(environ)
    assert class_archive.driver_options(environ) != ""
    assert class_archive.driver_options({**environ, variable: value}) == ""
    assert class_archive.driver_options(environ, settings=["-Dx=1 -Xshare:off"]) == ""
    assert class_archive.driver_options(environ, settings=["-Dx=1"]) != ""


def test_a_cache_path_with_a_colon_is_never_mapped_nor_built(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    environ[class_archive.CACHE_DIR_ENV] = str(tmp_path / "co:lon")
    _built(environ)
    assert class_archive.driver_options(environ) == ""
    with pytest.raises(
        class_archive.ClassArchiveError, match="holds a ':', which the JVM reads as separating"
    ):
        class_archive.build(environ)


def test_a_conf_directory_with_files_is_named_before_building(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    conf = Path(environ["SPARK_HOME"]) / "conf"
    conf.mkdir()
    assert class_archive.conf_dir_in_the_way(environ) is None
    (conf / "spark-defaults.conf.template").write_text("# template\n")
    assert class_archive.conf_dir_in_the_way(environ) == conf
    with pytest.raises(class_archive.ClassArchiveError) as raised:
        class_archive.build(environ)
    assert f"Spark's conf directory {conf} holds files" in str(raised.value)
    assert "point SPARK_CONF_DIR at an empty directory" in str(raised.value)
    empty = tmp_path / "empty-conf"
    empty.mkdir()
    assert class_archive.conf_dir_in_the_way({**environ, "SPARK_CONF_DIR": str(empty)}) is None


def test_an_unwritable_cache_is_named(tmp_path: Path) -> None:
    environ = _installation(tmp_path)
    (tmp_path / "a-file").write_text("")
    environ[class_archive.CACHE_DIR_ENV] = str(tmp_path / "a-file" / "cache")
    with pytest.raises(
        class_archive.ClassArchiveError, match=r"could not be written under .*: set SPARKAFKA_CACHE_DIR"
    ):
        class_archive.build(environ)
