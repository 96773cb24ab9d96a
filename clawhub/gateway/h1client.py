"""The gateway's completion requests to its upstreams: a small HTTP/1.1 client on asyncio with httptools'
response parser (the one uvicorn serves the gateway with), and kept-alive connections reused one request at
a time.

Measured in one process (fake upstream, 32 KB OpenClaw-shaped requests and their 32 KB replies, 32 at once,
load 9-11), the client side of one request cost 412-573 us of CPU through aiohttp and 128-227 us here:
aiohttp's request, response, stream reader, timer and connector objects were most of it. It does only what
the gateway needs: POST a body it already encoded, hand back the status and headers, then the body whole
(``aread``) or as it arrives (``aiter_raw``).

Errors are the httpx errors the gateway reasons about, as the aiohttp client before it raised them: a
kept-alive connection the server closed before answering is ``RemoteProtocolError`` (retried once on a fresh
connection: forwarding.STALE_ERRORS), a connection that cannot be made ``ConnectError``, a cut mid-body
``ReadError``, a read (or a connect, or a wait for a free connection) that took too long ``ReadTimeout``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools
import httpx
import orjson

PAUSE_BYTES = 256 * 1024  # body bytes buffered but not yet taken before reading from the upstream pauses


class _Connection(asyncio.Protocol):
    """One connection to an upstream, one request at a time: it parses the answer to the request in flight
    and keeps its body until the response takes it."""

    def __init__(self, client: UpstreamClient, key: tuple) -> None:
        self.client, self.key = client, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.busy = False
        self.idle_since = 0.0
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-cased names
        self.keep_alive = True
        self.started: asyncio.Future | None = None  # done when the answer's headers arrived
        self.waiter: asyncio.Future | None = None  # done when more body (or its end) arrived
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.complete = False
        self.error: Exception | None = None

    # --- asyncio.Protocol and httptools' callbacks ---------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_read = self.client.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response from the upstream: {exc}"))
            self.transport.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.started is not None and not self.started.done():
            self.started.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > PAUSE_BYTES and not self.paused:
            self.paused = True  # a slow reader (a client reading a stream slowly): let TCP hold the rest
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.busy and not self.complete:
            if self.started is not None and not self.started.done():
                # Closed before it answered: on a reused connection, the server dropped it while it sat idle.
                self._fail(httpx.RemoteProtocolError("Server disconnected"))
            else:
                self._fail(httpx.ReadError("Server disconnected in the middle of the response"))
        self.client.closed(self)

    # --- for the client and the response --------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        self.error = error
        for future in (self.started, self.waiter):
            if future is not None and not future.done():
                future.set_exception(error)

    def send(self, head: bytes, payload: bytes) -> asyncio.Future:
        loop = self.client.loop
        self.reset()
        self.busy = True
        self.started = loop.create_future()
        self.last_read = loop.time()
        self.transport.writelines((head, payload))
        if self.timer is None:
            self.timer = loop.call_at(self.last_read + self.client.read_timeout, self._check_read)
        return self.started

    def _check_read(self) -> None:
        """The connection's one timer: a request whose upstream sent nothing for read_timeout fails (one timer
        per connection, checked lazily, rather than one per read)."""
        self.timer = None
        if not self.busy or self.complete or self.lost:
            return
        due = self.last_read + self.client.read_timeout
        if self.client.loop.time() < due:
            self.timer = self.client.loop.call_at(due, self._check_read)
            return
        self._fail(httpx.ReadTimeout("The upstream sent nothing within the read timeout"))
        self.transport.close()

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks, self.buffered = [], 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def more(self) -> None:
        """Waits for more of the body, or its end; raises what ended the connection."""
        if self.error is not None:
            raise self.error
        self.waiter = self.client.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class UpstreamResponse:
    """An upstream's answer once its headers arrived; its body is read with ``aread`` or ``aiter_raw``."""

    __slots__ = ("_conn", "status_code", "headers", "content", "_read", "_closed")

    def __init__(self, conn: _Connection):
        self._conn = conn
        self.status_code = conn.status
        self.headers = conn.headers  # lower-cased names
        self.content = b""  # the body, once aread() read it
        self._read = self._closed = False

    async def aread(self) -> bytes:
        """The whole body; read once, then the same bytes again (forwarding reads a 400 twice)."""
        if self._read:
            return self.content
        conn = self._conn
        parts = []
        while True:
            if conn.chunks:
                parts.append(conn.take())
            if conn.complete:
                break
            await conn.more()
        self.content = parts[0] if len(parts) == 1 else b"".join(parts)
        self._read = True
        return self.content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            await conn.more()

    def json(self):
        return orjson.loads(self.content)

    async def aclose(self) -> None:
        # A fully read answer gives its connection back to the pool; one read only partly (a client went
        # away) closes it, which is what makes vLLM abort that generation.
        if not self._closed:
            self._closed = True
            self._conn.client.release(self._conn)


