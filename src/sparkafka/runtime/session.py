"""A SparkSession for sparkafka's own commands, with Spark's console noise turned down."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING

from sparkafka.errors import SparkafkaError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
# Where a JVM takes options besides its command line; a collector chosen there must not be contradicted.
JAVA_OPTIONS_VARIABLES = ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")
_COLLECTOR_FLAG = re.compile(r"-XX:[+-]Use\w*GC\b")
_LOCAL_MASTER = re.compile(r"local(?:\[(?:\*|\d+)(?:,\s*\d+)?\])?")
SERIAL_GC_MAX_CORES = 2
# How the driver JVM compiles: "full" is the JVM's own tiered compilation (C1, then C2 for hot code);
# "quick" stops at C1 (-XX:TieredStopAtLevel=1).
JIT_ENV = "SPARKAFKA_DRIVER_JIT"
JIT_MODES = {"full": "", "quick": "-XX:TieredStopAtLevel=1"}
_JIT_FLAG = re.compile(r"-XX:(?:[+-]TieredCompilation\b|TieredStopAtLevel=)")


def spark_session(
    app_name: str, *, master: str = "local[*]", conf: dict[str, str] | None = None
) -> SparkSession:
    """Create (or get) a session with the ``sparkafka`` format registered.

    Spark's Python processes run the same Python interpreter as the caller (it has sparkafka
    installed), unless PYSPARK_PYTHON names another; with a local master through
    :mod:`sparkafka.runtime.python_exec` when it is installed, and executor workers start through
    :mod:`sparkafka.runtime.worker_daemon`: both import PySpark from its compiled files, not from
    pyspark.zip. log4j prints errors only unless SPARKAFKA_SPARK_LOG_LEVEL says otherwise; no
    progress bars; the web UI on, at any free port (``conf`` may name one); the driver JVM's collector
    and compiler mode are chosen by :func:`driver_java_options`, and it maps the class archive where
    one was built (:mod:`sparkafka.runtime.class_archive`); with a local master, checkpoints are
    written as described at :func:`_prefer_local_checkpoints`."""
    from pyspark.sql import SparkSession

    import sparkafka
    from sparkafka.runtime import class_archive
    from sparkafka.runtime.python_exec import launcher_path

    # On a cluster the executors' interpreter path is the cluster's business; locally every Python
    # process Spark starts is on this machine, where the launcher is installed beside this Python.
    spark_python = (launcher_path() if is_local_master(master) else None) or sys.executable
    own_zygote(spark_python)
    os.environ.setdefault("PYSPARK_PYTHON", spark_python)
    # Spark also starts the driver-side lookup of Python data sources with this one.
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", spark_python)
    level = spark_log_level()
    log_config = resources.files("sparkafka").joinpath("resources/log4j2.properties")
    base_options = f"-Dlog4j.configurationFile={log_config} -Dsparkafka.spark.log.level={level}"
    java_settings = [value for key, value in (conf or {}).items() if "JavaOptions" in key]
    if archive_options := class_archive.driver_options(settings=java_settings):
        base_options = f"{base_options} {archive_options}"
    java_options = driver_java_options(master, base_options)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", java_options)
        # The UI's monitoring API tells the exactly-once sink's tasks how many write partitions a
        # micro-batch has (sparkafka.publish_status_url).
        .config("spark.ui.enabled", "true")
        # Any free port: Spark's 4040 and the 16 after it may all be taken on a busy host, and
        # Spark then fails to start the session at all. The address is logged below.
        .config("spark.ui.port", "0")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.daemon.module", "sparkafka.runtime.worker_daemon")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARKAFKA_SHUFFLE_PARTITIONS", "4"))
        # The exactly-once sink's df.write inside foreachBatch (update and complete mode) writes
        # through a batch plan, which adaptive execution could split otherwise when a micro-batch is
        # replayed; register() below turns it off for stateless streaming plans.
        .config("spark.sql.adaptive.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(level.upper())
    local = (spark.sparkContext.master or "").startswith("local")  # getOrCreate may return another session
    if local and spark.conf.get(CHECKPOINT_MANAGER_KEY, None) is None:
        _prefer_local_checkpoints(spark)
    sparkafka.register(spark)
    log.info("Spark web UI: %s", spark.sparkContext.uiWebUrl)
    return spark


def own_zygote(spark_python: str) -> None:
    """Start this process's zygote (:mod:`sparkafka.runtime.runner_zygote`) unless it has one, and
    name it in the environment, which the JVM started next hands to Spark's Python processes: they
    are then forked ready-made. Never another process's: a zygote inherited from the program that
    started this one ends with that program, and its Spark's processes with it. Only where every
    Python process Spark starts runs ``spark_python``, sparkafka's launcher; ``SPARKAFKA_RUNNER_ZYGOTE``
    set empty turns it off."""
    from sparkafka.runtime.python_exec import ZYGOTE_ENV, ZYGOTE_OWNER_ENV
    from sparkafka.runtime.runner_zygote import start as start_zygote

    me = str(os.getpid())
    if os.environ.get(ZYGOTE_OWNER_ENV, me) != me:
        del os.environ[ZYGOTE_OWNER_ENV]
        os.environ.pop(ZYGOTE_ENV, None)
    if (
        spark_python != sys.executable
        and os.environ.get("PYSPARK_DRIVER_PYTHON", spark_python) == spark_python
        and ZYGOTE_ENV not in os.environ
        and (socket_path := start_zygote()) is not None
    ):
        os.environ[ZYGOTE_ENV] = socket_path
        os.environ[ZYGOTE_OWNER_ENV] = me


def spark_log_level() -> str:
    """The level of Spark's own log: SPARKAFKA_SPARK_LOG_LEVEL, errors only by default."""
    return os.environ.get("SPARKAFKA_SPARK_LOG_LEVEL", "error").lower()


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: the driver JVM runs the tasks itself."""
    return _LOCAL_MASTER.fullmatch(master.strip()) is not None


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask, as the JVM counts them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def driver_java_options(
    master: str, base: str, *, cores: int | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """``base`` plus the compiler mode ``SPARKAFKA_DRIVER_JIT`` asks for (:func:`_with_jit_mode`),
    plus ``-XX:+UseSerialGC`` when a local master runs on a machine of at most two cores and no
    collector is chosen elsewhere (the JVM refuses two).

    With a local master the driver JVM runs every task. On two cores the JVM picks G1, whose
    concurrent refinement and marking threads take CPU from the task threads: the map pipeline
    over a 1 M-record backlog used about 4 s less JVM CPU and ran about 10 % faster with the serial
    collector (docs/benchmarks.md). The driver's heap is small (spark.driver.memory, 1 GiB by
    default), so its young collections stay short. On more cores, or with a cluster master, the
    JVM's own choice stands."""
    environ = os.environ if environ is None else environ
    cores = machine_cores() if cores is None else cores
    options = _with_jit_mode(base, environ)
    chosen = _chosen_already(_COLLECTOR_FLAG, base, environ)
    if not is_local_master(master) or cores > SERIAL_GC_MAX_CORES or chosen:
        return options
    return f"{options} -XX:+UseSerialGC"


