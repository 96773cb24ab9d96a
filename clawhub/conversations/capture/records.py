"""The record the gateway hands to the background writer for every /v1 request it served.

Plain data: the hot path builds it without touching the database; the capture consumer stores batches of
them (``capture.store``, and ``clawhub.usage`` for the metering) off the event loop.

The hand-off's record format is a TurnRecord as orjson, field by field, so fields added to TurnRecord flow
through without the hand-off changing; unknown fields are ignored on the way back, missing ones take their
defaults. When the prompt's token ids came as vLLM's own JSON text (``RawIds``: the gateway cuts them out of
the reply unparsed), that text follows the object after a newline, ``{...}\n[1,2,...]``, and the object has
``"prompt_token_ids": null``: an agent's prompt is 15k ids, which neither side then parses as part of the
record (orjson never writes a raw newline, so the first one ends the object). A record that is the object
alone (every record handed off before this format, and any whose ids were parsed) reads as before. A consumer
older than this format dead-letters records that carry the text as undecodable: roll consumers out first, or
requeue them afterwards (``capture_consumer --requeue-undecodable``).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson

from clawhub.conversations.storage import pack_ids, unpack_ids


class RawIds(Sequence[int]):
    """Token ids kept as the JSON array text vLLM wrote (``b"[1,2,3]"``), unparsed until someone reads them:
    the gateway hands them to capture and, when the client asked, back to the client as they came; the
    consumer parses them once, to pack them (``capture.compact``). The text is vLLM's and is checked only
    there: ``packed()`` is None unless it is a list of ints from 0 to 2**32 - 1."""

    __slots__ = ("raw", "_count", "_ints")

    def __init__(self, raw: bytes):
        self.raw = raw
        self._count: int | None = None
        self._ints: list[int] | None = None

    def ints(self) -> list[int] | None:
        """The ids, parsed once; None when the text is not a list of uint32."""
        if self._ints is None:
            packed = self.packed()
            self._ints = unpack_ids(packed) if packed is not None else None
        return self._ints

    def packed(self) -> bytes | None:
        """The ids as storage packs them (one parse); None when the text is not a list of uint32 (the turn is
        then stored without served prompt ids)."""
        try:
            value = orjson.loads(self.raw)
            return pack_ids(value) if type(value) is list else None
        except (orjson.JSONDecodeError, TypeError, OverflowError):
            return None

    def __len__(self) -> int:
        # Counted without parsing (the Messages and Responses streams report it as input tokens at once).
        if self._count is None:
            self._count = self.raw.count(b",") + 1 if self.raw.strip(b"[] \t\r\n") else 0
        return self._count

    def __iter__(self) -> Iterator[int]:
        return iter(self.ints() or ())

    def __getitem__(self, index):  # type: ignore[override]
        return (self.ints() or [])[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RawIds):
            return self.raw == other.raw or self.ints() == other.ints()
        return isinstance(other, list) and self.ints() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RawIds({len(self.raw)} bytes)"


@dataclass
class TurnRecord:
    request_id: str
    route: str  # "chat" | "completions": what was served upstream, and the shape of ``request``
    key_id: int
    user_id: int
    tenant_id: int
    group_id: int | None
    model: str  # the client-facing model id ("clawhub-personal", "clawhub-group-<slug>", "base")
    upstream_model: str  # what vLLM was asked for: an adapter name like "t7-v3", or the base model
    adapter_version_id: int | None
    upstream: str  # base URL of the upstream that served it
    status: str  # "complete" | "cut" (stream ended early) | "failed"
    http_status: int
    started_at: float  # unix seconds
    latency_ms: float
    ttft_ms: float | None = None  # streams only
    stream: bool = False
    # Session identity as the client gave it (headers, body fields or the system-prompt marker); None = infer.
    session_id: str | None = None
    turn_type: str | None = None  # "main" | "side" | "playground" (a playground key's) | None (infer)
    session_done: bool = False
    # What was sent upstream minus ClawHub's own fields: messages (or prompt), tools, and sampling params.
    request: dict[str, Any] = field(default_factory=dict)
    # choices as the client would see them, joined from chunks for streams: content, tool_calls,
    # finish_reason.
    choices: list[dict[str, Any]] = field(default_factory=list)
    # Sampled completion token ids and their logprobs for choice 0, as vLLM returned them.
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # The prompt's token ids as vLLM rendered them (chat: the template applied to messages, tools and
    # chat_template_kwargs), so a training sample is exactly the sequence that was served.
    # A list when it was parsed (or in a record handed off before RawIds), else RawIds.
    prompt_token_ids: list[int] | RawIds | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_estimated: bool = False  # True when a cut stream had no usage chunk and tokens were estimated
    error: str | None = None
    # The X-Request-Id that follows this request through the logs (the client's, or one the gateway made).
    # Unlike request_id it may repeat: a client may send the same id twice, and capture dedups on request_id.
    trace_id: str = ""
    # The output cap that really applied when it was below the client's max_tokens / max_completion_tokens
    # (clamped to the model's context by the gateway, or by vLLM to what is left after the prompt).
    clamped_max_tokens: int | None = None
    # The API the client spoke when it is not the route's own: "messages" | "responses" (served as chat).
    # "" for chat and completions, and in records handed off before the field existed.
    api: str = ""


# --- the record format --------------------------------------------------------------------------------------

_FIELDS = tuple(f.name for f in fields(TurnRecord))


def _null(value: Any) -> None:
    if isinstance(value, RawIds):
        return None  # written after the object instead
    raise TypeError


def encode(record: TurnRecord) -> bytes:
    # orjson serialises dataclasses natively, every field, in a few microseconds per KB.
    try:
        if isinstance(record.prompt_token_ids, RawIds):
            return orjson.dumps(record, default=_null) + b"\n" + record.prompt_token_ids.raw
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        # A request nested deeper than orjson writes (254 levels, the record's own included) that the gateway
        # still parsed: the turn is kept without what it asked and answered (a side turn: never trained on),
        # not lost, and its in-flight entry closes as usual.
        return orjson.dumps(replace(record, request={"model": record.model}, choices=[], token_ids=None,
                                    logprobs=None, prompt_token_ids=None, turn_type="side",
                                    error=record.error or "request nested too deeply to keep"))


def decode(payload: bytes) -> TurnRecord:
    end = payload.find(b"\n")
    data = orjson.loads(payload if end < 0 else memoryview(payload)[:end])
    record = TurnRecord(**{name: data[name] for name in _FIELDS if name in data})
    if end >= 0:
        record.prompt_token_ids = RawIds(payload[end + 1:])
    return record


def without_content(record: TurnRecord) -> TurnRecord:
    """The record less everything the user sent or was sent (its ids, timing and counts stay): what an
    acknowledged record of a deleted account becomes in the spool. Each field is no longer than before."""
    return replace(record, request={}, choices=[], token_ids=None, logprobs=None, prompt_token_ids=None,
                   session_id=None if record.session_id is None else "",
                   error=None if record.error is None else "", trace_id="")
