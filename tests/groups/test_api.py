import re

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from clawhub.groups.models import Role
from clawhub.groups.selectors import role_of
from clawhub.keys.selectors import key_resolve
from clawhub.keys.services import key_create
from clawhub.tenants.models import Tenant
from tests.factories import make_user
from tests.groups.conftest import token_of

pytestmark = pytest.mark.django_db

ROLES = ("owner", "admin", "member", "viewer", "outsider", "anonymous")

# Each endpoint: (method, path, body). {placeholders} are filled from the crew: "target" is a plain member,
# "admin2" a second admin, "invitation" and "token" belong to an open link-only member invitation.
ENDPOINTS = {
    "list groups": ("get", "/api/groups/", None),
    "create group": ("post", "/api/groups/", {"name": "Fresh"}),
    "group detail": ("get", "/api/groups/{slug}/", None),
    "rename group": ("patch", "/api/groups/{slug}/", {"name": "Renamed"}),
    "delete group": ("delete", "/api/groups/{slug}/", None),
    "list members": ("get", "/api/groups/{slug}/members/", None),
    "member -> viewer": ("patch", "/api/groups/{slug}/members/{target}/", {"role": "viewer"}),
    "admin -> member": ("patch", "/api/groups/{slug}/members/{admin2}/", {"role": "member"}),
    "member -> admin": ("patch", "/api/groups/{slug}/members/{target}/", {"role": "admin"}),
    "remove member": ("delete", "/api/groups/{slug}/members/{target}/", None),
    "remove admin": ("delete", "/api/groups/{slug}/members/{admin2}/", None),
    "leave": ("post", "/api/groups/{slug}/leave/", None),
    "transfer": ("post", "/api/groups/{slug}/transfer/", {"user_id": "{target}"}),
    "list invitations": ("get", "/api/groups/{slug}/invitations/", None),
    "invite member": ("post", "/api/groups/{slug}/invitations/", {"role": "member"}),
    "invite admin": ("post", "/api/groups/{slug}/invitations/", {"email": "a@example.com", "role": "admin"}),
    "revoke invitation": ("delete", "/api/groups/{slug}/invitations/{invitation}/", None),
    "invitation detail": ("get", "/api/invitations/{token}/", None),
    "accept invitation": ("post", "/api/invitations/{token}/accept/", None),
    "decline invitation": ("post", "/api/invitations/{token}/decline/", None),
}

# The expected status of every endpoint for every caller. Non-members get 404 (group names do not leak),
# anonymous callers 401; members who lack the role 403; the owner cannot leave (409); members cannot accept or
# decline an invitation to a group they are already in (409).
MATRIX = {
    #                       owner admin member viewer outsider anonymous
    "list groups":          (200, 200, 200, 200, 200, 401),
    "create group":         (201, 201, 201, 201, 201, 401),
    "group detail":         (200, 200, 200, 200, 404, 401),
    "rename group":         (200, 200, 403, 403, 404, 401),
    "delete group":         (204, 403, 403, 403, 404, 401),
    "list members":         (200, 200, 200, 200, 404, 401),
    "member -> viewer":     (200, 200, 403, 403, 404, 401),
    "admin -> member":      (200, 403, 403, 403, 404, 401),
    "member -> admin":      (200, 403, 403, 403, 404, 401),
    "remove member":        (204, 204, 403, 403, 404, 401),
    "remove admin":         (204, 403, 403, 403, 404, 401),
    "leave":                (409, 204, 204, 204, 404, 401),
    "transfer":             (200, 403, 403, 403, 404, 401),
    "list invitations":     (200, 200, 403, 403, 404, 401),
    "invite member":        (201, 201, 403, 403, 404, 401),
    "invite admin":         (201, 403, 403, 403, 404, 401),
    "revoke invitation":    (204, 204, 403, 403, 404, 401),
    "invitation detail":    (200, 200, 200, 200, 200, 401),
    "accept invitation":    (409, 409, 409, 409, 200, 401),
    "decline invitation":   (409, 409, 409, 409, 204, 401),
}
assert set(MATRIX) == set(ENDPOINTS)

