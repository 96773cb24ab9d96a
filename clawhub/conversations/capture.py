"""Persists the gateway's TurnRecords: sessions, turns, next-state links and usage, a batch at a time.

The capture consumer (clawhub.gateway.consumer) calls ``capture_store(batch)``. A batch is one transaction of
a fixed number of queries, whatever its size. If the batch fails, each record is retried alone, so one bad
record costs only itself: the others are committed and ``CaptureFailed`` names the ones that failed, so that
the consumer retries them and, in the end, dead-letters them (never a silent skip). Records already stored
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
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, JSONField, Q
from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.utils import timezone

from clawhub.conversations.identity import (
    MAIN,
    message_hashes,
    next_state_messages,
    reply_message,
    turn_type_for,
)
from clawhub.conversations.links import FAILED, order_key, relink
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.privacy import capture_allowed_many
from clawhub.conversations.sampling import turn_sampling
from clawhub.conversations.selectors import stored_prompt_chains, turns_awaiting_next_near
from clawhub.conversations.services import turns_ready_notify
from clawhub.conversations.storage import pack_ids, split_ids, split_messages
from clawhub.gateway.records import TurnRecord

logger = logging.getLogger("clawhub.conversations.capture")

# Counters the metrics endpoint can export, next to the gateway writer's.
STATS = {"stored": 0, "duplicates": 0, "failed": 0, "batch_retries": 0}
_stats_lock = threading.Lock()

_EXTERNAL_ID_MAX = Session._meta.get_field("external_id").max_length

# Usage metering lives in an app above conversations (clawhub.usage), which registers its writer here from its
# AppConfig.ready(). It runs in the store's transaction with every new record of a batch (side turns, failed
# requests and users who turned storage off included), and for a dead-lettered record alone.
_usage_recorder: Callable[..., None] | None = None


def register_usage_recorder(recorder: Callable[..., None]) -> None:
    """``recorder(records=...)`` meters the served requests of an iterable of TurnRecords."""
    global _usage_recorder
    _usage_recorder = recorder


def _meter_usage(records: Iterable[TurnRecord]) -> None:
    if _usage_recorder is None:
        raise RuntimeError("no usage recorder registered: is clawhub.usage in INSTALLED_APPS?")
    _usage_recorder(records=records)


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
    candidates: list[tuple[str, int]]  # (prefix hash, messages in it), newest first
    continuation: str
    # Also continued by a request that resends this one without its trailing retry messages (identity).
    continuation_without_retry: str = ""
    prompt_hash: str = ""
    retry_hashes: tuple[str, ...] = ()
    session_ref: int | Session | None = None  # an existing session's id, or a new Session
    session: Session | None = None
    turn: Turn | None = None
    packed_ids: bytes | None = None  # record.prompt_token_ids packed (storage.pack_ids), once

    @property
    def continuations(self) -> tuple[str, ...]:
        """The hashes a request continuing this one may carry for its prefix ending with the reply."""
        if self.continuation_without_retry:
            return (self.continuation, self.continuation_without_retry)
        return (self.continuation,) if self.continuation else ()


class CaptureFailed(Exception):
    """Records of a batch that could not be stored while the database answered (a deadlock, a statement
    timeout, a schema mismatch, a bug on an odd body). The rest of the batch is committed; nothing of these
    was written."""

    def __init__(self, failures: list[tuple[TurnRecord, Exception]]):
        self.failures = failures
        super().__init__("; ".join(f"turn {record.request_id}: {type(exc).__name__}: {exc}"
                                   for record, exc in failures[:5]))


def capture_store(records: list[TurnRecord]) -> None:
    """Stores a batch of records. Never leaves a record half-written. Raises ``CaptureFailed`` (after
    committing the others) for records that cannot be stored while the database answers, and the database's
    own error when it cannot be reached at all: either way the caller still holds the records and decides."""
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
    failures: list[tuple[TurnRecord, Exception]] = []
    for record in records:
        try:
            with transaction.atomic():
                stored = _store([record])
            _count("stored", stored)
        except Exception as exc:
            if not _database_usable():
                raise  # the rest waits for the database; what was committed is skipped as known next time
            _count("failed")
            logger.exception("capture of turn %s failed", record.request_id)
            failures.append((record, exc))
    if failures:
        raise CaptureFailed(failures)


def capture_usage_only(*, record: TurnRecord) -> None:
    """Meters a record that will never become a turn (the consumer dead-lettered it): it was still served."""
    try:
        with transaction.atomic():
            _meter_usage([record])
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
        _lock_owners({(r.tenant_id, r.user_id) for r in kept})
        items = [_item(r) for r in sorted(kept, key=lambda r: (r.started_at, r.request_id))]
        _resolve_explicit_sessions(items)
        graph = _Graph.load(items)
        _infer_sessions(items, graph)
        graph.lock_sessions(items)
        ready = _write_turns(items, graph, now)
        turns_ready_notify(turn_ids=ready)
    _meter_usage(records)
    return len(kept)


def _lock_owners(owners: set[tuple[int, int]]) -> None:
    """Serialises writers per (tenant, user) until commit, with transaction-scoped advisory locks taken in
    one statement in a fixed order (so two writers never deadlock on them).

    Linking reads what other writers committed: a turn whose parent another gateway process is writing
    right now must either see that parent, or be seen by it (the parent then adopts it). Without the lock,
    both transactions could look before either commits and the link would be lost. Other users' batches
    never wait on each other. SQLite (the embedded default) has one writer at a time anyway."""
    if connection.vendor != "postgresql" or not owners:
        return
    keys = sorted({(tenant_id << 32) ^ user_id for tenant_id, user_id in owners})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(k) FROM (SELECT unnest(%s::bigint[]) AS k ORDER BY 1) AS owners",
            [keys],
        )


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
    if not messages:
        return _Item(record=record, messages=messages, turn_type=turn_type, external_id=external_id,
                     candidates=[], continuation="")
    hashes = message_hashes(messages, reply_message(record.choices))
    return _Item(
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


# Turn fields capture reads and writes on stored turns it links: loaded with .only(), so that writing them
# back never touches a deferred field (which would cost a query per turn).
_LINK_FIELDS = (
    "id",
    "session_id",
    "tenant_id",
    "user_id",
    "turn_type",
    "status",
    "created_at",
    "request_id",
    "continuation_hash",
    "continuation_hash_without_retry",
    "prompt_hash",
    "parent_hash",
    "parent_id",
    "link",
    "regenerate_of_id",
    "follows",
    "next_state",
    "next_state_at",
    "closed_without_next",
    "prompt_base_id",
    "messages_shared",
    "prompt_token_ids_shared",
    "prompt_token_count",
)
# What the post-insert UPDATE writes: links, next states, and bases that were new turns at insert time.
_UPDATED = [
    "parent",
    "link",
    "regenerate_of",
    "next_state",
    "next_state_at",
    "closed_without_next",
    "prompt_base",
]


def _owner(turn_or_record) -> tuple[int, int]:
    return (turn_or_record.tenant_id, turn_or_record.user_id)


class _Graph:
    """The stored turns a batch links to, loaded up front in a fixed number of queries, one object per row
    (so that a turn reached twice is changed once), plus the batch's own new turns as they are built."""

    def __init__(self):
        self.by_pk: dict[int, Turn] = {}
        self.by_continuation: dict[tuple[int, int, str], list[Turn]] = defaultdict(list)
        self.by_prompt: dict[tuple[int, int, str], list[Turn]] = defaultdict(list)
        self.by_parent_hash: dict[tuple[int, int, str], list[Turn]] = defaultdict(list)
        self.children: dict[int, list[Turn]] = defaultdict(list)  # by id(parent)
        self.pending: dict[int, list[Turn]] = defaultdict(list)  # waiting main turns by session pk
        self.inferred_sessions: dict[int, bool] = {}
        self.dirty: dict[int, Turn] = {}  # stored turns whose links changed, by id()
        self.merges: list[tuple[int, Session]] = []  # (inferred session to empty, the session it joins)
        self.locked: dict[int, Session] = {}
        self.closed_sessions: set[int] = set()

    def _add(self, turn: Turn) -> Turn:
        known = self.by_pk.get(turn.pk)
        if known is not None:
            return known
        self.by_pk[turn.pk] = turn
        owner = _owner(turn)
        for digest in (turn.continuation_hash, turn.continuation_hash_without_retry):
            if digest:
                self.by_continuation[(*owner, digest)].append(turn)
        if turn.prompt_hash:
            self.by_prompt[(*owner, turn.prompt_hash)].append(turn)
        if turn.parent_hash:
            self.by_parent_hash[(*owner, turn.parent_hash)].append(turn)
        return turn

    @classmethod
    def load(cls, items: list[_Item]) -> "_Graph":
        graph = cls()
        mains = [it for it in items if it.turn_type == MAIN]
        # Stored turns a new turn may continue (their prompt + reply is a prefix of its messages).
        continued = {(*_owner(it.record), h) for it in items for h, _ in it.candidates}
        lookups = {
            "continuation_hash": continued,
            "continuation_hash_without_retry": continued,
            # First turns a new one may regenerate (or be regenerated by).
            "prompt_hash": {
                (*_owner(it.record), h) for it in mains for h in (it.prompt_hash, *it.retry_hashes) if h
            },
            # Stored turns that continue a new one (written before it by a faster writer).
            "parent_hash": {(*_owner(it.record), h) for it in mains for h in it.continuations},
        }
        ids = _link_rows(lookups)
        if ids is None:
            return graph
        rows = (
            Turn.objects.filter(id__in=ids)
            .select_related("session")
            .only(*_LINK_FIELDS, "session__inferred", "session__closed_at")
        )
        for turn in rows.order_by("id"):
            graph._add(turn)
            graph.inferred_sessions[turn.session_id] = turn.session.inferred
            if turn.session.closed_at is not None:
                graph.closed_sessions.add(turn.session_id)
        # The families these turns belong to: the children of every stored main turn a new turn may
        # continue, and the parents (and their children) of stored turns a new turn may adopt.
        family = {t.pk for t in graph.by_pk.values() if t.turn_type == MAIN and t.continuation_hash}
        family |= {t.parent_id for t in graph.by_pk.values() if t.parent_id}
        if family:
            for turn in Turn.objects.filter(Q(parent_id__in=family) | Q(id__in=family)).only(*_LINK_FIELDS):
                graph._add(turn)
        for turn in graph.by_pk.values():
            if turn.parent_id and turn.parent_id in graph.by_pk:
                parent = graph.by_pk[turn.parent_id]
                turn.parent_ref = parent
                graph.children[id(parent)].append(turn)
            if turn.regenerate_of_id and turn.regenerate_of_id in graph.by_pk:
                turn.regenerate = graph.by_pk[turn.regenerate_of_id]
        return graph

    def lock_sessions(self, items: list[_Item]) -> None:
        """Locks the existing sessions in id order (the batch's, and inferred ones a new turn may absorb),
        and loads each one's main turns still waiting for a next state."""
        existing_ids = {it.session_ref for it in items if isinstance(it.session_ref, int)}
        absorbable = {t.session_id for t in self.by_pk.values() if self.inferred_sessions.get(t.session_id)}
        ids = existing_ids | absorbable
        self.locked = {s.pk: s for s in Session.objects.select_for_update().filter(id__in=ids).order_by("id")}
        for it in items:
            ref = it.session_ref
            if isinstance(ref, int):
                if ref not in self.locked:
                    # Deleted since it was looked up: start afresh rather than fail the batch.
                    self.locked[ref] = _new_session(it.record)
                it.session = self.locked[ref]
            else:
                it.session = ref
        # Waiting turns matter to a session the client closes (all of them) and to a turn without history
        # in a session the client names (the newest before it): only those sessions' are read.
        closing = {
            it.session_ref for it in items if it.record.session_done and isinstance(it.session_ref, int)
        }
        answering = {
            it.session_ref
            for it in items
            if it.external_id
            and isinstance(it.session_ref, int)
            and not it.candidates
            and not any(m.get("role") == "assistant" for m in it.messages or () if isinstance(m, dict))
        } - closing
        if not (closing or answering):
            return
        since = _ts(min(it.record.started_at for it in items))
        waiting = turns_awaiting_next_near(session_ids=answering, since=since, every_in=closing)
        for turn in sorted(waiting.only(*_LINK_FIELDS), key=order_key):
            turn = self._add(turn)
            self.pending[turn.session_id].append(turn)

    def mark(self, turn: Turn) -> None:
        if turn.pk is not None:
            self.dirty[id(turn)] = turn


