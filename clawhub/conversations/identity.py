"""Session and turn identity from the messages alone: pure functions, no database.

Session inference: a chat request whose messages are an earlier request's messages plus that request's reply
(and more after it) continues the earlier request's session. Each stored turn keeps a ``continuation_hash`` of
its messages plus its reply; a request ending with two or more user messages (OpenClaw's retry of a message,
with its instruction to answer) also keeps a ``continuation_hash_without_retry`` of its messages as far as the
first of those plus its reply, as OpenClaw resends them after a served retry (without the instruction). A new
request hashes every prefix of its messages that ends right after an assistant message and looks those hashes
up, among both. Hashes are taken over a canonical form, so that what clients change when they resend history
(content as a string or as text parts, null vs missing fields, whitespace at the ends, tool-call ids,
reasoning fields they drop, the time stamp OpenClaw puts in front of a user message) does not break the match.

Linking (``clawhub.conversations.links``) builds on the same hashes: a turn's ``prompt_hash`` says which other
turns it repeats (a regenerate), its ``parent_hash`` which turn's prompt + reply it continues.
"""

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from workers.messages import content_text

MAIN = "main"
SIDE = "side"
# Set by the gateway for a playground key's requests, never read from what a client sends.
PLAYGROUND = "playground"

# How many assistant-ending prefixes of one request are looked up, newest first. The newest matches in the
# normal case; older ones catch a client that dropped or regenerated its last exchanges.
MAX_PREFIX_CANDIDATES = 32

# OpenClaw's own housekeeping turns, recognised by the newest user message. The heartbeat prompt is
# configurable in OpenClaw, but its reply convention (HEARTBEAT_OK) and HEARTBEAT.md are not; the memory flush
# before compaction starts with its fixed phrase. Only the user message is read: OpenClaw's ordinary system
# prompt explains HEARTBEAT_OK on every turn.
SIDE_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("heartbeat", re.compile(r"HEARTBEAT_OK|\bHEARTBEAT\.md\b")),
    ("memory_flush", re.compile(r"pre-compaction memory flush", re.IGNORECASE)),
)


# OpenClaw prefixes each user message with when it was sent, e.g. "[Tue 2026-12-01 08:27 UTC] ". It is not
# part of what the user said, and a client may render it differently when it resends the history.
TIMESTAMP_PREFIX = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?(?: [A-Za-z+\-0-9:]+)?\] "
)
# Context OpenClaw injects as a user message (workspace files, tool hints): not something the user said, so
# never a next state.
INTERNAL_CONTEXT = re.compile(
    r"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>.*?(?:<<<END_OPENCLAW_INTERNAL_CONTEXT>>>|\Z)", re.DOTALL
)


def _canonical_content(content: Any, *, user: bool = False) -> Any:
    if content is None:
        return None
    if isinstance(content, str):
        text = content.strip()
        return (TIMESTAMP_PREFIX.sub("", text, count=1) if user else text) or None
    if isinstance(content, list):
        if all(
            isinstance(p, str) or (isinstance(p, dict) and p.get("type") in ("text", None)) for p in content
        ):
            return _canonical_content(content_text(content), user=user)
        # Images and other parts: keep them, with their text parts normalised the same way.
        return [
            {"type": "text", "text": content_text([p]).strip()}
            if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
            else p
            for p in content
        ]
    return content


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments.strip()
    return arguments


def canonical_message(message: Any) -> dict:
    """The parts of a message that say what was said: role, content and tool calls (name and arguments).

    Tool-call ids, names, reasoning and other fields are left out: clients resend them inconsistently, and
    they never distinguish two conversations that agree on everything else.
    """
    if not isinstance(message, dict):
        return {"role": "", "content": str(message)}
    out: dict[str, Any] = {"role": str(message.get("role") or "")}
    content = _canonical_content(message.get("content"), user=out["role"] == "user")
    if content is not None:
        out["content"] = content
    calls = []
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") or {}
            calls.append(
                {"name": function.get("name"), "arguments": _canonical_arguments(function.get("arguments"))}
            )
    if calls:
        out["tool_calls"] = calls
    return out