CASES = [(endpoint, role, expected) for endpoint, row in MATRIX.items() for role, expected in zip(ROLES, row,
                                                                                                   strict=True)]


def _fill(value, values: dict):
    if isinstance(value, str):
        filled = value.format(**values)
        return int(filled) if value.startswith("{") and filled.isdigit() else filled
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    return value


@pytest.mark.parametrize("endpoint, role, expected", CASES, ids=[f"{e}-{r}" for e, r, _ in CASES])
def test_permission_matrix(crew, link_invitation, api_as, endpoint, role, expected):
    invitation, token = link_invitation
    values = {"slug": crew.group.slug, "target": crew.target.pk, "admin2": crew.admin2.pk,
              "invitation": invitation.pk, "token": token}
    method, path, body = ENDPOINTS[endpoint]
    client = api_as(None if role == "anonymous" else crew.as_role(role))
    response = getattr(client, method)(_fill(path, values), data=_fill(body, values), format="json")
    assert response.status_code == expected, response.content
    if expected >= 400:
        assert set(response.json()["error"]) >= {"code", "message"}


# --- what the endpoints say and do --------------------------------------------------------------------------


def test_outputs_carry_the_callers_role(crew, api_as):
    listed = api_as(crew.viewer).get("/api/groups/").json()
    assert listed == [{"id": crew.group.pk, "name": "Crew", "slug": "crew", "model_id": "clawhub-group-crew",
                       "role": "viewer", "created_at": listed[0]["created_at"]}]
    assert api_as(crew.admin).get("/api/groups/crew/").json()["role"] == "admin"
    members = api_as(crew.member).get("/api/groups/crew/members/").json()
    assert members["role"] == "member"
    assert [m["email"] for m in members["members"]][0] == "owner@example.com"
    assert {m["email"]: m["role"] for m in members["members"]}["viewer@example.com"] == "viewer"


def test_group_detail_names_the_group_tenant_the_training_api_takes(crew, api_as):
    client = api_as(crew.viewer)
    tenant_id = client.get("/api/groups/crew/").json()["tenant_id"]
    assert tenant_id == Tenant.objects.get(kind=Tenant.Kind.GROUP, group=crew.group).pk
    assert tenant_id != Tenant.objects.get(kind=Tenant.Kind.USER, user=crew.viewer).pk
    assert client.get(f"/api/training/tenants/{tenant_id}/runs/").status_code == 200
    # PATCH on the same URL answers with the same representation; the list leaves the tenant out.
    renamed = api_as(crew.admin).patch("/api/groups/crew/", {"name": "Crew 2"}, format="json").json()
    assert renamed["tenant_id"] == tenant_id
    assert "tenant_id" not in client.get("/api/groups/").json()[0]


def test_create_then_rename_keeps_slug(api_as, crew):
    client = api_as(crew.outsider)
    created = client.post("/api/groups/", {"name": "Night Shift"}, format="json")
    assert created.status_code == 201
    assert created.json()["slug"] == "night-shift" and created.json()["role"] == "owner"
    renamed = client.patch("/api/groups/night-shift/", {"name": "Day Shift"}, format="json")
    assert renamed.json()["name"] == "Day Shift" and renamed.json()["slug"] == "night-shift"
    taken = client.post("/api/groups/", {"name": "Night shift"}, format="json")
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "slug_taken"


def test_link_is_returned_only_for_link_invitations(crew, api_as, django_capture_on_commit_callbacks):
    client = api_as(crew.admin)
    by_link = client.post("/api/groups/crew/invitations/", {}, format="json").json()
    assert by_link["link"].endswith("/") and by_link["status"] == "open" and by_link["role"] == "member"
    with django_capture_on_commit_callbacks(execute=True):
        by_email = client.post("/api/groups/crew/invitations/", {"email": "x@example.com", "role": "viewer"},
                               format="json").json()
    assert by_email["link"] is None
    assert token_of(by_link["link"]) not in str(client.get("/api/groups/crew/invitations/").json())
    assert len(mail.outbox) == 1 and "x@example.com" in mail.outbox[0].to
    listed = client.get("/api/groups/crew/invitations/").json()
    assert {i["email"] for i in listed} == {"", "x@example.com"}


