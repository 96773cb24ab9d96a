"""Writes for users and sign-in. The audit log is written by ``clawhub.accounts.audit`` (re-exported here)."""

import time
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, authenticate, login, logout
from django.contrib.auth.hashers import make_password
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core import signing
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.encoding import force_bytes
from django.utils.http import urlencode, urlsafe_base64_encode

from clawhub.accounts.audit import audit_record, audit_record_for_tenant  # noqa: F401  (re-exported)
from clawhub.accounts.models import User, UserSession
from clawhub.accounts.selectors import (
    EMAIL_VERIFICATION_SALT,
    email_normalize,
    user_for_email_verification,
    user_for_password_reset,
    user_get_by_email,
)
from clawhub.accounts.throttle import (
    IP,
    account_mail_allowed,
    login_failure_record,
    login_failures_clear,
    login_succeeded,
    login_throttle_check,
)
from clawhub.core.api import client_ip
from clawhub.core.exceptions import (
    AuthenticationFailed,
    Conflict,
    NotFound,
    PermissionDenied,
    ValidationFailed,
)
from clawhub.core.task_names import ACCOUNT_MAIL
from clawhub.core.tasks import enqueue_on_commit
from clawhub.core.updates import model_update


def _clean_email(email: str) -> str:
    email = email_normalize(email)
    try:
        validate_email(email)
    except DjangoValidationError:
        raise ValidationFailed("A valid email address is required.", field="email",
                               fields={"email": ["Enter a valid email address."]}) from None
    return email


def _check_password_rules(password: str, *, user: User, field: str) -> None:
    """Runs Django's password validators; their messages come back as field errors."""
    try:
        validate_password(password, user=user)
    except DjangoValidationError as exc:
        raise ValidationFailed("Choose a stronger password.", code="weak_password", field=field,
                               fields={field: list(exc.messages)}) from None


@transaction.atomic
def user_create(*, email: str, password: str | None, display_name: str = "", **fields: Any) -> User:
    """Creates a user and their personal tenant."""
    email = _clean_email(email)
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict("An account with this email already exists.", code="email_taken", field="email",
                       fields={"email": ["An account with this email already exists."]})
    user = User(email=email, display_name=display_name, **fields)
    user.set_password(password) if password else user.set_unusable_password()
    return user_insert(user=user)


@transaction.atomic
def user_insert(*, user: User) -> User:
    """Saves a new user built elsewhere (Django admin's add form) together with their personal tenant."""
    return User.objects.insert(user)


def user_signup(*, email: str, password: str, display_name: str = "", ip: str | None = None,
                next_path: str = "") -> User | None:
    """Self-service sign-up. Never signs in: callers answer every address alike and send the person to log in.

    An address that already has an account gets None, and that account's owner a mail saying someone tried
    (within the account-mail limits); a new one gets its account, and the verification link when the site
    requires verified addresses. Both paths hash the password once, so neither answers noticeably sooner.
    ``next_path`` (a path on this site, checked by the caller) is where the verification link leads after.
    """
    email = _clean_email(email)
    display_name = (display_name or "").strip()
    _check_password_rules(password, user=User(email=email, display_name=display_name), field="password")
    existing = user_get_by_email(email=email)
    if existing is not None:
        make_password(password)  # the hash a new account costs, thrown away: the same work on both paths
        if existing.is_active and account_mail_allowed(email=email, ip=ip):
            _send(user=existing, kind=MAIL_SIGNUP_EXISTS)
        audit_record(actor=None, action="user.signup_existing", target=existing, subject_user=existing, ip=ip)
        return None
    with transaction.atomic():
        user = user_create(email=email, password=password, display_name=display_name)
        audit_record(actor=user, action="user.signup", target=user, subject_user=user, ip=ip)
    if settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION:
        email_verification_send(user=user, next_path=next_path)
    return user


