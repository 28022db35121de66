"""One client connection of the broker: framing, back-pressure, connection limits and the SASL gate.

A connection cuts size-prefixed frames from what it receives, queues them, and hands them one at a
time to its broker (:class:`ConnectionHost`, which :class:`~sparkafka.broker.server.Broker` is), writing
each response before it takes the next request, as Kafka handles a connection's requests in order.
It depends on the broker only through :class:`ConnectionHost`: its settings, the memory and
connection bounds shared by all connections, the set of open connections, and ``handle``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from kafka.protocol.sasl import SaslHandshakeResponse

from sparkafka.broker import protocol
from sparkafka.broker.config import BrokerConfig
from sparkafka.broker.errors import ErrorCode
from sparkafka.broker.handlers import api_versions_response
from sparkafka.broker.handlers.data import FAST_HANDLERS, NOT_HANDLED
from sparkafka.broker.limits import LISTEN_BACKLOG, ConnectionQuotas, RequestMemory
from sparkafka.broker.log_segment import FileRegion
from sparkafka.broker.sasl import (
    SaslState,
    answered_out_of_order,
    plain_authentication_error,
)

log = logging.getLogger("sparkafka.broker")


@dataclass(frozen=True, slots=True)
class Listener:
    """A listener other than the plaintext one, as its clients see the broker: ``config`` is the
    broker's config with ``host`` and ``port`` set to the address advertised on this listener."""

    name: str
    config: BrokerConfig


@dataclass(slots=True)
class RequestContext:
    api_key: int
    version: int
    correlation_id: int
    client_id: str
    client_host: str
    connection: Connection


# The listener the current request arrived on, set in each TLS connection's task (tasks copy the
# context they start in); None: the plaintext listener. Kafka answers Metadata, FindCoordinator and
# DescribeCluster with the addresses of the listener the request came on, so a client that
# bootstrapped on the TLS port is sent to the TLS port.
_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("listener", default=None)


def current_listener() -> Listener | None:
    """The listener the request being handled arrived on; None: the plaintext listener."""
    return _LISTENER.get()


class ConnectionHost(Protocol):
    """What a connection needs of its broker."""

    request_memory: RequestMemory
    connection_quotas: ConnectionQuotas[Connection]
    # Every open connection: a stop closes them, idle ones are closed by connections.max.idle.ms.
    connections: set[Connection]

    @property
    def config(self) -> BrokerConfig: ...

    async def handle(self, request: Any, context: RequestContext) -> Any: ...


# Frames up to this size are received into a connection's reusable buffer and copied out; larger ones
# (produce batches) are received straight into a buffer of their own, with no further copy. Small
# enough that thousands of idle connections cost little memory.
_RECEIVE_BUFFER_BYTES = 64 * 1024
# Read-ahead: stop reading from a client once this many bytes of requests wait to be handled, resume
# below half of it. Requests are still handled one at a time and answered in order.
_MAX_QUEUED_BYTES = 8 * 1024 * 1024
_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class _BadSize:
    """Queued in place of a frame whose announced size is out of bounds: the connection closes there."""

    size: int


