"""Lets scripts call the REST API with an API key (``Authorization: Bearer chk_…`` or ``X-API-Key``)."""

from rest_framework import authentication, exceptions

from clawhub.keys.selectors import SECRET_PREFIX, key_resolve


def presented_secret(request) -> str | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.META.get("HTTP_X_API_KEY") or None


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        secret = presented_secret(request)
        if secret is None or not secret.startswith(SECRET_PREFIX):
            return None
        resolved = key_resolve(secret=secret)
        if resolved is None:
            raise exceptions.AuthenticationFailed("Invalid, revoked or expired API key.")
        return resolved.user, resolved

    def authenticate_header(self, request) -> str:
        return "Bearer"
