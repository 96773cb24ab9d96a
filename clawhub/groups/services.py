"""Writes for groups, memberships and invitations.

Who may do what (enforced here, whatever the caller checked before):
- viewer: see the group and its members;      member: + bind keys to the group, leave;
- admin: + invite members/viewers, revoke invitations, remove members/viewers, switch roles between member and
  viewer, rename the group;
- owner: + invite/promote/demote/remove admins, transfer ownership, delete the group. Exactly one owner, who
  cannot leave without transferring first.
Non-members get NotFound rather than PermissionDenied, so a group's existence does not leak.
"""

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.core.updates import model_update
from clawhub.groups.models import ROLE_RANK, Group, Invitation, Membership, Role
from clawhub.groups.rules import can_change_role, can_grant, can_remove
from clawhub.groups.selectors import (
    invitation_get_by_token,
    invitation_status,
    invitation_token_digest,
    role_of,
)
from clawhub.keys.models import ApiKey
from clawhub.keys.services import key_revoke


@transaction.atomic
def group_create(*, actor: User, name: str, slug: str = "", ip: str | None = None) -> Group:
    """Creates a group, its tenant (shared adapter) and the creator's owner membership."""
    from clawhub.tenants.models import Tenant

    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A group needs a name.", field="name")
    slug = slugify(slug or name)[:60]
    if not slug:
        raise ValidationFailed("The group name needs at least one letter or digit.", field="slug")
    if Group.objects.filter(slug=slug).exists():
        raise Conflict("A group with this slug already exists.", code="slug_taken", field="slug")
    group = Group.objects.create(name=name, slug=slug, created_by=actor)
    Tenant.objects.create(kind=Tenant.Kind.GROUP, group=group)
    Membership.objects.create(group=group, user=actor, role=Role.OWNER)
    audit_record(actor=actor, action="group.create", target=group, subject_user=actor, group=group, ip=ip)
    return group


# --- helpers ------------------------------------------------------------------------------------------------


def _require_role(*, group: Group, actor: User, at_least: Role, action: str) -> Role:
    """The actor's role if at least ``at_least``; NotFound for non-members, PermissionDenied if weaker."""
    role = role_of(group=group, user=actor)
    if role is None:
        raise NotFound("No such group.")
    if ROLE_RANK[role] < ROLE_RANK[at_least]:
        raise PermissionDenied(f"Only a group {at_least.value} or above may {action}.", role=role.value)
    return role


def _lock_group(group: Group) -> None:
    # Every membership change locks the group row first, so concurrent changes (two transfers, a removal
    # racing a promotion, two people accepting one link) happen one after another and see each other's result.
    Group.objects.select_for_update().filter(pk=group.pk).first()


def _locked_membership(group: Group, user: User) -> Membership:
    """``user``'s membership of the group, read after locking the group (see _lock_group)."""
    _lock_group(group)
    membership = Membership.objects.filter(group=group, user=user).first()
    if membership is None:
        raise NotFound("No such member.")
    return membership


def _parse_role(value: str | Role, *, field: str = "role") -> Role:
    try:
        return Role(value)
    except ValueError:
        raise ValidationFailed(f"Unknown role {value!r}.", field=field) from None


def _revoke_keys(*, group: Group, actor: User, owner: User | None = None, ip: str | None, reason: str) -> int:
    """Revokes the live keys bound to the group (only ``owner``'s when given): keys need member or above."""
    keys = ApiKey.objects.filter(group=group, revoked_at__isnull=True).select_related("owner", "group")
    if owner is not None:
        keys = keys.filter(owner=owner)
    count = 0
    for key in keys:
        key_revoke(key=key, actor=actor, ip=ip, reason=reason)
        count += 1
    return count


def _revoke_invitations_beyond(*, group: Group, inviter: User, role: Role | None, actor: User | None,
                               ip: str | None, reason: str) -> int:
    """Revokes the open invitations ``inviter`` made in the group that their role now (``role``; None when
    they are no longer in the group) could not make. An invitation speaks with its inviter's authority, so it
    must not outlive it: a removed or demoted admin's links would otherwise still let people in."""
    count = 0
    now = timezone.now()
    open_ones = Invitation.objects.select_for_update().filter(
        group=group, invited_by=inviter, accepted_at__isnull=True, declined_at__isnull=True,
        revoked_at__isnull=True, expires_at__gt=now)
    for invitation in open_ones:
        if role is not None and can_grant(role, Role(invitation.role)):
            continue
        invitation.revoked_at = now
        invitation.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="invitation.revoke", target=invitation, subject_user=inviter,
                     group=group, ip=ip, email=invitation.email, role=invitation.role, reason=reason)
        count += 1
    return count


