"""PyFlink competitor of the pipeline benchmark: Kafka -> Flink -> Kafka on a local mini-cluster.

Runs in the venv made by `benchmarks/systems/flink_env.py` (PyFlink 2.0 plus the Kafka connector jars of
the ``shigawire-apache-flink-libraries`` wheel) and imports only the standard library and pyflink:

    <flink venv python> benchmarks/systems/flink.py --bootstrap-servers HOST:PORT --input-topic I \\
        --output-topic O --workload map|count --guarantee exactly-once|at-least-once --work-dir DIR \\
        --commit-interval-ms 1000 [--udf python|java]

The input topic is read from the earliest offset of every partition (consumer group
``bench-flink-<output topic>``); records are ``key=k<n>``, ``value=<13-digit ms>,<padding>``.

* ``map`` (seed 001, EVENT(a,b)): one output record per input record, same key, value
  ``EVENT(<input value>)``. ``--udf python`` computes it in a Python scalar UDF called once per record;
  ``--udf java`` with SQL ``CONCAT``, so no Python runs per record.
* ``count`` (seed 003, keyed running count): one output record per input record, key = input key, value =
  the number of records seen so far for that key as ASCII decimal (so the last one per key is the
  total). ``--udf python``: DataStream ``key_by`` + a Python ``KeyedProcessFunction`` keeping the count
  in Flink keyed state; ``--udf java``: SQL ``COUNT(*) ... GROUP BY`` into an ``upsert-kafka`` sink.

Keys must be read and written, and PyFlink's DataStream KafkaSource/KafkaSink cannot read a record's key
or write one taken from a field without custom Java, so both ends are Flink SQL Kafka tables
(``key.format``/``value.format`` ``raw``); underneath they are the same KafkaSource and KafkaSink as in
the DataStream API.

Guarantees:

* ``exactly-once``: the sink is a KafkaSink with ``DeliveryGuarantee.EXACTLY_ONCE``
  (``sink.delivery-guarantee``): each subtask writes into a Kafka transaction that is committed when the
  checkpoint covering it completes, and the source offsets are part of the same checkpoint (exactly-once
  checkpoint mode, aligned barriers). Output becomes visible to ``read_committed`` readers once per
  checkpoint, i.e. every ``--commit-interval-ms``. The transactional id prefix is derived from the output
  topic (unique per benchmark run); ``transaction.timeout.ms`` is 60 s, below the broker's maximum.
* ``at-least-once``: KafkaSink with ``DeliveryGuarantee.AT_LEAST_ONCE`` (no transactions; the producer is
  flushed on each checkpoint) and at-least-once checkpoint mode (no barrier alignment), same interval.
  After a failure, records since the last checkpoint are produced again.

Checkpoints go to ``<work-dir>/checkpoints`` and Flink's logs to ``<work-dir>/log``.

Tuning, from trials at 50,000 records on this 2-core machine (alongside another busy test suite, so
rough): Python functions run in PyFlink's ``thread`` execution mode (embedded in the TaskManager JVM via
pemja) rather than the default ``process`` mode (a separate Python worker fed over Beam/gRPC): same
results, the keyed running count about 2.7x faster (about 4,100 vs 1,500 records/s) and the map no
slower. Parallelism is 2 (the machine's 2 cores, 4 input partitions): for the Python count it was
about 1.7x faster than 1, for the map the two were within noise. Both stay selectable for comparison
with the hidden options ``--python-execution-mode process`` and ``--parallelism 1``.

Runs until SIGTERM/SIGINT, then cancels the job and exits 0 within a few seconds. If the job fails
(after at most 3 restarts from the last checkpoint) the error is printed on stderr and the exit code is 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import sysconfig
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import FrameType

import pyflink
from pyflink.common import Configuration, Row, Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext, StreamExecutionEnvironment
from pyflink.datastream.state import ValueStateDescriptor
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import udf

# The benchmark's shared command line (stdlib only), next to this script.
from runner_args import consumer_group, runner_parser

PARALLELISM = 2
PYTHON_EXECUTION_MODE = "thread"
TRANSACTION_TIMEOUT_MS = 60_000
CONNECTOR_DIST = "shigawire-apache-flink-libraries"
CONNECTOR_JAR_PREFIXES = ("flink-connector-kafka", "kafka-clients")
CANCEL_TIMEOUT_S = 6.0
POLL_INTERVAL_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = runner_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--udf",
        choices=("python", "java"),
        default="python",
        help="python: the per-record work runs in a Python function; java: built-in Flink SQL only",
    )
    parser.add_argument("--parallelism", type=int, default=PARALLELISM, help=argparse.SUPPRESS)
    parser.add_argument(
        "--python-execution-mode",
        choices=("process", "thread"),
        default=None,
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args(argv)
    if args.commit_interval_ms < 10:
        parser.error("--commit-interval-ms must be at least 10")
    args.work_dir = Path(args.work_dir).resolve()
    if args.python_execution_mode is None:
        args.python_execution_mode = PYTHON_EXECUTION_MODE
        if PYTHON_EXECUTION_MODE == "thread" and not sysconfig.get_config_var("Py_ENABLE_SHARED"):
            # pemja loads libpython into the JVM; a statically linked interpreter has none to load.
            print("[flink] no shared libpython: Python functions run in process mode", file=sys.stderr)
            args.python_execution_mode = "process"
    return args


def connector_jars() -> list[Path]:
    """The Kafka connector and client jars shipped by the shigawire wheel."""
    try:
        files = metadata.distribution(CONNECTOR_DIST).files or []
    except metadata.PackageNotFoundError:
        sys.exit(f"error: {CONNECTOR_DIST} is not installed; run benchmarks/systems/flink_env.py first")
    jars = [
        Path(str(f.locate())).resolve()
        for f in files
        if f.name.endswith(".jar") and f.name.startswith(CONNECTOR_JAR_PREFIXES)
    ]
    if not all(any(j.name.startswith(prefix) for j in jars) for prefix in CONNECTOR_JAR_PREFIXES):
        found = [j.name for j in jars]
        sys.exit(f"error: {CONNECTOR_DIST} holds no flink-connector-kafka/kafka-clients jar pair: {found}")
    return jars


def pipeline_jars(jars: list[Path]) -> list[str]:
    """file:// URLs of the connector jars that must be shipped with the job.

    The shigawire wheel unpacks its jars into pyflink/lib, which PyFlink already puts on the JVM's
    classpath. Listing them in pipeline.jars as well loads kafka-clients a second time, in the
    child-first user-code class loader, and job submission fails ("cannot assign instance of
    org.apache.kafka.clients.consumer.OffsetResetStrategy to field ... of type
    org.apache.kafka.clients.consumer.OffsetResetStrategy"). So only jars outside pyflink/lib (another
    layout of the wheel) go into pipeline.jars.
    """
    lib = (Path(pyflink.__file__).resolve().parent / "lib").resolve()
    return [j.as_uri() for j in jars if j.parent != lib]


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def with_clause(options: dict[str, str]) -> str:
    return ",\n  ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in options.items())


def kafka_table_ddl(name: str, columns: str, options: dict[str, str]) -> str:
    return f"CREATE TEMPORARY TABLE {name} (\n  {columns}\n) WITH (\n  {with_clause(options)}\n)"


def source_options(args: argparse.Namespace) -> dict[str, str]:
    # Through SQL the start position is a table option, so PyFlink's KafkaTopicPartition and
    # KafkaOffsetResetStrategy helpers are never used: they name the kafka-clients classes as shaded
    # into Flink's fat connector jar (org.apache.flink.kafka.shaded.org.apache.kafka...), which the
    # plain jars of the shigawire wheel do not have.
    return {
        "connector": "kafka",
        "topic": args.input_topic,
        "properties.bootstrap.servers": args.bootstrap_servers,
        "properties.group.id": consumer_group("flink", args.output_topic),
        "scan.startup.mode": "earliest-offset",
        "key.format": "raw",
        "key.fields": "k",
        "value.format": "raw",
        "value.fields-include": "EXCEPT_KEY",
    }


def sink_options(args: argparse.Namespace, upsert: bool) -> dict[str, str]:
    options = {
        "connector": "upsert-kafka" if upsert else "kafka",
        "topic": args.output_topic,
        "properties.bootstrap.servers": args.bootstrap_servers,
        "key.format": "raw",
        "value.format": "raw",
        "value.fields-include": "EXCEPT_KEY",
        "sink.delivery-guarantee": args.guarantee,
        "properties.transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS),
    }
    if not upsert:
        # upsert-kafka takes its key from the PRIMARY KEY instead.
        options["key.fields"] = "k"
    if args.guarantee == "exactly-once":
        # One prefix per run: KafkaSink aborts lingering transactions of its own prefix on start-up, and a
        # prefix shared with an earlier run would make it probe (and fence) that run's ids too.
        options["sink.transactional-id-prefix"] = f"bench-flink-{args.output_topic}"
    return options


def event(value: str) -> str:
    return "EVENT(" + value + ")"


class RunningCount(KeyedProcessFunction):
    """Per key (the input key), emit (key, records seen so far) for every record."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield Row(value[0], str(n))


