"""The gateway's connections to its upstreams, over aiohttp's HTTP/1.1 client.

Completions go through ``UpstreamClient``: one aiohttp session and a response object with only what the
gateway reads (status, headers, ``aread``, ``aiter_raw``, ``aclose``). Measured per request in one run,
httpx's own transport (httpcore + h11) cost about 0.7 ms of CPU on an agent-sized request, httpx's API over
aiohttp (``UpstreamTransport``) 440-485 us, aiohttp alone 160-230 us: httpx's request, header and response
models were most of it. The rare calls (health checks, /v1/models, adapter loads, /tokenize) keep httpx's API
over the same kind of aiohttp pool (``UpstreamTransport``): the admin helpers they share with the workers
speak httpx.

Both translate aiohttp's errors into the httpx errors the gateway reasons about: a kept-alive connection the
server closed is ``RemoteProtocolError`` (retried once: forwarding.STALE_ERRORS), a connection that cannot be
made ``ConnectError``, a cut mid-body ``ReadError``, a read that waited too long ``ReadTimeout``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport


def _translated(exc: BaseException) -> BaseException | None:
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(str(exc) or "Server disconnected")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, aiohttp.ServerTimeoutError | aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(str(exc))
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientOSError | aiohttp.ClientConnectionError):
        return httpx.ReadError(str(exc))
    return None


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """While sending: aiohttp's connection errors and timeouts raised as the httpx errors callers catch."""
    try:
        yield
    except aiohttp.ClientError as exc:
        translated = _translated(exc)
        if translated is None:
            raise
        raise translated from exc
    except TimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "timed out") from exc


def _raised(exc: BaseException) -> BaseException:
    """The httpx error for an aiohttp failure (or a timeout) while a request was sent or its answer read."""
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out")
    return _translated(exc) or httpx.ReadError(str(exc))


def _session(keepalive: float, max_connections: int) -> aiohttp.ClientSession:
    """``keepalive``: seconds an idle connection is kept (0: none is kept, every request connects)."""
    connector_args = {"force_close": True} if keepalive <= 0 else {"keepalive_timeout": keepalive}
    connector = aiohttp.TCPConnector(limit=max_connections, **connector_args)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


def _release(response: aiohttp.ClientResponse) -> None:
    # Releases a fully read connection to the pool; one read only partly (a client went away) is closed,
    # which is what makes vLLM abort that generation.
    if response.content.at_eof():
        response.release()
    else:
        response.close()


class UpstreamResponse:
    """An upstream's answer once its headers arrived; its body is read with ``aread`` or ``aiter_raw``."""

    __slots__ = ("_response", "status_code", "headers", "content")

    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response
        self.status_code = response.status
        self.headers = response.headers  # case-insensitive
        self.content = b""  # the body, once aread() read it

    async def aread(self) -> bytes:
        try:
            self.content = await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _raised(exc) from exc
        return self.content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _raised(exc) from exc

    def json(self):
        return orjson.loads(self.content)

    async def aclose(self) -> None:
        _release(self._response)


class UpstreamClient:
    """POSTs to upstreams over one pool of kept-alive connections (``keepalive`` as in ``_session``)."""

    def __init__(self, *, keepalive: float, connect_timeout: float, read_timeout: float,
                 max_connections: int = 1024):
        self._keepalive, self._max = keepalive, max_connections
        self._session: aiohttp.ClientSession | None = None
        # As httpx.Timeout(read_timeout, connect=connect_timeout) was: each read and the wait for a pooled
        # connection are bounded by the read timeout, making a connection by the connect timeout.
        self._timeout = aiohttp.ClientTimeout(sock_connect=connect_timeout, sock_read=read_timeout,
                                              connect=read_timeout)

    async def post(self, url: str, payload: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Sends the request; returns once the answer's headers arrived (its body is read separately)."""
        if self._session is None:  # made on the running loop, on first use
            self._session = _session(self._keepalive, self._max)
        with _as_httpx_errors():
            response = await self._session.post(url, data=payload, headers=headers, allow_redirects=False,
                                                 compress=False, timeout=self._timeout)
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Stream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise (_translated(exc) or httpx.ReadError(str(exc))) from exc

    async def aclose(self) -> None:
        _release(self._response)


class UpstreamTransport(AiohttpTransport):
    """httpx's API over an aiohttp pool (``keepalive`` as in ``_session``)."""

    def __init__(self, *, keepalive: float, max_connections: int = 1024):
        super().__init__(client=lambda: _session(keepalive, max_connections))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        with _as_httpx_errors():
            response = await self.client.request(
                method=request.method, url=str(request.url), headers=request.headers,
                data=request.content or None, allow_redirects=False, auto_decompress=False, compress=False,
                timeout=aiohttp.ClientTimeout(sock_connect=timeout.get("connect"),
                                              sock_read=timeout.get("read"), connect=timeout.get("pool")),
            ).__aenter__()
        return httpx.Response(status_code=response.status, headers=response.raw_headers,
                              stream=_Stream(response), request=request,
                              extensions={"http_version": b"HTTP/1.1"})
