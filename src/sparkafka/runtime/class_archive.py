"""A class-data-sharing archive of the Spark driver JVM's classes, made once per JDK and Spark.

Why: every start of a driver JVM loads, parses and verifies the same few thousand classes of Spark
and its dependencies. A dynamic CDS archive (JDK 13+, ``-XX:ArchiveClassesAtExit``) keeps them
parsed and verified in a file the JVM maps at its next start. Measured on two cores
(``python -m benchmarks.startup``, docs/benchmarks.md), a local session started, running one
aggregation and stopped: 16.3 s of CPU and 9.8 s to the first answer without the archive, 10.4 s
and 6.1 s with it.

Steps of :func:`build` (``sparkafka class-archive build``):

1. The archive's name is a digest of what decides whether the JVM may use it (:func:`archive_key`):
   the java executable Spark's launcher will run, its JDK's ``release`` file and ``libjvm.so``,
   and every jar of the Spark installation (name, size, modification time). Another JDK or Spark
   gets another archive; an old one is never mistaken for the current.
2. A child process starts a sparkafka session whose driver JVM has ``-XX:ArchiveClassesAtExit``
   pointing at a temporary file, runs a small batch query and a streaming query through a Python
   data source source and sink (the classes every pipeline loads), stops the session and waits for
   the JVM to exit: the JVM writes the archive as it exits.
3. Only a file the JVM finished (exit code 0, the archive's magic number in its header, which the
   JVM writes last) becomes the archive, synced to disk and renamed, and its size is recorded
   beside it. A Spark conf directory holding files is refused beforehand: Spark puts it first on
   the class path, where a JVM archives nothing beside a non-empty directory.

Steps of :func:`driver_options` (every sparkafka session, :mod:`sparkafka.runtime.session`):

1. ``SPARKAFKA_CLASS_ARCHIVE=off``, or class sharing chosen by the user (``-Xshare``,
   ``SharedArchiveFile`` in a JVM options variable, PYSPARK_SUBMIT_ARGS or the session's Java
   options): nothing.
2. No archive for the current key, one whose size is not the recorded one, or a path with a ``:``
   (the JVM would read two archives): nothing.
3. Otherwise ``-XX:SharedArchiveFile=<archive> -Xshare:auto``, with the JVM's CDS log lines off.

Invariants: an archive under its final name is complete (a JVM maps the file, and a truncated one
makes it crash: written elsewhere, renamed when whole, its size checked before every use); an
archive is never written in place (running JVMs map it; a new build replaces it by a rename); an
archive the JVM cannot use (another class path, say) is ignored by the JVM, which then loads classes
as usual; nothing here changes what runs, only how fast the classes are found."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sparkafka.errors import SparkafkaError
from sparkafka.runtime.session import JAVA_OPTIONS_VARIABLES

log = logging.getLogger(__name__)

SWITCH_ENV = "SPARKAFKA_CLASS_ARCHIVE"
CACHE_DIR_ENV = "SPARKAFKA_CACHE_DIR"
# Set by build() for its child process only: where that child's driver JVM writes the archive.
_DUMP_TO_ENV = "SPARKAFKA_CLASS_ARCHIVE_DUMP_TO"
_FORMAT = 1
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# The flags that choose class sharing.
_SHARING_FLAGS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
# The first bytes of a dynamic archive the JVM finished writing (it writes its header last).
_DYNAMIC_ARCHIVE_MAGIC = bytes.fromhex("a8ab0bf0")
_BUILD_TIMEOUT_S = 900
PROBE_FORMAT = "sparkafka_class_archive_probe"


class ClassArchiveError(SparkafkaError):
    """The class archive could not be built."""


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """SPARKAFKA_CACHE_DIR, else ``$XDG_CACHE_HOME/sparkafka``, else ``~/.cache/sparkafka``."""
    environ = os.environ if environ is None else environ
    if explicit := environ.get(CACHE_DIR_ENV):
        return Path(explicit)
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkafka"


def java_executable(environ: Mapping[str, str] | None = None) -> Path | None:
    """The java that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on PATH."""
    environ = os.environ if environ is None else environ
    if java_home := environ.get("JAVA_HOME"):
        return Path(java_home) / "bin" / "java"
    found = shutil.which("java", path=environ.get("PATH"))
    return Path(found) if found else None


def spark_jars(environ: Mapping[str, str] | None = None) -> Path:
    """The jars of the Spark installation PySpark starts: ``$SPARK_HOME/jars``, else PySpark's own."""
    environ = os.environ if environ is None else environ
    if spark_home := environ.get("SPARK_HOME"):
        return Path(spark_home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_key(environ: Mapping[str, str] | None = None) -> str | None:
    """Step 1 of :func:`build`; None when there is no java or no Spark jars to key it by."""
    java = java_executable(environ)
    jars = spark_jars(environ)
    if java is None or not java.exists() or not jars.is_dir():
        return None
    return classpath_key(java, jars)


def classpath_key(java: Path, jars: Path) -> str:
    """A digest of what decides whether ``java`` may map an archive of the classes in ``jars``: the
    JDK (its ``release`` file and ``libjvm.so``) and every jar's name, size and modification time."""
    java = java.resolve()
    digest = hashlib.sha256(f"format {_FORMAT}\njava {java}\n".encode())
    jdk_home = java.parent.parent
    for part in (jdk_home / "release", jdk_home / "lib" / "server" / "libjvm.so"):
        digest.update(_identity(part).encode())
    for jar in sorted(jars.iterdir()):
        digest.update(_identity(jar).encode())
    return digest.hexdigest()[:24]


def _identity(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return f"{path.name} absent\n"
    return f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n"


def archive_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the archive of the current JDK and Spark lives (it may not exist yet)."""
    key = archive_key(environ)
    return None if key is None else cache_dir(environ) / "class-archives" / f"spark-driver-{key}.jsa"


def conf_dir_in_the_way(environ: Mapping[str, str] | None = None) -> Path | None:
    """Spark's conf directory when it holds files: Spark's launcher puts it first on the driver's
    class path, and a JVM archives no classes with a non-empty directory there."""
    environ = os.environ if environ is None else environ
    conf = environ.get("SPARK_CONF_DIR") or str(spark_jars(environ).parent / "conf")
    try:
        return Path(conf) if any(Path(conf).iterdir()) else None
    except OSError:  # absent, or not a directory: not on the class path as a directory
        return None


def _size_record(archive: Path) -> Path:
    return archive.with_name(archive.name + ".json")


def switched_off(environ: Mapping[str, str] | None = None) -> bool:
    """``SPARKAFKA_CLASS_ARCHIVE`` is off, 0, false or no."""
    environ = os.environ if environ is None else environ
    return environ.get(SWITCH_ENV, "").strip().lower() in ("off", "0", "false", "no")


def usable_archive(environ: Mapping[str, str] | None = None) -> Path | None:
    """Steps 1 and 2 of :func:`driver_options`: the current archive when it is whole and not
    switched off."""
    return None if switched_off(environ) else whole_archive(environ)


def whole_archive(environ: Mapping[str, str] | None = None) -> Path | None:
    """Step 2 of :func:`driver_options`: the archive of the current JDK and Spark, when it is
    there and as long as recorded when it was built."""
    archive = archive_path(environ)
    # The JVM reads a ':' in SharedArchiveFile as separating two archives, and then maps none.
    return archive if archive is not None and ":" not in str(archive) and is_whole(archive) else None


def is_whole(archive: Path) -> bool:
    """``archive`` is there, with the size :func:`keep` recorded for it (a JVM crashes on a
    truncated one)."""
    try:
        recorded = json.loads(_size_record(archive).read_text())["size"]
        size = archive.stat().st_size
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if size != recorded:
        log.warning(
            "ignoring the class archive %s: its size is not the one recorded when it was built", archive
        )
    return size == recorded


def keep(written: Path, archive: Path) -> Path:
    """Step 3 of :func:`build`: the file a JVM wrote becomes ``archive`` by a rename, then its size
    is recorded beside it (until then a reader finds no record and does not map it)."""
    if not finished_archive(written):
        raise ClassArchiveError(
            f"{written} is not a class archive the JVM finished writing (it writes the header last); "
            "nothing was kept"
        )
    with open(written, "rb") as finished:  # on disk before the rename makes it the archive
        os.fsync(finished.fileno())
    size = written.stat().st_size
    # Two builds finishing together would otherwise leave one's archive beside the other's size.
    with open(archive.parent / ".keep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _size_record(archive).unlink(missing_ok=True)
        os.replace(written, archive)
        record = _size_record(archive)
        staged = record.with_name(f"{record.name}.{os.getpid()}")
        staged.write_text(json.dumps({"size": size}))
        os.replace(staged, record)
    return archive


def finished_archive(path: Path) -> bool:
    """``path`` starts as a dynamic archive does once the JVM finished it."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == _DYNAMIC_ARCHIVE_MAGIC
    except OSError:
        return False


def mapping_options(archive: Path) -> str:
    """The JVM options that map ``archive``, quietly, and fall back to plain class loading when the
    JVM cannot use it."""
    return f"-XX:SharedArchiveFile={shlex.quote(str(archive))} -Xshare:auto {QUIET}"


def driver_options(environ: Mapping[str, str] | None = None, *, settings: Iterable[str] = ()) -> str:
    """The driver JVM's options for the archive (:func:`build`'s child: for writing it). Nothing
    where the user chose class sharing already, in a JVM options variable, PYSPARK_SUBMIT_ARGS or
    the session's ``settings`` (its Java options): ours would override ``-Xshare:off``, and a
    ``-Xshare:on`` with an archive the JVM cannot use would stop the session from starting."""
    environ = os.environ if environ is None else environ
    if dump_to := environ.get(_DUMP_TO_ENV):
        return f"-XX:ArchiveClassesAtExit={shlex.quote(dump_to)} {QUIET}"
    chosen = [environ.get(name, "") for name in (*JAVA_OPTIONS_VARIABLES, "PYSPARK_SUBMIT_ARGS")]
    if any(flag in text for text in (*chosen, *settings) for flag in _SHARING_FLAGS):
        return ""
    archive = usable_archive(environ)
    if archive is None:
        return ""
    return mapping_options(archive)


def build(environ: Mapping[str, str] | None = None, *, timeout_s: float = _BUILD_TIMEOUT_S) -> Path:
    """Steps 2 and 3 of the module docstring; returns the archive. Replaces an archive of the same key."""
    environ = dict(os.environ if environ is None else environ)
    archive = archive_path(environ)
    if archive is None:
        raise ClassArchiveError(
            "no java or no Spark jars found: install Java 17+ (java on PATH or JAVA_HOME set) and "
            "PySpark, then build the class archive again"
        )
    if ":" in str(archive):
        raise ClassArchiveError(
            f"the class archive's path {archive} holds a ':', which the JVM reads as separating two "
            f"archives: set {CACHE_DIR_ENV} to a directory without one"
        )
    if (conf := conf_dir_in_the_way(environ)) is not None:
        raise ClassArchiveError(
            f"Spark's conf directory {conf} holds files, and Spark puts it first on the driver's class "
            "path, where a JVM archives no classes with a non-empty directory: sessions start without "
            "a class archive (or point SPARK_CONF_DIR at an empty directory, and build again)"
        )
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=archive.parent) as work:
            partial = Path(work) / archive.name
            _dump(environ, partial, Path(work) / "checkpoint", timeout_s)
            return keep(partial, archive)
    except OSError as error:
        raise ClassArchiveError(
            f"the class archive could not be written under {archive.parent} ({error}): set "
            f"{CACHE_DIR_ENV} to a writable directory"
        ) from None


def _dump(environ: Mapping[str, str], partial: Path, checkpoint: Path, timeout_s: float) -> None:
    """Step 2 of :func:`build`: the child process whose driver JVM writes ``partial``; fails unless
    the JVM exited cleanly and the file starts as a finished archive does."""
    child_env = {**environ, _DUMP_TO_ENV: str(partial), SWITCH_ENV: "off"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(checkpoint)],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise ClassArchiveError(
            f"building the class archive took longer than {timeout_s:.0f} s; nothing was kept"
        ) from error
    if done.returncode != 0 or not finished_archive(partial):
        tail = "\n".join(f"{done.stdout}\n{done.stderr}".strip().splitlines()[-15:])
        raise ClassArchiveError(
            f"the driver JVM wrote no whole class archive (exit code {done.returncode}); nothing was "
            f"kept, and sessions start as before. Its last output:\n{tail}"
        )


def remove(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Delete every class archive in the cache (running JVMs keep the files they mapped)."""
    folder = cache_dir(environ) / "class-archives"
    removed = []
    for path in sorted(folder.glob("spark-driver-*.jsa*")) if folder.is_dir() else []:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _probe(checkpoint: str) -> None:
    """Step 2's workload, in the child process whose driver JVM writes the archive."""
    from pyspark import SparkContext
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        ReadLimit,
        WriterCommitMessage,
    )

    from sparkafka.runtime.session import spark_session

    class ProbeReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
            return {"n": 3}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(index) for index in range(start["n"], end["n"])]

        def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
            yield (f"record {partition.value}".encode(),)

    class ProbeWriter(DataSourceStreamWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            pass

    class Probe(DataSource):
        @classmethod
        def name(cls) -> str:
            return PROBE_FORMAT

        def schema(self) -> str:
            return "value binary"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return ProbeReader()

        def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
            return ProbeWriter()

    spark = spark_session("sparkafka-class-archive", master="local[1]")
    spark.dataSource.register(Probe)
    spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    query = (
        spark.readStream.format(PROBE_FORMAT)
        .load()
        .writeStream.format(PROBE_FORMAT)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if gateway is None or process is None:
        raise ClassArchiveError("the session's driver JVM is not a child of this process")
    # The JVM exits when its standard input closes, and writes the archive as it exits.
    gateway.shutdown()
    process.stdin.close()
    if (code := process.wait(_BUILD_TIMEOUT_S)) != 0:
        raise ClassArchiveError(f"the driver JVM exited with code {code} while writing the class archive")


if __name__ == "__main__":
    _probe(sys.argv[1])