# How many stored turns per hash linking reads, newest first. Capture only ever needs the newest turn with a
# given prompt + reply (the parent), the first turns a prompt started in the sessions still open, and turns
# written moments before by a faster writer; reading all of them made a batch's cost grow with the history of
# a user who repeats a prompt (thousands of turns sharing one hash).
LINK_ROWS = 8

_LOOKUP_CONDITIONS = {
    # Must imply the partial index's condition (conversations.models.Turn.Meta.indexes) for it to be used.
    "continuation_hash": "",
    "continuation_hash_without_retry": "",
    "prompt_hash": " AND t.parent_id IS NULL AND t.link = ''",
    "parent_hash": "",
}


def _link_rows(lookups: dict[str, set[tuple[int, int, str]]]):
    """The ids of the newest LINK_ROWS turns of each (tenant, user, hash) for each hash column, as a subquery
    (each arm a bounded index scan of (tenant, hash, id)); None when there is nothing to look up."""
    lookups = {column: keys for column, keys in lookups.items() if keys}
    if not lookups:
        return None
    if connection.vendor != "postgresql":
        # The embedded SQLite default has no LATERAL: every match, as before (its histories are small).
        where = Q(pk__in=[])
        for column, keys in lookups.items():
            for tenant_id, user_id, digest in keys:
                extra = Q(parent__isnull=True, link="") if column == "prompt_hash" else Q()
                where |= Q(tenant_id=tenant_id, user_id=user_id, **{column: digest}) & extra
        return Turn.objects.filter(where).values("id")
    table = connection.ops.quote_name(Turn._meta.db_table)
    arms, params = [], []
    for column, keys in lookups.items():
        tenants, users, digests = zip(*sorted(keys), strict=True)
        arms.append(
            "SELECT l.id FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS k(tenant_id, user_id, h) "
            f"CROSS JOIN LATERAL (SELECT t.id FROM {table} AS t WHERE t.tenant_id = k.tenant_id "
            f"AND t.{column} = k.h AND t.{column} <> ''{_LOOKUP_CONDITIONS[column]} "
            f"AND t.user_id = k.user_id ORDER BY t.id DESC LIMIT {LINK_ROWS}) AS l"
        )
        params += [list(tenants), list(users), list(digests)]
    return RawSQL(" UNION ".join(arms), params)