def user_update(*, user: User, actor: User, display_name: str, ip: str | None = None) -> User:
    # The email is the login and the verified contact; changing it needs its own confirmed flow, not a PATCH.
    display_name = (display_name or "").strip()
    if len(display_name) > User._meta.get_field("display_name").max_length:  # type: ignore[operator]  # a CharField's max_length is set
        raise ValidationFailed("The display name is too long.", field="display_name",
                               fields={"display_name": ["At most 150 characters."]})
    changed = model_update(instance=user, fields=["display_name"], data={"display_name": display_name})
    if changed:
        old, new = changed["display_name"]
        audit_record(actor=actor, action="user.update", target=user, subject_user=user, ip=ip,
                     display_name={"old": old, "new": new})
    return user


# Sign-in ----------------------------------------------------------------------------------------------------

def user_login(*, request: HttpRequest, email: str, password: str) -> tuple[User, bool]:
    """Checks the password under the brute-force throttle and starts a session. Returns the user and whether
    this is the account's first sign-in (sign-up does not sign in, so a new account's first page comes here).

    Raises RateLimited while a lock covers the email from the client's address (even for the right password;
    clawhub.accounts.throttle), and
    AuthenticationFailed for wrong credentials or an address that still needs verifying.
    """
    email, ip = email_normalize(email), client_ip(request)
    login_throttle_check(email=email, ip=ip)
    user = authenticate(request, username=email, password=password)
    if user is None:
        login_failed(email=email, ip=ip, user_agent=_user_agent(request))
        raise AuthenticationFailed("Wrong email or password.", code="invalid_credentials")
    # The password was right: whatever the outcome below, these were not guesses.
    login_succeeded(email=email, ip=ip)
    if settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION and user.email_verified_at is None:
        audit_record(actor=None, action="auth.login_failed", target=user, subject_user=user, ip=ip,
                     reason="email_unverified", user_agent=_user_agent(request))
        # Said only after the password matched, so it reveals nothing to someone guessing addresses.
        raise AuthenticationFailed(
            "Confirm your email address before logging in: follow the link we sent you, "
            "or ask for a new one.",
            code="email_unverified",
        )
    first_sign_in = user.last_login is None  # login() sets it
    login(request, user)
    login_recorded(user=user, ip=ip, user_agent=_user_agent(request), via="site")
    return user, first_sign_in


def _user_agent(request: HttpRequest) -> str:
    return request.META.get("HTTP_USER_AGENT", "")[:UserSession._meta.get_field("user_agent").max_length]


def login_recorded(*, user: User, ip: str | None, user_agent: str, via: str) -> None:
    """Audits a sign-in (the site's login page and API, or Django admin's: ``via``), for the user to see."""
    audit_record(actor=user, action="auth.login", target=user, subject_user=user, ip=ip, via=via,
                 user_agent=user_agent)


def login_failed(*, email: str, ip: str | None, user_agent: str = "") -> None:
    """Counts one wrong password for the email and the IP (the site's and Django admin's logins alike), and
    audits it, and the lock-outs it starts. The row concerns the account with that address, whose owner sees
    it (not the address it came from: addresses are shown only to whoever acted, and staff); an address
    with no account is kept for staff."""
    email = email_normalize(email)
    user = user_get_by_email(email=email)
    audit_record(actor=None, action="auth.login_failed", target=user, subject_user=user, ip=ip,
                 reason="wrong_password", email="" if user else email, user_agent=user_agent)
    for scope in login_failure_record(email=email, ip=ip):
        _audit_lockout(email=email, ip=ip, scope=scope)


def _audit_lockout(*, email: str, ip: str | None, scope: str) -> None:
    user = user_get_by_email(email=email)
    audit_record(actor=None, action="auth.lockout", target=user, subject_user=user, ip=ip, scope=scope,
                 email=email if scope != IP else "")


def user_logout(*, request: HttpRequest) -> None:
    key = request.session.session_key
    logout(request)
    if key:
        UserSession.objects.filter(session_key=key).delete()


