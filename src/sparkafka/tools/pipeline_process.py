"""`sparkafka run` as a child process in its own process group, so the demo, `verify` and the tests
can SIGKILL all of it (driver JVM, Python workers) the way `kill -9` does in seed 001."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparkafka.errors import SparkafkaError
from sparkafka.runtime.session import JIT_ENV


def quick_start_environment() -> dict[str, str]:
    """For a pipeline started for a short while (the demo's, verify's): its driver JVM compiles with
    C1 only unless ``SPARKAFKA_DRIVER_JIT`` says otherwise
    (:func:`sparkafka.runtime.session.driver_java_options`), which about halves the JVM's CPU until
    the first output."""
    return {JIT_ENV: os.environ.get(JIT_ENV, "quick")}


class PipelineProcess:
    """One `sparkafka run` command line, started (and restarted) as its own process group; its
    stdout and stderr go to ``log_path``, which :meth:`wait_for` watches."""

    def __init__(
        self,
        log_path: Path,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.log_path = log_path
        self.args = args
        # Another program than `sparkafka run` taking ``args``: a user's own PySpark script, say.
        self.command = command or [sys.executable, "-m", "sparkafka", "run"]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None  # of the last run, once :meth:`terminate` stopped it
        self._log_offset = 0

    def start(self) -> PipelineProcess:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.exit_code = None
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [*self.command, *self.args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )
        return self

    def output(self) -> str:
        """What this run (since the last start) printed."""
        with open(self.log_path, "rb") as handle:
            handle.seek(self._log_offset)
            return handle.read().decode("utf-8", "replace")

    def wait_for(self, text: str, timeout_s: float = 120, *, new: bool = False) -> None:
        """Until this run has printed ``text`` (``new``: printed from now on)."""
        if not self.printed_within(text, timeout_s, new=new):
            raise SparkafkaError(
                f"pipeline did not print {text!r} within {timeout_s} s:\n{self.output()[-4000:]}"
            )

    def printed_within(self, text: str, timeout_s: float, *, new: bool = False) -> bool:
        """Whether this run prints ``text`` within ``timeout_s`` (``new``: from now on); raises if the
        process exits first."""
        deadline = time.monotonic() + timeout_s
        seen = len(self.output()) if new else 0
        while time.monotonic() < deadline:
            if text in self.output()[seen:]:
                return True
            if self.process is not None and self.process.poll() is not None:
                raise SparkafkaError(
                    f"pipeline exited ({self.process.returncode}) before printing {text!r}:\n"
                    f"{self.output()[-4000:]}"
                )
            time.sleep(0.05)
        return False

    def kill_group(self) -> None:
        """SIGKILL the whole process group: nothing is flushed, closed or aborted."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.exit_code = self.process.wait(timeout=30)
        self.process = None

    def terminate(self, timeout_s: float = 120) -> int:
        """SIGTERM the pipeline (a clean stop) and wait for it to exit; returns its exit code. Once
        stopped, it answers the same exit code again, so a cleanup may call it whatever ran before."""
        if self.process is None:
            if self.exit_code is None:
                raise SparkafkaError(f"the pipeline logging to {self.log_path} was never started")
            return self.exit_code
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        self.exit_code = code
        return code


def run_arguments(
    bootstrap_servers: str,
    source_topic: str,
    sink_topic: str,
    checkpoint: Path,
    *,
    sql: str | None = None,
    transform: str | None = None,
    trigger: str = "1s",
    delivery_guarantee: str = "exactly-once",
    master: str = "local[2]",
    sink_options: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`sparkafka run` arguments for a pipeline reading ``source_topic`` from its beginning, running
    ``sql`` or ``transform`` (``module:function``), one of them."""
    if (sql is None) == (transform is None):
        raise ValueError("give sql or transform, one of them")
    step = ["--sql", sql] if sql is not None else ["--transform", str(transform)]
    args = [
        "--bootstrap-servers", bootstrap_servers,
        "--source-topic", source_topic,
        "--sink-topic", sink_topic,
        "--checkpoint", str(checkpoint),
        "--trigger", trigger,
        "--master", master,
        "--delivery-guarantee", delivery_guarantee,
        "--source-option", "startingOffsets=earliest",
        *step,
        *extra,
    ]  # fmt: skip
    for option in sink_options:
        args += ["--sink-option", option]
    return args
