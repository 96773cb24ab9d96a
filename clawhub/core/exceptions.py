"""One error hierarchy for ClawHub.

Services raise these; they are rendered in one place: DRF's exception handler for the web API
(``clawhub.core.api``) and the OpenAI-shaped renderer for ``/v1``.
"""

from typing import Any


class ClawHubError(Exception):
    status: int = 400
    code: str = "invalid_request"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None, **data: Any):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.data = data


class ValidationFailed(ClawHubError):
    status = 400
    code = "invalid"


class AuthenticationFailed(ClawHubError):
    status = 401
    code = "not_authenticated"


class PermissionDenied(ClawHubError):
    status = 403
    code = "permission_denied"


class NotFound(ClawHubError):
    status = 404
    code = "not_found"


class Conflict(ClawHubError):
    status = 409
    code = "conflict"


class RateLimited(ClawHubError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, **kwargs: Any):
        super().__init__(message, retry_after=retry_after, **kwargs)
        self.retry_after = retry_after