@transaction.atomic
def user_sessions_end_all(*, user: User, actor: User | None, ip: str | None = None,
                          request: HttpRequest | None = None) -> User:
    """Ends every session of the user, on every device, the caller's own (``request``) included. API keys are
    not sessions and stay; the key page revokes them."""
    user = User.objects.select_for_update().get(pk=user.pk)
    user.session_epoch += 1  # ends them all, listed or not
    user.save(update_fields=["session_epoch"])
    for row in UserSession.objects.filter(user=user):
        _session_store(row.session_key).delete()
        row.delete()
    audit_record(actor=actor, action="user.sessions_end_all", target=user, subject_user=user, ip=ip)
    if request is not None:
        logout(request)
    return user


# Sessions: where a user is signed in (UserSession) ---------------------------------------------------------

# [session key, unix time] in the session: when its UserSession row was last written.
SESSION_SEEN_KEY = "_clawhub_seen"
# How stale "last active" may be: a signed-in session's row is written at most once in this many seconds.
SESSION_SEEN_EVERY = 300
SESSIONS_LISTED = 50


def _session_store(session_key: str):
    return import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)


def user_session_seen(*, request: HttpRequest) -> None:
    """Records the request's signed-in session in UserSession, at most once per SESSION_SEEN_EVERY. Called
    for every request (clawhub.accounts.middleware), so a session started anywhere (the login page, the
    login API, Django admin, a test's force_login) is listed."""
    session = getattr(request, "session", None)
    if session is None or not session.session_key or session.get(SESSION_KEY) is None:
        return  # no session, or nobody signed in to it
    key = session.session_key
    seen, now = session.get(SESSION_SEEN_KEY), time.time()
    if isinstance(seen, list) and seen[:1] == [key] and now - seen[-1] < SESSION_SEEN_EVERY:
        return
    if str(getattr(request.user, "pk", None)) != session[SESSION_KEY]:
        return  # its auth hash is stale (Django ends it), or an API key, not the session, authenticated
    UserSession.objects.update_or_create(
        session_key=key,
        defaults={"user": request.user, "last_seen_at": timezone.now(), "ip": client_ip(request),
                  "user_agent": _user_agent(request)},
    )
    session[SESSION_SEEN_KEY] = [key, now]


def user_sessions_active(*, user: User) -> list[UserSession]:
    """The user's signed-in sessions, newest activity first. Rows of sessions that ended without passing
    through here (expiry, a password change, an epoch bump, a flush) are dropped."""
    live, ended = [], []
    user_hash = user.get_session_auth_hash()
    for row in UserSession.objects.filter(user=user)[:SESSIONS_LISTED]:
        data = _session_store(row.session_key).load()  # {} when it expired or is gone
        if data.get(SESSION_KEY) == str(user.pk) and constant_time_compare(data.get(HASH_SESSION_KEY, ""),
                                                                             user_hash):
            live.append(row)
        else:
            ended.append(row.pk)
    if ended:
        UserSession.objects.filter(pk__in=ended).delete()
    return live


def user_session_end(*, user: User, session_id: int, actor: User, ip: str | None = None) -> None:
    """Signs one of the user's sessions out (another device; this one signs out with "Log out")."""
    row = UserSession.objects.filter(user=user, pk=session_id).first()
    if row is None:
        raise NotFound("No such session: it has ended already.")
    _session_store(row.session_key).delete()
    row.delete()
    audit_record(actor=actor, action="user.session_end", target=user, subject_user=user, ip=ip,
                 user_agent=row.user_agent, started=row.created_at.isoformat())


def _first_verification(*, user: User, ip: str | None, how: str) -> int:
    """The address has just been proven for the first time, by someone who may not be who signed up (a
    squatter can register a victim's address before the victim does, mint keys, and wait for the victim to
    reset the password). Keys minted before this moment are revoked and every session ends, so only the
    mailbox's owner keeps the account. Returns how many keys were revoked."""
    from clawhub.keys.services import keys_revoke_all

    revoked = keys_revoke_all(owner=user, actor=None, reason=f"email first verified ({how})",
                              created_before=timezone.now(), ip=ip)
    User.objects.filter(pk=user.pk).update(session_epoch=user.session_epoch + 1)
    user.session_epoch += 1
    return revoked


