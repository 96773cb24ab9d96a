"""REST API for judge rules."""

import pytest

from clawhub.feedback.models import JudgeRules
from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_key, make_user
from tests.groups.conftest import signed_in

pytestmark = pytest.mark.django_db


def test_personal_rules_default_then_update(api_client):
    user = make_user()
    client = signed_in(api_client, user)
    body = client.get("/api/judge-rules/").json()
    assert body["judge"] == "default" and body["negative_patterns"] == []
    assert any(r["name"] == "that's wrong" for r in body["defaults"]["negative_patterns"])
    response = client.put("/api/judge-rules/", {"negative_patterns": ["no bold"],
                                                "hint_templates": {"no bold": "Write plain sentences."}},
                          format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["negative_patterns"] == ["no bold"]
    assert JudgeRules.objects.get(tenant=user.tenant).hint_templates == {"no bold": "Write plain sentences."}


def test_invalid_pattern_is_a_400_with_the_reason(api_client):
    client = signed_in(api_client, make_user())
    response = client.put("/api/judge-rules/", {"negative_patterns": ["re:(oops"]}, format="json")
    assert response.status_code == 400
    assert "invalid regular expression" in response.json()["error"]["message"]


def test_session_writes_need_csrf(api_client):
    api_client.force_login(make_user())
    assert api_client.put("/api/judge-rules/", {"judge": "rule"}, format="json").status_code == 403
    assert not JudgeRules.objects.exists()


def test_only_an_admin_scoped_api_key_can_set_rules_without_csrf(api_client):
    _, plain = make_key()
    refused = api_client.put("/api/judge-rules/", {"judge": "rule"}, format="json",
                             HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert refused.status_code == 403 and not JudgeRules.objects.exists()
    key, secret = make_key(scopes=["admin"])
    response = api_client.put("/api/judge-rules/", {"judge": "rule"}, format="json",
                              HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    assert JudgeRules.objects.get(tenant=key.owner.tenant).judge == "rule"


@pytest.mark.parametrize(
    ("role", "read", "write"),
    [(Role.OWNER, 200, 200), (Role.ADMIN, 200, 200), (Role.MEMBER, 200, 403), (Role.VIEWER, 200, 403),
     (None, 404, 404)],
)
def test_group_rules_permissions(api_client, role, read, write):
    owner = make_user()
    group = make_group(owner)
    actor = owner if role == Role.OWNER else make_user()
    if role not in (Role.OWNER, None):
        add_member(group, actor, role)
    client = signed_in(api_client, actor)
    url = f"/api/groups/{group.slug}/judge-rules/"
    assert client.get(url).status_code == read
    assert client.put(url, {"positive_patterns": ["ship it"]}, format="json").status_code == write
    assert JudgeRules.objects.filter(tenant=group.tenant).exists() == (write == 200)


def test_anonymous_is_401(api_client):
    assert api_client.get("/api/judge-rules/").status_code == 401
