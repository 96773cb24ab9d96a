"""Who may do what to a key, endpoint by endpoint, on a key bound to a group and on a personal key.

The key owner is a plain member of the group; "other_owner" owns a different group. Someone else's key reads
as 404 (key ids do not leak); the group endpoints are 404 to non-members, 403 to members below admin.
"""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from clawhub.keys.models import ApiKey, ApiKeySecret
from tests.keys.conftest import arm_csrf, login

pytestmark = pytest.mark.django_db

ACTORS = ("key_owner", "group_owner", "group_admin", "group_member", "group_viewer", "other_owner",
          "anonymous")

# endpoint                                         key_owner g_owner g_admin member viewer other anonymous
GROUP_KEY = {
    ("GET", "/api/keys/{key}/"):                        (200, 404, 404, 404, 404, 404, 401),
    ("PATCH", "/api/keys/{key}/"):                      (200, 404, 404, 404, 404, 404, 401),
    ("POST", "/api/keys/{key}/revoke/"):                (200, 404, 404, 404, 404, 404, 401),
    ("POST", "/api/keys/{key}/rotate/"):                (200, 404, 404, 404, 404, 404, 401),
    ("GET", "/api/keys/{key}/openclaw/"):               (200, 404, 404, 404, 404, 404, 401),
    ("GET", "/api/groups/{group}/keys/"):               (403, 200, 200, 403, 403, 404, 401),
    ("POST", "/api/groups/{group}/keys/{key}/revoke/"): (403, 200, 200, 403, 403, 404, 401),
    ("GET", "/keys/{key}/"):                            (200, 404, 404, 404, 404, 404, 302),
    ("POST", "/keys/{key}/edit/"):                      (302, 404, 404, 404, 404, 404, 302),
    ("GET", "/keys/{key}/rotate/"):                     (200, 404, 404, 404, 404, 404, 302),
    ("GET", "/keys/{key}/revoke/"):                     (200, 404, 404, 404, 404, 404, 302),
    ("POST", "/keys/{key}/rotate/"):                    (302, 404, 404, 404, 404, 404, 302),
    ("POST", "/keys/{key}/revoke/"):                    (302, 404, 404, 404, 404, 404, 302),
    ("GET", "/keys/{key}/openclaw.json"):               (200, 404, 404, 404, 404, 404, 302),
}
PERSONAL_KEY = {
    **GROUP_KEY,
    # A personal key is not the group's: even its owners and admins find nothing to revoke there.
    ("POST", "/api/groups/{group}/keys/{key}/revoke/"): (403, 404, 404, 403, 403, 404, 401),
}
BODIES = {
    "/api/keys/{key}/": {"name": "renamed"},
    "/keys/{key}/edit/": {"name": "renamed"},
    # What the confirmation pages post (tests/keys/test_views.py: without it nothing changes).
    "/keys/{key}/rotate/": {"confirm": "yes"},
    "/keys/{key}/revoke/": {"confirm": "yes"},
}


def cases():
    for kind, matrix in (("group", GROUP_KEY), ("personal", PERSONAL_KEY)):
        for (method, url), statuses in matrix.items():
            assert len(statuses) == len(ACTORS)
            for actor, status in zip(ACTORS, statuses, strict=True):
                yield pytest.param(kind, method, url, actor, status, id=f"{kind}-{method}-{url}-{actor}")


def snapshot(key: ApiKey) -> tuple:
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    return row, sorted(ApiKeySecret.objects.filter(key=key).values_list("digest", "valid_until"))


@pytest.mark.parametrize("kind, method, url, actor, expected", list(cases()))
def test_permission_matrix(cast, kind, method, url, actor, expected):
    key, _ = cast["keys"][kind]
    path = url.format(key=key.pk, group=cast["group"].slug)
    is_api = path.startswith("/api/")
    client = APIClient(enforce_csrf_checks=True) if is_api else Client(enforce_csrf_checks=True)
    if actor == "anonymous":
        arm_csrf(client)  # so that a refusal is about the missing login, not the missing CSRF token
    else:
        login(client, cast["people"][actor])
    body = BODIES.get(url, {})
    before = snapshot(key)
    if method == "GET":
        response = client.get(path)
    elif is_api:
        response = getattr(client, method.lower())(path, body, format="json")
    else:
        response = client.post(path, body)

    assert response.status_code == expected, response.content[:300]
    if expected >= 400 or (expected == 302 and actor == "anonymous"):
        assert snapshot(key) == before  # a refused request changes nothing
    if expected < 400 and actor != "anonymous":  # an allowed write really happened
        key.refresh_from_db()
        if method == "GET":
            assert snapshot(key) == before
        elif url.endswith("/revoke/"):
            assert key.revoked_at is not None
        elif url.endswith("/rotate/"):
            assert ApiKeySecret.objects.filter(key=key).count() == 2
        else:
            assert key.name == "renamed"
    if expected == 302 and actor == "anonymous":
        assert response["Location"].startswith("/login/")
    if is_api and expected >= 400:
        assert set(response.json()["error"]) >= {"code", "message"}


def test_group_key_listing_contents_match_the_matrix(cast, api_client):
    login(api_client, cast["people"]["group_admin"])
    listed = {k["id"] for k in api_client.get(f"/api/groups/{cast['group'].slug}/keys/").json()}
    assert listed == {cast["keys"]["group"][0].pk}  # never the member's personal key


def test_a_group_owner_revoking_a_group_key_really_revokes_it(cast, api_client):
    key, secret = cast["keys"]["group"]
    login(api_client, cast["people"]["group_owner"])
    response = api_client.post(f"/api/groups/{cast['group'].slug}/keys/{key.pk}/revoke/", {"reason": "audit"},
                               format="json")
    assert response.status_code == 200 and response.json()["owner"] == "keyowner@example.com"
    script = APIClient()
    assert script.get("/api/keys/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


def test_another_groups_key_is_404_through_this_groups_endpoint(cast, api_client):
    from tests.factories import make_key

    other_key, _ = make_key(cast["people"]["other_owner"], group=cast["other_group"])
    login(api_client, cast["people"]["group_owner"])
    response = api_client.post(f"/api/groups/{cast['group'].slug}/keys/{other_key.pk}/revoke/")
    assert response.status_code == 404
    assert ApiKey.objects.get(pk=other_key.pk).revoked_at is None
