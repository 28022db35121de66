"""Spark's Python worker daemon, importing PySpark from its installed, compiled files.

Set as ``spark.python.daemon.module`` (sparkafka's own sessions do, see :mod:`sparkafka.runtime.session`).
It covers the executors' workers wherever they run, also when the Python executable is not
``sparkafka-python`` (a cluster's own interpreter); why, and the path rule it applies, are in
:mod:`sparkafka.runtime.python_exec`.

Steps, before anything imports PySpark:

1. apply the path rule to ``sys.path`` (:func:`sparkafka.runtime.python_exec.apply_path_rule`);
2. import PySpark's daemon and its worker module (``pyspark.worker``, which starts no thread and
   imports neither pyarrow nor pandas: PySpark's daemon leaves those to the forked workers, as
   they start threads), then move every object alive to the permanent generation (``gc.freeze()``).
   The daemon runs a full ``gc.collect()`` after every task of a reused worker, and collections
   skip frozen objects: about 30,000 of them walked per task less, as
   :mod:`sparkafka.connector.worker_heap` does for the modules the worker imports itself;
3. run PySpark's own daemon (``pyspark.daemon.manager``) unchanged; its forked workers inherit the
   path and the frozen objects.
"""

from __future__ import annotations

import gc

from sparkafka.runtime.python_exec import apply_path_rule


def main() -> None:
    apply_path_rule()
    import pyspark.worker  # noqa: F401  (imported once here rather than in every forked worker)
    from pyspark.daemon import manager

    gc.collect()
    gc.freeze()
    manager()


if __name__ == "__main__":
    main()
