"""A SparkSession for sparkafka's own commands, with Spark's console noise turned down."""

from __future__ import annotations

import os
import sys
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(
    app_name: str, *, master: str = "local[*]", conf: dict[str, str] | None = None
) -> SparkSession:
    """Create (or get) a session with the ``sparkafka`` format registered.

    Executors run the same Python interpreter as the caller (it has sparkafka installed); log4j
    prints errors only unless SPARKAFKA_SPARK_LOG_LEVEL says otherwise; no progress bars, no UI."""
    from pyspark.sql import SparkSession

    import sparkafka

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    level = os.environ.get("SPARKAFKA_SPARK_LOG_LEVEL", "error").lower()
    log_config = resources.files("sparkafka").joinpath("resources/log4j2.properties")
    java_options = f"-Dlog4j.configurationFile={log_config} -Dsparkafka.spark.log.level={level}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARKAFKA_SHUFFLE_PARTITIONS", "4"))
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(level.upper())
    sparkafka.register(spark)
    return spark
