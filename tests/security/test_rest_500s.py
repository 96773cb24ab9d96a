"""REST input that reached a 500: JSON nested deeper than Python's parser recurses, and ids past bigint in a
group member's URL or a transfer's body. Each is now a clean JSON 4xx."""

from rest_framework.test import APIClient

from clawhub.groups.models import Membership, Role
from tests.factories import add_member, make_group, make_user

HUGE = 2**64


def test_deeply_nested_json_on_login_is_a_json_400():
    client = APIClient()
    body = b'{"email": ' + b"[" * 100_000 + b"]" * 100_000 + b', "password": "x"}'
    response = client.post("/api/auth/login/", body, content_type="application/json")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert "nested too deeply" in response.json()["error"]["message"]


def test_ids_past_bigint_are_404_or_400_not_500(db):
    owner = make_user()
    group = make_group(owner)
    member = add_member(group, make_user(), Role.MEMBER)
    client = APIClient()
    client.force_login(owner)
    for user_id in (HUGE, 2**63):
        url = f"/api/groups/{group.slug}/members/{user_id}/"
        assert client.patch(url, {"role": "admin"}, format="json").status_code == 404
        assert client.delete(url).status_code == 404
        transfer = client.post(f"/api/groups/{group.slug}/transfer/", {"user_id": user_id}, format="json")
        assert transfer.status_code == 400 and "user_id" in str(transfer.json()["error"])
    assert Membership.objects.get(group=group, user=member).role == Role.MEMBER
