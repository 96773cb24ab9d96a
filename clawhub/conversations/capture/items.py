"""What a TurnRecord becomes on its way to the database: an ``Item`` (its messages' hashes, its turn type and
the session the client named), then an unsaved ``Turn`` and, where needed, a new ``Session``."""

import hashlib
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.models import Q

from clawhub.conversations.capture.records import TurnRecord
from clawhub.conversations.capture.rows import blank, set_fields
from clawhub.conversations.identity import (
    MAIN,
    message_hashes,
    next_state_messages,
    reply_message,
    turn_type_for,
)
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.sampling import turn_sampling

_EXTERNAL_ID_MAX = Session._meta.get_field("external_id").max_length


UNPACKED = b"not packed yet"  # Item.packed_ids before compact packs it (compared by identity)


@dataclass(eq=False)
class Item:
    """One record on its way to becoming a turn."""

    record: TurnRecord
    messages: list | None
    turn_type: str
    external_id: str  # the client's session id; "" = infer
    candidates: list[tuple[str, int]]  # (prefix hash, messages in it), newest first
    continuation: str
    # Also continued by a request that resends this one without its trailing retry messages (identity).
    continuation_without_retry: str = ""
    prompt_hash: str = ""
    retry_hashes: tuple[str, ...] = ()
    session_ref: int | Session | None = None  # an existing session's id, or a new Session
    session: Session | None = None
    turn: Turn | None = None
    # record.prompt_token_ids packed (storage.pack_ids), once, by capture.compact; None: it has none.
    packed_ids: bytes | None = UNPACKED
    context: Any = None  # capture.compact.Context: what its next state's prompt ids start with, made once

    @property
    def continuations(self) -> tuple[str, ...]:
        """The hashes a request continuing this one may carry for its prefix ending with the reply."""
        if self.continuation_without_retry:
            return (self.continuation, self.continuation_without_retry)
        return (self.continuation,) if self.continuation else ()


@lru_cache(maxsize=8)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


def item_of(record: TurnRecord) -> Item:
    messages = record.request.get("messages") if record.route == "chat" and record.request else None
    if not isinstance(messages, list):
        messages = None
    external_id = _external_id(record.session_id)
    turn_type = turn_type_for(
        explicit=record.turn_type,
        route=record.route,
        messages=messages,
        side_patterns=_compiled(tuple(settings.CONVERSATION_SIDE_PATTERNS)),
    )
    if not messages:
        return Item(record=record, messages=messages, turn_type=turn_type, external_id=external_id,
                     candidates=[], continuation="")
    hashes = message_hashes(messages, reply_message(record.choices))
    return Item(
        record=record,
        messages=messages,
        turn_type=turn_type,
        external_id=external_id,
        candidates=hashes.candidates,
        continuation=hashes.continuation,
        continuation_without_retry=hashes.continuation_without_retry,
        prompt_hash=hashes.prompt,
        retry_hashes=tuple(hashes.retries),
    )


def _external_id(raw: str | None) -> str:
    value = str(raw).strip() if raw is not None else ""
    if len(value) > _EXTERNAL_ID_MAX:
        # Still one stable id per client id, just short enough for the column.
        value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return value


def utc(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=UTC)


def ended_at(record: TurnRecord) -> datetime:
    return utc(record.started_at) + timedelta(milliseconds=max(record.latency_ms or 0, 0))


def new_session(record: TurnRecord, *, external_id: str = "") -> Session:
    return Session(
        tenant_id=record.tenant_id,
        key_id=record.key_id,
        user_id=record.user_id,
        external_id=external_id or f"inf-{uuid.uuid4().hex}",
        inferred=not external_id,
        started_at=utc(record.started_at),
        last_activity_at=ended_at(record),
    )