# Passwords --------------------------------------------------------------------------------------------------

@transaction.atomic
def user_password_change(*, user: User, old_password: str, new_password: str, ip: str | None = None) -> User:
    """Sets a new password after checking the current one. The caller keeps its own session alive
    (update_session_auth_hash); every other session of the user ends because the auth hash changed."""
    if not user.check_password(old_password):
        # A re-authentication that fails: the caller has not shown they hold the account (403, not 400).
        raise PermissionDenied("The current password is wrong.", code="wrong_password", field="old_password",
                               fields={"old_password": ["The current password is wrong."]})
    _check_password_rules(new_password, user=user, field="new_password")
    user.set_password(new_password)
    user.save(update_fields=["password"])
    audit_record(actor=user, action="user.password_change", target=user, subject_user=user, ip=ip)
    return user


def password_reset_request(*, email: str, ip: str | None = None) -> None:
    """Mails a reset link if the address belongs to an active account. Callers answer the same either way,
    so the form cannot be used to find out who has an account."""
    user = user_get_by_email(email=email)
    if not account_mail_allowed(email=email, ip=ip) or user is None or not user.is_active:
        # Counted before the lookup, so known and unknown addresses are limited alike.
        return
    _send(user=user, kind=MAIL_PASSWORD_RESET)
    audit_record(actor=None, action="user.password_reset_request", target=user, subject_user=user, ip=ip)


@transaction.atomic
def password_reset_confirm(*, uidb64: str, token: str, new_password: str, revoke_keys: bool = False,
                           ip: str | None = None) -> User:
    """Sets the password a reset link was sent for. The token is bound to the old password hash and the last
    login, so it works once. Every session ends (the password hash changed); ``revoke_keys`` also revokes
    every API key, which the reset pages offer, since a reset often follows a suspected compromise."""
    user = user_for_password_reset(uidb64=uidb64, token=token)
    if user is None:
        raise ValidationFailed("This password reset link is invalid or has expired. Ask for a new one.",
                               code="invalid_token", field="token")
    _check_password_rules(new_password, user=user, field="new_password")
    user.set_password(new_password)
    fields = ["password"]
    first_verification = user.email_verified_at is None
    if first_verification:
        # Only the owner of the mailbox could follow the link.
        user.email_verified_at = timezone.now()
        fields.append("email_verified_at")
    user.save(update_fields=fields)
    login_failures_clear(email=user.email, ip=ip)
    revoked = 0
    if first_verification:
        revoked = _first_verification(user=user, ip=ip, how="password reset")
    if revoke_keys:
        from clawhub.keys.services import keys_revoke_all

        revoked += keys_revoke_all(owner=user, actor=user, reason="password reset", ip=ip)
    audit_record(actor=user, action="user.password_reset", target=user, subject_user=user, ip=ip,
                 keys_revoked=revoked)
    return user


# Email verification -----------------------------------------------------------------------------------------

def email_verification_send(*, user: User, next_path: str = "") -> None:
    _send(user=user, kind=MAIL_VERIFY_EMAIL, next_path=next_path)


def email_verification_resend(*, email: str, ip: str | None = None, next_path: str = "") -> None:
    """Sends a new link to an unverified account; like the password reset, silent about unknown addresses,
    and under the same per-address and per-IP mail limits."""
    user = user_get_by_email(email=email)
    if not account_mail_allowed(email=email, ip=ip):
        return
    if user is not None and user.is_active and user.email_verified_at is None:
        email_verification_send(user=user, next_path=next_path)