def _session_key(turn_or_session) -> tuple:
    if isinstance(turn_or_session, Session):
        return ("db", turn_or_session.pk) if turn_or_session.pk is not None else ("new", id(turn_or_session))
    session = getattr(turn_or_session, "session_obj", None)
    if session is not None:
        return _session_key(session)
    return ("db", turn_or_session.session_id)


def _infer_sessions(items: list[_Item], graph: _Graph) -> None:
    """Sessions for records without an id: the session of the newest prefix of the messages that some turn of
    the same user in the same tenant produced (a turn earlier in this batch first), else of the turn the
    request repeats (a regenerate), else a new session."""
    in_batch: dict[tuple[int, int, str], _Item] = {}
    prompts: dict[tuple[int, int, str], _Item] = {}
    for it in items:
        owner = _owner(it.record)
        if it.session_ref is None:
            for digest, _ in it.candidates:
                earlier = in_batch.get((*owner, digest))
                if earlier is not None:
                    it.session_ref = earlier.session_ref
                    break
                stored = graph.by_continuation.get((*owner, digest))
                if stored:
                    it.session_ref = stored[-1].session_id  # ascending ids: the newest turn wins
                    break
            else:
                same = prompts.get((*owner, it.prompt_hash)) if it.turn_type == MAIN else None
                stored = _open_regenerate_targets(graph, it) if it.turn_type == MAIN else []
                if same is not None:
                    it.session_ref = same.session_ref
                elif stored:
                    it.session_ref = stored[0].session_id
                else:
                    it.session_ref = _new_session(it.record, external_id=it.external_id)
        for digest in it.continuations:
            in_batch[(*owner, digest)] = it
        if it.prompt_hash:
            prompts.setdefault((*owner, it.prompt_hash), it)


