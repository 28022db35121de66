"""A Spark standalone cluster on loopback addresses for the tests: a master on 127.0.0.1 and one
worker per host address (127.0.0.1, 127.0.0.2, ...: Spark tells hosts apart by address, and places a
speculative copy of a task only on another host), started with the ``spark-class`` launcher that the
PySpark package ships, each a JVM in a process group of its own.

Executors are the worker's child processes; :meth:`StandaloneCluster.executor_pids` finds them so
that a test can SIGKILL one, as when a machine of a real cluster is lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

from sparkafka.runtime import class_archive
from tests.ports import free_ports

SPARK_HOME = Path(pyspark.__file__).parent
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class StandaloneCluster:
    """``with StandaloneCluster(directory, workers=2) as cluster:`` — ``cluster.master_url`` is the
    ``spark://`` URL to give applications. Worker ``n`` listens on 127.0.0.``n+1``."""

    def __init__(
        self, directory: Path, *, workers: int, worker_cores: int = 1, worker_memory: str = "2g"
    ) -> None:
        self.directory = directory
        self.hosts = [f"127.0.0.{n + 1}" for n in range(workers)]
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        # Every port at once: chosen one by one, the system may hand out the same port twice.
        self.master_port, self.master_ui_port, *self.worker_ports = free_ports(2 + 2 * workers)
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @staticmethod
    def environment(local_ip: str = "127.0.0.1") -> dict[str, str]:
        """What every process of the cluster and its applications needs: loopback only; the master
        and workers map the driver's class archive (:func:`executor_settings` for executors)."""
        daemon_options = " ".join(
            part
            for part in (os.environ.get("SPARK_DAEMON_JAVA_OPTS", ""), class_archive.driver_options())
            if part
        )
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": local_ip,
            "SPARK_DAEMON_JAVA_OPTS": daemon_options,
        }

    @staticmethod
    def executor_settings() -> tuple[str, ...]:
        """Settings that let an application's executors map the driver's class archive: they start
        from the same jars (a JVM that cannot use it loads its classes as usual)."""
        options = class_archive.driver_options()
        return (f"spark.executor.extraJavaOptions={options}",) if options else ()

    def __enter__(self) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
            )
            for number, host in enumerate(self.hosts):
                self._start(
                    f"worker-{number}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--port",
                    str(self.worker_ports[2 * number]),
                    "--webui-port",
                    str(self.worker_ports[2 * number + 1]),
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(self.directory / f"work-{number}"),
                    self.master_url,
                    local_ip=host,
                )
            self._wait_for_alive_workers(timeout_s=120)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self, name: str, main_class: str, *args: str, local_ip: str = "127.0.0.1") -> None:
        with open(self.directory / f"{name}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self.environment(local_ip),
                )
            )

    def _master_state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as answer:
            return json.load(answer)

    def _wait_for_alive_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                workers = self._master_state().get("workers", [])
                if sum(worker.get("state") == "ALIVE" for worker in workers) == len(self.hosts):
                    return
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster process exited ({process.returncode}):\n{self.logs()}")
            time.sleep(0.5)
        raise RuntimeError(f"the workers did not register within {timeout_s} s:\n{self.logs()}")

    def executor_stderr(self) -> str:
        """What every executor of every application printed on stderr (its Python workers' too)."""
        files = sorted(self.directory.glob("work-*/*/*/stderr"))
        return "\n".join(path.read_text(errors="replace") for path in files)

    def executor_pid_that_printed(self, text: str) -> int | None:
        """The running executor whose stderr holds ``text`` (its work directory is named by its
        executor id, which its command line carries)."""
        printed = {
            path.parent.name
            for path in self.directory.glob("work-*/*/*/stderr")
            if text in path.read_text(errors="replace")
        }
        for pid in self.executor_pids():
            with contextlib.suppress(OSError):
                command = (Path(f"/proc/{pid}") / "cmdline").read_bytes().decode(errors="replace").split("\0")
                if "--executor-id" in command and command[command.index("--executor-id") + 1] in printed:
                    return pid
        return None

    def logs(self) -> str:
        logs = sorted(self.directory.glob("*.log"))
        return "\n".join(path.read_text(errors="replace")[-3000:] for path in logs)

    def executor_pids(self) -> list[int]:
        """The executor JVMs running now (children of the worker), oldest first."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if EXECUTOR_MAIN.encode() in command and self._is_ours(int(entry.name)):
                found.append(int(entry.name))
        return sorted(found)

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` descends from one of this cluster's workers."""
        worker_pids = {process.pid for process in self.processes}
        while pid > 1:
            if pid in worker_pids:
                return True
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        return False

    def wait_for_executors(self, count: int, timeout_s: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.executor_pids()
            if len(pids) >= count:
                return pids
            time.sleep(0.5)
        raise RuntimeError(f"{count} executor(s) did not start within {timeout_s} s:\n{self.logs()}")

    def stop(self) -> None:
        for pid in self.executor_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        self.processes.clear()
