"""Session and turn identity of a /v1 request, as the client gave it or as OpenClaw's requests show it.

Session id, first found wins:
1. the ``X-Session-Id`` header;
2. the ``session_id`` body field;
3. the ``[RL-TRAINING-META] session_id=…`` marker line in a system/developer message (OpenClaw's plugin puts
   it there when it cannot set headers);
4. OpenClaw's own ``Runtime: agent=main | session=agent:main:main | sessionId=<uuid> | …`` line in a user
   message (OpenClaw 2026.9 sends no session header at all; the line ends its first user message), the
   earliest user message that has one. It is left in the messages: it is part of the prompt the model saw.
Nothing found: capture infers the session from message prefixes.

Turn type: ``X-Turn-Type``, then ``turn_type``, then the marker; then, for chat requests without any of them,
the shape of OpenClaw's side requests (each is an extra call around the conversation, not a reply to the
user, so it must not become a main turn nor the next state of one):
- heartbeat: the newest user message is OpenClaw's heartbeat prompt ("Follow the heartbeat monitor scratch
  context…") or mentions ``HEARTBEAT_OK`` / ``HEARTBEAT.md`` (the older prompt and its reply convention);
- memory flush: a system or the newest user message starts "Pre-compaction memory flush";
- compaction: the system message is OpenClaw's summariser ("You are a context summarization assistant"), or
  the newest user message holds the ``<conversation>…</conversation>`` transcript it asks to summarise.
Anything else is left to capture (``None``: main unless capture's own rules say side). OpenClaw's ordinary
system prompt explains heartbeats on every turn, so for heartbeats only the user message is read.

Body fields are removed before forwarding (vLLM has a ``session_id`` of its own and refuses a non-string one)
and never refused, whatever their JSON type: a number as ``session_id`` becomes its decimal string, other
non-strings are ignored; an unknown ``turn_type`` is ignored (inferred); ``session_done`` is true for
``true``, a non-zero number, or "1"/"true"/"yes"/"on" in any case.
"""

import re
from dataclasses import dataclass

MARKER = "[RL-TRAINING-META]"
_MARKER_RE = re.compile(r"[ \t]*\[RL-TRAINING-META\][^\n]*\n?")
_FIELD_RE = re.compile(r"(session_id|turn_type|session_done)=(\S+)")
TURN_TYPES = ("main", "side")
_TRUE = ("1", "true", "yes", "on")
SESSION_ID_MAX = 200  # what capture stores (Session.external_id); a longer id is cut rather than refused
RUNTIME_SESSION = "sessionId="
_RUNTIME_RE = re.compile(r"^Runtime:[^\n]*?\bsessionId=([^\s|]+)", re.M)
_HEARTBEAT_RE = re.compile(r"heartbeat monitor scratch context|HEARTBEAT_OK|\bHEARTBEAT\.md\b")
_MEMORY_FLUSH = "pre-compaction memory flush"
_SUMMARISER = "you are a context summarization assistant"
_TRANSCRIPT_RE = re.compile(r"<conversation>.*</conversation>", re.S)


@dataclass(slots=True)
class Identity:
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False
    side_kind: str | None = None  # "heartbeat" | "memory_flush" | "compaction" when recognised by shape


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


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _coerce_session_id(value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        return None
    return value.strip()[:SESSION_ID_MAX] or None


def _coerce_turn_type(value) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value if value in TURN_TYPES else None


def _coerce_done(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return False


def runtime_session_id(messages: list) -> str | None:
    """The ``sessionId`` of OpenClaw's ``Runtime:`` line in the earliest user message that has one."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        text = _text(message.get("content"))
        if RUNTIME_SESSION in text:  # cheap test first: most user messages have no such line
            found = _RUNTIME_RE.search(text)
            if found:
                return _coerce_session_id(found.group(1))
    return None


def side_kind(messages: list) -> str | None:
    """Which of OpenClaw's side requests ``messages`` is, by its shape; None for an ordinary turn."""
    newest_user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
                       None)
    user_text = _text(newest_user.get("content")) if newest_user else ""
    for message in messages:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            system = _text(message.get("content")).lstrip()[:200].lower()
            if system.startswith(_SUMMARISER):
                return "compaction"
            if system.startswith(_MEMORY_FLUSH):
                return "memory_flush"
    if user_text.lstrip()[:100].lower().startswith(_MEMORY_FLUSH):
        return "memory_flush"
    if _HEARTBEAT_RE.search(user_text):
        return "heartbeat"
    if "<conversation>" in user_text and _TRANSCRIPT_RE.search(user_text):
        return "compaction"
    return None


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1").strip() if value else None


def extract_identity(headers: dict[bytes, bytes], body: dict) -> Identity:
    """Reads and removes ClawHub's own fields from ``body`` (mutated in place) and returns the identity.
    Never raises for what a client sent."""
    session_id = _coerce_session_id(body.pop("session_id", None))
    turn_type = _coerce_turn_type(body.pop("turn_type", None))
    done_field = body.pop("session_done", None)
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else None
    marker = _strip_marker(messages) if messages else {}

    identity = Identity()
    identity.session_id = (_coerce_session_id(_header(headers, b"x-session-id")) or session_id
                           or _coerce_session_id(marker.get("session_id"))
                           or (runtime_session_id(messages) if messages else None))
    identity.turn_type = (_coerce_turn_type(_header(headers, b"x-turn-type")) or turn_type
                          or _coerce_turn_type(marker.get("turn_type")))
    if identity.turn_type is None and messages:
        identity.side_kind = side_kind(messages)
        if identity.side_kind is not None:
            identity.turn_type = "side"
    h_done = _header(headers, b"x-session-done")
    if h_done is not None:
        identity.session_done = _coerce_done(h_done)
    elif done_field is not None:
        identity.session_done = _coerce_done(done_field)
    else:
        identity.session_done = _coerce_done(marker.get("session_done", ""))
    return identity
