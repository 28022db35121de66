"""Spark's Python worker daemon, importing PySpark from its installed, compiled files.

Set as ``spark.python.daemon.module`` (sparkafka's own sessions do, see :mod:`sparkafka.runtime.session`).
It covers the executors' workers wherever they run, also when the Python executable is not
``sparkafka-python`` (a cluster's own interpreter); why, and the path rule it applies, are in
:mod:`sparkafka.runtime.python_exec`.

Steps, before anything imports PySpark: apply the path rule to ``sys.path``
(:func:`sparkafka.runtime.python_exec.apply_path_rule`), then run PySpark's own daemon
(``pyspark.daemon.manager``) unchanged; its forked workers inherit the path.
"""

from __future__ import annotations

from sparkafka.runtime.python_exec import apply_path_rule


def main() -> None:
    apply_path_rule()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