class UpstreamClient:
    """POSTs to upstreams over kept-alive connections: an idle one is reused for up to ``keepalive`` seconds
    (0: none is kept, every request connects), at most ``max_connections`` are open at once."""

    def __init__(self, *, keepalive: float, connect_timeout: float, read_timeout: float,
                 max_connections: int = 1024):
        self._keepalive, self._max = keepalive, max_connections
        self._connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._waiting: deque[asyncio.Future] = deque()  # requests waiting for a connection to close or free
        self._targets: dict[str, tuple] = {}  # url -> (connection key, request line and Host header)
        self._ssl: ssl.SSLContext | None = None

    def _target(self, url: str) -> tuple:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise httpx.ConnectError(f"cannot send to {url!r}: not an http(s) URL")
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            line = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            if self._keepalive <= 0:
                line += "Connection: close\r\n"
            if len(self._targets) > 256:  # upstream URLs times paths: a handful; never grows without bound
                self._targets.clear()
            target = self._targets[url] = ((parts.hostname, port, tls), line.encode("latin-1"))
        return target

    async def post(self, url: str, payload: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Sends the request; returns once the answer's headers arrived (its body is read separately)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        key, line = self._target(url)
        conn = await self._acquire(key)
        head = b"%sContent-Length: %d\r\n%s\r\n" % (
            line, len(payload), "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1"))
        try:
            await conn.send(head, payload)
        except BaseException:
            self.release(conn)
            raise
        return UpstreamResponse(conn)

    async def _acquire(self, key: tuple) -> _Connection:
        idle = self._idle.get(key)
        now = self.loop.time()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be closing
            if not conn.lost and now - conn.idle_since < self._keepalive:
                conn.busy = True
                return conn
            conn.transport.close()
        while len(self._open) >= self._max:  # as aiohttp's limit: wait for one to free, the read timeout
            waiter = self.loop.create_future()
            self._waiting.append(waiter)
            try:
                await asyncio.wait_for(waiter, self.read_timeout)
            except TimeoutError:
                raise httpx.ReadTimeout("No upstream connection was free within the read timeout") from None
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if self._idle.get(key):
                return await self._acquire(key)
        return await self._connect(key)

    async def _connect(self, key: tuple) -> _Connection:
        host, port, tls = key
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(self, key), host, port,
                                            ssl=self._ssl if tls else None),
                self._connect_timeout)
        except TimeoutError:
            # As the aiohttp client raised it (a timeout while connecting), so forwarding answers 504.
            raise httpx.ReadTimeout(f"Connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"Cannot connect to {host}:{port}: {exc}") from exc
        self._open.add(conn)
        conn.busy = True
        return conn

    def release(self, conn: _Connection) -> None:
        conn.busy = False
        if conn.lost:
            return
        if conn.complete and conn.keep_alive and conn.error is None and self._keepalive > 0:
            conn.idle_since = self.loop.time()
            self._idle.setdefault(conn.key, []).append(conn)
            self._wake_one()
        else:
            conn.transport.close()  # connection_lost calls closed()

    def closed(self, conn: _Connection) -> None:
        self._open.discard(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in list(self._open):
            conn.transport.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close
