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

from dataclasses import dataclass

MARKER = "[RL-TRAINING-META]"
_MARKER_FIELDS = ("session_id", "turn_type", "session_done")
TURN_TYPES = ("main", "side")
_TRUE = ("1", "true", "yes", "on")
SESSION_ID_MAX = 200  # what capture stores (Session.external_id); a longer id is cut rather than refused
RUNTIME_SESSION = "sessionId="
_RUNTIME_LINE = "Runtime:"
_HEARTBEAT_PHRASES = ("heartbeat monitor scratch context", "HEARTBEAT_OK")
_HEARTBEAT_FILE = "HEARTBEAT.md"
_MEMORY_FLUSH = "pre-compaction memory flush"
_SUMMARISER = "you are a context summarization assistant"
_TRANSCRIPT_OPEN, _TRANSCRIPT_CLOSE = "<conversation>", "</conversation>"
# This runs on the event loop before any quota check, on text the client wrote, so it uses no regex (a
# backtracking one took seconds on a 40 KB run of spaces) and reads at most this many characters at each end
# of a message: where OpenClaw puts what is looked for (the marker ends a system prompt, the Runtime line ends
# the first user message, a side request's phrase starts its user message, a transcript spans it). Whatever
# lies between is neither read nor changed, whatever the body's size.
SCAN_CHARS = 16_384


@dataclass(slots=True)
class Identity:
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False
    # "heartbeat" | "memory_flush" | "compaction" (OpenClaw), "title" | "quota_probe" (Claude Code), by shape
    side_kind: str | None = None


def _ends(text: str) -> tuple[str, str]:
    """The first and the last SCAN_CHARS characters of ``text``, or all of it and "" when that is no more."""
    if len(text) <= 2 * SCAN_CHARS:
        return text, ""
    return text[:SCAN_CHARS], text[-SCAN_CHARS:]


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _has_word(text: str, word: str) -> bool:
    """``word`` in ``text`` with no letter, digit or underscore on either side (a regex's ``\\bword\\b``)."""
    at = text.find(word)
    while at != -1:
        end = at + len(word)
        if ((at == 0 or not _is_word_char(text[at - 1]))
                and (end == len(text) or not _is_word_char(text[end]))):
            return True
        at = text.find(word, at + 1)
    return False


def _marker_fields(line: str, found: dict[str, str]) -> None:
    """Adds the ``name=value`` fields of one marker line (from the marker on) to ``found``."""
    for word in line.split():
        name, equals, value = word.partition("=")
        if equals and value and name in _MARKER_FIELDS:
            found[name] = value


def _drop_markers(text: str, found: dict[str, str]) -> str:
    """``text`` without its marker lines (each from the spaces before the marker to the end of its line, the
    newline included), their fields added to ``found``. One pass of ``str.find``: linear in ``text``."""
    kept: list[str] = []
    done = 0
    at = text.find(MARKER)
    while at != -1:
        before = text[done:at]
        kept.append(before.rstrip(" \t") if before.endswith((" ", "\t")) else before)
        newline = text.find("\n", at)
        end = len(text) if newline == -1 else newline
        _marker_fields(text[at + len(MARKER):end], found)
        done = end if newline == -1 else end + 1
        at = text.find(MARKER, done)
    if not kept:
        return text
    kept.append(text[done:])
    return "".join(kept)


def _take_marker(text: str, found: dict[str, str]) -> str:
    """Adds the fields of ``text``'s marker lines to ``found``; returns ``text`` without them."""
    head, tail = _ends(text)
    if not tail:
        return _drop_markers(head, found).strip()
    middle = text[SCAN_CHARS:-SCAN_CHARS]
    return (_drop_markers(head, found) + middle + _drop_markers(tail, found)).strip()


def _strip_marker(messages: list) -> dict[str, str]:
    """Removes the marker from system/developer messages; returns the fields it carried."""
    found: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            if MARKER in content[:SCAN_CHARS] or MARKER in content[-SCAN_CHARS:]:
                message["content"] = _take_marker(content, found)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str) and (MARKER in text[:SCAN_CHARS] or MARKER in text[-SCAN_CHARS:]):
                    part["text"] = _take_marker(text, found)
    return found


def _text(content) -> str:
    """The text of a message's content: the string, or its text parts joined."""
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


def _runtime_value(line: str) -> str | None:
    """The value of the first ``sessionId=`` word of a Runtime line that has one (up to a space or ``|``)."""
    at = line.find(RUNTIME_SESSION)
    while at != -1:
        start = at + len(RUNTIME_SESSION)
        if ((at == 0 or not _is_word_char(line[at - 1])) and start < len(line)
                and not line[start].isspace() and line[start] != "|"):
            return line[start:].split(None, 1)[0].partition("|")[0]
        at = line.find(RUNTIME_SESSION, start)
    return None


def _runtime_in(text: str, *, starts_line: bool) -> str | None:
    """The session id of the first line of ``text`` that starts with ``Runtime:`` and has one; the start of
    ``text`` counts as a line start only if ``starts_line``."""
    prefix = "\n" + _RUNTIME_LINE
    if starts_line and text.startswith(_RUNTIME_LINE):
        start = 0
    else:
        at = text.find(prefix)
        start = -1 if at == -1 else at + 1
    while start != -1:
        newline = text.find("\n", start)
        found = _runtime_value(text[start + len(_RUNTIME_LINE):len(text) if newline == -1 else newline])
        if found or newline == -1:
            return found
        at = text.find(prefix, newline)
        start = -1 if at == -1 else at + 1
    return None


def runtime_session_id(messages: list) -> str | None:
    """The ``sessionId`` of OpenClaw's ``Runtime:`` line in the earliest user message that has one."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        head, tail = _ends(_text(message.get("content")))
        found = _runtime_in(head, starts_line=True) or (tail and _runtime_in(tail, starts_line=False))
        if found:
            return _coerce_session_id(found)
    return None


def _is_heartbeat(text: str) -> bool:
    return any(phrase in text for phrase in _HEARTBEAT_PHRASES) or _has_word(text, _HEARTBEAT_FILE)


def _holds_transcript(head: str, tail: str) -> bool:
    """A ``<conversation>`` opened and later closed (the summariser's transcript, which may be long)."""
    opened = head.find(_TRANSCRIPT_OPEN)
    if opened == -1:
        return False
    after = opened + len(_TRANSCRIPT_OPEN)
    return head.find(_TRANSCRIPT_CLOSE, after) != -1 or _TRANSCRIPT_CLOSE in tail


def _starts_with(text: str, phrase: str) -> bool:
    return text[:SCAN_CHARS].lstrip()[: len(phrase)].lower() == phrase


def side_kind(messages: list) -> str | None:
    """Which of OpenClaw's side requests ``messages`` is, by its shape; None for an ordinary turn."""
    newest_user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
                       None)
    user_text = _text(newest_user.get("content")) if newest_user else ""
    for message in messages:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            system = _text(message.get("content"))
            if _starts_with(system, _SUMMARISER):
                return "compaction"
            if _starts_with(system, _MEMORY_FLUSH):
                return "memory_flush"
    if _starts_with(user_text, _MEMORY_FLUSH):
        return "memory_flush"
    head, tail = _ends(user_text)
    if _is_heartbeat(head) or _is_heartbeat(tail):
        return "heartbeat"
    if _holds_transcript(head, tail):
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
