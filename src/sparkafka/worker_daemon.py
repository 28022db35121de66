"""Spark's Python worker daemon, importing PySpark from its installed, compiled files.

Set as ``spark.python.daemon.module`` (sparkafka's own sessions do, see :mod:`sparkafka.session`).

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
worker's PYTHONPATH, and PySpark from PyPI ships those zips inside the installed package, so
SPARK_HOME/python/lib/pyspark.zip exists there. Python's zipimport keeps no bytecode cache: every
worker process compiles each PySpark module it imports from source. A worker's imports (the daemon,
then ``pyspark.worker`` and the SQL modules in each forked worker) cost 1-2 s of CPU per process;
the installed package's compiled files make that a fraction.

Steps, before anything imports PySpark:

1. Find the installed packages: a directory on ``sys.path`` (not a zip) holding ``pyspark/__init__.py``.
2. Drop from ``sys.path`` each zip inside that package's ``python/lib`` whose top-level package
   (``pyspark``, ``py4j``) is also installed as a directory on ``sys.path``: the zip is part of the
   same distribution, so the same code runs, only from compiled files.
3. Run PySpark's own daemon (``pyspark.daemon.manager``) unchanged; its forked workers inherit the path.

Invariants: a zip outside the installed package (a cluster's own SPARK_HOME, ``--py-files``) is never
dropped; a package that is not also installed keeps its zip; nothing else on the path moves.
"""

from __future__ import annotations

import os
import sys

BUNDLED_ARCHIVE_PACKAGES = {"pyspark.zip": "pyspark", "py4j-": "py4j"}


def _package_of_archive(file_name: str) -> str | None:
    for prefix, package in BUNDLED_ARCHIVE_PACKAGES.items():
        if file_name == prefix or (prefix.endswith("-") and file_name.startswith(prefix)):
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
    """``path`` minus the zips that only duplicate installed packages (module docstring, steps 1-2)."""
    pyspark_dir = _installed_package_dir(path, "pyspark")
    if pyspark_dir is None:
        return list(path)
    bundled_lib = os.path.join(pyspark_dir, "python", "lib")
    kept = []
    for entry in path:
        package = _package_of_archive(os.path.basename(entry)) if entry.endswith(".zip") else None
        if (
            package is not None
            and os.path.dirname(os.path.realpath(entry)) == bundled_lib
            and _installed_package_dir(path, package) is not None
        ):
            continue
        kept.append(entry)
    return kept


def main() -> None:
    sys.path[:] = without_bundled_archives(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