def invitation_link(*, token: str) -> str:
    """The absolute URL an invitee opens to accept or decline."""
    return f"{settings.PUBLIC_BASE_URL}{reverse('invitation', kwargs={'token': token})}"


# --- groups -------------------------------------------------------------------------------------------------


@transaction.atomic
def group_update(*, actor: User, group: Group, name: str, ip: str | None = None) -> Group:
    """Renames the group. The slug stays: it is the group's URL and clients' model id clawhub-group-<slug>."""
    _require_role(group=group, actor=actor, at_least=Role.ADMIN, action="rename the group")
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A group needs a name.", field="name")
    if len(name) > Group._meta.get_field("name").max_length:  # type: ignore[operator]  # a CharField's max_length is set
        raise ValidationFailed("The name is too long.", field="name")
    changed = model_update(instance=group, fields=["name"], data={"name": name})
    if changed:
        audit_record(actor=actor, action="group.update", target=group, subject_user=actor, group=group, ip=ip,
                     old_name=changed["name"][0], name=name)
    return group


@transaction.atomic
def group_delete(*, actor: User, group: Group, ip: str | None = None) -> None:
    """Deletes the group and, by cascade, its tenant, memberships and invitations.

    Keys bound to it are revoked first, through key_revoke, so that gateways drop their cached copies and each
    revocation is audited; the cascade then removes the rows.
    """
    _require_role(group=group, actor=actor, at_least=Role.OWNER, action="delete the group")
    _lock_group(group)
    revoked = _revoke_keys(group=group, actor=actor, ip=ip, reason="group deleted")
    # Recorded before the delete: the audit row keeps slug and name after its group link is nulled.
    audit_record(actor=actor, action="group.delete", target=group, subject_user=actor, group=group, ip=ip,
                 slug=group.slug, name=group.name, keys_revoked=revoked)
    group.delete()


@transaction.atomic
def group_transfer_ownership(
    *, actor: User, group: Group, new_owner: User, ip: str | None = None
) -> Membership:
    """Makes an existing member the owner; the old owner stays on as admin."""
    _require_role(group=group, actor=actor, at_least=Role.OWNER, action="transfer ownership")
    _lock_group(group)
    if new_owner.pk == actor.pk:
        # The state is what is wrong, not the input (the same id is a valid transfer in another group).
        raise Conflict("You already own this group.", code="already_owner", field="user_id")
    target = Membership.objects.filter(group=group, user=new_owner).first()
    if target is None:
        raise ValidationFailed("Ownership can only go to a member of the group.", code="not_a_member",
                               field="user_id")
    old = Membership.objects.get(group=group, user=actor)
    # Demote first: the one_owner_per_group constraint forbids two owners even for an instant.
    old.role = Role.ADMIN
    old.save(update_fields=["role"])
    _revoke_invitations_beyond(group=group, inviter=actor, role=Role.ADMIN, actor=actor, ip=ip,
                               reason="no longer the owner")
    previous_role = target.role
    target.role = Role.OWNER
    target.save(update_fields=["role"])
    audit_record(actor=actor, action="group.transfer_ownership", target=group, subject_user=new_owner,
                 group=group, ip=ip, previous_owner=actor.pk, new_owner=new_owner.pk,
                 new_owner_previous_role=previous_role)
    return target


# --- memberships --------------------------------------------------------------------------------------------


@transaction.atomic
def membership_change_role(
    *, actor: User, group: Group, user: User, role: str | Role, ip: str | None = None
) -> Membership:
    """Changes a member's role. Admins switch people between member and viewer; admin roles are the owner's.

    Demotion to viewer revokes the person's keys bound to the group (binding a key needs member or above).
    """
    actor_role = _require_role(group=group, actor=actor, at_least=Role.ADMIN, action="change roles")
    new_role = _parse_role(role)
    membership = _locked_membership(group, user)
    old_role = Role(membership.role)
    if new_role == Role.OWNER:
        raise ValidationFailed("Use an ownership transfer to make someone the owner.", code="use_transfer",
                               field="role")
    if old_role == Role.OWNER:
        raise PermissionDenied("The owner's role changes only through an ownership transfer.")
    if not can_change_role(actor_role, old_role, new_role):
        raise PermissionDenied("Only the owner may promote or demote admins.")
    if new_role == old_role:
        return membership
    membership.role = new_role
    membership.save(update_fields=["role"])
    _revoke_invitations_beyond(group=group, inviter=user, role=new_role, actor=actor, ip=ip,
                               reason=f"inviter now {new_role.value}")
    revoked = 0
    if ROLE_RANK[new_role] < ROLE_RANK[Role.MEMBER]:
        revoked = _revoke_keys(group=group, actor=actor, owner=user, ip=ip,
                               reason=f"demoted to {new_role.value}")
    audit_record(actor=actor, action="membership.change_role", target=membership, subject_user=user,
                 group=group, ip=ip, old_role=old_role.value, role=new_role.value, keys_revoked=revoked)
    return membership


