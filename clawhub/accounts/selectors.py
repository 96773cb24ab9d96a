"""Reads for users, account tokens and the audit log."""

from django.conf import settings
from django.contrib.auth.tokens import default_token_generator
from django.core import signing
from django.db.models import Q, QuerySet
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode

from clawhub.accounts.models import AuditLog, MailboxMessage, User
from clawhub.core.exceptions import NotFound, PermissionDenied
from clawhub.groups.models import Group, Role
from clawhub.groups.selectors import has_role, role_of

# Separates email-verification signatures from every other use of SECRET_KEY.
EMAIL_VERIFICATION_SALT = "clawhub.accounts.verify-email"
# The email backend that keeps mail for /mailbox/ (clawhub/accounts/mailbox.py).
LOCAL_MAILBOX_BACKEND = "clawhub.accounts.mailbox.EmailBackend"


def email_normalize(email: str) -> str:
    """The one spelling of an address that ClawHub stores and looks up."""
    return User.objects.normalize_email(email or "").strip().lower()


def user_by_id(*, user_id: int | None) -> User | None:
    """For tasks: the user an id names, or None (no id, or the user was deleted since)."""
    return User.objects.filter(pk=user_id).first() if user_id else None


def user_get_by_email(*, email: str) -> User | None:
    return User.objects.filter(email=email_normalize(email)).first()


def user_for_password_reset(*, uidb64: str, token: str) -> User | None:
    """The active user a password-reset link stands for, or None if the link is malformed, used or expired."""
    try:
        pk = force_str(urlsafe_base64_decode(uidb64))
        user = User.objects.filter(pk=int(pk), is_active=True).first()
    except (TypeError, ValueError, OverflowError):
        return None
    if user is None or not default_token_generator.check_token(user, token):
        return None
    return user


def user_for_email_verification(*, token: str) -> User | None:
    """The user an email-verification link stands for. The link names the address too, so a link sent
    before an address change cannot verify the new address."""
    try:
        payload = signing.loads(token, salt=EMAIL_VERIFICATION_SALT,
                                max_age=settings.ACCOUNTS_EMAIL_VERIFICATION_TIMEOUT)
    except signing.BadSignature:  # also raised for expired links (SignatureExpired is a subclass)
        return None
    if not isinstance(payload, dict):
        return None
    # A payload without "u" matches nobody (pk=None).
    return User.objects.filter(pk=payload.get("u"), email=payload.get("e"),  # type: ignore[misc]
                               is_active=True).first()


# Audit log --------------------------------------------------------------------------------------------------

def _audit_rows() -> QuerySet[AuditLog]:
    return AuditLog.objects.select_related("actor", "subject_user", "group")


def audit_for_user(*, user: User) -> QuerySet[AuditLog]:
    """What the user did, and what was done to them."""
    return _audit_rows().filter(Q(actor=user) | Q(subject_user=user))


def audit_for_group(*, group: Group, user: User) -> QuerySet[AuditLog]:
    """Everything that happened in a group; for its owner and admins, and for site staff.

    Members and viewers get 403 (they know the group exists); anyone else 404, so group names do not leak.
    """
    if not user.is_staff and not has_role(group=group, user=user, at_least=Role.ADMIN):
        if role_of(group=group, user=user) is None:
            raise NotFound("No such group.")
        raise PermissionDenied("Only the group's owner and admins may read its audit log.")
    return _audit_rows().filter(group=group)


def audit_all(*, user: User) -> QuerySet[AuditLog]:
    if not user.is_staff:
        raise PermissionDenied("Only site staff may read the whole audit log.")
    return _audit_rows()


def audit_list(*, user: User, group_slug: str = "", everything: bool = False) -> QuerySet[AuditLog]:
    """The rows the audit API and page show for a filter: one group, everything (staff), or the user's own."""
    if group_slug:
        group = Group.objects.filter(slug=group_slug).first()
        if group is None:
            raise NotFound("No such group.")
        return audit_for_group(group=group, user=user)
    if everything:
        return audit_all(user=user)
    return audit_for_user(user=user)


SIGN_IN_ACTIONS = ("auth.login", "auth.login_failed", "auth.lockout")


def audit_sign_ins(*, user: User, limit: int = 10) -> list[AuditLog]:
    """The newest sign-ins to the user's account, and the attempts that failed, for the account page."""
    return list(_audit_rows().filter(subject_user=user, action__in=SIGN_IN_ACTIONS)[:limit])


# (name, what a User-Agent header says) in the order they are told apart: Edge and Opera also say Chrome,
# Chrome also says Safari, and Android also says Linux.
_BROWSERS = (("Edge", "Edg/"), ("Opera", "OPR/"), ("Firefox", "Firefox/"), ("Chrome", "Chrome/"),
             ("Chromium", "Chromium/"), ("Safari", "Safari/"), ("curl", "curl/"), ("Python", "python"))
_SYSTEMS = (("Android", "Android"), ("iPhone", "iPhone"), ("iPad", "iPad"), ("Windows", "Windows"),
            ("macOS", "Mac OS X"), ("ChromeOS", "CrOS"), ("Linux", "Linux"))


def device_label(user_agent: str) -> str:
    """"Firefox on Linux" from a User-Agent header; the header itself when neither part is known."""
    browser = next((name for name, mark in _BROWSERS if mark in user_agent), "")
    system = next((name for name, mark in _SYSTEMS if mark in user_agent), "")
    if browser and system:
        return f"{browser} on {system}"
    return browser or system or user_agent[:60] or "Unknown device"


def audit_groups_for(*, user: User) -> QuerySet[Group]:
    """The groups whose audit log the user may read: the ones they own or administer, or all for staff."""
    groups = Group.objects.order_by("name")
    if user.is_staff:
        return groups
    return groups.filter(memberships__user=user, memberships__role__in=[Role.ADMIN, Role.OWNER])


def audit_ip_visible(*, row: AuditLog, viewer: User) -> bool:
    """Addresses are personal data: a row shows its IP only to site staff and to the person who acted."""
    return viewer.is_staff or (row.actor_id is not None and row.actor_id == viewer.pk)


def local_mailbox_enabled() -> bool:
    """Whether mail goes to the local mailbox (/mailbox/) rather than out of the site."""
    return settings.EMAIL_BACKEND == LOCAL_MAILBOX_BACKEND


def mailbox_messages(*, user: User, limit: int = 50) -> list[MailboxMessage]:
    """The newest mails the local mailbox kept for the user's address, sent before or after they signed up
    (an invitation reaches a new person that way)."""
    return list(MailboxMessage.objects.filter(to_email=email_normalize(user.email))[:limit])