def _open_regenerate_targets(graph: _Graph, it: _Item) -> list[Turn]:
    owner = _owner(it.record)
    found = [
        t
        for h in (it.prompt_hash, *it.retry_hashes)
        for t in graph.by_prompt.get((*owner, h), ())
        if t.turn_type == MAIN
        and t.parent_id is None
        and t.session_id not in graph.closed_sessions
    ]
    return sorted(found, key=order_key)


def _write_turns(items: list[_Item], graph: _Graph, now: datetime) -> list[int]:
    """Creates the turns, links them to the turns they continue (and those to them), closes finished
    sessions. Returns the ids of turns that got their next state or were closed without one."""
    turns: list[Turn] = []
    ready: dict[int, Turn] = {}
    sessions: dict[int, Session] = {}
    new_in_session: dict[tuple, list[Turn]] = defaultdict(list)
    by_continuation: dict[tuple[int, int, str], Turn] = {}
    for it in items:
        record, session = it.record, it.session
        sessions[id(session)] = session
        turn = it.turn = _turn(it, index=session.turn_count)
        turn.session_obj = session
        turns.append(turn)
        session.turn_count += 1
        session.last_activity_at = max(session.last_activity_at, _ended(record))
        if session.closed_at is not None:
            # A client may come back to a closed session (same id, or a continuation of its messages). The
            # session opens again; its closed turns stay closed, having been handed to judging already.
            session.closed_at, session.close_reason = None, ""
        if it.turn_type == MAIN:
            _link_new_turn(it, graph, by_continuation, new_in_session, ready, now)
            _adopt_waiting_children(it, graph, ready, now)
            new_in_session[_session_key(session)].append(turn)
            for digest in it.continuations:
                by_continuation.setdefault((*_owner(record), digest), turn)
        # Stored against its parent, else the turn it regenerates.
        turn.base_ref = getattr(turn, "parent_ref", None) or getattr(turn, "regenerate", None)
        if record.session_done:
            for waiting in _waiting(session, graph, new_in_session):
                waiting.closed_without_next = True
                graph.mark(waiting)
                ready[id(waiting)] = waiting
            session.closed_at, session.close_reason = now, Session.CloseReason.DONE
    _compact(items, graph)
    # New sessions go in with their final counts, so that only the existing ones need an UPDATE.
    existing = [s for s in sessions.values() if s.pk is not None]
    _insert_rows(Session, [s for s in sessions.values() if s.pk is None])
    for turn in turns:
        turn.session = turn.session_obj  # now with its primary key
        _resolve_refs(turn)
    _insert_rows(Turn, turns)
    # Links to turns that were new at insert time, and every stored turn whose links changed: one UPDATE.
    after = [t for t in turns if t.refs_pending]
    for turn in [*after, *graph.dirty.values()]:
        _resolve_refs(turn)
    _update_rows(Turn, after + list(graph.dirty.values()), _UPDATED)
    merged_into = {}
    for source, target in graph.merges:
        if _merge_session(source, target, graph):
            merged_into[id(target)] = target
    changed = {id(s): s for s in existing}
    changed.update(merged_into)
    _update_rows(
        Session, list(changed.values()), ["turn_count", "last_activity_at", "closed_at", "close_reason"]
    )
    for it in items:
        _remember(it)
    return [t.pk for t in ready.values()]


