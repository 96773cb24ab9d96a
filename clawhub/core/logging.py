"""Structured logs: one JSON object per line, a request id that follows a request everywhere, no secrets.

The request id lives in a contextvar. The web sets it in ``RequestIdMiddleware`` (from ``X-Request-Id`` or
a new one) and the /v1 gateway sets it with ``set_request_id`` for each request it serves. Celery carries it
across the broker in a task header: ``before_task_publish`` copies the current id into the message and
``task_prerun`` restores it in the worker, so gateway → capture → judge → training lines share one id.

This module must stay importable before Django is configured: the settings module builds ``LOGGING`` with it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

REQUEST_ID_HEADER = "X-Request-Id"
# The Celery message header that carries the id; custom headers end up as attributes of ``task.request``.
TASK_HEADER = "clawhub_request_id"

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("clawhub_request_id", default=None)

# A client-supplied id goes into every log line and back into a response header: accept only a short, plain
# token so nobody can forge log lines or inject headers through it.
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id() -> str:
    return uuid.uuid4().hex


def clean_request_id(value: str | None) -> str | None:
    """``value`` if it is safe to log and echo, else None (the caller then makes a new one)."""
    if value and _VALID_REQUEST_ID.match(value):
        return value
    return None


def get_request_id() -> str | None:
    return _request_id.get()


def set_request_id(value: str | None) -> contextvars.Token:
    """Sets the id for the current context; pass the returned token to ``reset_request_id`` when done."""
    return _request_id.set(value)


def reset_request_id(token: contextvars.Token) -> None:
    _request_id.reset(token)


# --- redaction ----------------------------------------------------------------------------------------------

# API keys are "chk_" + url-safe base64; bearer tokens may be anything a client sends after "Bearer".
_API_KEY = re.compile(r"chk_[A-Za-z0-9_-]{8,}")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,}")
API_KEY_MASK = "chk_[REDACTED]"
BEARER_MASK = r"\1[REDACTED]"
# An invitation link carries its secret in the path (/invitations/<token>/), and a 4xx on it is logged.
_INVITATION = re.compile(r"(/invitations/)[A-Za-z0-9_-]{16,}")
INVITATION_MASK = r"\1[REDACTED]"


def redact(text: str) -> str:
    """``text`` with every API key, bearer token and invitation token masked."""
    # Bearer first: a bearer token that is an API key is then masked whole, not in two pieces.
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(BEARER_MASK, text)
    if "chk_" in text:
        text = _API_KEY.sub(API_KEY_MASK, text)
    if "/invitations/" in text:
        text = _INVITATION.sub(INVITATION_MASK, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(v) for v in value]
    if type(value) is tuple:
        return tuple(_redact_value(v) for v in value)
    return value


# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged as a field.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message", "asctime", "request_id",
}


class RedactFilter(logging.Filter):
    """Masks API keys, bearer and invitation tokens in the message, its arguments, extras and exceptions.

    Attach it to HANDLERS (not loggers): a logger's filters do not see records propagated from child loggers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            # A bad %-format must neither crash the caller nor reach handleError's traceback with a key in it.
            record.msg, record.args = redact(f"{record.msg} (log arguments dropped: bad format)"), None
            message = record.msg
        redacted = redact(message)
        if redacted != message or record.args:
            # Freeze the formatted message so a %-argument holding a key cannot be re-rendered later.
            record.msg, record.args = redacted, None
        for name, value in list(vars(record).items()):
            if name not in _RECORD_ATTRS:
                setattr(record, name, _redact_value(value))
        if record.exc_info and not record.exc_text:
            # Tracebacks can quote locals or request bodies: render once here so the text can be masked.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _record_request_id(record: logging.LogRecord) -> str | None:
    """The id in effect for a record: the contextvar, else the id of the request the record names.

    django.request logs 4xx/5xx responses after the middleware chain has returned (the contextvar is reset by
    then) but passes the request along, and RequestIdMiddleware keeps the id on it.
    """
    return get_request_id() or getattr(getattr(record, "request", None), "request_id", None)