def _chosen_already(flag: re.Pattern[str], base: str, environ: Mapping[str, str]) -> bool:
    """Whether ``flag`` is set in ``base`` or in a Java options variable: sparkafka's choice must
    not contradict it."""
    places = (base, *(environ.get(name, "") for name in JAVA_OPTIONS_VARIABLES))
    return any(flag.search(options) for options in places)


def _with_jit_mode(base: str, environ: Mapping[str, str]) -> str:
    """``base`` plus the compiler flags of ``SPARKAFKA_DRIVER_JIT`` (:data:`JIT_MODES`), unless the
    JVM's compilation is chosen in ``base`` or a Java options variable already.

    Why "quick": until its first output a pipeline's driver JVM spends about half its CPU compiling
    Spark's planning and start-up code with C2, code that then hardly runs again; C1 alone reaches
    the first output about 2 s sooner on 13 % less CPU, and then runs records on 12 % more CPU each,
    at an 18 % lower sustained rate (docs/benchmarks.md, "The driver JVM's compiler"). What starts
    a pipeline for a short while (the demo, `sparkafka verify`) asks for it, as the test suite does
    for all its JVMs; a long-running pipeline keeps the JVM's default."""
    mode = environ.get(JIT_ENV, "full").strip().lower()
    if mode not in JIT_MODES:
        raise SparkafkaError(
            f"{JIT_ENV}={environ[JIT_ENV]!r} is not a compiler mode of the driver JVM: set it to "
            f"{' or '.join(repr(name) for name in JIT_MODES)}, or unset it (full)"
        )
    if _chosen_already(_JIT_FLAG, base, environ) or not JIT_MODES[mode]:
        return base
    return f"{base} {JIT_MODES[mode]}"


def _prefer_local_checkpoints(spark: SparkSession) -> None:
    """Write streaming checkpoints through Hadoop's FileSystem API instead of Spark's default,
    FileContext.

    Without Hadoop's native library (PySpark from PyPI has none) FileContext sets permissions and
    resolves links of a local file by starting ``chmod`` and ``readlink`` processes: about a dozen
    for the offset and commit log entries of every micro-batch, 100-200 ms of each batch. The
    FileSystem API starts a third as many; each file still appears whole (a temporary file, then
    rename(2)). What it gives up: it checks that a log entry does not exist before the rename
    instead of failing the rename, so two processes running one query on one checkpoint at the
    same time are no longer caught at that point (one query per checkpoint is a precondition
    anyway, docs/guarantees.md). Only for local masters: on a cluster the checkpoint is on a
    distributed file system, where FileContext's rename is the one to keep."""
    jvm = getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        return
    try:
        jvm.java.lang.Class.forName(FILE_SYSTEM_CHECKPOINT_MANAGER)
    except Exception:  # another Spark version keeps the class elsewhere: keep Spark's default
        return
    spark.conf.set(CHECKPOINT_MANAGER_KEY, FILE_SYSTEM_CHECKPOINT_MANAGER)