def email_verification_request(*, user: User, ip: str | None = None, next_path: str = "") -> bool:
    """A signed-in user asks for a (new) confirmation link, e.g. to accept an invitation sent to their
    address. False when nothing was sent: the address is confirmed already, or over the mail limits."""
    if user.email_verified_at is not None or not account_mail_allowed(email=user.email, ip=ip):
        return False
    email_verification_send(user=user, next_path=next_path)
    return True


@transaction.atomic
def user_email_verify(*, token: str, signed_in: User | None = None, ip: str | None = None) -> User:
    """Confirms the address a verification link was sent to.

    ``signed_in`` is the user the request is signed in as, if any. When that is the account itself, the one
    who signed up is the one at the mailbox and nothing else changes; otherwise the person who follows the
    link may not be the one who registered the address, and the first verification ends what was made before
    it (``_first_verification``).
    """
    user = user_for_email_verification(token=token)
    if user is None:
        raise ValidationFailed("This verification link is invalid or has expired. Ask for a new one.",
                               code="invalid_token", field="token")
    if user.email_verified_at is None:
        user.email_verified_at = timezone.now()
        user.save(update_fields=["email_verified_at"])
        revoked = 0
        if signed_in is None or signed_in.pk != user.pk:
            revoked = _first_verification(user=user, ip=ip, how="verification link")
        audit_record(actor=user, action="user.email_verify", target=user, subject_user=user, ip=ip,
                     keys_revoked=revoked)
    return user


MAIL_PASSWORD_RESET, MAIL_VERIFY_EMAIL, MAIL_SIGNUP_EXISTS = "password_reset", "verify_email", "signup_exists"


def _send(*, user: User, kind: str, next_path: str = "") -> None:
    """Hands the mail to the account-mail task once the caller's transaction commits: the request is answered
    in the same time whether a mail goes out or not, and a slow mail server holds no web worker. The limits
    (account_mail_allowed) were applied by the caller."""
    if next_path:
        enqueue_on_commit(ACCOUNT_MAIL, user.pk, kind=kind, next_path=next_path)
    else:
        enqueue_on_commit(ACCOUNT_MAIL, user.pk, kind=kind)


def _mail_content(*, user: User, kind: str, next_path: str = "") -> tuple[str, str, dict[str, Any]]:
    """(subject, template, context) of one account mail, with a link made now; a verification link leads
    on to ``next_path``."""
    base = settings.PUBLIC_BASE_URL
    if kind == MAIL_PASSWORD_RESET:
        link = base + reverse("password_reset_confirm", kwargs={
            "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
            "token": default_token_generator.make_token(user),
        })
        return ("Reset your ClawHub password", "accounts/email/password_reset.txt",
                {"link": link, "valid_hours": settings.PASSWORD_RESET_TIMEOUT // 3600})
    if kind == MAIL_VERIFY_EMAIL:
        token = signing.dumps({"u": user.pk, "e": user.email}, salt=EMAIL_VERIFICATION_SALT)
        return ("Confirm your email address for ClawHub", "accounts/email/verify_email.txt",
                {"link": base + reverse("verify_email", kwargs={"token": token})
                 + (f"?{urlencode({'next': next_path})}" if next_path else ""),
                 "valid_hours": settings.ACCOUNTS_EMAIL_VERIFICATION_TIMEOUT // 3600})
    if kind == MAIL_SIGNUP_EXISTS:
        return ("Someone tried to sign up to ClawHub with your address", "accounts/email/signup_exists.txt",
                {"link": base + reverse("password_reset")})
    raise ValueError(f"unknown account mail {kind!r}")


def account_mail_deliver(*, user_id: int, kind: str, next_path: str = "") -> bool:
    """Sends one account mail (the account-mail task's body). False when the account is gone or inactive, or
    when it no longer needs the mail (a verification for an address confirmed meanwhile)."""
    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None or (kind == MAIL_VERIFY_EMAIL and user.email_verified_at is not None):
        return False
    subject, template, context = _mail_content(user=user, kind=kind, next_path=next_path)
    body = render_to_string(template, {"user": user, **context})
    send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [user.email])
    return True
