"""Spark's Python processes importing PySpark from its installed, compiled files, not from the
zips bundled inside the package; and ``sparkafka-python``, the executable that does it for every
process Spark starts.

Why: Spark starts each Python process as ``<python> -m <module>`` with ``$SPARK_HOME/python/lib/
pyspark.zip`` (and py4j's zip) first on its PYTHONPATH. PySpark from PyPI ships those zips inside
the installed package, and zipimport keeps no bytecode cache, so every such process compiles each
PySpark module it imports from source: 1-2 s of CPU per process. Besides the executors' workers
(their daemon can be replaced, :mod:`sparkafka.runtime.worker_daemon`), Spark starts driver-side daemons
that look up, create and plan Python data sources, and a new streaming source runner for every
streaming query reading a Python data source. sparkafka's local sessions make ``sparkafka-python``
the PYSPARK_PYTHON of all of them (:mod:`sparkafka.runtime.session`).

The path rule (:func:`without_bundled_archives`):

1. find the installed packages: a directory on ``sys.path`` (not a zip) holding ``pyspark/__init__.py``;
2. drop from ``sys.path`` each zip inside that package's ``python/lib`` whose top-level package
   (``pyspark``, ``py4j``) is also installed as a directory on ``sys.path``: the zip is part of the
   same distribution, so the same code runs, only from compiled files;
3. drop each jar inside that package's ``jars``: Spark also puts the jar holding its own Python
   runner classes (spark-core, ~6,000 entries) on the path, for distributions that ship PySpark
   inside that jar; the installed package ships its Python as files beside it and its jars hold
   JVM classes only, so the interpreter would only read their directories to find nothing there.

Dropping an entry also forgets its importer in ``sys.path_importer_cache``: the interpreter made one
while the entry was on the path at start-up, and ``importlib.invalidate_caches()``, which PySpark
calls for every task and every runner (``setup_spark_files``), re-reads the whole directory of each
cached zip or jar (spark-core's jar: ~40 ms of CPU each time).

Invariants: a zip or jar outside the installed package (a cluster's own SPARK_HOME, ``--py-files``,
``--jars``) is never dropped; a package that is not also installed keeps its zip; nothing else on
the path moves.

Steps of ``sparkafka-python -m MODULE ARG...``:

1. apply the path rule to ``sys.path`` (:func:`apply_path_rule`);
2. put the working directory first on ``sys.path``, where ``python -m`` has it, instead of this
   script's directory;
3. a streaming source runner or a worker daemon, when a zygote serves this session
   (:mod:`sparkafka.runtime.runner_zygote`), runs in a child of the zygote, which has PySpark
   imported already, with this process's standard streams; its exit status is ours (this process
   waits for it as a shell, :func:`sparkafka.runtime.runner_zygote.run_through`);
4. otherwise run MODULE as ``__main__`` with ``sys.argv`` as ``python -m`` sets it; its exit status
   is ours.

Any other command line (``-c``, a script, interpreter options) goes to the interpreter unchanged.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys

LAUNCHER_NAME = "sparkafka-python"
# A zygote's socket (sparkafka.runtime.runner_zygote), and the modules it runs: kept here, so that a launcher
# imports the zygote's module only when it has something to ask of it.
ZYGOTE_ENV = "SPARKAFKA_RUNNER_ZYGOTE"
# The process that started the zygote ZYGOTE_ENV names: a process that inherited both from the one
# that started it (a pipeline started from a program with a session) starts a zygote of its own, so
# that its Spark's processes do not end with the other program. ZYGOTE_ENV set empty: no zygote.
ZYGOTE_OWNER_ENV = "SPARKAFKA_RUNNER_ZYGOTE_OWNER"
# The process that started the launcher (Spark's JVM), in the environment of a process the zygote
# runs for it: that process descends from the zygote, not from the JVM, and whatever looks for the
# Spark driver among its ancestors (the exactly-once sink's checkpoint lease) looks there instead.
LAUNCHER_PARENT_ENV = "SPARKAFKA_LAUNCHER_PARENT"
SERVED_MODULES = (
    # One per streaming query that reads a Python data source.
    "pyspark.sql.streaming.python_streaming_source_runner",
    # The driver-side daemons Spark starts, one per kind of planning request (look up, create and plan
    # a data source, create a writer, commit a write, the streaming sink's runner), whose forked
    # workers run a module of ``pyspark.sql.worker``.
    "pyspark.daemon",
    # The executors' worker daemon of sparkafka's sessions (spark.python.daemon.module).
    "sparkafka.runtime.worker_daemon",
)
_BUNDLED_ARCHIVES = (("pyspark", "pyspark.zip"), ("py4j", "py4j-"))  # (package, file name or prefix)


def _package_of_archive(file_name: str) -> str | None:
    for package, name in _BUNDLED_ARCHIVES:
        if file_name == name:
            return package
        if name.endswith("-") and file_name.startswith(name):
            return package
    return None


def _installed_package_dir(path: list[str], package: str) -> str | None:
    for entry in path:
        if entry.endswith(".zip") or not os.path.isdir(entry or "."):
            continue
        candidate = os.path.join(entry or ".", package)
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return os.path.realpath(candidate)
    return None


def without_bundled_archives(path: list[str]) -> list[str]:
    """``path`` minus the zips that only duplicate installed packages and the installed PySpark's
    own jars (the path rule above)."""
    pyspark_dir = _installed_package_dir(path, "pyspark")
    if pyspark_dir is None:
        return list(path)
    bundled_lib = os.path.join(pyspark_dir, "python", "lib")
    bundled_jars = os.path.join(pyspark_dir, "jars")
    kept = []
    for entry in path:
        if entry.endswith(".jar") and os.path.dirname(os.path.realpath(entry)) == bundled_jars:
            continue
        package = _package_of_archive(os.path.basename(entry)) if entry.endswith(".zip") else None
        if (
            package is not None
            and os.path.dirname(os.path.realpath(entry)) == bundled_lib
            and _installed_package_dir(path, package) is not None
        ):
            continue
        kept.append(entry)
    return kept


def apply_path_rule() -> None:
    """Apply the path rule to ``sys.path`` in place and forget the importers of the dropped zips."""
    kept = without_bundled_archives(sys.path)
    dropped = set(sys.path).difference(kept)
    sys.path[:] = kept
    for entry in dropped:
        sys.path_importer_cache.pop(entry, None)


def launcher_path() -> str | None:
    """The installed ``sparkafka-python`` beside this interpreter, or None (not installed)."""
    return shutil.which(LAUNCHER_NAME, path=os.path.dirname(sys.executable))


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    module = args[1]
    script_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
    apply_path_rule()
    if sys.path and os.path.abspath(sys.path[0] or ".") == script_dir:
        sys.path[0] = os.getcwd()
    zygote = os.environ.get(ZYGOTE_ENV)
    if zygote and module in SERVED_MODULES:
        from sparkafka.runtime.runner_zygote import run_through

        os.environ[LAUNCHER_PARENT_ENV] = str(os.getppid())
        status = run_through(zygote, module, args[2:], wait_in_shell=True)
        del os.environ[LAUNCHER_PARENT_ENV]
        if status is not None:
            sys.exit(status)
    sys.argv = [module, *args[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
