"""Helpers for server-rendered views: the services' errors as Django's error pages or as messages."""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect

from clawhub.core.exceptions import ClawHubError, NotFound, PermissionDenied


def page_errors(view):
    """Turns the services' NotFound and PermissionDenied into Django's 404 and 403 pages."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        except PermissionDenied as exc:
            raise DjangoPermissionDenied(exc.message) from exc

    return wrapped


def post_and_redirect(
    request: HttpRequest,
    action: Callable[[], Any],
    success: str | Callable[[Any], str],
    back: str,
) -> HttpResponseRedirect:
    """Runs a form post's service call and goes back to ``back`` with a message: ``success`` (or
    ``success(result)``), or the refusal's message. NotFound and PermissionDenied pass through, for
    ``page_errors`` to render as 404 and 403."""
    try:
        result = action()
    except (NotFound, PermissionDenied):
        raise
    except ClawHubError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, success(result) if callable(success) else success)
    return redirect(back)
