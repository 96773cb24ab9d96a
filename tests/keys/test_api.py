import re
from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.groups.models import Role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.openclaw import SECRET_PLACEHOLDER
from tests.factories import add_member, make_group, make_key, make_user
from tests.keys.conftest import login

pytestmark = pytest.mark.django_db

KEY_FIELDS = {"id", "name", "display", "group", "created_at", "last_used_at", "expires_at", "revoked_at",
              "allowed_models", "rpm_limit", "tpm_limit", "concurrency_limit", "scopes", "is_active"}


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def create(client, **body):
    body.setdefault("name", "laptop")
    response = client.post("/api/keys/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_create_returns_the_secret_once_with_the_openclaw_block(api_client, settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.org"
    user = make_user()
    login(api_client, user)
    response = api_client.post("/api/keys/", {"name": "laptop", "rpm_limit": 30}, format="json")
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    secret = body["secret"]
    assert secret.startswith("chk_")
    assert set(body["key"]) == KEY_FIELDS
    assert body["key"]["display"] == f"{secret[:8]}…{secret[-4:]}"
    assert (body["key"]["rpm_limit"], body["key"]["is_active"], body["key"]["group"]) == (30, True, None)
    provider = body["openclaw"]["config"]["models"]["providers"]["clawhub"]
    assert provider["apiKey"] == secret
    assert provider["baseUrl"] == "https://hub.example.org/v1"
    assert f"--custom-api-key {secret}" in body["openclaw"]["onboard_command"]

    # Never again: not in the list, the detail, nor the OpenClaw endpoint.
    key_id = body["key"]["id"]
    for url in ("/api/keys/", f"/api/keys/{key_id}/", f"/api/keys/{key_id}/openclaw/"):
        later = api_client.get(url)
        assert later.status_code == 200
        assert secret not in later.content.decode()
    openclaw = api_client.get(f"/api/keys/{key_id}/openclaw/").json()
    assert openclaw["config"]["models"]["providers"]["clawhub"]["apiKey"] == SECRET_PLACEHOLDER
    assert '"$CLAWHUB_API_KEY"' in openclaw["onboard_command"]


def test_create_group_key_by_slug_and_its_model_ids(api_client):
    owner = make_user()
    group = make_group(owner, name="Crew")
    login(api_client, owner)
    body = create(api_client, group="crew", allowed_models=["clawhub-group-crew"])
    assert body["key"]["group"] == "crew"
    assert ApiKey.objects.get(pk=body["key"]["id"]).group == group
    provider = body["openclaw"]["config"]["models"]["providers"]["clawhub"]
    assert [m["id"] for m in provider["models"]] == ["clawhub-group-crew"]
    primary = body["openclaw"]["config"]["agents"]["defaults"]["model"]["primary"]
    assert primary == "clawhub/clawhub-group-crew"


@pytest.mark.parametrize("role, status", [(Role.MEMBER, 201), (Role.ADMIN, 201), (Role.VIEWER, 403),
                                          (None, 404)])
def test_create_group_key_needs_membership(api_client, role, status):
    group = make_group(name="Crew")
    user = add_member(group, role=role) if role else make_user()
    login(api_client, user)
    response = api_client.post("/api/keys/", {"name": "k", "group": "crew"}, format="json")
    assert response.status_code == status
    assert ApiKey.objects.filter(owner=user).exists() == (status == 201)
    if status == 404:  # a group the user is not in reads as unknown, whether it exists or not
        assert response.json()["error"]["data"]["field"] == "group"


@pytest.mark.parametrize("body, field", [
    ({"name": ""}, "fields"),
    ({"name": "k", "rpm_limit": 0}, "fields"),
    ({"name": "k", "expires_at": "2001-01-01T00:00:00Z"}, "field"),
])
def test_create_rejects_bad_input_with_the_house_error_shape(api_client, body, field):
    login(api_client, make_user())
    response = api_client.post("/api/keys/", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["data"]
    assert not ApiKey.objects.exists()


def test_create_with_a_model_the_tenant_does_not_serve_is_404_model_not_found(api_client):
    # As OpenAI answers an unknown model; the model ids a key may name depend on its tenant.
    login(api_client, make_user())
    response = api_client.post("/api/keys/", {"name": "k", "allowed_models": ["gpt-4o"]}, format="json")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["data"]["field"] == "allowed_models"
    assert not ApiKey.objects.exists()


def test_session_writes_need_the_csrf_token(api_client):
    user = make_user()
    api_client.force_login(user)  # no CSRF token
    response = api_client.post("/api/keys/", {"name": "k"}, format="json")
    assert response.status_code == 403
    assert not ApiKey.objects.exists()


def test_patch_updates_and_validates(api_client):
    user = make_user()
    login(api_client, user)
    key_id = create(api_client, rpm_limit=5)["key"]["id"]
    expiry = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    response = api_client.patch(f"/api/keys/{key_id}/", {
        "name": "renamed", "rpm_limit": None, "tpm_limit": 900, "allowed_models": ["base"],
        "expires_at": expiry.isoformat(),
    }, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["rpm_limit"], body["tpm_limit"], body["allowed_models"]) == (
        "renamed", None, 900, ["base"])
    key = ApiKey.objects.get(pk=key_id)
    assert key.expires_at == expiry and key.tpm_limit == 900
    bad = api_client.patch(f"/api/keys/{key_id}/", {"allowed_models": ["clawhub-group-x"]}, format="json")
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "model_not_found"
    assert ApiKey.objects.get(pk=key_id).allowed_models == ["base"]


def test_lifecycle_through_the_api(api_client, settings):
    """create (with the read scope) → the key authenticates → rotate → the old secret is inference-only inside
    the grace window (403 on the REST API) → unknown after it; expiry ends the key; revoke ends it."""
    settings.KEY_ROTATION_GRACE = timedelta(hours=1)
    user = make_user()
    login(api_client, user)
    created = create(api_client, scopes=["read"])
    assert created["key"]["scopes"] == ["inference", "read"]
    key_id, first = created["key"]["id"], created["secret"]

    script = type(api_client)(enforce_csrf_checks=True)  # a separate client with no session, like a script
    listed = script.get("/api/keys/", **bearer(first))
    assert listed.status_code == 200 and [k["id"] for k in listed.json()] == [key_id]

    rotated = api_client.post(f"/api/keys/{key_id}/rotate/")
    assert rotated.status_code == 200 and rotated["Cache-Control"] == "no-store"
    second = rotated.json()["secret"]
    assert second != first and rotated.json()["key"]["id"] == key_id
    assert rotated.json()["openclaw"]["config"]["models"]["providers"]["clawhub"]["apiKey"] == second
    in_grace = script.get("/api/keys/", **bearer(first))  # inside the grace window: /v1 only
    assert in_grace.status_code == 403 and in_grace.json()["error"]["code"] == "insufficient_scope"
    assert script.get("/api/keys/", **bearer(second)).status_code == 200

    ApiKeySecret.objects.filter(key_id=key_id, valid_until__isnull=False).update(
        valid_until=timezone.now() - timedelta(seconds=1))
    expired_grace = script.get("/api/keys/", **bearer(first))
    assert expired_grace.status_code == 401
    assert expired_grace.json()["error"]["code"] == "authentication_failed"
    assert script.get("/api/keys/", **bearer(second)).status_code == 200

    # Expiry: set through the API, then let time pass.
    assert api_client.patch(f"/api/keys/{key_id}/", {
        "expires_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json").status_code == 200
    assert script.get("/api/keys/", **bearer(second)).status_code == 200
    ApiKey.objects.filter(pk=key_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert script.get("/api/keys/", **bearer(second)).status_code == 401
    assert api_client.get(f"/api/keys/{key_id}/").json()["is_active"] is False
    ApiKey.objects.filter(pk=key_id).update(expires_at=None)

    revoked = api_client.post(f"/api/keys/{key_id}/revoke/", {"reason": "lost laptop"}, format="json")
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None and revoked.json()["is_active"] is False
    assert script.get("/api/keys/", **bearer(second)).status_code == 401
    assert api_client.post(f"/api/keys/{key_id}/rotate/").status_code == 409
    assert api_client.patch(f"/api/keys/{key_id}/", {"name": "x"}, format="json").status_code == 409


def test_scripts_manage_keys_with_a_bearer_key_and_x_api_key(api_client):
    """A key with the keys and read scopes manages keys from a script; a default key may not."""
    user = make_user()
    _, plain = make_key(user)
    refused = api_client.post("/api/keys/", {"name": "from a script"}, format="json", **bearer(plain))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
    _, secret = make_key(user, scopes=["keys", "read"])
    created = api_client.post("/api/keys/", {"name": "from a script"}, format="json", **bearer(secret))
    assert created.status_code == 201  # API keys are not subject to CSRF: they are not ambient credentials
    assert created.json()["key"]["scopes"] == ["inference"]
    listed = api_client.get("/api/keys/", HTTP_X_API_KEY=secret)
    assert listed.status_code == 200 and len(listed.json()) == 3
    assert api_client.get("/api/keys/").status_code == 401
    assert api_client.get("/api/keys/", **bearer("chk_" + "A" * 43)).status_code == 401


def test_revoked_key_gets_401_on_the_rest_api(api_client):
    user = make_user()
    key, secret = make_key(user, scopes=["read", "keys"])
    assert api_client.get("/api/keys/", **bearer(secret)).status_code == 200
    assert api_client.post(f"/api/keys/{key.pk}/revoke/", **bearer(secret)).status_code == 200
    response = api_client.get("/api/keys/", **bearer(secret))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_list_shows_only_the_callers_keys(api_client):
    me, other = make_user(), make_user()
    mine, _ = make_key(me)
    make_key(other)
    login(api_client, me)
    assert [k["id"] for k in api_client.get("/api/keys/").json()] == [mine.pk]


def test_group_key_list_for_admins_shows_owner_and_only_group_keys(api_client):
    owner = make_user()
    group = make_group(owner, name="Crew")
    member = add_member(group, make_user(email="m@example.com"))
    bound, secret = make_key(member, group=group)
    make_key(member)
    login(api_client, owner)
    body = api_client.get("/api/groups/crew/keys/").json()
    assert [(k["id"], k["owner"], k["group"]) for k in body] == [(bound.pk, "m@example.com", "crew")]
    assert secret not in str(body)


def test_a_new_key_gets_the_sites_default_limits_unless_its_creator_names_them(api_client, web_client,
                                                                               settings):
    """Finding N14: new keys had no /v1 quota. Left out, a limit is the site's default; null is none."""
    settings.KEY_DEFAULT_RPM_LIMIT, settings.KEY_DEFAULT_TPM_LIMIT = 120, None
    settings.KEY_DEFAULT_CONCURRENCY_LIMIT = 8
    user = make_user()
    login(api_client, user)
    defaulted = create(api_client)["key"]
    assert (defaulted["rpm_limit"], defaulted["tpm_limit"], defaulted["concurrency_limit"]) == (120, None, 8)
    chosen = create(api_client, rpm_limit=30, concurrency_limit=None)["key"]
    assert (chosen["rpm_limit"], chosen["concurrency_limit"]) == (30, None)
    # The key page shows the defaults filled in.
    login(web_client, user)
    page = web_client.get("/keys/").content.decode()
    assert re.search(r'name="rpm_limit" value="120"', page)
    assert re.search(r'name="concurrency_limit" value="8"', page)
