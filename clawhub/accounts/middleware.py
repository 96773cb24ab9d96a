"""Keeps the list of where each user is signed in (clawhub.accounts.services.user_session_seen)."""

from clawhub.accounts.services import user_session_seen


class SessionTrackingMiddleware:
    """After the view, so the session a login just started (a new key) is the one recorded, and one a logout
    just ended is not. Costs nothing on most requests: the session remembers when its row was written."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        user_session_seen(request=request)
        return response