def _canonical_encoding(message: Any) -> bytes:
    # OpenClaw's internal context is not part of the conversation: OpenClaw sends it after the newest user
    # message and leaves it out when it resends that history with the reply, so it must not change a hash.
    if is_internal_context(message):
        return b""
    # orjson escapes newlines inside strings, so "\n" cleanly separates messages in the hashed stream.
    return orjson.dumps(canonical_message(message), option=orjson.OPT_SORT_KEYS) + b"\n"


# Canonical encodings of messages hashed lately, by their JSON as sent. A conversation resends its whole
# history with every request, so nearly all of a request's messages were canonicalised for an earlier one;
# the JSON (orjson, in C) costs a fraction of canonicalising in Python. Bounded by the bytes it holds, and
# emptied when full (a conversation's next request fills it again with what it still needs).
_ENCODINGS: dict[bytes, bytes] = {}
_ENCODINGS_MAX_BYTES = 8 * 1024 * 1024
_encodings_bytes = 0


def _encoded(message: Any) -> bytes:
    global _encodings_bytes
    try:
        key = orjson.dumps(message)
    except TypeError:  # not JSON (a caller's own objects): canonicalised each time
        return _canonical_encoding(message)
    encoded = _ENCODINGS.get(key)
    if encoded is None:
        encoded = _canonical_encoding(message)
        if _encodings_bytes > _ENCODINGS_MAX_BYTES:
            _ENCODINGS.clear()
            _encodings_bytes = 0
        _ENCODINGS[key] = encoded
        # Approximate across threads (no lock): the bound only keeps the memory in check.
        _encodings_bytes += len(key) + len(encoded)
    return encoded


@dataclass(frozen=True)
class MessageHashes:
    """Every hash capture needs of one request, from one pass over its messages."""

    candidates: list[tuple[str, int]]  # ``prefix_hashes_with_lengths``
    prompt: str  # ``prompt_hash``
    retries: list[str]  # ``retry_hashes``
    continuation: str  # ``continuation_hash`` with the reply ("" without one)
    # ``continuation_hash_without_retry``: the continuation hash of the request without the user messages
    # after the first of its trailing ones ("" when it ends with fewer than two, or has no reply).
    continuation_without_retry: str = ""


def message_hashes(messages: Sequence[Any], reply: dict | None = None) -> MessageHashes:
    """Each message is canonicalised and encoded once, and every hash is a snapshot of one incremental hash:
    the five hashes taken one by one cost five encodings of a history that grows with the conversation."""
    # Retry prompts end inside the run of trailing user messages: after its first, up to before its last.
    end = len(messages)
    while end > 0 and isinstance(messages[end - 1], dict) and messages[end - 1].get("role") == "user":
        end -= 1
    retry_from, retry_to = (end + 1, len(messages) - 1) if len(messages) - end >= 2 else (0, -1)
    hasher = hashlib.sha256()
    candidates: list[tuple[str, int]] = []
    retries: list[str] = []
    # The history as far as the first user message of the trailing run (internal context, which hashes to
    # nothing, does not count as one), kept only if another user message follows it.
    before_retry = None
    retried = False
    for n, message in enumerate(messages, 1):
        encoded = _encoded(message)
        hasher.update(encoded)
        if isinstance(message, dict) and message.get("role") == "assistant":
            candidates.append((hasher.hexdigest(), n))
        if retry_from <= n <= retry_to:
            retries.append(hasher.hexdigest())
        if n > end and encoded:
            if before_retry is None:
                before_retry = hasher.copy()
            else:
                retried = True
    prompt = hasher.hexdigest()
    continuation = without_retry = ""
    if reply is not None:
        encoded = _encoded(reply)
        hasher.update(encoded)
        continuation = hasher.hexdigest()
        if retried and before_retry is not None:
            before_retry.update(encoded)
            without_retry = before_retry.hexdigest()
    return MessageHashes(candidates=candidates[::-1][:MAX_PREFIX_CANDIDATES], prompt=prompt, retries=retries,
                         continuation=continuation, continuation_without_retry=without_retry)


def prefix_hashes(messages: Sequence[Any]) -> list[str]:
    """Hashes of every prefix of ``messages`` that ends right after an assistant message, newest first.

    One pass with an incremental hash: long agent conversations have hundreds of messages.
    """
    return [digest for digest, _ in prefix_hashes_with_lengths(messages)]