def _waiting(session: Session, graph: _Graph, new_in_session: dict[tuple, list[Turn]]) -> list[Turn]:
    key = _session_key(session)
    stored = graph.pending.get(session.pk, []) if session.pk is not None else []
    return [
        t
        for t in [*stored, *new_in_session.get(key, [])]
        if t.status != FAILED and t.next_state is None and not t.closed_without_next
    ]


def _link_new_turn(it: _Item, graph: _Graph, by_continuation, new_in_session, ready, now) -> None:
    """Finds the main turn the new turn's request continues (the newest matching prefix, in the same
    session), and recomputes that turn's family; a turn that continues nothing may regenerate a first
    turn, or (a client that does not resend history, in a session it names) answer the session's newest
    waiting turn."""
    turn, owner, key = it.turn, _owner(it.record), _session_key(it.session)
    parent = None
    for digest, _ in it.candidates:
        options = [by_continuation.get((*owner, digest))] + list(
            graph.by_continuation.get((*owner, digest), ())
        )
        options = [t for t in options if t is not None and t.turn_type == MAIN and _session_key(t) == key]
        if options:
            parent = options[0] if options[0].pk is None else max(options, key=order_key)
            break
    if parent is not None:
        _set_parent(turn, parent, graph, ready, now)
        return
    if not it.candidates:
        originals = _open_regenerate_targets(graph, it)
        originals += [
            t
            for t in new_in_session.get(key, ())
            if t.parent_ref is None
            and (t.prompt_hash == it.prompt_hash or t.prompt_hash in it.retry_hashes)
        ]
        originals = [t for t in originals if _session_key(t) == key and order_key(t) < order_key(turn)]
        if originals:
            first = min(originals, key=order_key)
            turn.link, turn.regenerate = Turn.Link.REGENERATE, getattr(first, "regenerate", None) or first
            return
        # A stored first turn asking the same that started later (written by a slower writer): it is the
        # regenerate of this one.
        for later in graph.by_prompt.get((*owner, it.prompt_hash), ()):
            if (
                later.parent_id is None
                and later.turn_type == MAIN
                and _session_key(later) == key
                and order_key(later) > order_key(turn)
                and later.link != Turn.Link.REGENERATE
            ):
                later.link, later.regenerate = Turn.Link.REGENERATE, turn
                graph.mark(later)
        if it.external_id and not any(
            m.get("role") == "assistant" for m in it.messages or () if isinstance(m, dict)
        ):
            waiting = [
                t for t in _waiting(it.session, graph, new_in_session) if order_key(t) < order_key(turn)
            ]
            if waiting:
                previous = max(waiting, key=order_key)
                turn.parent_ref, turn.link = previous, Turn.Link.NEXT
                previous.next_state, previous.next_state_at = turn.follows or None, now
                if not turn.follows:
                    previous.closed_without_next = True
                graph.mark(previous)
                ready[id(previous)] = previous


