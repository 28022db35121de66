"""Kafka -> Spark -> Kafka pipelines without writing Python: what `sparkafka run` and the demo start.

A pipeline reads topics with the sparkafka source, applies a SQL statement over the view ``input``
or a ``module:function`` DataFrame transform, and writes with the sparkafka sink. It restarts from
its checkpoint after a failure (Flink's fixed-delay restart strategy), and stops cleanly on
SIGINT/SIGTERM: the running micro-batch is finished, transactions it left open are aborted, and the
checkpoint is kept so the next start resumes exactly where this one stopped.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkafka.connector.api import (
    EXACTLY_ONCE,
    SinkOptions,
    SourceOptions,
    default_transactional_id_prefix,
    effective_prefix,
    fence_query_transactions,
)
from sparkafka.errors import SparkafkaError, SparkafkaOptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

# seed 001's job: "aa,bb" -> "EVENT(aa,bb)"
SEED_MAP_SQL = "SELECT key, concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
# How long a stop waits for the micro-batch in progress before cutting it short.
STOP_WAIT_S = 60


@dataclass
class PipelineConfig:
    bootstrap_servers: str
    sink_topic: str
    checkpoint: str
    source_topics: list[str] = field(default_factory=list)
    source_pattern: str | None = None
    sql: str | None = None
    transform: str | None = None
    trigger: str = "1 second"
    delivery_guarantee: str = "exactly-once"
    source_options: dict[str, str] = field(default_factory=dict)
    sink_options: dict[str, str] = field(default_factory=dict)
    query_name: str | None = None
    # append for stateless maps and watermarked windows, update for running aggregates
    output_mode: str = "append"

    def __post_init__(self) -> None:
        if bool(self.source_topics) == bool(self.source_pattern):
            raise SparkafkaOptionError(
                "give the input as --source-topic (repeatable) or --source-pattern, exactly one of them"
            )
        if self.sql and self.transform:
            raise SparkafkaOptionError("give --sql or --transform, not both")
        if self.output_mode not in ("append", "update", "complete"):
            raise SparkafkaOptionError(
                f"output mode must be append, update or complete, got {self.output_mode!r}"
            )

    def source_option_map(self) -> dict[str, str]:
        """The source's options: the input selection, then --source-option (which may override)."""
        selection = (
            {"subscribePattern": self.source_pattern}
            if self.source_pattern
            else {"subscribe": ",".join(self.source_topics)}
        )
        return {"kafka.bootstrap.servers": self.bootstrap_servers, **selection, **self.source_options}

    def sink_option_map(self) -> dict[str, str]:
        """The sink's options: topic and guarantee, then --sink-option (which may override)."""
        return {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "topic": self.sink_topic,
            "deliveryGuarantee": self.delivery_guarantee,
            **self.sink_options,
        }

    def validate_options(self) -> None:
        """Parse both option maps as the connector will, so a mistake fails before Spark starts (and
        is never taken for a failure worth a restart)."""
        SourceOptions.parse(self.source_option_map()).for_stream()
        SinkOptions.parse(self.sink_option_map())


