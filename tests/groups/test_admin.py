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


def _group_form(group, *, change: dict) -> dict:
    """The group change page's POST: its fields and every member row, with ``change`` applied to rows by
    membership id ({id: {"role": ...} or {"DELETE": "on"}})."""
    rows = list(group.memberships.order_by("pk"))
    data = {"name": group.name, "slug": group.slug, "memberships-TOTAL_FORMS": str(len(rows)),
            "memberships-INITIAL_FORMS": str(len(rows)), "memberships-MIN_NUM_FORMS": "0",
            "memberships-MAX_NUM_FORMS": "1000"}
    for i, row in enumerate(rows):
        data.update({f"memberships-{i}-id": str(row.pk), f"memberships-{i}-group": str(group.pk),
                     f"memberships-{i}-user": str(row.user_id), f"memberships-{i}-role": row.role})
        data.update({f"memberships-{i}-{k}": v for k, v in change.get(row.pk, {}).items()})
    return data


@pytest.mark.parametrize("edit", [{"DELETE": "on"}, {"role": "admin"}], ids=["delete", "demote"])
def test_the_group_page_cannot_delete_or_demote_the_owner_row(crew, web_as, edit):
    client = web_as(make_user(is_staff=True, is_superuser=True))
    owner_row = crew.group.memberships.get(role="owner")
    url = f"/admin/groups/group/{crew.group.pk}/change/"
    response = client.post(url, _group_form(crew.group, change={owner_row.pk: edit}))
    assert response.status_code == 200 and "transfer" in response.content.decode()
    owner_row.refresh_from_db()
    assert owner_row.role == "owner"
    # Other rows still change as before.
    member_row = crew.group.memberships.get(user=crew.member)
    ok = client.post(url, _group_form(crew.group, change={member_row.pk: {"role": "viewer"}}))
    assert ok.status_code == 302
    member_row.refresh_from_db()
    assert member_row.role == "viewer"


def _generations(*keys):
    from clawhub.keys.cache import key_cache_generation_now

    return [key_cache_generation_now(key_id=key.pk) for key in keys]


@pytest.mark.parametrize("edit", [{"DELETE": "on"}, {"role": "viewer"}], ids=["delete", "demote"])
def test_a_member_row_changed_on_the_group_page_makes_gateways_look_its_group_keys_up_again(
        crew, web_as, edit, django_capture_on_commit_callbacks):
    from clawhub.keys.cache import key_cache_generation
    from tests.factories import make_key

    group_key, _ = make_key(crew.member, group=crew.group)
    personal_key, _ = make_key(crew.member)
    other_key, _ = make_key(crew.target, group=crew.group)
    for key in (group_key, personal_key, other_key):
        key_cache_generation(key_id=key.pk)  # what a gateway's lookup saw
    before = _generations(group_key, personal_key, other_key)
    client = web_as(make_user(is_staff=True, is_superuser=True))
    row = crew.group.memberships.get(user=crew.member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/admin/groups/group/{crew.group.pk}/change/",
                               _group_form(crew.group, change={row.pk: edit}))
    assert response.status_code == 302
    after = _generations(group_key, personal_key, other_key)
    # Only the member's key bound to the group stops working (key_resolve); the others stay cached.
    assert after[0] != before[0] and after[1:] == before[1:]


def test_a_membership_deleted_on_its_own_page_makes_gateways_look_its_group_keys_up_again(
        crew, web_as, django_capture_on_commit_callbacks):
    from clawhub.keys.cache import key_cache_generation
    from tests.factories import make_key

    group_key, _ = make_key(crew.member, group=crew.group)
    before = key_cache_generation(key_id=group_key.pk)
    client = web_as(make_user(is_staff=True, is_superuser=True))
    row = crew.group.memberships.get(user=crew.member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/admin/groups/membership/{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert _generations(group_key) != [before]
