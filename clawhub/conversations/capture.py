"""Persists the gateway's TurnRecords: sessions, turns, next-state links and usage, a batch at a time.

The gateway's writer thread calls ``capture_store(batch)`` off the event loop. A batch is one transaction of a
fixed number of queries, whatever its size. If the batch fails, each record is retried alone, so one bad
record costs only itself; its usage is still counted when that part can be written. Records already stored
(a batch delivered twice) are skipped, turns and usage alike.

Per batch, in order: skip known request ids, and the records of users who turned storage off; find or create
the sessions the client named; infer the others from the messages (``conversations.identity``); lock every
existing session touched, in id order, so that concurrent writers number turns and link next states one after
the other; create turns; link each session's waiting main turn to the new main turn's user or tool messages;
close sessions the client said are done; add usage; hand linked and closed turns to judging after commit.
"""

import hashlib
import logging
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from clawhub.conversations.identity import (
    MAIN,
    continuation_hash,
    next_state_messages,
    prefix_hashes,
    reply_message,
    turn_type_for,
)
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.privacy import capture_allowed_many
from clawhub.conversations.selectors import turns_awaiting_next
from clawhub.conversations.services import turns_ready_notify
from clawhub.gateway.records import TurnRecord
from clawhub.usage.services import usage_record

logger = logging.getLogger("clawhub.conversations.capture")

# Counters the metrics endpoint can export, next to the gateway writer's.
STATS = {"stored": 0, "duplicates": 0, "skipped": 0, "batch_retries": 0}
_stats_lock = threading.Lock()

_EXTERNAL_ID_MAX = Session._meta.get_field("external_id").max_length


def _count(name: str, n: int = 1) -> None:
    with _stats_lock:
        STATS[name] += n


@dataclass(eq=False)
class _Item:
    """One record on its way to becoming a turn."""

    record: TurnRecord
    messages: list | None
    turn_type: str
    external_id: str  # the client's session id; "" = infer
    candidates: list[str]  # prefix hashes to look up, newest first
    continuation: str
    session_ref: int | Session | None = None  # an existing session's id, or a new Session
    session: Session | None = None


def capture_store(records: list[TurnRecord]) -> None:
    """Stores a batch of records. Never leaves a record half-written; a record that cannot be stored is logged
    and skipped. Raises only when the database cannot be reached at all (the writer counts that)."""
    if not records:
        return
    try:
        with transaction.atomic():
            stored = _store(records)
        _count("stored", stored)  # counted after the commit: PostgreSQL checks foreign keys only then
        return
    except Exception:
        if not _database_usable():
            raise
        _count("batch_retries")
        logger.exception("capture of a batch of %d turns failed; storing them one by one", len(records))
    for record in records:
        try:
            with transaction.atomic():
                stored = _store([record])
            _count("stored", stored)
        except Exception:
            _count("skipped")
            logger.exception("capture of turn %s failed; the turn is skipped", record.request_id)
            _meter_only(record)


def _meter_only(record: TurnRecord) -> None:
    # A record that cannot become a turn was still served: keep its usage if that much can be written.
    try:
        with transaction.atomic():
            usage_record(records=[record])
    except Exception:
        logger.exception("usage of turn %s could not be recorded either", record.request_id)


def _database_usable() -> bool:
    try:
        connection.ensure_connection()
        return connection.is_usable()
    except Exception:
        return False


def _store(records: Sequence[TurnRecord]) -> int:
    """Stores what is new in ``records``; returns how many turns it wrote."""
    now = timezone.now()
    records = _unseen(records)
    if not records:
        return 0
    # A user who turned storage off is served and metered, but none of their turns is written. (Their records
    # leave no request id behind, so only their usage would count twice if a batch were delivered twice.)
    allowed = capture_allowed_many({(r.user_id, r.key_id) for r in records})
    kept = [r for r in records if allowed[(r.user_id, r.key_id)][0]]
    if kept:
        items = [_item(r) for r in sorted(kept, key=lambda r: r.started_at)]
        _resolve_explicit_sessions(items)
        _infer_sessions(items)
        pending = _lock_sessions(items)
        ready = _write_turns(items, pending, now)
        turns_ready_notify(turn_ids=ready)
    usage_record(records=records)
    return len(kept)


def _unseen(records: Sequence[TurnRecord]) -> list[TurnRecord]:
    by_id: dict[str, TurnRecord] = {}
    for record in records:
        by_id.setdefault(record.request_id, record)
    known = set(
        Turn.objects.filter(request_id__in=list(by_id)).order_by().values_list("request_id", flat=True)
    )
    if known or len(by_id) < len(records):
        _count("duplicates", len(records) - len(by_id) + len(known))
    return [r for request_id, r in by_id.items() if request_id not in known]


