"""deploy/nginx.conf parses (crossplane, with nginx's directive contexts) and streams /v1 unbuffered."""

import crossplane
import pytest

from tests.deploy.conftest import DEPLOY


@pytest.fixture(scope="module")
def config() -> list[dict]:
    payload = crossplane.parse(
        str(DEPLOY / "nginx.conf"), single=True, check_ctx=True, check_args=True, comments=False
    )
    assert payload["status"] == "ok", payload["errors"]
    return payload["config"][0]["parsed"]


def block(directives: list[dict], name: str, *args: str) -> list[dict]:
    for d in directives:
        if d["directive"] == name and (not args or d["args"] == list(args)):
            return d["block"]
    raise AssertionError(f"no {name} {' '.join(args)} block")


def values(directives: list[dict], name: str) -> list[list[str]]:
    return [d["args"] for d in directives if d["directive"] == name]


def test_nginx_conf_is_valid(config):
    assert block(config, "http")


def test_v1_streams_are_not_buffered_and_may_run_long(config):
    server = block(block(config, "http"), "server")
    v1 = block(server, "location", "/v1/")
    assert values(v1, "proxy_buffering") == [["off"]]
    assert values(v1, "proxy_cache") == [["off"]]
    assert values(v1, "proxy_read_timeout") == [["600s"]]
    assert ["X-Accel-Buffering", "no", "always"] in values(v1, "add_header")
    assert values(v1, "proxy_pass") == [["http://clawhub_web"]]


def test_keepalive_upstream_and_forwarded_headers(config):
    http = block(config, "http")
    upstream = block(http, "upstream", "clawhub_web")
    assert values(upstream, "keepalive")
    server = block(http, "server")
    assert values(server, "proxy_http_version") == [["1.1"]]
    headers = {args[0]: args[1] for args in values(server, "proxy_set_header")}
    # An empty Connection header (via the map) keeps upstream connections alive.
    assert headers["Connection"] == "$clawhub_connection"
    assert headers["X-Forwarded-Proto"] == "$scheme"
    assert "X-Forwarded-For" in headers
    assert headers["X-Request-Id"] == "$clawhub_request_id"


def test_body_limit_matches_the_gateway(config):
    from django.conf import settings

    server = block(block(config, "http"), "server")
    (limit,) = values(server, "client_max_body_size")
    assert limit == ["4m"]
    assert settings.GATEWAY_MAX_BODY_BYTES == 4 * 1024 * 1024


def test_metrics_and_readiness_are_not_public(config):
    server = block(block(config, "http"), "server")
    # One regex covers /metrics, /metrics/, /metrics/… (tests/security/test_shipped_secrets.py resolves them).
    assert values(block(server, "location", "~*", "^/(metrics|readyz)(/.*)?$"), "deny") == [["all"]]
