import html
import re
from datetime import timedelta
from urllib.parse import quote, unquote

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.accounts.selectors import LOCAL_MAILBOX_BACKEND
from clawhub.groups.models import Group, Invitation, Role
from clawhub.groups.selectors import role_of
from clawhub.groups.services import invitation_create
from clawhub.keys.selectors import key_resolve
from clawhub.keys.services import key_create
from tests.factories import PASSWORD, make_user
from tests.groups.conftest import token_of

pytestmark = pytest.mark.django_db


def web_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(response) -> str:
    return response.content.decode()


def test_pages_need_a_login(crew, link_invitation):
    _, token = link_invitation
    for url in ("/groups/", "/groups/crew/", f"/invitations/{token}/"):
        response = Client().get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


def test_list_shows_my_groups_with_my_role_and_creates_one(crew, web_as):
    client = web_as(crew.viewer)
    listing = page(client.get("/groups/"))
    assert "Crew" in listing and "clawhub-group-crew" in listing and "role-viewer" in listing
    assert "Elsewhere" not in listing
    response = client.post("/groups/", {"name": "Night Shift"})
    assert response.status_code == 302 and response["Location"] == "/groups/night-shift/"
    assert role_of(group=Group.objects.get(slug="night-shift"), user=crew.viewer) == Role.OWNER
    duplicate = client.post("/groups/", {"name": "Night shift"}, follow=True)
    assert "already exists" in page(duplicate)


def test_outsiders_get_404_on_the_detail_page(crew, web_as):
    assert web_as(crew.outsider).get("/groups/crew/").status_code == 404
    assert web_as(crew.outsider).post("/groups/crew/rename/", {"name": "x"}).status_code == 404


def test_detail_shows_only_the_controls_the_role_allows(crew, web_as):
    owner = page(web_as(crew.owner).get("/groups/crew/"))
    for marker in ('id="invite-form"', 'id="rename-form"', 'id="transfer-form"', 'id="delete-link"',
                   f"/groups/crew/members/{crew.admin2.pk}/role/"):
        assert marker in owner, marker
    assert 'id="leave-form"' not in owner

    admin = page(web_as(crew.admin).get("/groups/crew/"))
    assert 'id="invite-form"' in admin and 'id="rename-form"' in admin and 'id="leave-form"' in admin
    assert 'id="delete-link"' not in admin and 'id="transfer-form"' not in admin
    assert f"/groups/crew/members/{crew.target.pk}/role/" in admin
    assert f"/groups/crew/members/{crew.admin2.pk}/role/" not in admin  # admins are the owner's call
    assert f"/groups/crew/members/{crew.admin2.pk}/remove/" not in admin
    assert '<option value="admin"' not in admin

    viewer = page(web_as(crew.viewer).get("/groups/crew/"))
    assert "member@example.com" in viewer and "owner@example.com" in viewer
    assert 'id="invite-form"' not in viewer and "/role/" not in viewer and 'id="leave-form"' in viewer


def test_link_invitation_is_shown_once(crew, web_as):
    client = web_as(crew.admin)
    response = client.post("/groups/crew/invitations/", {"email": "", "role": "viewer"})
    assert response.status_code == 302
    first = page(client.get("/groups/crew/"))
    assert 'id="invitation-link"' in first
    invitation = Invitation.objects.get(group=crew.group)
    assert invitation.role == Role.VIEWER and invitation.email == ""
    second = page(client.get("/groups/crew/"))
    assert 'id="invitation-link"' not in second
    assert "link" in second  # still listed among open invitations, without its token