def _set_parent(turn: Turn, parent: Turn, graph: _Graph, ready, now) -> None:
    old = getattr(turn, "parent_ref", None)
    if old is parent:
        return
    if old is not None:
        graph.children[id(old)] = [t for t in graph.children[id(old)] if t is not turn]
        _relink(old, graph, ready, now)
    turn.parent_ref = parent
    graph.children[id(parent)].append(turn)
    graph.mark(turn)
    _relink(parent, graph, ready, now)


def _relink(parent: Turn, graph: _Graph, ready, now) -> None:
    changed, became_ready = relink(parent, graph.children[id(parent)], now=now)
    for child in changed:
        graph.mark(child)
    if getattr(parent, "links_changed", False):
        graph.mark(parent)
    if became_ready:
        ready[id(parent)] = parent


def _adopt_waiting_children(it: _Item, graph: _Graph, ready, now) -> None:
    """Stored turns whose request continues this new turn, written before it by a faster writer: they become
    its children. One in an inferred session of its own brings that session along."""
    turn, key = it.turn, _session_key(it.session)
    waiting = [c for h in it.continuations for c in graph.by_parent_hash.get((*_owner(it.record), h), ())]
    for child in waiting:
        if (
            child.turn_type != MAIN
            or order_key(child) <= order_key(turn)
            or getattr(child, "parent_ref", None) is turn
        ):
            continue
        if _session_key(child) != key:
            if not graph.inferred_sessions.get(child.session_id) or child.session_id not in graph.locked:
                continue  # a session the client named keeps its turns
            if all(source != child.session_id for source, _ in graph.merges):
                graph.merges.append((child.session_id, it.session))
        _set_parent(child, turn, graph, ready, now)


