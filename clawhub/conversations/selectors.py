"""Reads for sessions and turns. A user sees their own; admins review samples through clawhub.review."""

from collections.abc import Iterable
from datetime import date, datetime, time, timedelta

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.utils import timezone

from clawhub.conversations.models import CUT_ENDINGS, ConversationSettings, Session, Turn
from clawhub.conversations.storage import Rebuilder, Stored
from clawhub.core.exceptions import NotFound
from workers.messages import content_text


def _day_start(day: date, *, days_after: int = 0) -> datetime | None:
    """When ``day`` (plus ``days_after``) starts in the site's time zone; None past the calendar's ends."""
    try:
        return timezone.make_aware(datetime.combine(day + timedelta(days=days_after), time.min))
    except (OverflowError, ValueError):
        return None


def sessions_for_user(*, user, turn_type: str | None = None, text: str = "", key_id: int | None = None,
                      since: date | None = None, until: date | None = None) -> QuerySet[Session]:
    """The user's sessions, newest activity first, with their main, side and playground turn counts.
    ``turn_type`` keeps the sessions that have at least one turn of that type; ``text`` those with a turn
    whose messages or reply contain it (any case: a scan of the user's own turns, fine for a page; NULs,
    which PostgreSQL text cannot hold, are dropped from it); ``key_id`` those its key sent; ``since`` /
    ``until`` (days, both included, in the site's time zone) those active on one of those days."""
    sessions = (
        Session.objects.filter(user=user)
        .select_related("key", "tenant__group")
        .annotate(
            main_turns=Count("turns", filter=Q(turns__turn_type=Turn.Type.MAIN)),
            side_turns=Count("turns", filter=Q(turns__turn_type=Turn.Type.SIDE)),
            playground_turns=Count("turns", filter=Q(turns__turn_type=Turn.Type.PLAYGROUND)),
        )
        .order_by("-last_activity_at", "-id")
    )
    counted: dict[str, str] = {Turn.Type.MAIN: "main_turns", Turn.Type.SIDE: "side_turns",
               Turn.Type.PLAYGROUND: "playground_turns"}
    if turn_type in counted:
        sessions = sessions.filter(**{f"{counted[turn_type]}__gt": 0})
    if key_id is not None:
        sessions = sessions.filter(key_id=key_id)
    start = _day_start(since) if since is not None else None
    end = _day_start(until, days_after=1) if until is not None else None
    if start is not None:
        sessions = sessions.filter(last_activity_at__gte=start)
    if end is not None:
        sessions = sessions.filter(started_at__lt=end)
    text = text.replace("\x00", "")
    if text:
        # The messages are stored as JSON text (messages_added; older rows in request), the reply as JSON.
        found = Turn.objects.annotate(request_text=Cast("request", TextField()),
                                      response_text=Cast("response", TextField())).filter(
            Q(messages_added__icontains=text) | Q(request_text__icontains=text)
            | Q(response_text__icontains=text),
            session=OuterRef("pk"), user=user)
        sessions = sessions.filter(Exists(found))
    return sessions


def recent_length_cuts(*, tenant_id: int, last: int = 50) -> tuple[int, int, int | None]:
    """Of the tenant's ``last`` newest main turns: how many there are, how many stopped at max_tokens, and
    the output limit those asked for most often (None when they named none). A turn cut there is not judged
    unless the tenant includes them, so a client whose max_tokens is too small teaches nothing."""
    rows = list(Turn.objects.filter(tenant_id=tenant_id, turn_type=Turn.Type.MAIN).order_by("-created_at")
                .values_list("ended", "request__max_tokens", "request__max_completion_tokens")[:last])
    asked = [tokens or completion for ended, tokens, completion in rows if ended == Turn.Ended.LENGTH]
    limits = [n for n in asked if isinstance(n, int)]
    common = max(set(limits), key=limits.count) if limits else None
    return len(rows), len(asked), common


def first_user_messages(*, sessions: Iterable[Session]) -> dict[int, str]:
    """The text of each session's first user message (its first turn's), for the conversation list."""
    first = list(Turn.objects.filter(session__in=list(sessions), index=0))
    messages = turns_messages(turns=first)
    shown = {}
    for turn in first:
        users = (m for m in messages.get(turn.pk) or [] if isinstance(m, dict) and m.get("role") == "user")
        said = next(users, None)
        if said is not None:
            shown[turn.session_id] = content_text(said.get("content"))
    return shown


def session_get_for_user(*, user, session_id: int) -> Session:
    """One of the user's sessions. Anyone else's is "not found", so that ids do not reveal what exists."""
    session = Session.objects.select_related("key", "tenant__group").filter(pk=session_id, user=user).first()
    if session is None:
        raise NotFound("No such session.")
    return session


