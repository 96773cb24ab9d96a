"""What an API key may do, and which scope each REST endpoint needs.

A key lives in a plain file on the user's machine and is read by an agent that runs tools and reads web pages,
so by default it can do only what it is for: ``inference`` (the /v1 gateway, and explicit feedback on its own
turns). Everything else a key may do on the REST API is an opt-in scope the owner ticks when creating the key:

- ``read``: GET the account's REST resources (profile, keys, groups, conversations, samples, usage, training,
  adapters, audit log), never the full export.
- ``keys``: create, change, rotate and revoke keys; a key never grants more scopes than it holds itself,
  nor changes or rotates a key that holds more (a rotation hands out the new secret).
- ``export``: download everything ClawHub keeps about the user (``/api/me/export/``).
- ``admin``: every other change through the REST API: groups, members, invitations and ownership transfers,
  review decisions and policies, judge rules, privacy switches, training runs and adapters.

A secret in its rotation grace window is ``inference`` only, whatever the key holds: "rotate after a leak"
must not leave the thief a way to manage the account for a day. Signing out, changing the password, signing
out everywhere and deleting the account need a logged-in session, whatever a key holds.

``REST_RULES`` names the rule of every REST endpoint and method by URL name. A URL under /api/ that is not in
it refuses every key (``KeyScopePermission``), and tests/security/test_scope_matrix.py fails until the new
endpoint gets a rule here.
"""

from enum import StrEnum

from rest_framework.permissions import BasePermission


class Scope(StrEnum):
    INFERENCE = "inference"
    READ = "read"
    KEYS = "keys"
    EXPORT = "export"
    ADMIN = "admin"


# Shown on the key page and in the API next to each scope.
SCOPE_DESCRIPTIONS: dict[Scope, str] = {
    Scope.INFERENCE: "Call the /v1 gateway (chat, completions, models) and send feedback on this key's own "
                     "turns. Every key has it.",
    Scope.READ: "Read your account through the REST API: profile, keys, groups, conversations, samples, "
                "usage, training and adapters.",
    Scope.KEYS: "Create, change, rotate and revoke API keys.",
    Scope.EXPORT: "Download everything ClawHub keeps about you.",
    Scope.ADMIN: "Change things through the REST API: groups, members, invitations and ownership, review "
                 "decisions, judge rules, privacy, training and adapters.",
}
DEFAULT_SCOPES: list[str] = [Scope.INFERENCE.value]
MANAGEMENT_SCOPES: tuple[Scope, ...] = (Scope.READ, Scope.KEYS, Scope.EXPORT, Scope.ADMIN)
ALL_SCOPES: list[str] = [s.value for s in Scope]

# Rules that are not a scope.
SESSION = "session"  # a logged-in session only; no key, whatever it holds
PUBLIC = "public"  # anonymous callers use it (sign-up, login, reset); a key adds nothing

R, K, E, A = Scope.READ, Scope.KEYS, Scope.EXPORT, Scope.ADMIN
_READ_ONLY = {"GET": R}

