"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) for the tests that compare
sparkafka with it: the jars ``scripts/install --test`` fetches with Maven (``tests/spark_kafka``).

Without them the tests that need them skip, saying why — except under CI (``CI=true``), where they
fail: CI must run them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SPARK_KAFKA_VERSION = (REPOSITORY / "tests" / "spark_kafka" / "version").read_text().split()[0]
# The connector and what it needs beyond the jars PySpark ships (Hadoop, Scala, compression codecs
# and logging come with PySpark; a second copy of them on the class path could clash).
_NEEDED = (
    "spark-sql-kafka-0-10_2.13-",
    "spark-token-provider-kafka-0-10_2.13-",
    "kafka-clients-",
    "commons-pool2-",
)


def spark_kafka_jars() -> list[Path]:
    """The jars to add to a SparkSession (``spark.jars``) for ``format("kafka")``, or skip (fail
    under CI) saying what is missing."""
    directory = (
        REPOSITORY / ".venv" / "share" / "sparkafka-test" / f"spark-sql-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    )
    found = [path for path in sorted(directory.glob("*.jar")) if path.name.startswith(_NEEDED)]
    if len(found) < len(_NEEDED):
        missing = (
            f"Spark's Kafka connector {SPARK_KAFKA_VERSION} is not in {directory}: "
            "scripts/install --test fetches it"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the tests against Spark's Kafka connector: {missing}")
        pytest.skip(missing)
    return found
