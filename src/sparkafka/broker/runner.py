"""Ways to run the broker: as the foreground process (the CLI), in a background thread of the
current process, or as a child process (what tests and the demo use, so it can be SIGKILLed)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.server import READY_LINE, SSL_READY_LINE, Broker

log = logging.getLogger("sparkafka.broker")


def run_forever(config: BrokerConfig, *, schema_registry: tuple[str, int] | None = None) -> None:
    """Serve until SIGTERM or SIGINT; print the ready line once connections are accepted.

    With ``schema_registry`` (host, port) a Schema Registry is served there too, storing its schemas
    in the broker's own ``_schemas`` topic; its ready line follows the broker's."""

    async def main() -> None:
        broker = Broker(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await broker.start()
        warn_if_open(config, "broker", config.host, broker.port)
        if broker.ssl_listener is not None and config.ssl_listener is not None:
            tls = config.ssl_listener
            port = broker.ssl_listener.config.port
            if tls.client_auth != "required":
                warn_if_open(config, "broker's SSL listener", tls.host, port)
            # Before the ready line, which tells a waiting parent that everything is up.
            print(SSL_READY_LINE.format(host=tls.host, port=port), flush=True)
        print(READY_LINE.format(host=config.host, port=broker.port), flush=True)
        registry = None
        try:
            if schema_registry is not None:
                from sparkafka.broker.schema_registry import READY_LINE as REGISTRY_READY_LINE
                from sparkafka.broker.schema_registry import SchemaRegistryServer

                registry = SchemaRegistryServer(
                    *schema_registry,
                    _own_client_config(config, broker.port),
                    users=config.sasl_plain_users,
                    failed_authentication_delay_s=config.connection_failed_authentication_delay_ms / 1000,
                )
                # Off the event loop: loading reads _schemas from this very broker.
                try:
                    await asyncio.to_thread(registry.start)
                except Exception as error:  # the finally below still closes what start() opened
                    host, port = schema_registry
                    raise RuntimeError(
                        f"the schema registry could not start on {host}:{port}: {error}. Pick a free port "
                        "with --schema-registry HOST:PORT (port 0 picks one)"
                    ) from error
                warn_if_open(config, "schema registry", registry.host, registry.port)
                print(REGISTRY_READY_LINE.format(url=registry.url), flush=True)
            await stop.wait()
        finally:
            if registry is not None:
                await asyncio.to_thread(registry.stop)
            await broker.stop()

    asyncio.run(main())


def loopback_only(host: str) -> bool:
    """Whether listening on ``host`` accepts connections from this machine only."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_loopback:
            return False
    return bool(addresses)


def warn_if_open(config: BrokerConfig, what: str, host: str, port: int) -> None:
    # Other machines can reach such a listener, and without SASL users nothing asks who they are.
    if config.sasl_plain_users or loopback_only(host):
        return
    exposed = "every schema and config" if what == "schema registry" else "every topic"
    log.warning(
        "the %s listens on %s:%d, reachable from other machines, without authentication: anyone who can "
        "connect can read and change %s. Listen on 127.0.0.1, or require SASL/PLAIN users with "
        "--sasl-users-file or $SPARKAFKA_BROKER_SASL_USERS",
        what,
        host or "*",
        port,
        exposed,
    )


def _own_client_config(config: BrokerConfig, port: int) -> dict[str, object]:
    """Kafka client settings for components of the broker process that talk to its own listener."""
    host = "127.0.0.1" if config.host in ("", "0.0.0.0", "::") else config.host
    client: dict[str, object] = {
        "bootstrap.servers": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "logger": logging.getLogger("sparkafka.broker.librdkafka"),
    }
    if config.sasl_plain_users:
        user = config.sasl_plain_users[0]
        client.update(
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": user.username,
                "sasl.password": user.password,
            }
        )
    return client


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
        warn_if_open(self.config, "broker", self.config.host, self._broker.port)
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
    again restarts it on the same port and data directory. ``schema_registry=True`` also serves a
    Schema Registry (``--schema-registry``) at ``schema_registry_url``, on the same port after a
    restart."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
        schema_registry: bool = False,
        schema_registry_port: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.schema_registry = schema_registry
        self.schema_registry_port = schema_registry_port
        self._schema_registry_url: str | None = None
        # The TLS listener's port, once started with --ssl-listen in extra_args
        self.ssl_port: int | None = None
        self.process: subprocess.Popen[str] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ssl_bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` of the TLS listener (``--ssl-listen`` in ``extra_args``)."""
        if self.ssl_port is None:
            raise RuntimeError("this broker has no SSL listener: pass --ssl-listen HOST:PORT in extra_args")
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def schema_registry_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the Schema Registry (started with ``schema_registry=True``)."""
        if self._schema_registry_url is None:
            raise RuntimeError(
                "this broker runs no schema registry: create BrokerProcess(..., schema_registry=True) "
                "(or pass --schema-registry HOST:PORT in extra_args) and start() it"
            )
        return self._schema_registry_url

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
        self._schema_registry_url = None
        if self.schema_registry:
            command += ["--schema-registry", f"127.0.0.1:{self.schema_registry_port}"]
        wants_registry = "--schema-registry" in command
        log_file = open(self.log_path, "a")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
        )
        log_file.close()
        assert self.process.stdout is not None
        broker_ready = False
        # Read from the descriptor, not with readline(): lines printed together would wait in the
        # file object's buffer, where select() does not see them.
        received = b""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                received += os.read(self.process.stdout.fileno(), 65536)
                *lines, received = received.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("sparkafka broker SSL listener ready on "):
                        self.ssl_port = int(line.rsplit(":", 1)[1])
                    elif line.startswith("sparkafka broker ready on "):
                        self.port = int(line.rsplit(":", 1)[1])
                        broker_ready = True
                    elif line.startswith("sparkafka schema registry ready on "):
                        self._schema_registry_url = line.rsplit(" ", 1)[1]
                        self.schema_registry_port = int(self._schema_registry_url.rsplit(":", 1)[1])
                if broker_ready and (not wants_registry or self._schema_registry_url is not None):
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
