"""What an agent CLI under test sends, kept for the test and its artifacts: every request to the gateway
(``Recorder``, an ASGI wrapper) and every connection it tries to open elsewhere (``VendorTrap``, an HTTP proxy
that refuses everything, so vendor hosts fail the same way offline and on a machine with a network).

Nothing secret is kept: the key headers are replaced by what they were (``Bearer <secret>``), and bodies are
kept whole only in memory (the artifacts get ``shape``: keys, sizes, roles, tool names, no text).
"""

from __future__ import annotations

import json
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Any

_SECRET_HEADERS = {"authorization": "Bearer <secret>", "x-api-key": "<secret>"}


@dataclass
class Seen:
    """One request that reached the gateway."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or None
    status: int | None = None

    def summary(self) -> dict:
        return {"method": self.method, "path": self.path, "query": self.query, "status": self.status,
                "headers": self.headers, "body": shape(self.body)}


@dataclass
class Recorder:
    """Wraps an ASGI app; ``seen`` lists the HTTP requests it served, in the order they finished."""

    app: Any = None
    seen: list[Seen] = field(default_factory=list)

    def wrapping(self, app) -> Recorder:
        """Itself, recording in front of ``app`` (for ``serve_gateway(wrap=...)``)."""
        self.app = app
        return self

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        status: list[int] = []

        async def receive_and_keep():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive_and_keep, send_and_note)
        finally:
            headers = {}
            for name, value in scope["headers"]:
                text = name.decode("latin-1").lower()
                headers[text] = _SECRET_HEADERS.get(text, value.decode("latin-1"))
            try:
                body = json.loads(b"".join(chunks)) if chunks else None
            except ValueError:
                body = None
            self.seen.append(Seen(method=scope["method"], path=scope["path"],
                                  query=scope.get("query_string", b"").decode("latin-1"), headers=headers,
                                  body=body, status=status[0] if status else None))


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def _items(items) -> list[dict]:
    """Messages (chat, Messages) or input items (Responses): role or type, block types, sizes."""
    out = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            out.append({"type": type(item).__name__})
            continue
        entry: dict = {k: item[k] for k in ("role", "type") if k in item}
        content = item.get("content")
        if isinstance(content, list):
            entry["blocks"] = [b.get("type") for b in content if isinstance(b, dict)]
        entry["chars"] = len(_text(content)) if content is not None else len(json.dumps(item))
        out.append(entry)
    return out


def _tool_name(tool) -> str:
    if not isinstance(tool, dict):
        return "?"
    return tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type") or "?"


def shape(body) -> Any:
    """A request body without its text: every top-level key, with sizes for the conversation and tools and
    the values of the small fields."""
    if not isinstance(body, dict):
        return body if body is None else type(body).__name__
    out: dict = {"keys": sorted(body), "bytes": len(json.dumps(body))}
    for name, value in body.items():
        if name in ("messages", "input") and isinstance(value, list):
            out[name] = _items(value)
        elif name in ("input", "instructions", "prompt") and isinstance(value, str):
            out[name] = {"chars": len(value)}
        elif name == "system":
            out[name] = ({"chars": len(value)} if isinstance(value, str) else
                         [{"type": b.get("type"), "chars": len(b.get("text") or ""),
                           **({"cache_control": b["cache_control"]} if "cache_control" in b else {})}
                          for b in value if isinstance(b, dict)] if isinstance(value, list) else
                         type(value).__name__)
        elif name == "tools" and isinstance(value, list):
            out[name] = sorted(_tool_name(t) for t in value)
            out["tools_bytes"] = len(json.dumps(value))
        elif name == "metadata" and isinstance(value, dict):
            out[name] = sorted(value)
        elif isinstance(value, bool | int | float) or value is None:
            out[name] = value
        elif isinstance(value, str):
            out[name] = value if len(value) <= 80 else {"chars": len(value)}
        elif isinstance(value, dict) and len(json.dumps(value)) <= 200:
            out[name] = value
        else:
            out[name] = type(value).__name__
    return out


class _Refuse(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(8192).decode("latin-1").strip()
        while self.rfile.readline(8192).strip():  # the request's headers (a proxy's own: no secrets kept)
            pass
        if line:
            self.server.attempts.append(line)  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


class VendorTrap(socketserver.ThreadingTCPServer):
    """An HTTP(S) proxy on 127.0.0.1 that refuses every request and CONNECT, keeping each request line
    (``CONNECT statsig.anthropic.com:443 HTTP/1.1``) in ``attempts``. Point HTTPS_PROXY / HTTP_PROXY at
    ``url`` with NO_PROXY=127.0.0.1 so only traffic to other hosts comes here."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Refuse)
        self.attempts: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def hosts(self) -> list[str]:
        """The hosts asked for, once each, in the order first asked."""
        found: list[str] = []
        for line in self.attempts:
            parts = line.split()
            target = parts[1] if len(parts) > 1 else line
            host = target.split("://", 1)[-1].split("/", 1)[0]
            if host not in found:
                found.append(host)
        return found

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def env(self) -> dict[str, str]:
        proxies = dict.fromkeys(("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"), self.url)
        return {**proxies, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@dataclass
class AtLeastTokens:
    """An ASGI proxy in front of an upstream (vLLM): every POST /v1/chat/completions asks for at least
    ``min_tokens`` sampled tokens (vLLM's ``min_tokens``); everything else passes unchanged, streamed or
    not."""

    upstream: str
    min_tokens: int = 4

    async def __call__(self, scope, receive, send) -> None:
        import httpx

        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (message := await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
            body = json.dumps({**json.loads(body), "min_tokens": self.min_tokens}).encode()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]
                   if k.lower() not in (b"host", b"content-length")}
        url = f"{self.upstream}{scope['path']}" + (f"?{scope['query_string'].decode()}"
                                                   if scope["query_string"] else "")
        async with httpx.AsyncClient(timeout=None) as client, client.stream(
                scope["method"], url, content=body, headers=headers) as answer:
            await send({"type": "http.response.start", "status": answer.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in answer.headers.items()
                                    if k.lower() not in ("content-length", "transfer-encoding")]})
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
