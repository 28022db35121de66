"""The ``sparkafka`` format, found by PySpark without ``sparkafka.register(spark)``.

Spark 4 looks for Python data sources the first time a session resolves a format name: its
driver-side Python imports every top-level module whose name starts with ``pyspark_`` and registers
the ``DefaultSource`` it exports under that class's ``name()``, for every session of the JVM. The
lookup runs in the interpreter Spark starts for driver-side Python (``spark.pyspark.driver.python``,
``PYSPARK_DRIVER_PYTHON`` or ``PYSPARK_PYTHON``), so the format is found wherever sparkafka is
installed there."""

from sparkafka.connector.datasource import KafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
