"""Brute-force protection for logins.

Failed attempts are counted per email and per client IP in the shared cache (Redis in production and
tests). When either counter reaches ``LOGIN_FAILURE_LIMIT`` within ``LOGIN_FAILURE_WINDOW``, that email or IP
is locked for one window: every attempt is refused, the right password included, so that guessing cannot go
on in the background. A successful login clears the email's counter; the IP's counter is left to expire,
because one right password from an address does not make the other guesses from it harmless.
"""

import hashlib
import math
import time

from django.conf import settings
from django.core.cache import cache

from clawhub.core.exceptions import RateLimited

EMAIL, IP = "email", "ip"


def _key(kind: str, scope: str, value: str) -> str:
    # Digests keep addresses out of the cache's key space (it is shared and often inspected).
    return f"login-fail:{kind}:{scope}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def _scopes(email: str, ip: str | None) -> list[tuple[str, str]]:
    scopes = [(EMAIL, email.strip().lower())]
    if ip:
        scopes.append((IP, ip))
    return scopes


def _window_seconds() -> int:
    return max(1, int(settings.LOGIN_FAILURE_WINDOW.total_seconds()))


def login_throttle_check(*, email: str, ip: str | None) -> None:
    """Raises RateLimited while the email or the IP is locked out."""
    lock_keys = [_key("lock", scope, value) for scope, value in _scopes(email, ip)]
    locked_until = [until for until in cache.get_many(lock_keys).values() if until]
    if not locked_until:
        return
    retry_after = max(1, math.ceil(max(locked_until) - time.time()))
    minutes = math.ceil(retry_after / 60)
    raise RateLimited(
        f"Too many failed login attempts. Try again in {minutes} minute{'s' if minutes != 1 else ''}.",
        retry_after=retry_after,
    )


def login_failure_record(*, email: str, ip: str | None) -> list[str]:
    """Counts one failed attempt. Returns the scopes ("email", "ip") that this failure has just locked."""
    window = _window_seconds()
    newly_locked = []
    for scope, value in _scopes(email, ip):
        count_key = _key("count", scope, value)
        # add() starts the window at the first failure and incr() is atomic on Redis and keeps the key's
        # expiry, so parallel guesses are all counted and the window does not slide with each of them.
        cache.add(count_key, 0, timeout=window)
        try:
            count = cache.incr(count_key)
        except ValueError:  # the window ended between add() and incr()
            cache.set(count_key, 1, timeout=window)
            count = 1
        if count >= settings.LOGIN_FAILURE_LIMIT:
            # add() so that a lock is never extended by the attempts that race in after it.
            if cache.add(_key("lock", scope, value), time.time() + window, timeout=window):
                newly_locked.append(scope)
    return newly_locked


def login_failures_clear(*, email: str) -> None:
    """Forgets the failures and any lock of one email (after a successful login or a password reset)."""
    value = email.strip().lower()
    cache.delete_many([_key("count", EMAIL, value), _key("lock", EMAIL, value)])


# Account mails (password reset, verification resend) -----------------------------------------------------

def account_mail_allowed(*, email: str, ip: str | None) -> bool:
    """Counts one account mail asked for this address and from this IP, and says whether it may go: at most
    ACCOUNT_MAIL_PER_ADDRESS per address and ACCOUNT_MAIL_PER_IP per IP in ACCOUNT_MAIL_WINDOW. Beyond that
    the request is answered as always (it reveals nothing) but no mail is sent, so the forms cannot be used to
    flood a mailbox or to make the site a spam relay."""
    window = max(1, int(settings.ACCOUNT_MAIL_WINDOW.total_seconds()))
    allowed = True
    for scope, value, limit in ((EMAIL, email.strip().lower(), settings.ACCOUNT_MAIL_PER_ADDRESS),
                                (IP, ip or "", settings.ACCOUNT_MAIL_PER_IP)):
        if not value or not limit:
            continue
        key = _key("mail", scope, value)
        cache.add(key, 0, timeout=window)
        try:
            count = cache.incr(key)
        except ValueError:
            cache.set(key, 1, timeout=window)
            count = 1
        allowed = allowed and count <= limit
    return allowed
