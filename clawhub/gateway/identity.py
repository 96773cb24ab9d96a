"""Session and turn identity of a /v1 request, as the client gave it.

Precedence: headers (X-Session-Id, X-Turn-Type, X-Session-Done), then body fields (session_id, turn_type,
session_done, removed before forwarding), then the ``[RL-TRAINING-META] session_id=… turn_type=…`` marker in
the system prompt (removed before forwarding: OpenClaw's plugin puts it there when it cannot set headers).
Anything left unset is inferred later by capture (prefix continuation), not here.
"""

import re
from dataclasses import dataclass

from clawhub.gateway.errors import bad_request

MARKER = "[RL-TRAINING-META]"
_MARKER_RE = re.compile(r"[ \t]*\[RL-TRAINING-META\][^\n]*\n?")
_FIELD_RE = re.compile(r"(session_id|turn_type|session_done)=(\S+)")
TURN_TYPES = ("main", "side")
_TRUE = ("1", "true", "yes", "on")


@dataclass(slots=True)
class Identity:
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False


def _take_marker(text: str, found: dict[str, str]) -> str:
    """Adds the fields of ``text``'s marker lines to ``found``; returns ``text`` without them."""
    for line in _MARKER_RE.findall(text):
        found.update(_FIELD_RE.findall(line))
    return _MARKER_RE.sub("", text).strip()


def _strip_marker(messages: list) -> dict[str, str]:
    """Removes the marker from system/developer messages; returns the fields it carried."""
    found: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            if MARKER in content:
                message["content"] = _take_marker(content, found)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str) and MARKER in text:
                    part["text"] = _take_marker(text, found)
    return found


def extract_identity(headers: dict[bytes, bytes], body: dict) -> Identity:
    """Reads and removes ClawHub's own fields from ``body`` (mutated in place) and returns the identity."""
    session_id = body.pop("session_id", None)
    turn_type = body.pop("turn_type", None)
    session_done = body.pop("session_done", None)
    if session_id is not None and not isinstance(session_id, str):
        raise bad_request("session_id must be a string.", param="session_id")
    if turn_type is not None and turn_type not in TURN_TYPES:
        raise bad_request("turn_type must be 'main' or 'side'.", param="turn_type")
    if session_done is not None and not isinstance(session_done, bool):
        raise bad_request("session_done must be a boolean.", param="session_done")
    messages = body.get("messages")
    marker = _strip_marker(messages) if isinstance(messages, list) else {}

    h_session = headers.get(b"x-session-id")
    h_turn = headers.get(b"x-turn-type")
    h_done = headers.get(b"x-session-done")
    identity = Identity()
    identity.session_id = (h_session.decode("latin-1") if h_session else None) or session_id \
        or marker.get("session_id")
    turn = (h_turn.decode("latin-1").lower() if h_turn else None) or turn_type or marker.get("turn_type")
    identity.turn_type = turn if turn in TURN_TYPES else None
    if h_done is not None:
        identity.session_done = h_done.decode("latin-1").strip().lower() in _TRUE
    elif session_done is not None:
        identity.session_done = session_done
    else:
        identity.session_done = marker.get("session_done", "").lower() in _TRUE
    return identity
