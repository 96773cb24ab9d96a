"""Finding 5: shipped defaults are not secrets, and /metrics has one path that nginx and the app agree on.

Production refuses to start on the placeholders env.example used to ship (or on short secrets); compose takes
the secrets from a file the operator writes; nginx denies every spelling of /metrics and /readyz (checked by
resolving nginx's location rules over the crossplane-parsed config: nginx itself is not installed here) and
the app answers only the exact paths.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import crossplane
import pytest
import yaml
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GOOD = {
    "DJANGO_SETTINGS_MODULE": "clawhub.settings.production",
    "DJANGO_SECRET_KEY": "Zq8" + os.urandom(30).hex(),
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "DJANGO_ALLOWED_HOSTS": "hub.example.com",
}


def _check(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "METRICS_"))}
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **GOOD, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("DJANGO_SECRET_KEY", "change-me-to-a-long-random-string-" + "x1y2z3" * 5, "placeholder"),
    ("DJANGO_SECRET_KEY", "short-but-random-8Fq2", "at least 50"),
    ("METRICS_TOKEN", "change-me-metrics-token", "placeholder"),
    ("METRICS_TOKEN", "abc123", "at least 24"),
    ("DATABASE_URL", "postgres://clawhub:change-me@postgres:5432/clawhub", "placeholder"),
])
def test_production_refuses_placeholder_and_short_secrets(name, value, says):
    result = _check(**{name: value})
    assert result.returncode != 0
    assert says in result.stderr and name.split("_")[0] in result.stderr


def test_production_starts_with_real_secrets():
    result = _check(METRICS_TOKEN=os.urandom(16).hex())
    assert result.returncode == 0, result.stderr


def test_compose_takes_secrets_from_the_operators_file_not_the_example():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if {"path": "./env.example"} in service.get("env_file", []):
            # Required (no "required: false"): there is no default to fall back on.
            assert {"path": "./secrets.env"} in service["env_file"], name
    example = (DEPLOY / "env.example").read_text()
    for secret in ("DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "DATABASE_URL", "METRICS_TOKEN"):
        assert not re.search(rf"^{secret}=", example, re.M), f"{secret} is set in env.example"
    assert "deploy/secrets.env" in (ROOT / ".gitignore").read_text().split()


# --- /metrics: nginx and the app ----------------------------------------------------------------------------


def _server_locations() -> list[dict]:
    payload = crossplane.parse(str(DEPLOY / "nginx.conf"), single=True, check_ctx=True, check_args=True,
                               comments=False)
    assert payload["status"] == "ok", payload["errors"]
    http = next(d for d in payload["config"][0]["parsed"] if d["directive"] == "http")["block"]
    server = next(d for d in http if d["directive"] == "server")["block"]
    return [d for d in server if d["directive"] == "location"]


def nginx_location(uri: str, locations: list[dict]) -> dict:
    """The location nginx picks for ``uri``: an exact match; else the longest prefix, unless it is ^~, loses
    to the first regex (in order) that matches."""
    prefixes = []
    for loc in locations:
        args = loc["args"]
        if args[0] == "=" and args[1] == uri:
            return loc
        if args[0] in ("^~",) or len(args) == 1:
            prefix = args[-1]
            if uri.startswith(prefix):
                prefixes.append((len(prefix), args[0] == "^~", loc))
    best = max(prefixes, key=lambda p: p[0]) if prefixes else None
    if best and best[1]:
        return best[2]
    for loc in locations:
        args = loc["args"]
        if args[0] in ("~", "~*") and re.search(args[1], uri, re.I if args[0] == "~*" else 0):
            return loc
    assert best, f"no location for {uri}"
    return best[2]


@pytest.mark.parametrize("uri", ["/metrics", "/metrics/", "/metrics//", "/metrics/x", "/METRICS/", "/readyz",
                                 "/readyz/", "/readyz/gateway"])
def test_nginx_denies_every_spelling_of_the_private_endpoints(uri):
    chosen = nginx_location(uri, _server_locations())
    assert {"directive": "deny", "args": ["all"]} in [{k: d[k] for k in ("directive", "args")}
                                                      for d in chosen["block"]], chosen["args"]


def test_nginx_still_proxies_the_rest():
    locations = _server_locations()
    for uri in ("/v1/chat/completions", "/api/keys/", "/metricsfoo", "/healthz"):
        chosen = nginx_location(uri, locations)
        assert not any(d["directive"] == "deny" for d in chosen["block"]), uri


@override_settings(METRICS_TOKEN="a-real-token-0123456789abcdef", METRICS_ALLOWED_NETS=[])
def test_the_app_answers_metrics_on_the_exact_path_only(db):
    client = Client()
    auth = {"HTTP_AUTHORIZATION": "Bearer a-real-token-0123456789abcdef"}
    assert client.get("/metrics", **auth).status_code == 200
    for other in ("/metrics/", "/metrics//"):
        response = client.get(other, **auth)
        assert response.status_code == 404 and b"# HELP" not in response.content, other
    assert client.get("/metrics").status_code == 403


def test_nginx_logs_token_paths_without_the_token():
    payload = crossplane.parse(str(DEPLOY / "nginx.conf"), single=True, check_ctx=True, check_args=True,
                               comments=False)
    http = next(d for d in payload["config"][0]["parsed"] if d["directive"] == "http")["block"]
    log_format = " ".join(next(d for d in http if d["directive"] == "log_format")["args"])
    assert '"uri":"$clawhub_log_uri"' in log_format and "$request_uri" not in log_format
    mapping = next(d for d in http if d["directive"] == "map" and d["args"] == ["$uri", "$clawhub_log_uri"])
    rules = {d["directive"]: d["args"][0] for d in mapping["block"]}
    nginx_pattern = next(k for k in rules if k.startswith("~"))
    pattern = nginx_pattern[1:].replace("(?<", "(?P<")  # PCRE's named group, in Python's spelling
    links = [("/password-reset/MQ/abc-123def/", "abc-123def"), ("/verify-email/eyJ1Ijo.sig/", "eyJ1Ijo"),
             ("/invitations/Zt0k3n/", "Zt0k3n"), ("/api/invitations/Zt0k3n/accept/", "Zt0k3n")]
    for uri, token in links:
        match = re.match(pattern, uri)
        assert match, uri
        logged = rules[nginx_pattern].replace("${clawhub_route}", match.group("clawhub_route"))
        assert logged.endswith("/[token]") and token not in logged, (uri, logged)
    assert rules["default"] == "$uri"
