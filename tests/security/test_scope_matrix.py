"""The permission matrix of API-key scopes, generated from the URL conf.

Every REST endpoint and method under /api/ is called as: a key with each single scope (inference only, read,
keys, export, admin), a rotated-out secret of a key that holds every scope (in its grace window), a signed-in
session with CSRF, the same session without CSRF, and nobody. Expected:

- a key whose scopes cover the endpoint's rule gets exactly what the session with CSRF gets (the same user,
  the same URL, the same body): the scope gate lets it through and the view decides the rest;
- a key that lacks the scope, any key on a session-only endpoint, and every rotated-out secret: 403
  ``insufficient_scope``;
- the session without CSRF: the same as with CSRF for reads, 403 "CSRF Failed" for writes;
- nobody: 401 (403 where only a session authenticates) unless the endpoint is public.

An endpoint that is in the URL conf but not in ``clawhub.keys.scopes.REST_RULES`` fails
``test_every_endpoint_has_a_rule``, so a new endpoint cannot ship without deciding what a key may do there.
"""

import pytest
from django.db import transaction
from django.urls import URLResolver, get_resolver
from rest_framework.test import APIClient

from clawhub.keys.scopes import MANAGEMENT_SCOPES, PUBLIC, REST_RULES, SESSION, Scope, rule_for
from clawhub.keys.services import key_rotate
from tests.factories import make_group, make_key, make_user
from tests.keys.conftest import arm_csrf

METHODS = ("get", "post", "put", "patch", "delete")


def _api_endpoints() -> list[tuple[str, str, object]]:
    """(url name, route, method) for every view method under /api/."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
                continue
            route = prefix + str(pattern.pattern)
            view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
            if not route.startswith("api/") or view is None:
                continue
            for method in METHODS:
                if hasattr(view, method):
                    found.append((pattern.name, route, method.upper()))

    walk(get_resolver().url_patterns, "")
    return found


ENDPOINTS = _api_endpoints()


def test_the_matrix_sees_every_api_endpoint():
    names = {name for name, _route, _method in ENDPOINTS}
    assert {"api-keys", "api-me-export", "api-group-transfer", "api-training-run-start"} <= names
    assert len(ENDPOINTS) > 50


def test_every_endpoint_has_a_rule():
    missing = [f"{method} {route} ({name})" for name, route, method in ENDPOINTS
               if rule_for(url_name=name, method=method) is None]
    assert not missing, ("Endpoints without a scope rule; add them to clawhub.keys.scopes.REST_RULES: "
                         + ", ".join(missing))
    declared = {(name, method) for name, methods in REST_RULES.items() for method in methods}
    served = {(name, method) for name, _route, method in ENDPOINTS}
    assert declared - served == set(), "rules for endpoints that do not exist"


def _fill(route: str, *, world: dict) -> str:
    """A concrete path: the caller's own group, key and tenant, so the request reaches the view's work."""
    values = {"<slug:slug>": world["group"].slug, "<int:key_id>": str(world["other_key"].pk),
              "<int:tenant_id>": str(world["user"].tenant.pk), "<int:user_id>": str(world["user"].pk),
              "<str:token>": "no-such-token"}
    path = route
    for placeholder, value in values.items():
        path = path.replace(placeholder, value)
    # The other ids (versions, runs, samples, sessions, invitations) name nothing: 404 for all allowed.
    for placeholder in ("<int:version_id>", "<int:run_id>", "<int:sample_id>", "<int:session_id>",
                        "<int:invitation_id>", "<int:turn_id>"):
        path = path.replace(placeholder, "999999")
    return "/" + path


def _call(client: APIClient, method: str, path: str, **extra):
    # Each call runs in a savepoint that is rolled back, so every caller sees the same starting state.
    with transaction.atomic():
        response = getattr(client, method.lower())(path, {}, format="json", **extra) \
            if method != "GET" else client.get(path, **extra)
        transaction.set_rollback(True)
    return response


def _code(response) -> str | None:
    try:
        return response.json().get("error", {}).get("code")
    except (ValueError, TypeError, AttributeError):  # no body (204) or not JSON
        return None


def _message(response) -> str:
    try:
        return response.json().get("error", {}).get("message", "")
    except (ValueError, TypeError, AttributeError):
        return ""


@pytest.fixture
def world(db):
    user = make_user()
    group = make_group(user)
    keys = {scope: make_key(user, name=f"only {scope}", scopes=[scope])[1] for scope in Scope}
    everything, old_secret = make_key(user, name="everything", scopes=[s.value for s in MANAGEMENT_SCOPES])
    key_rotate(key=everything, actor=user)  # old_secret is now in its grace window
    other_key, _ = make_key(user, name="the one acted on")
    return {"user": user, "group": group, "keys": keys, "grace": old_secret, "other_key": other_key}


@pytest.mark.parametrize(("name", "route", "method"), ENDPOINTS,
                         ids=[f"{m} {r}" for _n, r, m in ENDPOINTS])
def test_scope_matrix(world, name, route, method):
    rule = rule_for(url_name=name, method=method)
    assert rule is not None
    path = _fill(route, world=world)

    anonymous = _call(APIClient(enforce_csrf_checks=True), method, path)
    if rule == PUBLIC:
        # What a key adds to a public endpoint is nothing: it is answered as for anyone.
        for secret in list(world["keys"].values()) + [world["grace"]]:
            keyed = _call(APIClient(enforce_csrf_checks=True), method, path,
                          HTTP_AUTHORIZATION=f"Bearer {secret}")
            assert keyed.status_code == anonymous.status_code
        return
    # 401, or 403 where only a session authenticates (no authenticator to ask for credentials).
    assert anonymous.status_code in (401, 403) and _code(anonymous) == "not_authenticated", anonymous.content

    session = arm_csrf(APIClient(enforce_csrf_checks=True))
    session.force_login(world["user"])
    arm_csrf(session)
    with_csrf = _call(session, method, path)
    assert with_csrf.status_code not in (401,), with_csrf.content
    assert not _message(with_csrf).startswith("CSRF Failed")
    assert _code(with_csrf) != "insufficient_scope"

    no_csrf = APIClient(enforce_csrf_checks=True)
    no_csrf.force_login(world["user"])
    without = _call(no_csrf, method, path)
    if method == "GET":
        assert without.status_code == with_csrf.status_code
    else:
        assert without.status_code == 403 and _message(without).startswith("CSRF Failed"), without.content

    for scope, secret in world["keys"].items():
        keyed = _call(APIClient(enforce_csrf_checks=True), method, path,
                      HTTP_AUTHORIZATION=f"Bearer {secret}")
        if rule == scope:
            assert keyed.status_code == with_csrf.status_code, (scope, keyed.content, with_csrf.content)
            assert _code(keyed) != "insufficient_scope"
        elif rule == SESSION:
            # Session-only views either do not read keys at all, or refuse them by rule.
            assert keyed.status_code == 403 and _code(keyed) in ("insufficient_scope", "not_authenticated")
        else:
            assert keyed.status_code == 403 and _code(keyed) == "insufficient_scope", (scope, keyed.content)

    grace = _call(APIClient(), method, path, HTTP_AUTHORIZATION=f"Bearer {world['grace']}")
    assert grace.status_code == 403, grace.content
    assert _code(grace) in (("insufficient_scope", "not_authenticated") if rule == SESSION
                            else ("insufficient_scope",))