@transaction.atomic
def membership_remove(*, actor: User, group: Group, user: User, ip: str | None = None) -> None:
    """Removes someone from the group and revokes their keys bound to it. Removing oneself is leaving."""
    if user.pk == actor.pk:
        return membership_leave(actor=actor, group=group, ip=ip)
    actor_role = _require_role(group=group, actor=actor, at_least=Role.ADMIN, action="remove members")
    membership = _locked_membership(group, user)
    role = Role(membership.role)
    if role == Role.OWNER:
        raise PermissionDenied("The owner cannot be removed.")
    if not can_remove(actor_role, role):
        raise PermissionDenied("Only the owner may remove admins.")
    _membership_end(membership, group=group, user=user, role=role, actor=actor, ip=ip,
                    action="membership.remove", reason="removed from group")


@transaction.atomic
def membership_leave(*, actor: User, group: Group, ip: str | None = None) -> None:
    """The actor leaves the group; their keys bound to it are revoked. The owner must transfer first."""
    role = _require_role(group=group, actor=actor, at_least=Role.VIEWER, action="leave")
    if role == Role.OWNER:
        raise Conflict("The owner cannot leave; transfer ownership to another member first.",
                       code="owner_must_transfer")
    _lock_group(group)
    membership = Membership.objects.get(group=group, user=actor)
    _membership_end(membership, group=group, user=actor, role=role, actor=actor, ip=ip,
                    action="membership.leave", reason="left group")


def _membership_end(membership: Membership, *, group: Group, user: User, role: Role, actor: User,
                    ip: str | None, action: str, reason: str) -> None:
    """``user`` is out of the group: their keys bound to it and their open invitations are revoked, the
    membership audited and deleted."""
    revoked = _revoke_keys(group=group, actor=actor, owner=user, ip=ip, reason=reason)
    _revoke_invitations_beyond(group=group, inviter=user, role=None, actor=actor, ip=ip,
                               reason=f"inviter {reason}")
    audit_record(actor=actor, action=action, target=membership, subject_user=user, group=group, ip=ip,
                 role=role.value, keys_revoked=revoked)
    membership.delete()


# --- invitations --------------------------------------------------------------------------------------------


@transaction.atomic
def invitation_create(
    *, actor: User, group: Group, email: str = "", role: str | Role = Role.MEMBER, ip: str | None = None
) -> tuple[Invitation, str]:
    """Creates an invitation and returns it with its link, which holds the only copy of the token.

    With an email, the link is mailed there and only a user with that address may accept. Without one, the
    link itself is the invitation: whoever holds it may accept it, once.
    """
    actor_role = _require_role(group=group, actor=actor, at_least=Role.ADMIN, action="invite people")
    role = _parse_role(role)
    if role == Role.OWNER:
        raise ValidationFailed("Nobody is invited as owner; transfer ownership to a member instead.",
                               field="role")
    if not can_grant(actor_role, role):
        raise PermissionDenied("Only the owner may invite admins.")
    email = (email or "").strip().lower()
    invitee = None
    if email:
        try:
            validate_email(email)
        except DjangoValidationError:
            raise ValidationFailed("Enter a valid email address.", field="email") from None
        invitee = User.objects.filter(email__iexact=email).first()
        if invitee is not None and Membership.objects.filter(group=group, user=invitee).exists():
            raise Conflict("This person is already a member of the group.", code="already_member",
                           field="email")
        open_invitations = Invitation.objects.filter(
            group=group, email__iexact=email, accepted_at__isnull=True, declined_at__isnull=True,
            revoked_at__isnull=True, expires_at__gt=timezone.now(),
        )
        if open_invitations.exists():
            raise Conflict("This address already has an open invitation; revoke it to send a new one.",
                           code="already_invited", field="email")
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        group=group,
        email=email,
        role=role,
        token_digest=invitation_token_digest(token),
        invited_by=actor,
        expires_at=timezone.now() + settings.INVITATION_TTL,
    )
    link = invitation_link(token=token)
    audit_record(actor=actor, action="invitation.create", target=invitation, subject_user=invitee,
                 group=group, ip=ip, email=email, role=role.value, by_link=not email)
    if email:
        subject = f"You are invited to join {group.name} on ClawHub"
        body = (
            f"{actor.name} invited you to join the group \"{group.name}\" on ClawHub as {role.value}.\n\n"
            f"Open this link to accept or decline:\n{link}\n\n"
            f"The invitation expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC. "
            f"Sign in (or sign up) with {email} to accept it.\n"
        )
        # After commit: a rolled-back invitation must not leave a live-looking email behind.
        transaction.on_commit(lambda: send_mail(subject, body, None, [email]))
    return invitation, link