def resolve_explicit_sessions(items: list[Item]) -> None:
    """Sessions the client named: created if new (racing writers agree through the unique constraint), then
    read back. In a group tenant two members may pick the same id; a session belongs to one user, so the
    second member's turns go to a session under an id namespaced by their user id."""
    todo = [it for it in items if it.external_id]
    for attempt in range(2):
        if not todo:
            return
        first: dict[tuple[int, str], Item] = {}
        for it in todo:
            first.setdefault((it.record.tenant_id, it.external_id), it)
        # Sorted, so that two writers inserting overlapping sets wait on each other in the same order.
        Session.objects.bulk_create(
            [
                new_session(it.record, external_id=name)
                for (_, name), it in sorted(first.items(), key=_by_key)
            ],
            ignore_conflicts=True,
        )
        names_by_tenant: dict[int, list[str]] = defaultdict(list)
        for tenant_id, name in first:
            names_by_tenant[tenant_id].append(name)
        where = Q(pk__in=[])
        for tenant_id, names in names_by_tenant.items():
            where |= Q(tenant_id=tenant_id, external_id__in=names)
        found = {
            (s.tenant_id, s.external_id): s
            for s in Session.objects.filter(where).only("id", "tenant_id", "external_id", "user_id")
        }
        collided = []
        for it in todo:
            session = found[(it.record.tenant_id, it.external_id)]
            if session.user_id == it.record.user_id:
                it.session_ref = session.pk
            else:
                collided.append(it)
        for it in collided:
            # After a second collision (an id crafted to look namespaced) the turn simply opens a new session.
            it.external_id = _external_id(f"{it.external_id}~u{it.record.user_id}") if attempt == 0 else ""
        todo = collided


def _by_key(entry: tuple[tuple[int, str], Item]) -> tuple[int, str]:
    return entry[0]


def owner_of(turn_or_record) -> tuple[int, int]:
    return (turn_or_record.tenant_id, turn_or_record.user_id)


def ended_reason(record: TurnRecord) -> str:
    """How the reply ended, from what the gateway saw: a whole reply's finish reason, or why it was cut."""
    if record.status == Turn.Status.FAILED:
        return Turn.Ended.UPSTREAM_ERROR if record.http_status >= 500 else ""
    if record.status == Turn.Status.CUT:
        if record.http_status == 499 or (record.error or "").startswith("client disconnected"):
            return Turn.Ended.CLIENT_DISCONNECT
        return Turn.Ended.UPSTREAM_ERROR
    choice = record.choices[0] if record.choices and isinstance(record.choices[0], dict) else {}
    finish = choice.get("finish_reason")
    if finish == "length":
        return Turn.Ended.LENGTH
    if finish == "tool_calls":
        return Turn.Ended.TOOL_CALLS
    if finish in ("stop", "eos", None, "function_call") or finish:
        # vLLM says "stop" for an end-of-sequence token and a stop string alike; other servers differ.
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        return Turn.Ended.TOOL_CALLS if message.get("tool_calls") else Turn.Ended.STOP
    return Turn.Ended.STOP


def new_turn(it: Item, *, index: int) -> Turn:
    r = it.record
    request = dict(r.request or {})
    if it.messages is not None:
        request.pop("messages", None)  # stored apart, as what it adds to its base (see compact)
    turn = blank(Turn)
    set_fields(
        turn,
        session=it.session,
        tenant_id=r.tenant_id,
        key_id=r.key_id,
        user_id=r.user_id,
        index=index,
        turn_type=it.turn_type,
        request_id=r.request_id,
        route=r.route,
        api=r.api or r.route,
        model=r.model,
        upstream_model=r.upstream_model or "",
        adapter_version_id=r.adapter_version_id,
        request=request,
        response=r.choices or [],
        token_ids=r.token_ids,
        logprobs=r.logprobs,
        sampling=turn_sampling(r.request or {}),
        prompt_tokens=max(int(r.prompt_tokens or 0), 0),
        completion_tokens=max(int(r.completion_tokens or 0), 0),
        usage_estimated=r.usage_estimated,
        status=r.status,
        http_status=r.http_status,
        latency_ms=r.latency_ms,
        ttft_ms=r.ttft_ms,
        error=r.error or "",
        created_at=utc(r.started_at),
        continuation_hash=it.continuation,
        continuation_hash_without_retry=it.continuation_without_retry,
        prompt_hash=it.prompt_hash if it.turn_type == MAIN else "",
        parent_hash=it.candidates[0][0] if it.candidates and it.turn_type == MAIN else "",
        follows=(next_state_messages(it.messages) or None) if it.messages and it.turn_type == MAIN else None,
        ended=ended_reason(r),
    )
    clamped = getattr(r, "clamped_max_tokens", None)
    turn.clamped_max_tokens = max(int(clamped), 0) if isinstance(clamped, int) else None
    turn.retry_hashes = it.retry_hashes
    turn.parent_ref = None
    return turn