def prefix_hashes_with_lengths(messages: Sequence[Any]) -> list[tuple[str, int]]:
    """``prefix_hashes`` with the number of messages in each prefix."""
    return message_hashes(messages).candidates


def prompt_hash(messages: Sequence[Any]) -> str:
    """The hash of a request's messages as they are: two requests with the same one ask the same thing (a
    regenerate or a retry of the other)."""
    return message_hashes(messages).prompt


def retry_hashes(messages: Sequence[Any]) -> list[str]:
    """Prompt hashes of ``messages`` without one, two, … of its trailing user messages (all but the first of
    them). OpenClaw retries a failed turn with the failed user message kept in the history, so a retry's
    prompt is the failed turn's prompt plus more user messages."""
    return message_hashes(messages).retries


def continuation_hash(messages: Sequence[Any], reply: dict | None) -> str:
    """The hash a request continuing this exchange will have for its prefix ending with ``reply``."""
    return message_hashes(messages, reply).continuation


def continuation_hash_without_retry(messages: Sequence[Any], reply: dict | None) -> str:
    """The continuation hash of ``messages`` cut after the first of its two or more trailing user messages.

    OpenClaw retries a message by sending the history, that message and an instruction to answer; when the
    retry is served, its next request resends the message and the reply but not the instruction. That
    request's prefix ending with the reply has this hash. "" when the request does not end that way."""
    return message_hashes(messages, reply).continuation_without_retry


def reply_message(choices: Sequence[Any]) -> dict | None:
    """Choice 0 as the assistant message a client resends in its next request, or None if there was no reply.

    Accepts the shapes the gateway may record: an OpenAI ``message``, a joined stream ``delta``, or the
    fields directly on the choice.
    """
    if not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message") or choice.get("delta") or choice
    if not isinstance(message, dict):
        return None
    content, tool_calls = message.get("content"), message.get("tool_calls")
    if content is None and not tool_calls:
        return None
    return {"role": "assistant", "content": content, "tool_calls": tool_calls or None}


def is_internal_context(message: Any) -> bool:
    """A user message that holds nothing but OpenClaw's internal context (as a string or content parts)."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    text = content_text(message.get("content"))
    return "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in text and not INTERNAL_CONTEXT.sub("", text).strip()


def next_state_messages(messages: Sequence[Any]) -> list[dict]:
    """What a request adds after the conversation's last assistant message: its user and tool messages.

    That is the previous turn's next state: the tool results answering its tool calls, or the user's reply.
    Without any assistant message (a client that does not resend history) it is the newest user message.
    User messages that only carry OpenClaw's internal context are left out (the user did not say them), and a
    user message repeated right after itself counts once (OpenClaw keeps a failed turn's message in the
    history and sends it again when it retries).
    """
    last_assistant = None
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            last_assistant = i
    if last_assistant is None:
        for message in reversed(messages):
            if (
                isinstance(message, dict)
                and message.get("role") == "user"
                and not is_internal_context(message)
            ):
                return [message]
        return []
    out: list[dict] = []
    for m in messages[last_assistant + 1 :]:
        if not isinstance(m, dict) or m.get("role") not in ("user", "tool") or is_internal_context(m):
            continue
        if (
            out
            and m.get("role") == "user"
            and out[-1].get("role") == "user"
            and canonical_message(m) == canonical_message(out[-1])
        ):
            continue
        out.append(m)
    return out


def newest_user_text(messages: Sequence[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def turn_type_for(
    *,
    explicit: str | None,
    route: str,
    messages: Sequence[Any] | None,
    side_patterns: Iterable[re.Pattern[str]] = (),
) -> str:
    """main, side or playground, in this order: the explicit type (playground: set by the gateway); a request
    without a dialogue (the legacy completions route) is side; OpenClaw's heartbeat and memory-flush prompts,
    or a pattern the operator (or, later, the tenant) configured, in the newest user message make it side;
    everything else continues the user's dialogue and is main."""
    if explicit in (MAIN, SIDE, PLAYGROUND):
        return explicit
    if route != "chat" or messages is None:
        return SIDE
    text = newest_user_text(messages)
    if any(pattern.search(text) for _, pattern in SIDE_MARKERS):
        return SIDE
    if any(pattern.search(text) for pattern in side_patterns):
        return SIDE
    return MAIN