def _compact(items: list[_Item], graph: _Graph) -> None:
    """Writes each new turn's messages and prompt ids as what they add to its base's."""
    stored_bases = {
        it.turn.base_ref.pk
        for it in items
        if it.messages is not None
        and getattr(it.turn, "base_ref", None) is not None
        and it.turn.base_ref.pk is not None
    }
    known = _prompts_of(stored_bases, graph)
    by_turn = {id(it.turn): it for it in items}
    for it in items:
        turn, record = it.turn, it.record
        base = getattr(turn, "base_ref", None)
        base_messages = base_ids = None
        if base is not None:
            if base.pk is None:
                source = by_turn[id(base)]
                base_messages = source.messages
                if source.record.prompt_token_ids is not None:
                    base_ids = _packed_context(source)
            else:
                base_messages, base_ids = known.get(base.pk, (None, None))
        if it.messages is not None:
            turn.messages_shared, turn.messages_added = split_messages(it.messages, base_messages)
        else:
            turn.messages_shared, turn.messages_added = 0, ""
        ids = record.prompt_token_ids
        if ids is not None:
            turn.prompt_token_count = len(ids)
            turn.prompt_token_ids_shared, turn.prompt_token_ids_added = split_ids(_packed(it), base_ids)
        if not (turn.messages_shared or turn.prompt_token_ids_shared):
            turn.base_ref = None


# Prompts of turns this process wrote lately, so that the next turn of a conversation finds its base here
# instead of rebuilding it from the database: turn id -> (messages, prompt ids + reply ids).
# (The ids are packed, as split_ids compares them.)
_RECENT: "OrderedDict[int, tuple[list | None, bytes | list[int] | None]]" = OrderedDict()
_RECENT_MAX = 128
_recent_lock = threading.Lock()


def forget_recent_prompts() -> None:
    """Empties the writer's memory of recent prompts (tests, and anything that must read bases afresh)."""
    with _recent_lock:
        _RECENT.clear()


def _packed(it: _Item) -> bytes:
    """The record's prompt ids, packed once (a 32 KB agent prompt has thousands)."""
    if it.packed_ids is None:
        it.packed_ids = pack_ids(it.record.prompt_token_ids or ())
    return it.packed_ids


def _packed_context(it: _Item) -> bytes:
    """Prompt ids then reply ids, packed: what the next turn's prompt ids start with."""
    return _packed(it) + pack_ids(it.record.token_ids or ())


def _remember(it: _Item) -> None:
    if it.turn is None or it.turn.pk is None or it.messages is None or it.turn_type != MAIN:
        return
    context = _packed_context(it) if it.record.prompt_token_ids is not None else None
    with _recent_lock:
        _RECENT[it.turn.pk] = (it.messages, context)
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.popitem(last=False)


def _prompts_of(turn_ids: set[int], graph: _Graph) -> dict[int, tuple[list | None, list[int] | None]]:
    out: dict[int, tuple[list | None, list[int] | None]] = {}
    missing = set()
    with _recent_lock:
        for pk in turn_ids:
            if pk in _RECENT:
                out[pk] = _RECENT[pk]
            else:
                missing.add(pk)
    if missing:
        # Only the bases' own chains of bases, not their sessions' every turn (a session of repeated prompts
        # holds thousands).
        rebuilt = stored_prompt_chains(turn_ids=missing)
        with _recent_lock:
            for pk in missing:
                messages, ids, response = rebuilt.get(pk, (None, None, None))
                out[pk] = (messages, ids + list(response or ()) if ids is not None else None)
                if messages is not None:
                    _RECENT[pk] = out[pk]  # a base read once (a repeated prompt's first turn) is read again
            while len(_RECENT) > _RECENT_MAX:
                _RECENT.popitem(last=False)
    return out