def build_job(args: argparse.Namespace) -> StreamExecutionEnvironment:
    work_dir: Path = args.work_dir
    exactly_once = args.guarantee == "exactly-once"
    config = Configuration()
    config.set_string("parallelism.default", str(args.parallelism))
    config.set_string("execution.checkpointing.interval", f"{args.commit_interval_ms} ms")
    config.set_string("execution.checkpointing.mode", "EXACTLY_ONCE" if exactly_once else "AT_LEAST_ONCE")
    config.set_string("execution.checkpointing.storage", "filesystem")
    config.set_string("execution.checkpointing.dir", (work_dir / "checkpoints").as_uri())
    # A failing job (e.g. a broker rejecting a request) should surface as a non-zero exit, not retry
    # forever as with Flink's default restart strategy under checkpointing.
    config.set_string("restart-strategy.type", "fixed-delay")
    config.set_string("restart-strategy.fixed-delay.attempts", "3")
    config.set_string("restart-strategy.fixed-delay.delay", "1 s")
    # In process mode the JVM starts the Python workers with this interpreter; by default it would be
    # whatever `python` is on PATH, which is not this venv when the driver runs us by absolute path.
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    config.set_string("python.execution-mode", args.python_execution_mode)
    jars = pipeline_jars(connector_jars())
    if jars:
        config.set_string("pipeline.jars", ";".join(jars))

    env = StreamExecutionEnvironment.get_execution_environment(config)
    t_env = StreamTableEnvironment.create(env)
    t_env.execute_sql(kafka_table_ddl("src", "k STRING,\n  v STRING", source_options(args)))
    count_in_sql = args.workload == "count" and args.udf == "java"
    sink_columns = "k STRING,\n  v STRING" + (",\n  PRIMARY KEY (k) NOT ENFORCED" if count_in_sql else "")
    t_env.execute_sql(kafka_table_ddl("snk", sink_columns, sink_options(args, upsert=count_in_sql)))

    statements = t_env.create_statement_set()
    if args.workload == "map" and args.udf == "java":
        statements.add_insert_sql("INSERT INTO snk SELECT k, CONCAT('EVENT(', v, ')') FROM src")
    elif args.workload == "map":
        t_env.create_temporary_function("bench_event", udf(event, result_type=DataTypes.STRING()))
        statements.add_insert_sql("INSERT INTO snk SELECT k, bench_event(v) FROM src")
    elif count_in_sql:
        statements.add_insert_sql("INSERT INTO snk SELECT k, CAST(COUNT(*) AS STRING) FROM src GROUP BY k")
    else:
        out_type = Types.ROW_NAMED(["k", "v"], [Types.STRING(), Types.STRING()])
        counts = (
            t_env.to_data_stream(t_env.from_path("src"))
            .key_by(lambda row: row[0], key_type=Types.STRING())
            .process(RunningCount(), output_type=out_type)
        )
        statements.add_insert("snk", t_env.from_data_stream(counts))
    statements.attach_as_datastream()
    return env


