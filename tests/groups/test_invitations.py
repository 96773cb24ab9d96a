from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.accounts.models import AuditLog
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.groups.models import Invitation, Role
from clawhub.groups.selectors import group_invitations, invitation_get_by_token, invitation_status, role_of
from clawhub.groups.services import (
    invitation_accept,
    invitation_create,
    invitation_decline,
    invitation_revoke,
)
from tests.factories import make_user
from tests.groups.conftest import token_of

pytestmark = pytest.mark.django_db


def invite(crew, actor=None, **kwargs):
    invitation, link = invitation_create(actor=actor or crew.owner, group=crew.group, **kwargs)
    return invitation, token_of(link)


# --- by email -----------------------------------------------------------------------------------------------


def test_email_invitation_mails_the_accept_link_and_stores_only_a_digest(
        crew, mailoutbox, django_capture_on_commit_callbacks, settings):
    settings.PUBLIC_BASE_URL = "https://hub.example"
    with django_capture_on_commit_callbacks(execute=True):
        invitation, link = invitation_create(actor=crew.admin, group=crew.group, email=" Newbie@Example.com ",
                                             role=Role.VIEWER, ip="10.1.1.1")
    token = token_of(link)
    assert link == f"https://hub.example/invitations/{token}/"
    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert mail.to == ["newbie@example.com"]
    assert "Crew" in mail.subject
    assert link in mail.body
    assert len(token) >= 43
    row = Invitation.objects.filter(pk=invitation.pk).values().get()
    assert all(token not in str(value) for value in row.values())
    assert invitation_get_by_token(token=token).pk == invitation.pk
    assert invitation.email == "newbie@example.com" and invitation.role == Role.VIEWER
    audit = AuditLog.objects.get(action="invitation.create")
    assert (audit.actor, audit.group, audit.ip) == (crew.admin, crew.group, "10.1.1.1")


def test_no_mail_when_the_invitation_is_rolled_back(crew, mailoutbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        invitation_create(actor=crew.owner, group=crew.group, email="later@example.com")
    assert len(callbacks) == 1 and mailoutbox == []


def test_invitee_with_that_email_accepts_once(crew):
    invitation, token = invite(crew, email="Newbie@example.com", role=Role.VIEWER)
    newbie = make_user(email="newbie@example.com", email_verified_at=timezone.now())
    membership = invitation_accept(actor=newbie, token=token, ip="10.1.1.2")
    assert membership.role == Role.VIEWER
    assert role_of(group=crew.group, user=newbie) == Role.VIEWER
    invitation.refresh_from_db()
    assert invitation.accepted_by == newbie and invitation_status(invitation) == "accepted"
    audit = AuditLog.objects.get(action="invitation.accept")
    assert (audit.actor, audit.subject_user, audit.group) == (newbie, newbie, crew.group)
    with pytest.raises(Conflict) as excinfo:  # reuse
        invitation_accept(actor=newbie, token=token)
    assert excinfo.value.code == "invitation_used"


def test_email_invitation_refuses_another_address(crew):
    invitation, token = invite(crew, email="newbie@example.com")
    stranger = make_user(email="stranger@example.com")
    with pytest.raises(PermissionDenied) as excinfo:
        invitation_accept(actor=stranger, token=token)
    assert excinfo.value.code == "wrong_email"
    with pytest.raises(PermissionDenied):
        invitation_decline(actor=stranger, token=token)
    assert role_of(group=crew.group, user=stranger) is None
    invitation.refresh_from_db()
    assert invitation_status(invitation) == "open"


def test_expired_invitation_is_refused(crew, settings):
    settings.INVITATION_TTL = timedelta(hours=2)
    invitation, token = invite(crew)
    assert timedelta(hours=1, minutes=59) < invitation.expires_at - timezone.now() <= timedelta(hours=2)
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Conflict) as excinfo:
        invitation_accept(actor=make_user(), token=token)
    assert excinfo.value.code == "invitation_expired"
    assert "expired" in excinfo.value.message


def test_revoked_invitation_is_refused(crew):
    invitation, token = invite(crew, email="newbie@example.com")
    invitation_revoke(actor=crew.admin, invitation=invitation)
    assert AuditLog.objects.filter(action="invitation.revoke", group=crew.group).exists()
    with pytest.raises(Conflict) as excinfo:
        invitation_accept(actor=make_user(email="newbie@example.com"), token=token)
    assert excinfo.value.code == "invitation_revoked"
    assert list(group_invitations(group=crew.group)) == []


