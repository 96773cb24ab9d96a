"""A new secret crosses one redirect (POST -> redirect -> GET), so that reloading the page that shows it makes
no second key and no second rotation.

The session (stored in the database) keeps the secret only masked with a one-time pad, and the pad is a cookie
that only the secret page receives: neither alone gives the secret back, so no table ever holds it (as
tests/keys/test_secret_storage.py checks). The page that shows it takes both, and both are gone after.
"""

import secrets

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

_SESSION_KEY = "keys:new_secret:{key_id}"
_COOKIE = "clawhub_key_pad"
# Long enough to follow the redirect; a page never loaded leaves a pad that expires and means nothing alone.
_COOKIE_SECONDS = 300


def _xor(data: bytes, pad: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(data, pad, strict=True))


def secret_stash(request: HttpRequest, response: HttpResponse, *, key_id: int, secret: str,
                 rotated: bool, page: str | None = None) -> HttpResponse:
    """Keeps ``secret`` for the next load of ``page`` (by default the key's secret page; ``response`` is the
    redirect there)."""
    data = secret.encode()
    pad = secrets.token_bytes(len(data))
    request.session[_SESSION_KEY.format(key_id=key_id)] = {"masked": _xor(data, pad).hex(),
                                                            "rotated": rotated}
    response.set_cookie(_COOKIE, pad.hex(), max_age=_COOKIE_SECONDS, path=page or _page(key_id),
                        secure=request.is_secure(), httponly=True, samesite="Strict")
    return response


def secret_take(request: HttpRequest, *, key_id: int) -> tuple[str, bool] | None:
    """The stashed secret and whether it came from a rotation, forgotten on the way out; None once it was
    shown (or never stashed in this browser). The caller's response must go through ``secret_forget``."""
    kept = request.session.pop(_SESSION_KEY.format(key_id=key_id), None)
    pad = request.COOKIES.get(_COOKIE, "")
    if not kept or not pad:
        return None
    try:
        secret = _xor(bytes.fromhex(kept["masked"]), bytes.fromhex(pad)).decode()
    except (ValueError, UnicodeDecodeError):  # a pad from another stash: this one is lost, as if shown
        return None
    return secret, bool(kept["rotated"])


def secret_forget(response: HttpResponse, *, key_id: int, page: str | None = None) -> HttpResponse:
    response.delete_cookie(_COOKIE, path=page or _page(key_id), samesite="Strict")
    return response


def _page(key_id: int) -> str:
    return reverse("key_secret", kwargs={"key_id": key_id})
