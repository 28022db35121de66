"""sparkafka: exactly-once Kafka -> Spark -> Kafka pipelines for PySpark."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkafka.runtime import log_fallback

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__version__ = "0.1.0"

log_fallback.install()

__all__ = ["__version__", "format_known", "pin_write_partitioning", "publish_status_url", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``sparkafka`` format with a SparkSession, unless the session knows it already.

    After this, ``spark.readStream.format("sparkafka")`` and ``spark.read.format("sparkafka")`` read
    Kafka with the options of Spark's built-in Kafka source. Spark 4 usually finds the format by itself
    (see :mod:`pyspark_sparkafka`); this call makes a session independent of that lookup, which runs
    only where Spark's driver-side Python has sparkafka installed. A format found by the lookup is left
    as it is: registering it again would have Spark log that a statically registered data source was
    replaced. Imported lazily so that the command line tools do not pay for importing PySpark.

    It also turns adaptive execution off for stateless streaming plans
    (:func:`pin_write_partitioning`), which the exactly-once sink needs, and tells the sink's tasks
    where the driver's monitoring API is (:func:`publish_status_url`)."""
    from sparkafka.connector.datasource import KafkaDataSource

    pin_write_partitioning(spark)
    publish_status_url(spark)
    if not format_known(spark, KafkaDataSource.name()):
        spark.dataSource.register(KafkaDataSource)


def pin_write_partitioning(spark: SparkSession) -> None:
    """Turn adaptive query execution off for the session's stateless streaming plans.

    With it on (Spark's default since 4.1) Spark sizes a micro-batch's shuffle partitions by the
    data and the cores present when the batch runs, so a batch replayed after a crash can reach the
    sink split otherwise than when it was first written; the exactly-once sink refuses to write
    then. Stateful streaming plans never use adaptive execution, and batch queries keep it."""
    from sparkafka.connector.api import ADAPTIVE_STATELESS_STREAMING

    spark.conf.set(ADAPTIVE_STATELESS_STREAMING, "false")


def publish_status_url(spark: SparkSession) -> None:
    """Hand the address of the driver's web UI to the session's tasks.

    The exactly-once sink's tasks ask its monitoring API how many write partitions their micro-batch
    has and record the number in their commit markers, so that a replay split otherwise is refused
    before it writes (:mod:`sparkafka.connector.sink.stage_width`). Without a UI
    (``spark.ui.enabled=false``) nothing is published, and such a replay is found by the driver
    after it wrote. The API is asked once in the background right away
    (:func:`~sparkafka.connector.sink.stage_width.warm_up`), so the first tasks do not pay its set-up.

    A Spark Connect client has no SparkContext to ask where the UI is: it publishes the address the
    server's settings announce, ``http://{spark.driver.host}:{spark.ui.port}``, where the server
    sets ``spark.ui.port`` (Spark's default, 4040, is taken by the next application to start, which
    then binds 4041, so only a port set on purpose is trusted). The tasks check that the address
    answers for their own application (``spark.app.id``) and fall back to the checks that need no
    width otherwise, with a warning."""
    from sparkafka.connector.api import STATUS_URL_SETTING, warm_up

    try:
        url = spark.sparkContext.uiWebUrl
        app_id = spark.sparkContext.applicationId
    except Exception:  # a Spark Connect session has no SparkContext to ask
        url, app_id = _announced_status_url(spark), None
    if url:
        spark.conf.set(STATUS_URL_SETTING, url)
        if app_id:
            warm_up(url, app_id)
    else:
        spark.conf.unset(STATUS_URL_SETTING)


def _announced_status_url(spark: SparkSession) -> str | None:
    """The web UI's address by the settings of a session without a SparkContext (Spark Connect):
    None unless the UI is on and its port was set to a fixed one."""
    if (spark.conf.get("spark.ui.enabled", "true") or "").strip().lower() == "false":
        return None
    port = (spark.conf.get("spark.ui.port", None) or "").strip()
    host = (spark.conf.get("spark.driver.host", None) or "").strip()
    if not host or not port.isdigit() or int(port) == 0:
        return None
    return f"http://{host}:{port}"


def format_known(spark: SparkSession, name: str) -> bool:
    """Whether ``name`` already names a Python data source in this session (found by Spark's lookup
    or registered before). Asked of the session's JVM; False where there is none to ask (a Spark
    Connect session) or it cannot answer."""
    from py4j.protocol import Py4JError

    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))
    except (AttributeError, Py4JError):
        return False
