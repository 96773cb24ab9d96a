"""Brute-force protection for logins.

Failed attempts are counted in the shared cache (Redis in production and tests) three ways, each with its own
limit within ``LOGIN_FAILURE_WINDOW``; a counter at its limit locks for one window, and a lock refuses every
attempt it covers, the right password included, so that guessing cannot go on in the background:

- per account *and* address (``LOGIN_FAILURE_LIMIT``): whoever guesses at an account is stopped, and the
  account's owner elsewhere, or someone else behind the same address, is not;
- per account from every address (``LOGIN_FAILURE_ACCOUNT_LIMIT``, higher): guessing spread over many
  addresses;
- per address over every account (``LOGIN_FAILURE_IP_LIMIT``, higher still): spraying a few guesses at many
  accounts. This lock spares the accounts that signed in from the address before (within
  ``LOGIN_KNOWN_ADDRESS``): one person behind a shared address (a company's NAT, the embedded server's
  127.0.0.1) must not lock out everyone behind it.

A successful login clears its account's counters (and remembers the address for that account); the address's
own counter is left to expire, because one right password from an address does not make the other guesses
from it harmless. A limit of 0 turns its counter off.
"""

import hashlib
import math
import time
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache

from clawhub.core.exceptions import RateLimited

ACCOUNT_IP, ACCOUNT, IP = "account_ip", "account", "ip"
EMAIL = "email"  # the account mail limits' scope
LOGIN_KNOWN_ADDRESS = timedelta(days=30)


def _key(kind: str, scope: str, value: str) -> str:
    # Digests keep addresses out of the cache's key space (it is shared and often inspected).
    return f"login-fail:{kind}:{scope}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def _pair(email: str, ip: str | None) -> str:
    return f"{email.strip().lower()} {ip or ''}"


def _scopes(email: str, ip: str | None) -> list[tuple[str, str, int]]:
    """(scope, value, limit) of each counter a failure of this email from this address counts in."""
    scopes = [(ACCOUNT_IP, _pair(email, ip), settings.LOGIN_FAILURE_LIMIT),
              (ACCOUNT, email.strip().lower(), settings.LOGIN_FAILURE_ACCOUNT_LIMIT)]
    if ip:
        scopes.append((IP, ip, settings.LOGIN_FAILURE_IP_LIMIT))
    return [(scope, value, limit) for scope, value, limit in scopes if limit]


def _window_seconds() -> int:
    return max(1, int(settings.LOGIN_FAILURE_WINDOW.total_seconds()))


def login_throttle_check(*, email: str, ip: str | None) -> None:
    """Raises RateLimited while a lock covers this email from this address."""
    locks = {_key("lock", scope, value): scope for scope, value, _ in _scopes(email, ip)}
    known = _key("known", ACCOUNT_IP, _pair(email, ip))
    found = cache.get_many([*locks, known])
    locked_until = [until for key, until in found.items()
                    if key in locks and until and not (locks[key] == IP and found.get(known))]
    if not locked_until:
        return
    retry_after = max(1, math.ceil(max(locked_until) - time.time()))
    minutes = math.ceil(retry_after / 60)
    raise RateLimited(
        f"Too many failed login attempts. Try again in {minutes} minute{'s' if minutes != 1 else ''}.",
        retry_after=retry_after,
    )


def login_failure_record(*, email: str, ip: str | None) -> list[str]:
    """Counts one failed attempt. Returns the scopes (``ACCOUNT_IP``, ``ACCOUNT``, ``IP``) that this failure
    has just locked."""
    window = _window_seconds()
    newly_locked = []
    for scope, value, limit in _scopes(email, ip):
        count_key = _key("count", scope, value)
        # add() starts the window at the first failure and incr() is atomic on Redis and keeps the key's
        # expiry, so parallel guesses are all counted and the window does not slide with each of them.
        cache.add(count_key, 0, timeout=window)
        try:
            count = cache.incr(count_key)
        except ValueError:  # the window ended between add() and incr()
            cache.set(count_key, 1, timeout=window)
            count = 1
        if count >= limit:
            # add() so that a lock is never extended by the attempts that race in after it.
            if cache.add(_key("lock", scope, value), time.time() + window, timeout=window):
                newly_locked.append(scope)
    return newly_locked


def login_failures_clear(*, email: str, ip: str | None = None) -> None:
    """Forgets the failures and locks of one account, from every address and from ``ip`` (after a password
    reset, or a successful login)."""
    keys = [_key(kind, scope, value) for kind in ("count", "lock")
            for scope, value in ((ACCOUNT, email.strip().lower()), (ACCOUNT_IP, _pair(email, ip)))]
    cache.delete_many(keys)


def login_succeeded(*, email: str, ip: str | None) -> None:
    """The right password from this address: the account's failures are forgotten, and the address is one the
    account is known at (a lock of the whole address spares it)."""
    login_failures_clear(email=email, ip=ip)
    if ip:
        cache.set(_key("known", ACCOUNT_IP, _pair(email, ip)), True,
                  timeout=int(LOGIN_KNOWN_ADDRESS.total_seconds()))


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
