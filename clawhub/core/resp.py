"""A small Redis client for the gateway's per-request calls: one connection, commands pipelined in order.

redis-py (then without hiredis, which parses replies in C) parsed replies in Python, and it takes a connection
from a pool per call: measured in one run, the gateway's admission plus release scripts cost about 340 us of
CPU through it and 22-35 us written to a socket directly. This client sends every caller's commands over one
connection (Redis answers in order) and parses replies in one pass over what arrived. Commands are not written
one by one: what the event loop's callbacks of one round queue (the admissions, releases and capture hand-offs
of the requests that ran meanwhile) goes out in one write at the end of that round, and their replies come
back in as few reads, so concurrent requests share the system calls. One timer per connection bounds every
call, rather than one per call. Only what the hot path needs: commands in, replies out, EVALSHA with its
NOSCRIPT fallback.

Errors are redis-py's, so callers handle one family: a reply error is ``redis.ResponseError``, a lost or
refused connection ``redis.ConnectionError``, a call that waited longer than ``timeout``
``redis.TimeoutError`` (the connection is then dropped, as redis-py does: a late reply would be taken for the
next call's).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from urllib.parse import unquote, urlsplit

import redis

_CRLF = b"\r\n"


class _Incomplete(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def _as_bytes(arg) -> bytes:
    if isinstance(arg, bytes):
        return bytes(arg)
    if isinstance(arg, str):
        return str(arg).encode()
    if isinstance(arg, int | float):
        return repr(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} to Redis")


def encode(args: tuple) -> bytes:
    """One command in RESP: an array of bulk strings. (Exact type checks first: an admission sends 27
    arguments, and isinstance against a union for each cost a third of the encoding.)"""
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for arg in args:
        kind = type(arg)
        data = arg.encode() if kind is str else arg if kind is bytes else _as_bytes(arg)
        append(b"$%d\r\n" % len(data))
        append(data)
        append(_CRLF)
    return b"".join(parts)


def _parse(buffer: bytes, pos: int):
    """One reply at ``pos``: (value, position after it). Raises _Incomplete if it has not all arrived."""
    end = buffer.find(_CRLF, pos)
    if end < 0:
        raise _Incomplete
    kind, line = buffer[pos:pos + 1], buffer[pos + 1:end]
    pos = end + 2
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, pos
        if len(buffer) < pos + size + 2:
            raise _Incomplete
        return buffer[pos:pos + size], pos + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = _parse(buffer, pos)
            items.append(item)
        return items, pos
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return redis.ResponseError(line.decode("utf-8", "replace")), pos
    raise redis.ConnectionError(f"unexpected reply type {kind!r} from Redis")


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future] = deque()
        self.buffer = b""
        self.lost = False
        self.outgoing: list[bytes] = []  # commands queued in this round of the loop, written by flush()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def queue(self, loop: asyncio.AbstractEventLoop, payload: bytes) -> None:
        if not self.outgoing:
            loop.call_soon(self.flush)  # after every callback already ready in this round
        self.outgoing.append(payload)

    def flush(self) -> None:
        payload, self.outgoing = b"".join(self.outgoing), []
        if not self.lost:
            self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos = 0
        try:
            while pos < len(buffer):
                value, pos = _parse(buffer, pos)
                future = self.waiting[0]
                batch = getattr(future, "batch", None)
                if batch is not None:  # call_many: one future for all its replies, errors among them
                    batch[1].append(value)
                    if len(batch[1]) < batch[0]:
                        continue
                    value = batch[1]
                self.waiting.popleft()
                if future.done():  # its caller gave up (a timeout): the reply is dropped with it
                    continue
                if isinstance(value, redis.ResponseError):
                    future.set_exception(value)
                else:
                    future.set_result(value)
        except _Incomplete:
            pass
        except (redis.ConnectionError, ValueError, IndexError) as exc:
            self._fail(redis.ConnectionError(f"unreadable reply from Redis: {exc}"))
            self.transport.close()
            return
        self.buffer = buffer[pos:]

    def connection_lost(self, exc) -> None:
        self._fail(redis.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class RespClient:
    def __init__(self, url: str, *, timeout: float):
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"RespClient speaks redis:// only, not {parts.scheme}://")
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 6379
        self._db = int(parts.path.lstrip("/") or 0)
        self._username = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        self._timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future | None = None

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.lost:
            return protocol
        if self._connecting is None:  # one connect for every caller that finds none
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self._host, self._port), self._timeout)
        except (OSError, TimeoutError) as exc:
            where = f"{self._host}:{self._port}"
            raise redis.ConnectionError(f"cannot connect to Redis at {where}: {exc}") from exc
        setup = []
        if self._password is not None:
            user = (self._username,) if self._username else ()
            setup.append(("AUTH", *user, self._password))
        if self._db:
            setup.append(("SELECT", self._db))
        for command in setup:
            await self._send(protocol, command)
        self._protocol = protocol
        return protocol

    async def _send(self, protocol: _Protocol, args: tuple | None, many: list[tuple] | None = None):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.deadline = loop.time() + self._timeout
        if many is not None:
            future.batch = (len(many), [])
        protocol.waiting.append(future)
        protocol.queue(loop, encode(args) if many is None else b"".join(map(encode, many)))
        if protocol.timer is None:
            protocol.timer = loop.call_at(future.deadline, self._expire, protocol)
        return await future

    def _expire(self, protocol: _Protocol) -> None:
        """The connection's one timer: fails every call once the oldest unanswered one is past its deadline,
        else waits for that deadline. (A timer per call, or asyncio.wait_for, cost more CPU than the call.)"""
        protocol.timer = None
        if not protocol.waiting or protocol.lost:
            return
        loop = asyncio.get_running_loop()
        oldest = protocol.waiting[0].deadline
        if oldest > loop.time():
            protocol.timer = loop.call_at(oldest, self._expire, protocol)
            return
        # A late reply must not answer the next caller: the next call connects anew.
        protocol._fail(redis.TimeoutError(f"Redis did not answer within {self._timeout} s"))
        protocol.transport.close()

    async def call(self, *args):
        """Sends one command; returns its reply (bytes, int, a list of them, or None)."""
        return await self._send(await self._connection(), args)

    async def call_many(self, commands: list[tuple]) -> list:
        """Sends the commands in one write; returns their replies in order (a failed one as its
        ``redis.ResponseError``, not raised)."""
        if not commands:
            return []
        return await self._send(await self._connection(), None, commands)

    async def evalsha(self, script: Script, keys: list, args: list):
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self.call("EVAL", script.source, len(keys), *keys, *args)  # and Redis caches it

    async def close(self) -> None:
        if self._protocol is not None:
            self._protocol.transport.close()
            self._protocol = None


class Script:
    """A Lua script, called by its SHA1 (EVALSHA) and sent whole only the first time a Redis lacks it."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1