REST_RULES: dict[str, dict[str, str]] = {
    # accounts
    "api-auth-csrf": {"GET": PUBLIC},
    "api-auth-signup": {"POST": PUBLIC},
    "api-auth-login": {"POST": PUBLIC},
    "api-auth-logout": {"POST": SESSION},
    "api-auth-logout-everywhere": {"POST": SESSION},
    "api-auth-password-change": {"POST": SESSION},
    "api-auth-password-reset": {"POST": PUBLIC},
    "api-auth-password-reset-confirm": {"POST": PUBLIC},
    "api-auth-verify-email": {"POST": PUBLIC},
    "api-auth-verify-email-resend": {"POST": PUBLIC},
    "api-me": {"GET": R, "PATCH": A},
    "api-audit": _READ_ONLY,
    # groups
    "api-groups": {"GET": R, "POST": A},
    "api-group": {"GET": R, "PATCH": A, "DELETE": A},
    "api-group-members": _READ_ONLY,
    "api-group-member": {"PATCH": A, "DELETE": A},
    "api-group-leave": {"POST": A},
    "api-group-transfer": {"POST": A},
    "api-group-invitations": {"GET": R, "POST": A},
    "api-group-invitation": {"DELETE": A},
    "api-invitation": _READ_ONLY,
    "api-invitation-accept": {"POST": A},
    "api-invitation-decline": {"POST": A},
    # keys
    "api-keys": {"GET": R, "POST": K},
    "api-key-detail": {"GET": R, "PATCH": K},
    "api-key-revoke": {"POST": K},
    "api-key-rotate": {"POST": K},
    "api-key-openclaw": _READ_ONLY,
    "api-group-keys": _READ_ONLY,
    "api-group-key-revoke": {"POST": K},
    # adapters
    "api-adapter-versions": _READ_ONLY,
    "api-adapter-pin": {"POST": A},
    "api-adapter-unpin": {"POST": A},
    "api-adapter-version": _READ_ONLY,
    "api-adapter-version-rollback": {"POST": A},
    # conversations
    "api-sessions": _READ_ONLY,
    "api-session": _READ_ONLY,
    "api-conversation-settings": {"GET": R, "PATCH": A},
    # feedback
    "api-judge-rules": {"GET": R, "PUT": A},
    "api-group-judge-rules": {"GET": R, "PUT": A},
    # Rating a turn here is a change like any other (admin); the key that served a turn rates it on
    # /v1/feedback with inference.
    "api-turn-feedback": {"GET": R, "POST": A},
    # usage
    "api-usage": _READ_ONLY,
    # review
    "api-review-samples": _READ_ONLY,
    "api-review-samples-bulk": {"POST": A},
    "api-review-sample": _READ_ONLY,
    "api-review-sample-approve": {"POST": A},
    "api-review-sample-reject": {"POST": A},
    "api-review-policy": {"GET": R, "PATCH": A},
    "api-me-samples": _READ_ONLY,
    "api-me-sample": {"DELETE": A},
    "api-me-privacy": {"GET": R, "PATCH": A},
    "api-me-key-training": {"PATCH": A},
    "api-me-export": {"GET": E},
    "api-me-delete": {"POST": SESSION},
    # training
    "api-training-runs": _READ_ONLY,
    "api-training-run-start": {"POST": A},
    "api-training-settings": {"GET": R, "PATCH": A},
    "api-training-run": _READ_ONLY,
    "api-training-run-cancel": {"POST": A},
    # the API's own description
    "api-schema": {"GET": PUBLIC},
    "api-docs": {"GET": PUBLIC},
}


def rule_for(*, url_name: str | None, method: str) -> str | None:
    """The rule of one endpoint and method (a scope, SESSION or PUBLIC), or None if it has none."""
    method = "GET" if method in ("HEAD", "OPTIONS") else method
    return REST_RULES.get(url_name or "", {}).get(method)


def scopes_clean(scopes) -> list[str]:
    """A key's scopes as stored: ``inference`` first, then the known management scopes in a fixed order.

    Raises ValueError naming the unknown ones, so the caller can render it as its own error.
    """
    given = [scopes] if isinstance(scopes, str) else list(scopes or [])
    unknown = sorted(set(given) - set(ALL_SCOPES))
    if unknown:
        raise ValueError(f"Unknown scope{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"choose among {', '.join(ALL_SCOPES)}.")
    return [s for s in ALL_SCOPES if s == Scope.INFERENCE or s in given]


class KeyScopePermission(BasePermission):
    """Lets a request made with an API key through only if the key's secret holds the endpoint's scope.

    Sessions pass (DRF's SessionAuthentication has already enforced CSRF on writes). ``request.auth`` is the
    ``ResolvedKey`` that ``ApiKeyAuthentication`` returned.
    """

    message = "This API key may not do this."
    code = "insufficient_scope"

    def has_permission(self, request, view) -> bool:
        resolved = getattr(request, "auth", None)
        granted = getattr(resolved, "scopes", None)
        if granted is None:  # not a key
            return True
        match = getattr(request._request, "resolver_match", None)
        rule = rule_for(url_name=match.url_name if match else None, method=request.method)
        if rule is None or rule == SESSION:
            self.message = ("This needs a signed-in session; API keys cannot do it."
                            if rule == SESSION else "No API key may call this endpoint.")
            return False
        if rule == PUBLIC or rule in granted:
            return True
        self.message = (f"This API key lacks the '{rule}' scope (it has: {', '.join(granted)})."
                        + (" A rotated-out secret is inference-only." if not resolved.current else ""))
        return False
