"""Ways to run the broker: as the foreground process (the CLI), in a background thread of the
current process, or as a child process (what tests and the demo use, so it can be SIGKILLed)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.server import READY_LINE, Broker


def run_forever(config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT; print the ready line once connections are accepted."""

    async def main() -> None:
        broker = Broker(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await broker.start()
        print(READY_LINE.format(host=config.host, port=broker.port), flush=True)
        try:
            await stop.wait()
        finally:
            await broker.stop()

    asyncio.run(main())


class EmbeddedBroker:
    """The broker on an event loop in a daemon thread of this process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sparkafka-broker", daemon=True)
        self._broker: Broker | None = None

    @property
    def bootstrap_servers(self) -> str:
        assert self._broker is not None, "broker not started"
        return f"{self.config.host}:{self._broker.port}"

    def start(self) -> EmbeddedBroker:
        self._thread.start()

        async def start() -> Broker:
            broker = Broker(self.config)
            await broker.start()
            return broker

        self._broker = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=60)
        return self

    def stop(self) -> None:
        if self._broker is not None:
            asyncio.run_coroutine_threadsafe(self._broker.stop(), self._loop).result(timeout=60)
            self._broker = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BrokerProcess:
    """``sparkafka broker`` as a child process with its own data directory.

    ``kill()`` sends SIGKILL (nothing flushed, nothing closed), ``terminate()`` SIGTERM; ``start()``
    again restarts it on the same port and data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[str] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        command = [
            sys.executable,
            "-m",
            "sparkafka",
            "broker",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]
        log_file = open(self.log_path, "a")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
        )
        log_file.close()
        assert self.process.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                line = self.process.stdout.readline()
                if line.startswith("sparkafka broker ready on "):
                    self.port = int(line.rsplit(":", 1)[1])
                    return self
            if self.process.poll() is not None:
                break
        output = self.log_path.read_text()[-4000:] if self.log_path.exists() else ""
        self.kill()
        raise RuntimeError(f"sparkafka broker did not become ready; its log ends with:\n{output}")

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.terminate()