def turns_for_session(*, session: Session, turn_type: str | None = None) -> QuerySet[Turn]:
    """The session's turns in order. The sampled token ids and log-probs are left out: they are for training,
    large, and no page shows them."""
    turns = Turn.objects.filter(session=session, tenant_id=session.tenant_id).defer(
        "token_ids", "logprobs", "prompt_token_ids_added"
    )
    if turn_type:
        turns = turns.filter(turn_type=turn_type)
    return turns.order_by("index")


def turns_awaiting_next(*, session_ids: Iterable[int]) -> QuerySet[Turn]:
    """Main turns of these sessions that still wait for a next state. Failed turns never do: they had no
    reply for anything to answer."""
    return Turn.objects.filter(
        session_id__in=list(session_ids),
        turn_type=Turn.Type.MAIN,
        next_state__isnull=True,
        closed_without_next=False,
    ).exclude(status=Turn.Status.FAILED)


def turns_awaiting_next_near(
    *, session_ids: Iterable[int], since, every_in: Iterable[int] = ()
) -> QuerySet[Turn]:
    """``turns_awaiting_next`` of ``session_ids`` that started at ``since`` or later, and each session's
    newest one before: enough to find, for any turn that started after ``since``, the newest waiting turn
    before it, however many a session holds (bounded index scans on PostgreSQL). Also every waiting turn of
    the sessions ``every_in``. One query."""
    ids, every = sorted(set(session_ids)), sorted(set(every_in))
    waiting = turns_awaiting_next(session_ids=[*ids, *every])
    if connection.vendor != "postgresql" or not ids:
        return waiting
    table = connection.ops.quote_name(Turn._meta.db_table)
    # The arm's conditions repeat turn_awaiting_next_at's, so that index serves it.
    newest_before = RawSQL(
        "SELECT l.id FROM unnest(%s::bigint[]) AS s(id) CROSS JOIN LATERAL "
        f"(SELECT t.id FROM {table} AS t WHERE t.session_id = s.id AND t.turn_type = %s "
        "AND t.next_state IS NULL AND NOT t.closed_without_next AND t.status <> %s AND t.created_at < %s "
        "ORDER BY t.created_at DESC, t.request_id DESC LIMIT 1) AS l",
        [ids, Turn.Type.MAIN, Turn.Status.FAILED, since],
    )
    return waiting.filter(
        Q(session_id__in=every) | Q(created_at__gte=since) | Q(id__in=newest_before)
    )


# --- prompts, stored as what each turn adds to its base (conversations.storage) ----------------------------

_STORED_FIELDS = (
    "id",
    "prompt_base_id",
    "messages_shared",
    "messages_added",
    "request__messages",
    "prompt_token_ids_shared",
    "prompt_token_ids_added",
    "prompt_token_count",
    "token_ids",
)


def _stored_rows(where: Q) -> dict[int, Stored]:
    rows = {}
    for row in Turn.objects.filter(where).values_list(*_STORED_FIELDS):
        pk, base, shared, added, legacy, ids_shared, ids_added, id_count, response = row
        rows[pk] = Stored(
            base_id=base,
            messages_shared=shared,
            messages_added=added,
            legacy_messages=legacy if isinstance(legacy, list) else None,
            ids_shared=ids_shared,
            ids_added=bytes(ids_added) if ids_added is not None else None,
            id_count=id_count,
            response_ids=response if isinstance(response, list) else None,
        )
    return rows


def stored_prompts(
    *, session_ids: Iterable[int]
) -> dict[int, tuple[list | None, list[int] | None, list | None]]:
    """Every turn of these sessions as (messages, prompt token ids, reply token ids), in one query: a turn's
    base is always in its own session. None where it cannot be rebuilt (or was never served with ids)."""
    ids = list(session_ids)
    if not ids:
        return {}
    rows = _stored_rows(Q(session_id__in=ids))
    rebuild = Rebuilder(rows)
    return {pk: (rebuild.messages(pk), rebuild.prompt_ids(pk), row.response_ids) for pk, row in rows.items()}


def stored_prompt_chains(
    *, turn_ids: Iterable[int]
) -> dict[int, tuple[list | None, list[int] | None, list | None]]:
    """``stored_prompts`` for these turns only, reading each one's chain of bases (one recursive query) rather
    than its session's every turn."""
    ids = sorted(set(turn_ids))
    if not ids:
        return {}
    table = connection.ops.quote_name(Turn._meta.db_table)
    marks = ", ".join(["%s"] * len(ids))
    chain = RawSQL(
        f"WITH RECURSIVE chain(id, base) AS (SELECT id, prompt_base_id FROM {table} "
        f"WHERE id IN ({marks}) UNION SELECT t.id, t.prompt_base_id FROM {table} AS t "
        "JOIN chain AS c ON t.id = c.base) SELECT id FROM chain",
        ids,
    )
    rebuild = Rebuilder(_stored_rows(Q(id__in=chain)))
    return {
        pk: (rebuild.messages(pk), rebuild.prompt_ids(pk), rebuild.rows[pk].response_ids)
        for pk in ids
        if pk in rebuild.rows
    }


