"""Helpers for server-rendered views: the services' errors as Django's error pages or as messages."""

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

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
    ``page_errors`` to render as 404 and 403. When ``back`` scrolls to an element (``…#turn-12``), the message
    is tagged with it (``messages_by_anchor``), so the page can show it there, in view, and not at its top."""
    fragment = urlsplit(back).fragment
    tags = f"{ANCHOR_TAG}{fragment}" if fragment else ""
    try:
        result = action()
    except (NotFound, PermissionDenied):
        raise
    except ClawHubError as exc:
        messages.error(request, exc.message, extra_tags=tags)
    else:
        messages.success(request, success(result) if callable(success) else success, extra_tags=tags)
    return redirect(back)


ANCHOR_TAG = "at-"


def messages_by_anchor(request: HttpRequest) -> tuple[list, dict[str, list]]:
    """The request's messages (consumed, as the base template would): those for the top of the page, and by
    element id those ``post_and_redirect`` tagged with the element the page scrolls to. A page that places
    the latter puts what it does not place back on top."""
    top: list = []
    anchored: dict[str, list] = {}
    for message in messages.get_messages(request):
        tag = message.extra_tags or ""
        if tag.startswith(ANCHOR_TAG):
            anchored.setdefault(tag.removeprefix(ANCHOR_TAG), []).append(message)
        else:
            top.append(message)
    return top, anchored
