"""Operational endpoints: /healthz (liveness), /readyz (the web app's readiness), /readyz/gateway (the /v1
gateway's readiness: what the probe of pods that serve /v1 asks), /metrics (Prometheus).

``OpsEndpointsMiddleware`` answers these three paths before anything else runs. Probes and scrapers reach a
pod by its IP, which is not in ALLOWED_HOSTS, and must not be redirected to HTTPS, touch the session or depend
on the database (liveness): the normal stack would fail them for reasons that say nothing about health.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from clawhub.core.metrics import render_metrics

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 1.0

# A readiness check: its detail for the body, or an exception (CheckFailed for its own verdict).
Check = Callable[[], dict[str, Any] | None]


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The process is alive and serving. Touches nothing else, so a database outage never restarts pods."""
    return _no_store(JsonResponse({"status": "ok"}))


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """The web app is ready for traffic: database answers, broker reachable, at least one upstream healthy (if
    any), and what the apps register (the gateway: the capture hand-off able to take finished turns).

    The body names each check and what failed, but no addresses or error texts: this endpoint is public. Those
    go to the log.
    """
    return _readiness({"database": check_database, "broker": check_broker, "upstreams": check_upstreams,
                       **_app_checks(gateway=False)})


@require_GET
def readyz_gateway(request: HttpRequest) -> HttpResponse:
    """The /v1 gateway is ready: at least one upstream healthy (if any) and the capture hand-off able to take
    finished turns (the gateway app registers that check with ``gateway=True``). Neither the database nor the
    broker: through their outage the gateway serves known keys from its last good lookups and hands turns to
    the log, so a pod that serves /v1 must stay in the Service. It never touches the database, so a database
    that hangs (rather than refuses) cannot stall the probe."""
    return _readiness({"upstreams": check_upstreams, **_app_checks(gateway=True)})


def _readiness(checks: dict[str, Check]) -> HttpResponse:
    results = {name: _run_check(name, check) for name, check in checks.items()}
    failed = [name for name, result in results.items() if not result["ok"]]
    body = {"status": "unavailable" if failed else "ok", "checks": results, "failed": failed}
    return _no_store(JsonResponse(body, status=503 if failed else 200))


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return _no_store(JsonResponse(
            {"error": {"code": "permission_denied", "message": "Metrics are not available from here."}},
            status=403,
        ))
    payload, content_type = render_metrics()
    return _no_store(HttpResponse(payload, content_type=content_type))


# --- checks -------------------------------------------------------------------------------------------------


class CheckFailed(Exception):
    """A readiness check's own verdict (as opposed to an exception from the thing it checked)."""


# The checks the apps add, as core imports no app (the gateway's capture hand-off): name -> (check, whether
# /readyz/gateway runs it too). They run after core's own, in the order registered.
_registered: dict[str, tuple[Check, bool]] = {}


def register_readiness_check(name: str, check: Check, *, gateway: bool) -> None:
    """Adds ``check`` to /readyz, and to /readyz/gateway when ``gateway``. Called from the app's
    ``AppConfig.ready()``; registering a name again replaces its check."""
    _registered[name] = (check, gateway)


def _app_checks(*, gateway: bool) -> dict[str, Check]:
    """The registered checks /readyz/gateway runs (``gateway``), or all of them (/readyz)."""
    return {name: check for name, (check, for_gateway) in _registered.items() if for_gateway or not gateway}


def _run_check(name: str, check: Check) -> dict[str, Any]:
    try:
        detail = check() or {}
    except CheckFailed as exc:
        log.warning("readiness check %s failed: %s", name, exc)
        return {"ok": False, "error": str(exc)}
    except Exception as exc:
        log.warning("readiness check %s failed: %s: %s", name, type(exc).__name__, exc)
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True, **detail}


def check_database() -> None:
    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:
        # A broken connection would otherwise be reused by the next request on this thread.
        connection.close()
        raise


def check_broker() -> dict[str, Any]:
    url: str = settings.CELERY_BROKER_URL
    scheme = url.split("://", 1)[0]
    if scheme in ("redis", "rediss"):
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT_SECONDS,
                                      socket_timeout=PROBE_TIMEOUT_SECONDS)
        try:
            client.ping()
        finally:
            client.close()
    elif scheme == "filesystem":
        options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
        folder = Path(options.get("data_folder_in", ""))
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise CheckFailed("broker folder missing or not writable")
    else:
        from kombu import Connection

        with Connection(url, connect_timeout=PROBE_TIMEOUT_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, timeout=PROBE_TIMEOUT_SECONDS)
    return {"kind": scheme}


def upstream_urls() -> list[str]:
    """Base URLs from CLAWHUB_UPSTREAMS: a list of {"url", ...} objects (or plain URL strings)."""
    upstreams = getattr(settings, "CLAWHUB_UPSTREAMS", None) or []
    if isinstance(upstreams, str):
        upstreams = json.loads(upstreams) if upstreams.strip() else []
    urls = []
    for upstream in upstreams:
        if isinstance(upstream, dict):
            upstream = upstream.get("url") or upstream.get("base_url") or ""
        url = str(upstream).rstrip("/")
        # vLLM serves /health at its root, next to (not under) /v1.
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        if url:
            urls.append(url)
    return urls


def _upstream_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=PROBE_TIMEOUT_SECONDS).status_code == 200
    except httpx.HTTPError as exc:
        log.info("upstream %s unhealthy: %s", url, type(exc).__name__)
        return False


def check_upstreams() -> dict[str, Any]:
    urls = upstream_urls()
    if not urls:
        return {"configured": 0, "healthy": 0}
    # In parallel, so N dead upstreams cost one timeout, not N.
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        healthy = sum(pool.map(_upstream_healthy, urls))
    if not healthy:
        raise CheckFailed(f"none of {len(urls)} upstreams is healthy")
    return {"configured": len(urls), "healthy": healthy}


# --- metrics access -----------------------------------------------------------------------------------------


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = getattr(settings, "METRICS_ALLOWED_NETS", None) or []
    return [ipaddress.ip_network(net.strip(), strict=False) for net in nets if net.strip()]


def metrics_allowed(request: HttpRequest) -> bool:
    """With the right ``Authorization: Bearer <METRICS_TOKEN>``, or from METRICS_ALLOWED_NETS.

    A wrong token is refused even from an allowed network: a scraper sending one is misconfigured.
    """
    token: str = getattr(settings, "METRICS_TOKEN", "") or ""
    auth = request.headers.get("Authorization", "")
    if auth:
        scheme, _, presented = auth.partition(" ")
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(presented.strip(), token)
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return any(address in net for net in _allowed_networks())


# --- middleware ---------------------------------------------------------------------------------------------

OPS_VIEWS: dict[str, Callable[[HttpRequest], HttpResponse]] = {
    "/healthz": healthz,
    "/readyz": readyz,
    "/readyz/gateway": readyz_gateway,
    "/metrics": metrics,
}


class OpsEndpointsMiddleware:
    """Serves /healthz, /readyz and /metrics ahead of host validation, HTTPS redirects and sessions.

    Put it FIRST in MIDDLEWARE. The same views are also routed in clawhub/core/urls.py (for reverse()).
    """

    def __init__(self, get_response: Callable):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Exactly these paths, as deploy/nginx.conf denies them: "/metrics/" answered here once slipped past
        # nginx's "location = /metrics" (security review, finding 5).
        view = OPS_VIEWS.get(request.path_info)
        if view is not None:
            return view(request)
        return self.get_response(request)
