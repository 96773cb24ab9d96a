"""Finding 4: invitations do not outlive the inviter's rights, and an email-bound one needs that mailbox.

The attack: an admin makes a link invitation (or several), is then removed or demoted, and the links still let
people into the group. Or someone signs up with the invitee's address without owning it and takes the seat.
"""

import pytest
from django.utils import timezone

from clawhub.core.exceptions import Conflict, PermissionDenied
from clawhub.groups.models import Invitation, Membership, Role
from clawhub.groups.services import (
    group_transfer_ownership,
    invitation_accept,
    invitation_create,
    membership_change_role,
    membership_leave,
    membership_remove,
)
from tests.factories import add_member, make_group, make_user

pytestmark = pytest.mark.django_db


def token_of(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[1]


@pytest.fixture
def crew():
    owner = make_user()
    group = make_group(owner)
    admin = add_member(group, make_user(), Role.ADMIN)
    return owner, group, admin


@pytest.mark.parametrize("how", ["removed", "demoted", "left"])
def test_a_removed_or_demoted_admins_link_is_dead(crew, how):
    owner, group, admin = crew
    _, link = invitation_create(actor=admin, group=group, role=Role.MEMBER)
    _, owners_link = invitation_create(actor=owner, group=group, role=Role.MEMBER)
    if how == "removed":
        membership_remove(actor=owner, group=group, user=admin)
    elif how == "demoted":
        membership_change_role(actor=owner, group=group, user=admin, role=Role.MEMBER)
    else:
        membership_leave(actor=admin, group=group)
    stranger = make_user()
    with pytest.raises(Conflict) as err:
        invitation_accept(actor=stranger, token=token_of(link))
    assert err.value.code == "invitation_revoked"
    assert not Membership.objects.filter(group=group, user=stranger).exists()
    assert Invitation.objects.get(invited_by=admin).revoked_at is not None
    # The owner's own invitation is untouched.
    assert invitation_accept(actor=stranger, token=token_of(owners_link)).role == Role.MEMBER


def test_acceptance_rechecks_the_inviters_role_even_if_nothing_revoked_it(crew):
    """A role changed behind the services' back (Django admin, a data fix) must not leave a live link."""
    owner, group, admin = crew
    _, link = invitation_create(actor=admin, group=group, role=Role.VIEWER)
    Membership.objects.filter(group=group, user=admin).update(role=Role.VIEWER)
    with pytest.raises(Conflict) as err:
        invitation_accept(actor=make_user(), token=token_of(link))
    assert err.value.code == "invitation_revoked"


def test_a_former_owners_admin_invitations_die_with_the_ownership(crew):
    owner, group, admin = crew
    _, admin_link = invitation_create(actor=owner, group=group, role=Role.ADMIN)
    _, member_link = invitation_create(actor=owner, group=group, role=Role.MEMBER)
    group_transfer_ownership(actor=owner, group=group, new_owner=admin)
    with pytest.raises(Conflict):
        invitation_accept(actor=make_user(), token=token_of(admin_link))
    assert invitation_accept(actor=make_user(), token=token_of(member_link)).role == Role.MEMBER


def test_an_email_invitation_needs_a_verified_address(crew):
    owner, group, _ = crew
    _, link = invitation_create(actor=owner, group=group, email="pal@example.com", role=Role.MEMBER)
    squatter = make_user("pal@example.com")  # signed up with the address, never proved it
    with pytest.raises(PermissionDenied) as err:
        invitation_accept(actor=squatter, token=token_of(link))
    assert err.value.code == "email_unverified"
    assert not Membership.objects.filter(group=group, user=squatter).exists()
    squatter.email_verified_at = timezone.now()
    squatter.save(update_fields=["email_verified_at"])
    assert invitation_accept(actor=squatter, token=token_of(link)).role == Role.MEMBER