@transaction.atomic
def invitation_revoke(*, actor: User, invitation: Invitation, ip: str | None = None) -> Invitation:
    group = invitation.group
    _require_role(group=group, actor=actor, at_least=Role.ADMIN, action="revoke invitations")
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    status = invitation_status(invitation)
    if status in ("accepted", "declined"):
        raise Conflict(f"This invitation was already {status}.", code=f"invitation_{status}")
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        invitee = User.objects.filter(email__iexact=invitation.email).first() if invitation.email else None
        audit_record(actor=actor, action="invitation.revoke", target=invitation, subject_user=invitee,
                     group=group, ip=ip, email=invitation.email, role=invitation.role)
    return invitation


_CLOSED_MESSAGES = {
    "accepted": "This invitation has already been used.",
    "declined": "This invitation was declined.",
    "revoked": "This invitation was revoked by the group's admins.",
    "expired": "This invitation has expired; ask the group's admins for a new one.",
}


def _open_invitation_for(*, token: str, user: User) -> Invitation:
    """The invitation behind a token, locked, if it is still open and addressed to this user."""
    invitation = invitation_get_by_token(token=token)
    invitation = Invitation.objects.select_for_update().select_related("group").get(pk=invitation.pk)
    status = invitation_status(invitation)
    if status != "open":
        code = "invitation_used" if status == "accepted" else f"invitation_{status}"
        raise Conflict(_CLOSED_MESSAGES[status], code=code, status_detail=status)
    if invitation.email and invitation.email.lower() != user.email.lower():
        raise PermissionDenied(
            "This invitation was sent to another email address; sign in with that address to answer it.",
            code="wrong_email",
        )
    if invitation.email and user.email_verified_at is None:
        # Anyone can sign up with an address; only its mailbox's owner may take a seat meant for it.
        raise PermissionDenied(
            "Confirm your email address first (follow the link we sent you); then accept the invitation.",
            code="email_unverified",
        )
    return invitation


@transaction.atomic
def invitation_accept(*, actor: User, token: str, ip: str | None = None) -> Membership:
    """Joins the actor to the invitation's group with the invited role. The invitation is then used up."""
    invitation = _open_invitation_for(token=token, user=actor)
    group = invitation.group
    _lock_group(group)
    if Membership.objects.filter(group=group, user=actor).exists():
        raise Conflict("You are already a member of this group.", code="already_member")
    # Checked again here, whatever revoked or not: the inviter must still be able to grant the role now.
    inviter_role = role_of(group=group, user=invitation.invited_by) if invitation.invited_by else None
    if not can_grant(inviter_role, Role(invitation.role)):
        raise Conflict(_CLOSED_MESSAGES["revoked"], code="invitation_revoked", status_detail="revoked")
    membership = Membership.objects.create(group=group, user=actor, role=invitation.role)
    invitation.accepted_by = actor
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_by", "accepted_at"])
    audit_record(actor=actor, action="invitation.accept", target=invitation, subject_user=actor, group=group,
                 ip=ip, role=invitation.role, invited_by=invitation.invited_by_id)
    return membership


@transaction.atomic
def invitation_decline(*, actor: User, token: str, ip: str | None = None) -> Invitation:
    """Declines an open invitation; it cannot be used afterwards."""
    invitation = _open_invitation_for(token=token, user=actor)
    # A member has nothing to decline, and letting them would burn a link meant for someone else.
    if Membership.objects.filter(group=invitation.group, user=actor).exists():
        raise Conflict("You are already a member of this group.", code="already_member")
    invitation.declined_at = timezone.now()
    invitation.save(update_fields=["declined_at"])
    audit_record(actor=actor, action="invitation.decline", target=invitation, subject_user=actor,
                 group=invitation.group, ip=ip, role=invitation.role)
    return invitation
