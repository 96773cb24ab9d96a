"""A tiny OpenAI-compatible chat server on a real socket, for judge tests that need HTTP end to end (a worker
process, a real connection pool). Behaviour is set on the instance while it runs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, answer: Callable[[str], str] | None = None):
        self.answer = answer or (lambda prompt: "(a) the user moved on.\n\\boxed{1}")
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.fail_next: list[int] = []  # statuses to answer with, one per request, before answering normally
        self.release = threading.Event()  # requests wait for it when hold is set
        self.hold = False
        self.received = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.requests.append(body)
                    fake.headers.append(dict(self.headers))
                    status = fake.fail_next.pop(0) if fake.fail_next else 200
                fake.received.set()
                if fake.hold:
                    fake.release.wait(timeout=300)
                if status != 200:
                    return self._send(status, {"error": {"message": "try later", "type": "server_error"}})
                text = fake.answer(body["messages"][-1]["content"])
                self._send(200, {
                    "id": "cmpl-1", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                })

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def prm_or_hint(prm: str, hint: str) -> Callable[[str], str]:
    """An answer function that tells the PRM prompt from the hint prompt."""
    return lambda prompt: hint if "[HINT_START]" in prompt else prm