@lru_cache(maxsize=8)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


def _item(record: TurnRecord) -> _Item:
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
    return _Item(
        record=record,
        messages=messages,
        turn_type=turn_type,
        external_id=external_id,
        candidates=prefix_hashes(messages) if messages and not external_id else [],
        continuation=continuation_hash(messages, reply_message(record.choices)) if messages else "",
    )


def _external_id(raw: str | None) -> str:
    value = str(raw).strip() if raw is not None else ""
    if len(value) > _EXTERNAL_ID_MAX:
        # Still one stable id per client id, just short enough for the column.
        value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return value


def _ts(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=UTC)


def _ended(record: TurnRecord) -> datetime:
    return _ts(record.started_at) + timedelta(milliseconds=max(record.latency_ms or 0, 0))


def _new_session(record: TurnRecord, *, external_id: str = "") -> Session:
    return Session(
        tenant_id=record.tenant_id,
        key_id=record.key_id,
        user_id=record.user_id,
        external_id=external_id or f"inf-{uuid.uuid4().hex}",
        inferred=not external_id,
        started_at=_ts(record.started_at),
        last_activity_at=_ended(record),
    )


def _resolve_explicit_sessions(items: list[_Item]) -> None:
    """Sessions the client named: created if new (racing writers agree through the unique constraint), then
    read back. In a group tenant two members may pick the same id; a session belongs to one user, so the
    second member's turns go to a session under an id namespaced by their user id."""
    todo = [it for it in items if it.external_id]
    for attempt in range(2):
        if not todo:
            return
        first: dict[tuple[int, str], _Item] = {}
        for it in todo:
            first.setdefault((it.record.tenant_id, it.external_id), it)
        # Sorted, so that two writers inserting overlapping sets wait on each other in the same order.
        Session.objects.bulk_create(
            [
                _new_session(it.record, external_id=name)
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


def _by_key(entry: tuple[tuple[int, str], _Item]) -> tuple[int, str]:
    return entry[0]


def _infer_sessions(items: list[_Item]) -> None:
    """Sessions for records without an id: the newest prefix of the messages that some turn of the same user
    in the same tenant produced (a turn earlier in this batch first), else a new session."""
    hashes = {h for it in items if it.session_ref is None for h in it.candidates}
    stored: dict[tuple[int, int, str], int] = {}
    if hashes:
        tenants = {it.record.tenant_id for it in items if it.session_ref is None}
        # exclude() repeats the partial index's condition word for word, so that the planner can use it.
        rows = (
            Turn.objects.filter(tenant_id__in=tenants, continuation_hash__in=hashes)
            .exclude(continuation_hash="")
            .order_by("id")
            .values_list("tenant_id", "user_id", "continuation_hash", "session_id")
        )
        for tenant_id, user_id, digest, session_id in rows:
            stored[(tenant_id, user_id, digest)] = session_id  # ascending ids: the newest turn wins
    in_batch: dict[tuple[int, int, str], _Item] = {}
    for it in items:
        owner = (it.record.tenant_id, it.record.user_id)
        if it.session_ref is None:
            for digest in it.candidates:
                earlier = in_batch.get((*owner, digest))
                if earlier is not None:
                    it.session_ref = earlier.session_ref
                    break
                if (*owner, digest) in stored:
                    it.session_ref = stored[(*owner, digest)]
                    break
            else:
                it.session_ref = _new_session(it.record, external_id=it.external_id)
        if it.continuation:
            in_batch[(*owner, it.continuation)] = it


def _lock_sessions(items: list[_Item]) -> dict[int, Turn]:
    """Locks the existing sessions in id order, and returns each existing session's main turn still waiting
    for its next state. New sessions are only built here: _write_turns inserts them with final counts."""
    existing_ids = {it.session_ref for it in items if isinstance(it.session_ref, int)}
    locked = {s.pk: s for s in Session.objects.select_for_update().filter(id__in=existing_ids).order_by("id")}
    for it in items:
        ref = it.session_ref
        if isinstance(ref, int):
            if ref not in locked:
                # Deleted since it was looked up: start afresh rather than fail the batch.
                locked[ref] = _new_session(it.record)
            it.session = locked[ref]
        else:
            it.session = ref
    pending: dict[int, Turn] = {}
    if existing_ids:
        for turn in (
            turns_awaiting_next(session_ids=existing_ids).only("id", "session_id", "index").order_by("index")
        ):
            pending[turn.session_id] = turn
    return pending


def _write_turns(items: list[_Item], pending: dict[int, Turn], now: datetime) -> list[int]:
    """Creates the turns, links next states, closes finished sessions. Returns the ids of turns that got their
    next state or were closed without one."""
    turns: list[Turn] = []
    ready: list[Turn] = []
    # Both by id(session): new sessions have no pk until they are inserted below.
    sessions: dict[int, Session] = {}
    waiting: dict[int, Turn] = {}
    for it in items:
        if it.session.pk is not None and it.session.pk in pending:
            waiting[id(it.session)] = pending.pop(it.session.pk)
    for it in items:
        record, session = it.record, it.session
        sessions[id(session)] = session
        turn = _turn(it, index=session.turn_count)
        turns.append(turn)
        session.turn_count += 1
        session.last_activity_at = max(session.last_activity_at, _ended(record))
        if session.closed_at is not None:
            # A client may come back to a closed session (same id, or a continuation of its messages). The
            # session opens again; its closed turn stays closed, having been handed to judging already.
            session.closed_at, session.close_reason = None, ""
        if it.turn_type == MAIN:
            previous = waiting.pop(id(session), None)
            if previous is not None:
                following = next_state_messages(it.messages) if it.messages else []
                if following:
                    previous.next_state, previous.next_state_at = following, now
                else:
                    previous.closed_without_next = True
                ready.append(previous)
            if record.status != Turn.Status.FAILED:
                waiting[id(session)] = turn
        if record.session_done:
            previous = waiting.pop(id(session), None)
            if previous is not None:
                previous.closed_without_next = True
                ready.append(previous)
            session.closed_at, session.close_reason = now, Session.CloseReason.DONE
    # New sessions go in with their final counts, so that only the existing ones need an UPDATE.
    existing = [s for s in sessions.values() if s.pk is not None]
    Session.objects.bulk_create([s for s in sessions.values() if s.pk is None])
    created = {id(t) for t in turns}
    Turn.objects.bulk_create(turns)
    stored_before = [t for t in ready if id(t) not in created]
    _update_rows(Turn, stored_before, ["next_state", "next_state_at", "closed_without_next"])
    _update_rows(Session, existing, ["turn_count", "last_activity_at", "closed_at", "close_reason"])
    return [t.pk for t in ready]


def _update_rows(model, objs: list, fields: list[str]) -> None:
    """What ``bulk_update(objs, fields)`` does, as one ``UPDATE … FROM (VALUES …)`` statement.

    bulk_update builds a CASE WHEN expression per object and field; in the gateway's writer thread that cost
    more CPU than the rest of capture together (py-spy under bench_gateway). Rows are updated in id order, the
    order their sessions were locked in.
    """
    if not objs:
        return
    if connection.vendor != "postgresql":
        # The casts below are PostgreSQL's; the embedded SQLite default takes Django's portable path.
        model.objects.bulk_update(sorted(objs, key=lambda o: o.pk), fields)
        return
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    quote = connection.ops.quote_name
    row = "(" + ", ".join(f"%s::{column.db_type(connection)}" for column in columns) + ")"
    params: list = []
    for obj in sorted(objs, key=lambda o: o.pk):
        params.extend(column.get_db_prep_save(getattr(obj, column.attname), connection) for column in columns)
    names = ", ".join(quote(column.column) for column in columns)
    assignments = ", ".join(f"{quote(c.column)} = v.{quote(c.column)}" for c in columns[1:])
    pk = quote(meta.pk.column)
    sql = (f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "
           f"FROM (VALUES {', '.join([row] * len(objs))}) AS v ({names}) WHERE t.{pk} = v.{pk}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _turn(it: _Item, *, index: int) -> Turn:
    r = it.record
    return Turn(
        session=it.session,
        tenant_id=r.tenant_id,
        key_id=r.key_id,
        user_id=r.user_id,
        index=index,
        turn_type=it.turn_type,
        request_id=r.request_id,
        route=r.route,
        model=r.model,
        upstream_model=r.upstream_model or "",
        adapter_version_id=r.adapter_version_id,
        request=r.request or {},
        response=r.choices or [],
        token_ids=r.token_ids,
        logprobs=r.logprobs,
        prompt_tokens=max(int(r.prompt_tokens or 0), 0),
        completion_tokens=max(int(r.completion_tokens or 0), 0),
        usage_estimated=r.usage_estimated,
        status=r.status,
        http_status=r.http_status,
        latency_ms=r.latency_ms,
        ttft_ms=r.ttft_ms,
        error=r.error or "",
        created_at=_ts(r.started_at),
        continuation_hash=it.continuation,
    )