def _resolve_refs(turn: Turn) -> None:
    """Turns the in-memory links (objects that may have been new) into foreign key ids."""
    pending = False
    for attr, field in (
        ("parent_ref", "parent_id"),
        ("regenerate", "regenerate_of_id"),
        ("base_ref", "prompt_base_id"),
    ):
        if not hasattr(turn, attr):  # a stored turn whose link this batch did not touch keeps it
            if turn.pk is None:
                setattr(turn, field, None)
            continue
        target = getattr(turn, attr)
        if target is None:
            setattr(turn, field, None)
            continue
        if target.pk is None:
            pending = True
            setattr(turn, field, None)
        else:
            setattr(turn, field, target.pk)
    turn.refs_pending = pending


def _merge_session(source_id: int, target: Session, graph: _Graph) -> bool:
    """Moves the turns of an inferred session, opened by a turn whose parent had not been written yet, into
    the session of that parent (after its turns), and deletes it."""
    source = graph.locked.get(source_id)
    if source is None or source.pk == target.pk:
        return False
    offset = target.turn_count
    Turn.objects.filter(session_id=source_id).update(session_id=target.pk, index=F("index") + offset)
    target.turn_count += source.turn_count
    target.started_at = min(target.started_at, source.started_at)
    target.last_activity_at = max(target.last_activity_at, source.last_activity_at)
    Session.objects.filter(pk=source_id).delete()
    return True


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
    sql = (
        f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "
        f"FROM (VALUES {', '.join([row] * len(objs))}) AS v ({names}) WHERE t.{pk} = v.{pk}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


_PLAIN = (str, int, float, bool, bytes)  # exact types the driver takes as they are


def _insert_rows(model, objs: list) -> None:
    """What ``bulk_create(objs)`` does, as one ``COPY`` (ids drawn from the table's sequence first), and
    sets each object's primary key.

    bulk_create (and a multi-row INSERT alike) cost more CPU than the rest of storing a turn: a field's
    preparation per value, JSON dumped with the standard library, then the driver splitting a statement of
    thousands of placeholders and quoting each value in Python. COPY rows are formatted by the driver's C
    code; JSON goes through orjson (the records came through orjson, so it takes every value in them).
    """
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs)  # the embedded SQLite default: Django's portable path
        return
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    json_fields = {f.attname for f in fields if isinstance(f, JSONField)}
    columns = ", ".join(quote(f.column) for f in [meta.pk, *fields])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(objs)],
        )
        ids = [row[0] for row in cursor.fetchall()]
        # Django's wrapper turns the driver's errors into django.db ones (a DataError stays a DataError), as
        # for any query; the COPY itself goes through the driver's cursor, which Django does not wrap.
        with connection.wrap_database_errors:
            with cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy:
                for pk, obj in zip(ids, objs, strict=True):
                    values = obj.__dict__
                    row: list = [pk]
                    for f in fields:
                        value = values[f.attname]
                        if f.attname in json_fields:
                            value = None if value is None else orjson.dumps(value).decode()
                        elif isinstance(value, str):
                            value = str.__str__(value)  # a choices member as its plain value
                        elif not (value is None or type(value) in _PLAIN):
                            value = f.get_db_prep_save(value, connection)
                        row.append(value)
                    copy.write_row(row)
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


@lru_cache(maxsize=4)
def _defaults(model) -> tuple[dict, list]:
    """(attname -> default of every field with a constant default, the fields whose default is made anew)."""
    fields = model._meta.concrete_fields
    made = [f for f in fields if f.has_default() and callable(f.default)]
    return {f.attname: f.get_default() for f in fields if f not in made}, made


def _blank(model):
    """An unsaved instance with every field at its default, without Model.__init__ (which costs more than
    all the fields set after it): every field is set, so none is deferred."""
    constant, made = _defaults(model)
    obj = model.__new__(model)
    obj._state = ModelState()
    obj.__dict__.update(constant)
    for field in made:
        obj.__dict__[field.attname] = field.get_default()
    return obj


def _set(obj, **values) -> None:
    for name, value in values.items():
        setattr(obj, name, value)


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


def _turn(it: _Item, *, index: int) -> Turn:
    r = it.record
    request = dict(r.request or {})
    if it.messages is not None:
        request.pop("messages", None)  # stored apart, as what it adds to its base (see _compact)
    turn = _blank(Turn)
    _set(
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
        created_at=_ts(r.started_at),
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