def test_email_invitation_from_the_web_sends_mail(crew, web_as, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        web_as(crew.owner).post("/groups/crew/invitations/", {"email": "pal@example.com", "role": "member"})
    assert mail.outbox[0].to == ["pal@example.com"]
    assert "pal@example.com" in page(web_as(crew.owner).get("/groups/crew/"))


def test_refusals_come_back_as_messages(crew, web_as):
    response = web_as(crew.owner).post("/groups/crew/leave/", follow=True)
    assert "transfer ownership" in page(response)
    assert role_of(group=crew.group, user=crew.owner) == Role.OWNER
    response = web_as(crew.admin).post(f"/groups/crew/members/{crew.admin2.pk}/remove/", follow=True)
    assert "Only the owner may remove admins." in page(response)
    assert role_of(group=crew.group, user=crew.admin2) == Role.ADMIN


def test_web_role_change_remove_rename_transfer_delete(crew, web_as, django_capture_on_commit_callbacks):
    _, secret = key_create(owner=crew.target, name="bound", group=crew.group)
    admin = web_as(crew.admin)
    admin.post(f"/groups/crew/members/{crew.member.pk}/role/", {"role": "viewer"})
    assert role_of(group=crew.group, user=crew.member) == Role.VIEWER
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(f"/groups/crew/members/{crew.target.pk}/remove/")
    assert role_of(group=crew.group, user=crew.target) is None
    assert key_resolve(secret=secret) is None
    admin.post("/groups/crew/rename/", {"name": "Crew Two"})
    crew.group.refresh_from_db()
    assert crew.group.name == "Crew Two"

    owner = web_as(crew.owner)
    owner.post("/groups/crew/transfer/", {"user_id": crew.admin.pk})
    assert role_of(group=crew.group, user=crew.admin) == Role.OWNER
    assert role_of(group=crew.group, user=crew.owner) == Role.ADMIN
    left = owner.post("/groups/crew/leave/")
    assert left["Location"] == "/groups/" and role_of(group=crew.group, user=crew.owner) is None
    # Deleting asks first, on a page of its own: a post without its confirmation changes nothing.
    one_click = admin.post("/groups/crew/delete/")
    assert one_click["Location"] == "/groups/crew/delete/" and Group.objects.filter(slug="crew").exists()
    confirm = page(admin.get("/groups/crew/delete/"))
    assert "Delete Crew Two?" in confirm and 'name="confirm" value="yes"' in confirm
    deleted = admin.post("/groups/crew/delete/", {"confirm": "yes"})
    assert deleted["Location"] == "/groups/" and not Group.objects.filter(slug="crew").exists()


def test_invitation_page_accept(crew, link_invitation, web_as):
    _, token = link_invitation
    newbie = make_user()
    client = web_as(newbie)
    shown = page(client.get(f"/invitations/{token}/"))
    assert "Crew" in shown and 'value="accept"' in shown and 'value="decline"' in shown
    response = client.post(f"/invitations/{token}/", {"action": "accept"})
    assert response["Location"] == "/groups/crew/"
    assert role_of(group=crew.group, user=newbie) == Role.MEMBER
    used = page(web_as(make_user()).get(f"/invitations/{token}/"))
    assert "already been used" in used and 'value="accept"' not in used


def test_invitation_page_decline_expired_and_wrong_email(crew, web_as):
    invitation, link = invitation_create(actor=crew.owner, group=crew.group, email="pal@example.com")
    token = token_of(link)
    wrong = page(web_as(make_user()).get(f"/invitations/{token}/"))
    assert "sent to pal@example.com" in wrong and 'value="accept"' not in wrong
    pal = make_user(email="pal@example.com", email_verified_at=timezone.now())
    declined = web_as(pal).post(f"/invitations/{token}/", {"action": "decline"})
    assert declined["Location"] == "/groups/"
    assert role_of(group=crew.group, user=pal) is None
    assert "was declined" in page(web_as(pal).get(f"/invitations/{token}/"))

    expired, link = invitation_create(actor=crew.owner, group=crew.group)
    Invitation.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    client = web_as(make_user())
    assert "has expired" in page(client.get(f"/invitations/{token_of(link)}/"))
    refused = client.post(f"/invitations/{token_of(link)}/", {"action": "accept"}, follow=True)
    assert "has expired" in page(refused)
    assert web_as(make_user()).get("/invitations/bogus/").status_code == 404


@pytest.mark.parametrize("path, data", [
    ("/groups/", {"name": "Forged"}),
    ("/groups/crew/rename/", {"name": "Forged"}),
    ("/groups/crew/delete/", {}),
    ("/groups/crew/leave/", {}),
    ("/groups/crew/transfer/", {"user_id": "{target}"}),
    ("/groups/crew/invitations/", {"email": "", "role": "member"}),
    ("/groups/crew/invitations/{invitation}/revoke/", {}),
    ("/groups/crew/members/{target}/role/", {"role": "viewer"}),
    ("/groups/crew/members/{target}/remove/", {}),
    ("/invitations/{token}/", {"action": "decline"}),
])
def test_web_forms_enforce_csrf(crew, link_invitation, path, data):
    invitation, token = link_invitation
    values = {"target": crew.target.pk, "invitation": invitation.pk, "token": token}
    client = Client(enforce_csrf_checks=True)
    # The invitation page is posted by the invitee (an outsider), the rest by the owner, who may do it all.
    client.force_login(crew.outsider if path.startswith("/invitations/") else crew.owner)
    data = {k: str(v).format(**values) for k, v in data.items()}
    response = client.post(path.format(**values), data)
    assert response.status_code == 403
    assert Group.objects.filter(slug="crew", name="Crew").exists()
    assert not Group.objects.filter(slug="forged").exists()
    assert role_of(group=crew.group, user=crew.target) == Role.MEMBER
    assert role_of(group=crew.group, user=crew.owner) == Role.OWNER
    assert Invitation.objects.filter(group=crew.group).count() == 1
    assert Invitation.objects.get(pk=invitation.pk).revoked_at is None
    assert Invitation.objects.get(pk=invitation.pk).declined_at is None


def test_web_forms_work_with_the_csrf_token_from_the_page(crew):
    client = Client(enforce_csrf_checks=True)
    client.force_login(crew.owner)
    form_page = client.get("/groups/crew/")
    token = form_page.context["csrf_token"]
    response = client.post("/groups/crew/rename/", {"name": "Crew Renamed", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    crew.group.refresh_from_db()
    assert crew.group.name == "Crew Renamed"


# An email invitation to someone with no account, on a site with no mail server (the embedded default) ------

def _link_path(body: str, prefix: str) -> str:
    match = re.search(r"https?://[^/\s]+(" + re.escape(prefix) + r"[^\s\"<]*)", body)
    assert match, f"no {prefix} link in: {body}"
    return html.unescape(match.group(1))


def test_a_new_person_invited_by_email_signs_up_confirms_and_joins(crew, settings,
                                                                  django_capture_on_commit_callbacks):
    settings.EMAIL_BACKEND = LOCAL_MAILBOX_BACKEND
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = False  # the embedded default: unconfirmed accounts log in
    with django_capture_on_commit_callbacks(execute=True):
        _invitation, link = invitation_create(actor=crew.owner, group=crew.group, email="newbie@example.com")
    invitation_path = link[link.index("/invitations/"):]
    newbie = Client()

    # Signed out, the invitation asks for a log-in and remembers where it was; the sign-up link keeps it.
    response = newbie.get(invitation_path)
    assert response.status_code == 302
    login_path = response["Location"]
    assert login_path == f"/login/?next={quote(invitation_path)}"
    signup_path = re.search(r'href="(/signup/[^"]*)" id="signup-link"', page(newbie.get(login_path))).group(1)
    assert unquote(signup_path) == f"/signup/?next={invitation_path}"
    assert f'name="next" value="{invitation_path}"' in page(newbie.get(signup_path))
    signed_up = newbie.post(signup_path, {"email": "newbie@example.com", "next": invitation_path,
                                          "new_password1": PASSWORD, "new_password2": PASSWORD})
    assert f'name="next" value="{invitation_path}"' in page(signed_up)
    response = newbie.post("/login/", {"email": "newbie@example.com", "password": PASSWORD,
                                       "next": invitation_path})
    assert response.status_code == 302 and response["Location"] == invitation_path  # not onboarding

    # The address is not confirmed yet: the page asks for that first and can send the link.
    invitation_page = page(newbie.get(invitation_path))
    assert 'id="confirm-first"' in invitation_page and 'value="accept"' not in invitation_page
    refused = newbie.post(invitation_path, {"action": "accept"}, follow=True)
    assert "Confirm your email address first" in page(refused)
    response = newbie.post("/verify-email/request/", {"next": invitation_path})
    assert response.status_code == 302 and response["Location"] == "/mailbox/"

    # The site sends no mail out: both mails wait in the newcomer's mailbox, and nobody else's.
    mailbox = page(newbie.get("/mailbox/"))
    assert "You are invited to join Crew" in mailbox and "Confirm your email address" in mailbox
    assert "Confirm your email address" not in page(web_client(crew.owner).get("/mailbox/"))
    confirm = newbie.get(_link_path(mailbox, "/verify-email/"))
    assert confirm.status_code == 302 and confirm["Location"] == invitation_path
    response = newbie.post(invitation_path, {"action": "accept"})
    assert response.status_code == 302 and response["Location"] == "/groups/crew/"
    assert role_of(group=crew.group, user=User.objects.get(email="newbie@example.com")) == Role.MEMBER


def test_the_mailbox_is_only_there_when_the_site_keeps_its_mail(crew, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    client = web_client(crew.owner)
    assert client.get("/mailbox/").status_code == 404
    assert 'href="/mailbox/"' not in page(client.get("/groups/"))
    settings.EMAIL_BACKEND = LOCAL_MAILBOX_BACKEND
    assert client.get("/mailbox/").status_code == 200
    assert 'href="/mailbox/"' in page(client.get("/groups/"))


def test_only_the_owner_is_asked_to_delete_the_group(crew, web_as):
    for who in (crew.admin, crew.member):
        client = web_as(who)
        for response in (client.get("/groups/crew/delete/"),
                         client.post("/groups/crew/delete/", {"confirm": "yes"})):
            assert response["Location"] == "/groups/crew/"
        assert Group.objects.filter(slug="crew").exists()
    assert "Only the owner of the group can delete it." in page(web_as(crew.admin).get("/groups/crew/delete/",
                                                                                  follow=True))
    confirm = page(web_as(crew.owner).get("/groups/crew/delete/"))
    assert "revokes its" in confirm and "clawhub-group-crew" in confirm