def _rebuilder_for(turns: Iterable[Turn]) -> Rebuilder:
    return Rebuilder(_stored_rows(Q(session_id__in={t.session_id for t in turns})))


def turns_messages(*, turns: Iterable[Turn]) -> dict[int, list | None]:
    """The prompt messages of each turn, exactly as the gateway forwarded them (None for a /v1/completions
    turn, or when a base it is stored against was deleted)."""
    turns = list(turns)
    if not turns:
        return {}
    rebuild = _rebuilder_for(turns)
    return {t.pk: rebuild.messages(t.pk) for t in turns}


def turn_messages(*, turn: Turn) -> list | None:
    return turns_messages(turns=[turn]).get(turn.pk)


def turn_request(*, turn: Turn, messages: list | None = None) -> dict:
    """The request as it was sent upstream (messages included), for judging, review, export and evaluation.
    ``messages`` may be passed when already rebuilt (a page of turns rebuilds them in one query)."""
    request = dict(turn.request or {})
    if turn.route == "chat" and "messages" not in request:
        rebuilt = messages if messages is not None else turn_messages(turn=turn)
        if rebuilt is not None:
            request["messages"] = rebuilt
    return request


def turn_prompt_token_ids(*, turn: Turn) -> list[int] | None:
    """The prompt token ids vLLM served this turn with, or None (served without them: the trainer then
    renders the prompt with the chat template)."""
    if turn.prompt_token_count is None:
        return None
    return _rebuilder_for([turn]).prompt_ids(turn.pk)


def turns_prompt_token_ids(*, turns: Iterable[Turn]) -> dict[int, list[int] | None]:
    turns = list(turns)
    served = [t for t in turns if t.prompt_token_count is not None]
    out: dict[int, list[int] | None] = {t.pk: None for t in turns}
    if served:
        rebuild = _rebuilder_for(served)
        out.update({t.pk: rebuild.prompt_ids(t.pk) for t in served})
    return out


def turns_judgeable(*, turn_ids: Iterable[int]) -> list[int]:
    """Of these turns, the ones judging should see, in one query: cut turns are left out, except replies that
    stopped at max_tokens for a tenant that includes them (ConversationSettings.include_length_turns)."""
    ids = sorted(set(turn_ids))
    if not ids:
        return []
    length_included = Q(ended=Turn.Ended.LENGTH, tenant__conversation_settings__include_length_turns=True)
    return list(
        Turn.objects.filter(pk__in=ids)
        .exclude(Q(ended__in=CUT_ENDINGS) & ~length_included)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def turns_judgeable_loaded(turns: Iterable[Turn]) -> list[int]:
    """``turns_judgeable`` for turns in memory whose ``ended`` and ``tenant_id`` are loaded (capture's): no
    query unless one of them stopped at max_tokens, then one raw read of those tenants' settings (capture
    asks once per batch, and a queryset's building cost more CPU than its query)."""
    by_pk = {t.pk: t for t in turns}
    length_tenants = {t.tenant_id for t in by_pk.values() if t.ended == Turn.Ended.LENGTH}
    included: set[int] = set()
    if length_tenants:
        meta = ConversationSettings._meta
        quote = connection.ops.quote_name
        tenants = sorted(length_tenants)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {quote(meta.get_field('tenant').column)} FROM {quote(meta.db_table)} "
                f"WHERE {quote(meta.get_field('include_length_turns').column)} "
                f"AND {quote(meta.get_field('tenant').column)} IN ({', '.join(['%s'] * len(tenants))})",
                tenants,
            )
            included = {row[0] for row in cursor.fetchall()}
    return sorted(
        pk
        for pk, t in by_pk.items()
        if t.ended not in CUT_ENDINGS or (t.ended == Turn.Ended.LENGTH and t.tenant_id in included)
    )


def conversation_settings_for(*, tenant_id: int) -> ConversationSettings:
    """The tenant's settings, or unsaved defaults."""
    found = ConversationSettings.objects.filter(tenant_id=tenant_id).first()
    return found or ConversationSettings(tenant_id=tenant_id)


SERVED_IDS = "served ids"
RERENDERED = "re-rendered"


def turn_training_source(*, turn: Turn) -> tuple[str, str]:
    """Which sequence a training sample of this turn is built from, and why: the token ids vLLM served
    (prompt ids + sampled ids) when it returned both, else the prompt re-rendered with the chat template."""
    if turn.route != "chat":
        return RERENDERED, "completions route"
    if turn.prompt_token_count is None:
        return RERENDERED, "served without prompt token ids"
    if not turn.token_ids:
        return RERENDERED, "served without reply token ids"
    return SERVED_IDS, ""