class Stop(BaseException):
    """SIGTERM or SIGINT arrived.

    A BaseException so that Py4J's `except Exception` around a socket read it interrupts does not turn
    it into a network error and retry the call.
    """


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def describe_failure(exc: BaseException) -> str:
    """The exception and its chain of Java causes, one a line, without the stack traces."""
    java = getattr(exc, "java_exception", None)  # a Py4JJavaError
    if java is None:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    causes: list[str] = []
    while java is not None and len(causes) < 10:
        causes.append(str(java.toString()).strip())
        java = java.getCause()
    return "\n  caused by: ".join(causes)


def run(args: argparse.Namespace) -> int:
    (args.work_dir / "log").mkdir(parents=True, exist_ok=True)
    # Read by PyFlink when it launches the gateway JVM (the mini-cluster): keeps each run's logs apart
    # instead of piling them up inside the venv.
    os.environ.setdefault("FLINK_LOG_DIR", str(args.work_dir / "log"))
    if args.python_execution_mode == "thread":
        # The interpreter embedded in the JVM (pemja) starts from the base Python's prefix and would
        # not see this venv's packages ("No module named 'pyflink'"); it honours PYTHONPATH, which
        # the gateway JVM inherits when PyFlink launches it below.
        paths = [str(Path(pyflink.__file__).resolve().parent.parent)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    job_name = f"bench-flink-{args.workload}-{args.guarantee}-{args.udf}"
    client = None
    try:
        env = build_job(args)
        client = env.execute_async(job_name)
        details = f"parallelism {args.parallelism}"
        if args.udf == "python":
            details += f", Python in {args.python_execution_mode} mode"
        print(f"[flink] submitted {job_name} ({details})", file=sys.stderr, flush=True)
        # The per-job mini-cluster shuts down as soon as the job ends, so asking for its status
        # afterwards fails; the result future is completed (or failed) before that and keeps the cause.
        result = client.get_job_execution_result()
        while not result.done():
            time.sleep(POLL_INTERVAL_S)
        try:
            result.result()
        except Exception as exc:
            print(f"[flink] job failed: {describe_failure(exc)}", file=sys.stderr)
            print(f"[flink] Flink logs: {args.work_dir / 'log'}", file=sys.stderr)
            return 1
        # An unbounded source never finishes on its own.
        print("[flink] job finished unexpectedly", file=sys.stderr)
        return 1
    except Stop as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # A signal to the whole process group also reaches the gateway JVM, which then shuts down while
        # we talk to it; Py4J would log a traceback for every call that finds it gone.
        logging.disable(logging.CRITICAL)
        action = "cancelling the job" if client is not None else "stopping before submission"
        print(f"[flink] {stop}: {action}", file=sys.stderr, flush=True)
        if client is not None:
            try:
                cancelled = client.cancel()
                deadline = time.monotonic() + CANCEL_TIMEOUT_S
                while not cancelled.done() and time.monotonic() < deadline:
                    time.sleep(0.1)
            except Exception as exc:
                reason = describe_failure(exc)
                print(f"[flink] could not cancel (is the JVM stopping too?): {reason}", file=sys.stderr)
        # The gateway JVM (and with it the mini-cluster and its Python workers) exits when its stdin,
        # a pipe from this process, closes: that is, when we exit.
        return 0
    except Exception as exc:
        print(f"[flink] error: {describe_failure(exc)}", file=sys.stderr)
        print(f"[flink] Flink logs: {args.work_dir / 'log'}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
