import pytest

from clawhub.groups.services import invitation_create
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def test_staff_browse_groups_memberships_and_invitations_without_token_digests(crew, web_as):
    invitation, _ = invitation_create(actor=crew.owner, group=crew.group, email="pal@example.com")
    client = web_as(make_user(is_staff=True, is_superuser=True))
    for url in ("/admin/groups/group/", f"/admin/groups/group/{crew.group.pk}/change/",
                "/admin/groups/membership/", "/admin/groups/invitation/"):
        assert client.get(url).status_code == 200, url
    listing = client.get("/admin/groups/invitation/").content.decode()
    assert "pal@example.com" in listing and "open" in listing
    detail = client.get(f"/admin/groups/invitation/{invitation.pk}/change/").content.decode()
    assert invitation.token_digest not in detail and invitation.token_digest not in listing
    # Invitations are only made by invitation_create, which delivers the token.
    assert client.get("/admin/groups/invitation/add/").status_code == 403


def test_non_staff_cannot_open_the_admin(crew, web_as):
    response = web_as(crew.owner).get("/admin/groups/group/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