class Connection(asyncio.BufferedProtocol):
    """One client connection: receive frames, handle them one at a time in order, write responses.

    Receiving (get_buffer/buffer_updated, called by the event loop): size-prefixed frames are cut from
    the received bytes and queued; a frame too large for the receive buffer gets a buffer of its own
    that the socket fills directly. A task (_serve) takes frames from the queue, handles each and writes
    its response before taking the next, as Kafka handles a connection's requests in order. Responses
    are bytes, or pieces (bytes and file regions sent with sendfile) from the fast fetch path.
    """

    def __init__(self, broker: ConnectionHost, listener: Listener | None = None) -> None:
        self.broker = broker
        # None: the plaintext listener
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.client_ip = "unknown"
        self.client_host = "/unknown"
        # For connections.max.idle.ms: when bytes last came in or a response went out.
        self.last_active = time.monotonic()
        # What the connection may send before it is authenticated (sparkafka.broker.sasl).
        self.sasl_state = (
            SaslState.HANDSHAKE_OR_VERSIONS if broker.config.sasl_plain_users else SaslState.COMPLETE
        )
        # Set by a handler whose answer ends the connection (failed authentication), as Kafka does.
        self.close_after_response = False
        self.task: asyncio.Task[Any] | None = None
        self._logged_bad_input = False
        self._max_request_bytes = broker.config.socket_request_max_bytes
        self._max_unauthenticated_bytes = broker.config.sasl_server_max_receive_size
        # Receive state: the first _end bytes of _buffer are received but not yet cut into frames; a
        # large frame being received goes to _frame (grown as its body arrives, up to _frame_size), of
        # which _filled bytes have arrived.
        self._buffer = bytearray(_RECEIVE_BUFFER_BYTES)
        self._buffer_view = memoryview(self._buffer)
        self._end = 0
        self._frame: bytearray | None = None
        self._frame_size = 0
        self._filled = 0
        self._stopped_receiving = False
        self._frames: collections.deque[bytes | bytearray | _BadSize] = collections.deque()
        self._queued_bytes = 0
        self._queue_full = False
        # Bytes of this connection's requests counted in broker.request_memory.
        self._held = 0
        self._reading_paused = False
        self._eof = False
        self._frame_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # -- asyncio protocol callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.client_ip = str(peer[0])
            self.client_host = f"/{self.client_ip}"
        self.broker.connections.add(self)  # now, so that a stop() from here on closes it
        quotas = self.broker.connection_quotas
        if quotas.full:
            # Kafka stops accepting at max.connections: the client waits, unanswered, in the backlog.
            if len(quotas.waiting) >= LISTEN_BACKLOG:
                log.info(
                    "closing connection from %s: max.connections=%d reached and %d connections waiting",
                    self.client_host,
                    quotas.max_connections,
                    LISTEN_BACKLOG,
                )
                self.close()
                return
            self._reading_paused = True
            transport.pause_reading()
            quotas.waiting.append(self)
            return
        self._admit()

    def _admit(self) -> None:
        """Serve the connection, unless its address has max.connections.per.ip connections already."""
        if not self.broker.connection_quotas.enter(self.client_ip):
            # Kafka's words (ConnectionQuotas.TooManyConnectionsException, logged by the Acceptor).
            log.info(
                "Rejected connection from %s, address already has the configured maximum of %d connections.",
                self.client_ip,
                self.broker.connection_quotas.max_connections_per_ip,
            )
            self.close()
            return
        self.last_active = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._serve())
        self.update_reading()

    def _leave(self) -> None:
        quotas = self.broker.connection_quotas
        quotas.leave(self.client_ip)
        while quotas.waiting and not quotas.full:
            waiting = quotas.waiting.popleft()
            if waiting.transport is not None and not waiting.transport.is_closing():
                waiting._admit()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            if self._filled == len(self._frame):
                self._grow_frame()
            return memoryview(self._frame)[self._filled :]
        return self._buffer_view[self._end :]

    def _grow_frame(self) -> None:
        """Room for more of a large frame's body, never from its declared size alone: double what
        has arrived (so a long body is copied about once in all), within the memory budget."""
        frame = self._frame
        assert frame is not None
        step = min(self._frame_size, max(2 * len(frame), _RECEIVE_BUFFER_BYTES)) - len(frame)
        room = self.broker.request_memory.room(self)
        if room is not None:
            step = min(step, max(room, _RECEIVE_BUFFER_BYTES))
        zeros = bytes(step)  # calloc'ed: pages not written stay out of the process's memory
        try:
            frame += zeros
        except BufferError:  # a view of the frame is still alive somewhere: grow a copy instead
            self._frame = bytearray(frame) + zeros
        self._held += step
        self.broker.request_memory.take(step)

    def buffer_updated(self, nbytes: int) -> None:
        if self._stopped_receiving:
            return
        self.last_active = time.monotonic()
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == self._frame_size:
                frame, self._frame = self._frame, None
                self.broker.request_memory.end_frame(self)
                self._enqueue(frame)
            elif self._filled == len(self._frame):
                self.update_reading()  # the rest needs memory: wait here if the budget is spent
            return
        self._end += nbytes
        self._cut_frames()

    def eof_received(self) -> bool:
        # Keep the transport open for the answers to requests already received (a half-closed client).
        self._eof = True
        self._wake_serve()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is None:  # never served: it waited for a free slot, or was refused
            with contextlib.suppress(ValueError):
                self.broker.connection_quotas.waiting.remove(self)
            self.broker.connections.discard(self)
        self._eof = True
        self._wake_serve()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- receiving --------------------------------------------------------------------------------

    def _receive_limit(self) -> int:
        """The largest request this connection takes now: Kafka's SaslServerAuthenticator holds every
        request before authentication to sasl.server.max.receive.size (512 KiB by default), so a client that
        has not logged in cannot make the broker buffer socket.request.max.bytes."""
        if self.authenticated:
            return self._max_request_bytes
        return min(self._max_request_bytes, self._max_unauthenticated_bytes)

    def _cut_frames(self) -> None:
        """Queue every complete frame in the receive buffer; start a large frame's own buffer; move the
        rest to the buffer's start so a frame that fits the buffer always finds room."""
        buffer = self._buffer_view
        start, end = 0, self._end
        while end - start >= 4:
            (size,) = _SIZE.unpack_from(buffer, start)
            if size < 0 or size > self._receive_limit():
                self._enqueue(_BadSize(size))
                self._stopped_receiving = True  # nothing after a bad size is a request
                start = end
                break
            if end - start - 4 >= size:
                self._enqueue(bytes(buffer[start + 4 : start + 4 + size]))
                start += 4 + size
            elif size + 4 > len(buffer):
                # Its own buffer, grown by get_buffer as the body arrives.
                self._frame = bytearray(buffer[start + 4 : end])
                self._frame_size = size
                self._filled = len(self._frame)
                self._held += self._filled
                memory = self.broker.request_memory
                memory.take(self._filled)
                memory.start_frame(self)
                start = end
                break
            else:
                break
        if start:
            remaining = end - start
            buffer[:remaining] = bytes(buffer[start:end])
            self._end = remaining

    def _enqueue(self, frame: bytes | bytearray | _BadSize) -> None:
        """Queue a complete frame; a large frame's bytes are counted in request_memory already."""
        self._frames.append(frame)
        if not isinstance(frame, _BadSize):
            self._queued_bytes += len(frame)
            if isinstance(frame, bytes):
                self._held += len(frame)
                self.broker.request_memory.take(len(frame))
        if self._queued_bytes > _MAX_QUEUED_BYTES:
            self._queue_full = True
        if self._queue_full or self.broker.request_memory.exhausted:
            self.update_reading()
        self._wake_serve()

    def update_reading(self) -> None:
        """Pause reading while this connection's own queue is long (read-ahead) or while the
        broker's request memory is spent (unless this connection may finish its large frame);
        resume otherwise. Called again by request_memory when memory is given back."""
        transport = self.transport
        if transport is None or self.task is None or self._stopped_receiving:
            return
        memory = self.broker.request_memory
        blocked = not memory.may_read(self)
        if blocked:
            memory.wait(self)
        else:
            memory.stop_waiting(self)
        pause = self._queue_full or blocked
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _release(self, size: int) -> None:
        self._held -= size
        self.broker.request_memory.give_back(size)

    def _release_all(self) -> None:
        self._stopped_receiving = True
        self._frame = None
        self._frames.clear()
        self.broker.request_memory.forget(self)
        self._release(self._held)

    def _wake_serve(self) -> None:
        waiter, self._frame_waiter = self._frame_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _next_frame(self) -> bytes | bytearray | _BadSize | None:
        """The next received frame, or None once the client closed and every frame was handled."""
        while not self._frames:
            if self._eof:
                return None
            self._frame_waiter = asyncio.get_running_loop().create_future()
            await self._frame_waiter
        frame = self._frames.popleft()
        if not isinstance(frame, _BadSize):
            self._queued_bytes -= len(frame)
            if self._queue_full and self._queued_bytes <= _MAX_QUEUED_BYTES // 2:
                self._queue_full = False
                self.update_reading()
        return frame

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self, response: bytes | list[Any]) -> None:
        """Write a response: bytes, or pieces of which file regions go out with sendfile (each closed once
        sent). Returns when the transport's buffer is below its high-water mark."""
        transport = self.transport
        assert transport is not None
        self.last_active = time.monotonic()
        if isinstance(response, bytes):
            # A memoryview: the transport then keeps what the socket did not take without a copy first.
            transport.write(memoryview(response) if len(response) > 65536 else response)
        else:
            try:
                for piece in response:
                    if isinstance(piece, FileRegion):
                        await self._send_region(piece)
                    else:
                        transport.write(piece)
            finally:
                for piece in response:
                    if isinstance(piece, FileRegion):
                        piece.close()
        if self._writing_paused:
            if transport.is_closing():
                raise ConnectionResetError("connection lost")
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        self.last_active = time.monotonic()

    async def _send_region(self, region: FileRegion) -> None:
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            raise ConnectionResetError("connection lost")
        try:
            await asyncio.get_running_loop().sendfile(
                transport, cast(Any, region), region.offset, region.count, fallback=False
            )
        except (asyncio.SendfileNotAvailableError, NotImplementedError, RuntimeError):
            # An event loop, transport or platform without native sendfile (RuntimeError: "not
            # supported for transport"): the bytes go through memory instead.
            if transport.is_closing():
                raise ConnectionResetError("connection lost") from None
            transport.write(region.read())
        finally:
            region.close()

    # -- handling ---------------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.sasl_state is SaslState.COMPLETE

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping unsent output: a client that stopped reading would keep a
        graceful close (and with it the broker's stop) waiting for ever."""
        if self.transport is not None:
            self.transport.abort()

    def cancel(self) -> None:
        """End the connection's task too: a response going out with sendfile waits on the socket,
        and an aborted transport never wakes that wait."""
        self.abort()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def log_authentication_failure(self, reason: str) -> None:
        log.info("failed authentication with %s (%s)", self.client_host, reason)

    def _log_bad_input_once(self, message: str) -> None:
        if not self._logged_bad_input:
            self._logged_bad_input = True
            log.warning("closing connection from %s: %s", self.client_host, message)

    async def _serve(self) -> None:
        # Always set: a task admitted from another connection's teardown starts in a copy of that
        # task's context, whose listener may be the other one (TLS for a plaintext client).
        _LISTENER.set(self.listener)  # this task's own context: its requests, and what they start
        try:
            while True:
                frame = await self._next_frame()
                if frame is None:
                    return
                if isinstance(frame, _BadSize):
                    limit = (
                        f"socket.request.max.bytes={self._max_request_bytes}"
                        if self.authenticated
                        else f"sasl.server.max.receive.size={self._max_unauthenticated_bytes} before "
                        "authentication"
                    )
                    self._log_bad_input_once(f"request size {frame.size} is outside [0, {limit}]")
                    return
                response: bytes | list[Any] | Literal[False] | None
                if self.sasl_state is SaslState.RAW_TOKEN:
                    response = self._raw_sasl_token(bytes(frame))
                else:
                    response = await self._respond(frame)
                if response is False:
                    return
                if self.close_after_response:
                    # Kafka holds the answer to a failed authentication for
                    # connection.failed.authentication.delay.ms (default 100 ms), then closes: a
                    # guesser learns nothing sooner by dropping the connection, and answering before
                    # the close lets clients such as kafka-python read the error.
                    await asyncio.sleep(self.broker.config.connection_failed_authentication_delay_ms / 1000)
                if response is not None:
                    await self._write(response)
                self._release(len(frame))
                if self.close_after_response:
                    return
        except ConnectionError:
            return
        except Exception:
            log.exception("unexpected error serving %s; connection closed", self.client_host)
        finally:
            self.close()
            self._release_all()
            self.broker.connections.discard(self)
            self._leave()

    def _raw_sasl_token(self, token: bytes) -> bytes | None:
        """The SASL/PLAIN token that follows a SaslHandshake v0: on success the (empty) server challenge,
        size-prefixed; on failure the connection is closed without an answer (after the failed
        authentication delay), as Kafka does."""
        error = plain_authentication_error(self.broker.config.sasl_plain_users, token)
        if error is not None:
            self.log_authentication_failure(error)
            self.close_after_response = True
            return None
        self.sasl_state = SaslState.COMPLETE
        return struct.pack(">i", 0)

    def _refuse_before_authentication(self, header: protocol.RequestHeader) -> bytes | Literal[False]:
        """A request SASL authentication does not expect now: closed unanswered, or answered
        ILLEGAL_SASL_STATE first (sparkafka.broker.sasl, :func:`answered_out_of_order`)."""
        self.log_authentication_failure(
            f"unexpected request (api key {header.api_key}) during SASL authentication "
            f"({self.sasl_state.name.lower()})"
        )
        if not answered_out_of_order(self.sasl_state, header.api_key):
            return False
        version = header.api_version
        if header.api_key == protocol.ApiKey.API_VERSIONS:
            response = api_versions_response(ErrorCode.ILLEGAL_SASL_STATE)
            # An ApiVersions version this broker lacks is answered as v0, as KIP-511 answers it.
            version = version if protocol.is_supported(header.api_key, version) else 0
        elif protocol.is_supported(header.api_key, version):
            response = SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
        else:
            return False
        self.close_after_response = True
        return protocol.encode_response(response, version, header.correlation_id)

    async def _respond(self, frame: bytes | bytearray) -> bytes | list[Any] | Literal[False] | None:
        """The encoded response (bytes, or pieces from a fast handler), None when none is due (acks=0),
        False to close the connection."""
        try:
            header = protocol.peek_header(frame)
        except protocol.MalformedRequest as exc:
            self._log_bad_input_once(str(exc))
            return False
        unknown_api_versions = header.api_key == protocol.ApiKey.API_VERSIONS and not protocol.is_supported(
            header.api_key, header.api_version
        )
        if unknown_api_versions and header.api_version >= protocol.API_VERSIONS_FIRST_FLEXIBLE:
            # Answered below (KIP-511), but only once its header, a flexible one, could be read.
            try:
                protocol.check_header_tagged_fields(frame)
            except protocol.MalformedRequest as exc:
                self._log_bad_input_once(str(exc))
                return False
        if not self.sasl_state.accepts(header.api_key):
            return self._refuse_before_authentication(header)
        if unknown_api_versions:
            # KIP-511: answer an unknown ApiVersions version with v0 and UNSUPPORTED_VERSION so the
            # client can retry with a version we list.
            return protocol.encode_response(
                api_versions_response(ErrorCode.UNSUPPORTED_VERSION), 0, header.correlation_id
            )
        if not protocol.is_supported(header.api_key, header.api_version):
            self._log_bad_input_once(
                f"unsupported request api key {header.api_key} version {header.api_version} "
                f"from client {header.client_id!r}"
            )
            return False
        context = RequestContext(
            header.api_key,
            header.api_version,
            header.correlation_id,
            header.client_id or "",
            self.client_host,
            self,
        )
        fast_handler = FAST_HANDLERS.get(header.api_key)  # type: ignore[call-overload]
        if fast_handler is not None:
            fast_response = await fast_handler(self.broker, frame, context)
            if fast_response is not NOT_HANDLED:
                return cast("bytes | list[Any] | None", fast_response)
        try:
            request = protocol.decode_request(header, frame)
        except protocol.MalformedRequest as exc:
            self._log_bad_input_once(str(exc))
            return False
        response = await self.broker.handle(request, context)
        if response is None or response is False:
            return cast("Literal[False] | None", response)
        return protocol.encode_response(response, header.api_version, header.correlation_id)
