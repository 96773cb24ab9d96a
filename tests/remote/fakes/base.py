"""A threaded stdlib HTTP server that fakes a remote training service: routing, auth, recording, faults.

Each fake (tinker_server, fireworks_server) registers routes; this module runs them in a background thread,
records every request the SDK made (method, path, parsed body) so tests can compare what was SENT with
what the
batch should contain, and injects faults:

    server.faults.fail_next("/api/v1/forward_backward", status=500, times=1)   # a 500, then success
    server.faults.hang("/api/v1/create_model", seconds=30)                     # slower than any retry budget
    server.api_key = "..."                                                      # anything else is a 401
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass
class Response:
    status: int = 200
    body: bytes | dict | list = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def payload(self) -> bytes:
        if isinstance(self.body, dict | list):
            return json.dumps(self.body).encode()
        return self.body


Handler = Callable[[Request], Response]


class Faults:
    """Per-path fault switches; a path matches when it ends with the registered suffix."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fail: dict[str, list[int]] = {}
        self._hang: dict[str, float] = {}
        self.injected: list[tuple[str, str]] = []

    def fail_next(self, path_suffix: str, *, status: int = 500, times: int = 1) -> None:
        with self._lock:
            self._fail.setdefault(path_suffix, []).extend([status] * times)

    def hang(self, path_suffix: str, *, seconds: float) -> None:
        with self._lock:
            self._hang[path_suffix] = seconds

    def clear(self) -> None:
        with self._lock:
            self._fail.clear()
            self._hang.clear()

    def take(self, path: str) -> tuple[int | None, float]:
        with self._lock:
            status = None
            for suffix, statuses in self._fail.items():
                if path.endswith(suffix) and statuses:
                    status = statuses.pop(0)
                    self.injected.append(("status", path))
                    break
            delay = next((s for suffix, s in self._hang.items() if path.endswith(suffix)), 0.0)
            if delay:
                self.injected.append(("hang", path))
            return status, delay


class FakeServer:
    """Routes (method, regex) -> handler; subclasses add routes in __init__ and check auth in `authorize`."""

    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self.requests: list[Request] = []
        self.faults = Faults()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------------ set-up

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(pattern + r"$"), handler))

    def authorize(self, request: Request) -> Response | None:
        """Return an error response to refuse the request, None to let it through."""
        return None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeServer:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                response = server.dispatch(self.command, self.path, dict(self.headers.items()), body)
                payload = response.payload()
                try:
                    self.send_response(response.status)
                    self.send_header("Content-Type", response.content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in response.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to answer

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> Response:
        path, _, query = raw_path.partition("?")
        request = Request(
            method=method,
            path=path,
            headers={k.lower(): v for k, v in headers.items()},
            body=body,
            params=dict(p.split("=", 1) for p in query.split("&") if "=" in p),
        )
        if body and "json" in request.header("content-type"):
            try:
                request.json = json.loads(body)
            except ValueError:
                return Response(400, {"error": "invalid JSON"})
        self.requests.append(request)

        status, delay = self.faults.take(path)
        if delay:
            # Wait in slices so that stop() is not held up by a hanging request.
            self._stopping.wait(delay)
        if status is not None:
            return Response(status, {"error": {"message": f"injected {status}", "code": status}})
        refused = self.authorize(request)
        if refused is not None:
            return refused
        for route_method, pattern, handler in self.routes:
            match = pattern.match(path)
            if route_method == method and match:
                request.params.update(match.groupdict())
                try:
                    return handler(request)
                except Exception as exc:  # a bug in the fake must show up as a failed test, not a hang
                    return Response(500, {"error": f"fake server error: {exc!r}"})
        return Response(404, {"error": f"no fake route for {method} {path}"})

    # ------------------------------------------------------------------ inspection

    def calls(self, path_suffix: str) -> list[Request]:
        return [r for r in self.requests if r.path.endswith(path_suffix)]

    def paths(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.requests]


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
