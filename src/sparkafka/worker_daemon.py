"""Earlier name of :mod:`sparkafka.runtime.worker_daemon`, kept for ``spark.python.daemon.module``
settings that name it. Imports nothing of PySpark, as the daemon it starts requires."""

from sparkafka.runtime.worker_daemon import main

if __name__ == "__main__":
    main()
