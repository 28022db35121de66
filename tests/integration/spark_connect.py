"""A Spark Connect server of the installed PySpark, started as its users start one.

The server is the package's own ``sbin/start-connect-server.sh --wait`` (in the foreground, so the
test owns its process group and can SIGKILL it), bound to loopback ports of its own; its Python
workers run this interpreter's environment, where sparkafka is installed, through the
``sparkafka-python`` launcher as README's "With Spark Connect" says. The test process is the thin
client: ``SparkSession.builder.remote("sc://…")``, no JVM of its own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pyspark
from pyspark.sql import SparkSession

from sparkafka.runtime import class_archive
from sparkafka.runtime.python_exec import launcher_path

SPARK_HOME = Path(pyspark.__file__).parent
# What PySpark sets in os.environ once a Connect session exists in the process (and never unsets).
CONNECT_ENVIRONMENT = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
START_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ConnectServer:
    """``with ConnectServer(directory) as server: spark = server.session()``.

    ``kill()`` SIGKILLs the server (driver, executors and Python workers: one process group);
    ``start()`` starts it again on the same ports, as an operator restarts a crashed server."""

    def __init__(self, directory: Path, *, cores: int = 2) -> None:
        self.directory = directory
        self.cores = cores
        self.port = _free_port()
        self.ui_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"connect-server-{self.starts}.log"

    def start(self) -> ConnectServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        python = launcher_path() or shutil.which("python3") or "python3"
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            # A fixed port: sparkafka.register() on the client announces it to the sink's tasks.
            "spark.ui.port": str(self.ui_port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.showConsoleProgress": "false",
            "spark.python.daemon.module": "sparkafka.runtime.worker_daemon",
            "spark.sql.adaptive.enabled": "false",
        }
        if archive := class_archive.driver_options():
            settings["spark.driver.extraJavaOptions"] = archive
        command = [
            str(SPARK_HOME / "sbin" / "start-connect-server.sh"),
            "--wait",
            "--master",
            f"local[{self.cores}]",
        ]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        environment = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": python,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "SPARK_PID_DIR": str(self.directory / "pids"),
            "SPARK_IDENT_STRING": f"connect-{self.port}",
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the Connect server exited at start: {self.output()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"the Connect server did not listen within {START_TIMEOUT_S:.0f} s")

    def session(self) -> SparkSession:
        """A new client session on the server (a new Spark session there), with sparkafka registered."""
        import sparkafka

        spark = SparkSession.builder.remote(self.url).create()
        sparkafka.register(spark)
        return spark

    def output(self) -> str:
        return "".join(
            path.read_text(errors="replace") for path in sorted(self.directory.glob("connect-server-*.log"))
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        self.process = None

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