def test_invitee_flow_over_the_api(crew, api_as, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        created = api_as(crew.owner).post("/api/groups/crew/invitations/",
                                          {"email": "new@example.com", "role": "viewer"}, format="json")
    assert created.status_code == 201 and created.json()["link"] is None
    # The invitee learns the token from the mail only.
    token = re.search(r"/invitations/([\w-]+)/", mail.outbox[0].body).group(1)
    newbie = make_user(email="new@example.com", email_verified_at=timezone.now())
    client = api_as(newbie)
    detail = client.get(f"/api/invitations/{token}/").json()
    assert detail["group"] == {"name": "Crew", "slug": "crew"} and detail["role"] == "viewer"
    assert detail["status"] == "open" and detail["email"] == "new@example.com"
    wrong = api_as(make_user()).post(f"/api/invitations/{token}/accept/")
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "wrong_email"
    accepted = client.post(f"/api/invitations/{token}/accept/")
    assert accepted.status_code == 200 and accepted.json()["role"] == "viewer"
    assert role_of(group=crew.group, user=newbie) == Role.VIEWER
    again = client.post(f"/api/invitations/{token}/accept/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "invitation_used"
    assert client.get(f"/api/invitations/{token}/").json()["status"] == "accepted"
    assert client.get("/api/invitations/not-a-token/").status_code == 404


def test_transfer_over_the_api(crew, api_as):
    response = api_as(crew.owner).post("/api/groups/crew/transfer/", {"user_id": crew.member.pk},
                                       format="json")
    assert response.status_code == 200 and response.json()["role"] == "admin"
    assert role_of(group=crew.group, user=crew.member) == Role.OWNER
    not_member = api_as(crew.member).post("/api/groups/crew/transfer/", {"user_id": crew.outsider.pk},
                                          format="json")
    assert not_member.status_code == 404


def test_removing_a_member_revokes_their_group_key(crew, api_as):
    _, secret = key_create(owner=crew.target, name="bound", group=crew.group)
    assert key_resolve(secret=secret) is not None
    assert api_as(crew.admin).delete(f"/api/groups/crew/members/{crew.target.pk}/").status_code == 204
    assert key_resolve(secret=secret) is None


def test_session_writes_need_the_csrf_token(crew):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(crew.owner)
    response = client.patch("/api/groups/crew/", {"name": "No token"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]
    crew.group.refresh_from_db()
    assert crew.group.name == "Crew"


def test_scripts_use_a_scoped_api_key_without_csrf(crew):
    _, plain = key_create(owner=crew.admin, name="agent")
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    # A default (inference) key reads nothing and invites nobody.
    assert client.get("/api/groups/").status_code == 403
    assert client.post("/api/groups/crew/invitations/", {"role": "viewer"}, format="json").status_code == 403
    _, secret = key_create(owner=crew.admin, name="script", scopes=["read", "admin"])
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [g["slug"] for g in client.get("/api/groups/").json()] == ["crew"]
    response = client.post("/api/groups/crew/invitations/", {"role": "viewer"}, format="json")
    assert response.status_code == 201


def test_invalid_role_is_a_validation_error(crew, api_as):
    response = api_as(crew.owner).patch(f"/api/groups/crew/members/{crew.target.pk}/", {"role": "king"},
                                        format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"
    owner = api_as(crew.owner).patch(f"/api/groups/crew/members/{crew.target.pk}/", {"role": "owner"},
                                     format="json")
    assert owner.status_code == 400 and owner.json()["error"]["code"] == "use_transfer"
