"""The gateway's rare calls to its upstreams (health checks, /v1/models, adapter loads, /tokenize): httpx's
API over an aiohttp pool (``UpstreamTransport``), because the admin helpers they share with the workers speak
httpx. Completions go through clawhub.gateway.h1client instead: measured per request in one run, httpx's own
transport (httpcore + h11) cost about 0.7 ms of CPU on an agent-sized request, httpx's API over aiohttp
440-485 us, aiohttp alone 160-230 us (412-573 us with 32 KB bodies both ways), h1client 128-227 us.

aiohttp's errors are translated into the httpx errors the gateway reasons about: a kept-alive connection the
server closed is ``RemoteProtocolError``, a connection that cannot be made ``ConnectError``, a cut mid-body
``ReadError``, a read that waited too long ``ReadTimeout``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx
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
