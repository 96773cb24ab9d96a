"""The persona benchmark's clients of the stack: /api/ as a signed-in browser uses it, and /v1 through the
real ``openai`` SDK."""

from __future__ import annotations

import re
from collections.abc import Iterable
from html import unescape
from typing import Any

import httpx


class BenchError(RuntimeError):
    pass


class Api:
    """A session-authenticated client of /api/ (CSRF token from the cookie on every write)."""

    def __init__(self, base_url: str, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, body: Any = None, *, ok: Iterable[int] = (200, 201, 202, 204),
                params: dict | None = None) -> httpx.Response:
        headers = {}
        if method != "GET":
            headers["X-CSRFToken"] = self.http.cookies.get("csrftoken", "")
        response = self.http.request(method, path, json=body, params=params, headers=headers)
        if response.status_code not in set(ok):
            raise BenchError(f"{method} {path} -> {response.status_code}: {response.text[:500]}")
        return response

    def get(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, body: Any = None, **kw) -> httpx.Response:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def signup(self, email: str, password: str) -> dict:
        """Signs up, then logs in (sign-up signs nobody in); returns the user."""
        self.request("GET", "/api/auth/csrf/")
        self.post("/api/auth/signup/", {"email": email, "password": password})
        return self.post("/api/auth/login/", {"email": email, "password": password}).json()["user"]

    def tenant_ids(self) -> dict[str, int]:
        """label -> tenant id, read from the training page, which also shows that the tenant is listed there
        (/api/me/ and /api/groups/<slug>/ carry the same ``tenant_id``)."""
        return tenant_ids_from_html(self.request("GET", "/training/").text)


def tenant_ids_from_html(html: str) -> dict[str, int]:
    """The training page's table: each row's first cell (the tenant's label) and its /training/<id>/ link."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S):
        match = re.search(r"<td>(.*?)</td>.*?href=\"/training/(\d+)/\"", row, flags=re.S)
        if match:
            found[unescape(re.sub(r"\s+", " ", match.group(1)).strip())] = int(match.group(2))
    return found


def openai_client(base_url: str, secret: str) -> Any:
    import openai

    # Generations on a busy CPU can take minutes; a timeout is a failure of the stack, not of the bench.
    return openai.OpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key=secret, max_retries=2, timeout=600)


def temperature(value: float | None) -> dict[str, float]:
    """The request's temperature, or none: vLLM then samples at the model's served default."""
    return {} if value is None else {"temperature": value}
