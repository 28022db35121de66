"""A `--transform` for `sparkafka run` tests: fails the query once, while a flag file exists.

The flag lives in the file system (not in memory) because the failing code runs in Spark's Python
workers, and the failure must not repeat after the pipeline restarts its query."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql.functions import col, concat, lit, udf
from pyspark.sql.types import StringType


def _fail_once(value: str) -> str:
    flag = os.environ["SPARKAFKA_TEST_FAIL_FLAG"]
    try:
        os.remove(flag)
    except FileNotFoundError:
        return value
    raise RuntimeError("injected query failure (one shot)")


def fail_once_then_map(frame: DataFrame) -> DataFrame:
    checked = udf(_fail_once, StringType())
    return frame.select(concat(lit("EVENT("), checked(col("value").cast("string")), lit(")")).alias("value"))