class RequestIdFilter(logging.Filter):
    """Stamps ``record.request_id`` so text formats can use ``%(request_id)s``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) in (None, "-"):
            record.request_id = _record_request_id(record) or "-"
        return True


def _json_field(value: Any) -> Any:
    # An HttpRequest (django.request passes one) as method and path: its repr would add the query string.
    if hasattr(value, "method") and hasattr(value, "path") and hasattr(value, "META"):
        return f"{value.method} {value.path}"
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, extra fields, and exc/stack."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        if request_id in (None, "-"):
            request_id = _record_request_id(record)
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id,
        }
        for name, value in vars(record).items():
            if name not in _RECORD_ATTRS and name not in entry:
                entry[name] = _json_field(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # Second line of defence: a handler configured without RedactFilter still never prints a key.
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


def build_logging(*, level: str = "INFO", json_format: bool = True) -> dict[str, Any]:
    """The ``LOGGING`` dict: console output with request ids and redaction; JSON lines if ``json_format``."""
    formatter = (
        {"()": "clawhub.core.logging.JsonFormatter"}
        if json_format
        else {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": "clawhub.core.logging.RequestIdFilter"},
            "redact": {"()": "clawhub.core.logging.RedactFilter"},
        },
        "formatters": {"default": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "filters": ["request_id", "redact"],
            },
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Django logs every 4xx/5xx once through django.request; the root handler prints it.
            "django": {"level": level, "propagate": True},
            # Celery's own task loggers should print through the same handler (the worker keeps our root
            # logger because clawhub/core/celery_app.py sets worker_hijack_root_logger=False).
            "celery": {"level": level, "propagate": True},
        },
    }


# --- Django -------------------------------------------------------------------------------------------------


class RequestIdMiddleware:
    """Takes ``X-Request-Id`` (or makes one), keeps it in the contextvar for the request, echoes it back.

    Put it first in MIDDLEWARE so every later middleware's log lines carry the id.
    """

    def __init__(self, get_response: Callable):
        self.get_response = get_response

    def __call__(self, request):
        request_id = clean_request_id(request.headers.get(REQUEST_ID_HEADER)) or new_request_id()
        request.request_id = request_id
        token = set_request_id(request_id)
        try:
            response = self.get_response(request)
        finally:
            reset_request_id(token)
        response[REQUEST_ID_HEADER] = request_id
        return response


# --- Celery -------------------------------------------------------------------------------------------------


def _on_before_task_publish(headers: dict | None = None, **_: Any) -> None:
    request_id = get_request_id()
    if headers is not None and request_id and TASK_HEADER not in headers:
        headers[TASK_HEADER] = request_id


_task_tokens: dict[str, contextvars.Token] = {}


def _on_task_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    incoming = getattr(getattr(task, "request", None), TASK_HEADER, None)
    request_id = clean_request_id(incoming) or (f"task-{task_id}" if task_id else new_request_id())
    _task_tokens[task_id or ""] = set_request_id(request_id)


def _on_task_postrun(task_id: str | None = None, **_: Any) -> None:
    token = _task_tokens.pop(task_id or "", None)
    if token is not None:
        try:
            reset_request_id(token)
        except ValueError:  # created in another context (a thread pool worker); clearing is enough
            set_request_id(None)


def connect_celery_signals() -> None:
    """Carries the request id through Celery. Safe to call more than once (dispatch uids)."""
    from celery import signals

    signals.before_task_publish.connect(_on_before_task_publish, weak=False,
                                        dispatch_uid="clawhub.logging.before_publish")
    signals.task_prerun.connect(_on_task_prerun, weak=False, dispatch_uid="clawhub.logging.task_prerun")
    signals.task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="clawhub.logging.task_postrun")