def test_declined_invitation_cannot_be_accepted(crew):
    invitation, token = invite(crew, email="newbie@example.com")
    newbie = make_user(email="newbie@example.com", email_verified_at=timezone.now())
    invitation_decline(actor=newbie, token=token)
    invitation.refresh_from_db()
    assert invitation_status(invitation) == "declined"
    assert AuditLog.objects.get(action="invitation.decline").subject_user == newbie
    with pytest.raises(Conflict) as excinfo:
        invitation_accept(actor=newbie, token=token)
    assert excinfo.value.code == "invitation_declined"
    assert role_of(group=crew.group, user=newbie) is None


def test_unknown_token_is_not_found(crew):
    with pytest.raises(NotFound):
        invitation_accept(actor=crew.outsider, token="no-such-token")
    with pytest.raises(NotFound):
        invitation_get_by_token(token="")


def test_existing_member_cannot_accept_or_decline(crew):
    _, token = invite(crew)
    with pytest.raises(Conflict):
        invitation_accept(actor=crew.viewer, token=token)
    with pytest.raises(Conflict):
        invitation_decline(actor=crew.viewer, token=token)
    assert role_of(group=crew.group, user=crew.viewer) == Role.VIEWER
    assert invitation_accept(actor=crew.outsider, token=token).role == Role.MEMBER  # still open for others


def test_cannot_invite_a_member_or_invite_twice(crew):
    with pytest.raises(Conflict):
        invite(crew, email="MEMBER@example.com")
    invite(crew, email="twice@example.com")
    with pytest.raises(Conflict):
        invite(crew, email="twice@example.com")
    with pytest.raises(ValidationFailed):
        invite(crew, email="not-an-email")


# --- by link ------------------------------------------------------------------------------------------------


def test_link_invitation_admits_whoever_holds_it_once(crew, mailoutbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        invitation, token = invite(crew, actor=crew.admin)
    assert mailoutbox == [] and invitation.email == ""
    first, second = make_user(), make_user()
    assert invitation_accept(actor=first, token=token).role == Role.MEMBER
    with pytest.raises(Conflict) as excinfo:
        invitation_accept(actor=second, token=token)
    assert excinfo.value.code == "invitation_used"
    assert role_of(group=crew.group, user=second) is None


def test_every_link_has_its_own_token(crew):
    tokens = {invite(crew)[1] for _ in range(3)}
    assert len(tokens) == 3
    assert group_invitations(group=crew.group).count() == 3


# --- who may invite and revoke ------------------------------------------------------------------------------


def test_admins_invite_up_to_member_only_the_owner_invites_admins(crew):
    assert invite(crew, actor=crew.admin, role=Role.MEMBER)[0].role == Role.MEMBER
    assert invite(crew, actor=crew.admin, role=Role.VIEWER)[0].role == Role.VIEWER
    with pytest.raises(PermissionDenied):
        invite(crew, actor=crew.admin, role=Role.ADMIN)
    invitation, token = invite(crew, actor=crew.owner, role=Role.ADMIN)
    newbie = make_user()
    invitation_accept(actor=newbie, token=token)
    assert role_of(group=crew.group, user=newbie) == Role.ADMIN


def test_nobody_is_invited_as_owner(crew):
    with pytest.raises(ValidationFailed):
        invite(crew, actor=crew.owner, role=Role.OWNER)


@pytest.mark.parametrize("who, error", [("member", PermissionDenied), ("viewer", PermissionDenied),
                                         ("outsider", NotFound)])
def test_members_and_outsiders_cannot_invite_or_revoke(crew, who, error):
    with pytest.raises(error):
        invite(crew, actor=crew.as_role(who))
    invitation, _ = invite(crew)
    with pytest.raises(error):
        invitation_revoke(actor=crew.as_role(who), invitation=invitation)
    invitation.refresh_from_db()
    assert invitation.revoked_at is None


def test_a_used_invitation_cannot_be_revoked(crew):
    invitation, token = invite(crew)
    invitation_accept(actor=make_user(), token=token)
    with pytest.raises(Conflict):
        invitation_revoke(actor=crew.owner, invitation=invitation)