def load_transform(spec: str) -> Callable[[DataFrame], DataFrame]:
    """``package.module:function`` -> the function (DataFrame -> DataFrame).

    The module is looked up as ``python -m`` looks up its module: the working directory first, then
    the installed packages. The ``sparkafka`` command is a console script, whose ``sys.path`` starts
    with the script's own directory instead, so a module beside the user would not be found."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise SparkafkaOptionError(f"--transform {spec!r} is not module:function, e.g. mypkg.jobs:enrich")
    working_directory = os.getcwd()
    if not any(os.path.abspath(entry or ".") == working_directory for entry in sys.path):
        sys.path.insert(0, working_directory)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SparkafkaOptionError(
            f"--transform: cannot import module {module_name!r} (looked in the working directory "
            f"{working_directory} and the installed packages): {error}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise SparkafkaOptionError(f"--transform: {module_name!r} has no function {function_name!r}")
    return function


def ship_transform_module(spark: SparkSession, spec: str, scratch: Path) -> list[Path]:
    """Make the transform's code importable by every executor's Python workers, as
    ``spark-submit --py-files`` does: each module and package it imported from the working directory.

    Why: Spark's workers import a UDF's function by name when it is defined at module level (one
    decorated with ``@udf`` travels by value, a plain function under ``udf(f)`` by reference).
    Locally they share the driver's working directory; on a cluster they run in directories of their
    own, where a module that lies beside the user is missing and every task fails with
    ModuleNotFoundError.

    Steps:

    1. import the transform's module (:func:`load_transform`);
    2. take every top-level module now imported whose file, or package directory, lies in the
       working directory (symbolic links count where they are, not where they point): the
       transform's own and whatever it imports from there;
    3. add each with ``SparkContext.addPyFile``: a module file as it is, a package zipped into
       ``scratch`` (with its directory entries, so that namespace subpackages import too, and
       without ``__pycache__``); Spark serves the files from there for the whole application, so
       ``scratch`` must outlive the session;
    4. installed packages are left to the executors' own environment.

    Returns the paths handed to Spark."""
    load_transform(spec)
    shipped = []
    for name, origin in sorted(_working_directory_modules().items()):
        if origin.is_dir():
            archive_path = scratch / f"{name}.zip"
            _zip_package(origin, name, archive_path)
        else:
            archive_path = origin
        spark.sparkContext.addPyFile(str(archive_path))
        shipped.append(archive_path)
    if shipped:
        log.info("shipped %s to the executors for --transform %s", ", ".join(map(str, shipped)), spec)
    return shipped


def _working_directory_modules() -> dict[str, Path]:
    """Top-level modules imported from the working directory: name -> module file or package dir."""
    here = Path.cwd().resolve()
    found: dict[str, Path] = {}
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        package_dirs = [Path(entry) for entry in getattr(module, "__path__", None) or []]
        module_file = getattr(module, "__file__", None)
        candidates = package_dirs or ([Path(module_file)] if module_file else [])
        for origin in candidates:
            if origin.parent.resolve() == here:
                found[name] = origin
                break
    return found


def _zip_package(directory: Path, name: str, archive_path: Path) -> None:
    with zipfile.ZipFile(archive_path, "w", zipfile.ZIP_DEFLATED, strict_timestamps=False) as archive:
        for root, dirs, files in os.walk(directory, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            relative = Path(name, Path(root).relative_to(directory))
            archive.write(root, relative)  # the directory entry itself
            for file_name in sorted(files):
                archive.write(Path(root, file_name), relative / file_name)


class PipelineStopping(SparkafkaError):
    """Raised by a micro-batch that would start writing after a stop has begun: the batch is left
    uncommitted, and the next run replays it from the checkpoint."""


class BatchGate:
    """Lets a stop wait for the micro-batch write in progress, and refuses writes once it began.

    Spark's ``StreamingQuery.stop()`` interrupts whatever runs: a batch cut in the middle of its
    write is safe (its transactions are aborted, it is replayed) but fills the log with killed
    tasks and interrupted-callback traces. Through foreachBatch the pipeline owns the write, so:

    1. :meth:`writing` brackets each batch's write; it raises :class:`PipelineStopping` once
       :meth:`close` has been called, before anything is written;
    2. :meth:`close` refuses further writes and waits (bounded) for the write in progress;
    3. the caller then stops the query, which finds no write job to interrupt.

    Invariant: a batch either writes completely before the stop or not at all; none is committed
    without its output."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._writing = False
        self._closed = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._condition:
            if self._closed:
                raise PipelineStopping("the pipeline is stopping: this micro-batch is left to the next run")
            self._writing = True
        try:
            yield
        finally:
            with self._condition:
                self._writing = False
                self._condition.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Refuse new writes; True once no write is in progress, False if one outlasted ``timeout_s``."""
        with self._condition:
            self._closed = True
            return self._condition.wait_for(lambda: not self._writing, timeout_s)


def build_query(spark: SparkSession, config: PipelineConfig, gate: BatchGate | None = None) -> StreamingQuery:
    frame = spark.readStream.format("sparkafka").options(**config.source_option_map()).load()
    if config.transform:
        frame = load_transform(config.transform)(frame)
    elif config.sql:
        frame.createOrReplaceTempView("input")
        frame = spark.sql(config.sql)
    sink_options = config.sink_option_map()
    # The one write per micro-batch of update/complete mode keeps the streaming sink's default
    # transactional ids, which _fence also uses (a df.write must name its prefix).
    keeps_default_ids = SinkOptions.parse(sink_options).transactional_id_prefix is None
    writer = (
        frame.writeStream.option("checkpointLocation", config.checkpoint)
        .outputMode(config.output_mode)
        .trigger(processingTime=config.trigger)
    )
    if config.output_mode == "append":
        writer = writer.format("sparkafka").options(**sink_options)
    else:
        # Python streaming sinks take append mode only; update/complete output goes through
        # foreachBatch, whose write tasks still know the query and batch ids, so the sink's
        # exactly-once protocol applies unchanged.
        def write_batch(batch: DataFrame, batch_id: int) -> None:
            # The query's checkpoint, which Spark hands the streaming sink but not a df.write: the sink
            # reads the batch's plan there (docs/guarantees.md, "Between two runs").
            options = {**sink_options, "checkpointLocation": config.checkpoint}
            if keeps_default_ids:
                options["transactionalIdPrefix"] = default_transactional_id_prefix(_running_query_id(batch))
            with gate.writing() if gate is not None else contextlib.nullcontext():
                batch.write.format("sparkafka").options(**options).mode("append").save()

        writer = writer.foreachBatch(write_batch)
    if config.query_name:
        writer = writer.queryName(config.query_name)
    return writer.start()


def _last_report(query: StreamingQuery) -> tuple[Any, Any] | None:
    """Which progress report the query made last (None before the first)."""
    progress = query.lastProgress
    return (progress["batchId"], progress["timestamp"]) if progress else None


def _running_query_id(batch: DataFrame) -> str:
    """The id of the streaming query whose foreachBatch function is running (Spark sets it for the
    micro-batch's jobs, which is how the sink's write tasks know it too)."""
    query_id = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        raise SparkafkaError("a foreachBatch write ran without its streaming query's id")
    return str(query_id)


@dataclass(frozen=True)
class BatchProgress:
    batch_id: int
    input_rows: int
    output_rows: int
    lag: int | None
    duration_ms: int


def batch_progress(progress: dict[str, Any]) -> BatchProgress:
    """Summarise one StreamingQueryProgress (as a dict): rows in/out, lag behind the latest offsets."""
    lag: int | None = 0
    for source in progress.get("sources", []):
        try:
            latest = _flatten_offsets(source.get("latestOffset"))
            end = _flatten_offsets(source.get("endOffset"))
        except (TypeError, ValueError):
            lag = None
            break
        if lag is not None:
            lag += sum(max(latest[k] - end.get(k, 0), 0) for k in latest)
    sink_rows = (progress.get("sink") or {}).get("numOutputRows", -1)
    return BatchProgress(
        batch_id=int(progress["batchId"]),
        input_rows=int(progress.get("numInputRows", 0)),
        output_rows=int(sink_rows) if sink_rows is not None else -1,
        lag=lag,
        duration_ms=int((progress.get("durationMs") or {}).get("triggerExecution", 0)),
    )


def _flatten_offsets(encoded: Any) -> dict[str, int]:
    import json

    if encoded is None:
        return {}
    data = json.loads(encoded) if isinstance(encoded, str) else encoded
    if not data:
        return {}
    return {f"{t}-{p}": int(o) for t, parts in data.items() for p, o in parts.items()}


class RestartBudget:
    """How many failures a pipeline may restart from, as Flink's restart strategies count them:
    ``attempts`` in the pipeline's whole life (fixed-delay), or, with ``interval_s``, at most
    ``attempts`` within any such interval (failure-rate), so that a pipeline running for months is
    not ended by rare failures far apart."""

    def __init__(self, attempts: int, interval_s: float | None = None) -> None:
        self.attempts = attempts
        self.interval_s = interval_s
        self._failed_at: deque[float] = deque()

    def allows_another(self, now: float) -> bool:
        """Count a failure at ``now`` (monotonic seconds); whether a restart is still allowed."""
        self._failed_at.append(now)
        if self.interval_s is not None:
            while self._failed_at and now - self._failed_at[0] > self.interval_s:
                self._failed_at.popleft()
        return len(self._failed_at) <= self.attempts

    @property
    def counted(self) -> int:
        return len(self._failed_at)

    def describe(self) -> str:
        if self.interval_s is None:
            return f"--restart-attempts={self.attempts}"
        return f"--restart-attempts={self.attempts} within --restart-failure-interval={self.interval_s:g}s"


class Pipeline:
    """Runs a pipeline until stopped, restarting it from its checkpoint after failures."""

    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        *,
        restart_attempts: int = 0,
        restart_delay_s: float = 2.0,
        restart_failure_interval_s: float | None = None,
        on_progress: Callable[[BatchProgress], None] | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.restart_attempts = restart_attempts
        self.restart_delay_s = restart_delay_s
        self.restart_failure_interval_s = restart_failure_interval_s
        self.on_progress = on_progress
        self._stop_requested = threading.Event()
        self._query: StreamingQuery | None = None
        self._gate: BatchGate | None = None

    def request_stop(self, *_: object) -> None:
        self._stop_requested.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)

    def run(self) -> None:
        """Start, watch, restart on failure (as :class:`RestartBudget` allows), stop cleanly."""
        from pyspark.errors import PySparkException

        budget = RestartBudget(self.restart_attempts, self.restart_failure_interval_s)
        while True:
            self._gate = BatchGate()
            try:
                self._query = build_query(self.spark, self.config, self._gate)
            except PySparkException as refused:  # bad SQL, an unknown column: as before, no restart
                raise SparkafkaError(f"the pipeline's query could not start: {refused}") from None
            error = self._watch(self._query)
            if error is None:
                return
            if not budget.allows_another(time.monotonic()):
                raise SparkafkaError(
                    f"the pipeline failed {budget.counted} time(s), more than {budget.describe()}: {error}"
                ) from None
            log.warning(
                "pipeline failed (%s); restarting from checkpoint %s in %.1f s (failure %d of %s)",
                error,
                self.config.checkpoint,
                self.restart_delay_s,
                budget.counted,
                budget.describe(),
            )
            if self._stop_requested.wait(self.restart_delay_s):
                raise SparkafkaError(f"stopped while waiting to restart; the last run had failed: {error}")

    def _watch(self, query: StreamingQuery) -> str | None:
        """Block until the query fails (its error) or a stop is requested (None)."""
        reported = -1
        while not self._stop_requested.is_set():
            if not query.isActive:
                exception = query.exception()
                return str(exception) if exception is not None else "the query stopped"
            for progress in query.recentProgress:
                if progress["batchId"] > reported:
                    reported = progress["batchId"]
                    if self.on_progress is not None:
                        self.on_progress(batch_progress(progress))
            time.sleep(0.2)
        self._stop_gracefully(query)
        return None

    def _stop_gracefully(self, query: StreamingQuery) -> None:
        """Stop after the micro-batch in progress, and keep the checkpoint:

        1. silence Spark's and py4j's logs: what the stop cuts short is expected (an unexpected
           error is reported in step 4);
        2. foreachBatch pipelines close the :class:`BatchGate`, waiting up to a minute for the
           write in progress; append pipelines wait for the micro-batch in progress (bounded alike);
        3. stop the query;
        4. report its error, unless it is the refused write of step 2;
        5. exactly-once: fence the query's transactional ids, which aborts what a cut-short batch
           left open, so read_committed readers are not held back;
        6. restore the log levels."""
        from sparkafka.runtime.session import spark_log_level

        py4j_log = logging.getLogger("py4j")
        py4j_level = py4j_log.level
        py4j_log.setLevel(logging.CRITICAL)
        self.spark.sparkContext.setLogLevel("OFF")
        try:
            self._wait_for_the_batch_in_progress(query)
            query_id = str(query.id)
            query.stop()
            error = query.exception()
            if error is not None and "the pipeline is stopping" not in str(error):
                log.error("the query failed while stopping: %s", error)
            self._fence(query_id)
        finally:
            self.spark.sparkContext.setLogLevel(spark_log_level().upper())
            py4j_log.setLevel(py4j_level)
        log.info("pipeline stopped; checkpoint kept at %s", self.config.checkpoint)

    def _wait_for_the_batch_in_progress(self, query: StreamingQuery) -> None:
        if self._gate is not None and self.config.output_mode != "append":
            if not self._gate.close(STOP_WAIT_S):
                log.warning("a micro-batch write outlasted %d s; it is cut short", STOP_WAIT_S)
            return
        # Wait for the trigger running now alone: it reports its progress when it ends. Polling for an
        # idle trigger instead never saw one while batches ran back to back (a backlog, a 0 s trigger),
        # waited the whole minute, and cut a batch short all the same. (Batch ids would not do: an idle
        # trigger's progress carries the id of the batch still to come.)
        deadline = time.monotonic() + STOP_WAIT_S
        reported = _last_report(query)
        while (
            query.isActive
            and query.status.get("isTriggerActive")
            and _last_report(query) == reported
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)

    def _fence(self, query_id: str) -> None:
        # The merged options decide: --sink-option deliveryGuarantee overrides --delivery-guarantee.
        options = SinkOptions.parse(self.config.sink_option_map())
        if options.delivery_guarantee == EXACTLY_ONCE:
            prefix = effective_prefix(options, query_id)
            fence_query_transactions(options, prefix)
