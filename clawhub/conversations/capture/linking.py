"""Where each new turn goes: its session (named, inferred from its messages, or new), its parent (the turn its
request continues) or the first turn it regenerates, the stored turns it adopts, and the waiting turns it
answers or closes. Then the turns and sessions are written."""

from collections import defaultdict
from datetime import datetime

from django.db.models import F

from clawhub.conversations.capture.compact import compact, remember
from clawhub.conversations.capture.graph import Graph, session_key
from clawhub.conversations.capture.items import Item, ended_at, new_session, new_turn, owner_of
from clawhub.conversations.capture.rows import insert_rows, update_rows
from clawhub.conversations.identity import (
    MAIN,
)
from clawhub.conversations.links import FAILED, order_key, relink
from clawhub.conversations.models import Session, Turn

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


def infer_sessions(items: list[Item], graph: Graph) -> None:
    """Sessions for records without an id: the session of the newest prefix of the messages that some turn of
    the same user in the same tenant produced (a turn earlier in this batch first), else of the turn the
    request repeats (a regenerate), else a new session."""
    in_batch: dict[tuple[int, int, str], Item] = {}
    prompts: dict[tuple[int, int, str], Item] = {}
    for it in items:
        owner = owner_of(it.record)
        if it.session_ref is None:
            for digest, _ in it.candidates:
                earlier = in_batch.get((*owner, digest))
                if earlier is not None:
                    it.session_ref = earlier.session_ref
                    break
                stored = graph.by_continuation.get((*owner, digest))
                if stored:
                    it.session_ref = max(stored, key=_pk).session_id  # the newest turn wins
                    break
            else:
                same = prompts.get((*owner, it.prompt_hash)) if it.turn_type == MAIN else None
                stored = _open_regenerate_targets(graph, it) if it.turn_type == MAIN else []
                if same is not None:
                    it.session_ref = same.session_ref
                elif stored:
                    it.session_ref = stored[0].session_id
                else:
                    it.session_ref = new_session(it.record, external_id=it.external_id)
        for digest in it.continuations:
            in_batch[(*owner, digest)] = it
        if it.prompt_hash:
            prompts.setdefault((*owner, it.prompt_hash), it)


def _pk(turn: Turn) -> int:
    return turn.pk


def _open_regenerate_targets(graph: Graph, it: Item) -> list[Turn]:
    owner = owner_of(it.record)
    found = [
        t
        for h in (it.prompt_hash, *it.retry_hashes)
        for t in graph.by_prompt.get((*owner, h), ())
        if t.turn_type == MAIN
        and t.parent_id is None
        and t.session_id not in graph.closed_sessions
    ]
    return sorted(found, key=order_key)


def write_turns(items: list[Item], graph: Graph, now: datetime) -> list[Turn]:
    """Creates the turns, links them to the turns they continue (and those to them), closes finished
    sessions. Returns the turns that got their next state or were closed without one (saved, with their
    ``ended`` and ``tenant_id``)."""
    turns: list[Turn] = []
    ready: dict[int, Turn] = {}
    sessions: dict[int, Session] = {}
    new_in_session: dict[tuple, list[Turn]] = defaultdict(list)
    by_continuation: dict[tuple[int, int, str], Turn] = {}
    for it in items:
        record, session = it.record, it.session
        sessions[id(session)] = session
        turn = it.turn = new_turn(it, index=session.turn_count)
        turn.session_obj = session
        turns.append(turn)
        session.turn_count += 1
        session.last_activity_at = max(session.last_activity_at, ended_at(record))
        if session.closed_at is not None:
            # A client may come back to a closed session (same id, or a continuation of its messages). The
            # session opens again; its closed turns stay closed, having been handed to judging already.
            session.closed_at, session.close_reason = None, ""
        if it.turn_type == MAIN:
            _link_new_turn(it, graph, by_continuation, new_in_session, ready, now)
            _adopt_waiting_children(it, graph, ready, now)
            new_in_session[session_key(session)].append(turn)
            for digest in it.continuations:
                by_continuation.setdefault((*owner_of(record), digest), turn)
        # Stored against its parent, else the turn it regenerates.
        turn.base_ref = getattr(turn, "parent_ref", None) or getattr(turn, "regenerate", None)
        if record.session_done:
            for waiting in _waiting(session, graph, new_in_session):
                waiting.closed_without_next = True
                graph.mark(waiting)
                ready[id(waiting)] = waiting
            session.closed_at, session.close_reason = now, Session.CloseReason.DONE
    compact(items, graph)
    # New sessions go in with their final counts, so that only the existing ones need an UPDATE.
    existing = [s for s in sessions.values() if s.pk is not None]
    insert_rows(Session, [s for s in sessions.values() if s.pk is None])
    for turn in turns:
        turn.session = turn.session_obj  # now with its primary key
        _resolve_refs(turn)
    insert_rows(Turn, turns)
    # Links to turns that were new at insert time, and every stored turn whose links changed: one UPDATE.
    after = [t for t in turns if t.refs_pending]
    for turn in [*after, *graph.dirty.values()]:
        _resolve_refs(turn)
    update_rows(Turn, after + list(graph.dirty.values()), _UPDATED)
    merged_into = {}
    for source, target in graph.merges:
        if _merge_session(source, target, graph):
            merged_into[id(target)] = target
    changed = {id(s): s for s in existing}
    changed.update(merged_into)
    update_rows(
        Session, list(changed.values()), ["turn_count", "last_activity_at", "closed_at", "close_reason"]
    )
    for it in items:
        remember(it)
    return list(ready.values())


def _waiting(session: Session, graph: Graph, new_in_session: dict[tuple, list[Turn]]) -> list[Turn]:
    key = session_key(session)
    stored = graph.pending.get(session.pk, []) if session.pk is not None else []
    return [
        t
        for t in [*stored, *new_in_session.get(key, [])]
        if t.status != FAILED and t.next_state is None and not t.closed_without_next
    ]


def _link_new_turn(it: Item, graph: Graph, by_continuation, new_in_session, ready, now) -> None:
    """Finds the main turn the new turn's request continues (the newest matching prefix, in the same
    session), and recomputes that turn's family; a turn that continues nothing may regenerate a first
    turn, or (a client that does not resend history, in a session it names) answer the session's newest
    waiting turn."""
    turn, owner, key = it.turn, owner_of(it.record), session_key(it.session)
    parent = None
    for digest, _ in it.candidates:
        options = [by_continuation.get((*owner, digest))] + list(
            graph.by_continuation.get((*owner, digest), ())
        )
        options = [t for t in options if t is not None and t.turn_type == MAIN and session_key(t) == key]
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
        originals = [t for t in originals if session_key(t) == key and order_key(t) < order_key(turn)]
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
                and session_key(later) == key
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


def _set_parent(turn: Turn, parent: Turn, graph: Graph, ready, now) -> None:
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


def _relink(parent: Turn, graph: Graph, ready, now) -> None:
    changed, became_ready = relink(parent, graph.children[id(parent)], now=now)
    for child in changed:
        graph.mark(child)
    if getattr(parent, "links_changed", False):
        graph.mark(parent)
    if became_ready:
        ready[id(parent)] = parent


def _adopt_waiting_children(it: Item, graph: Graph, ready, now) -> None:
    """Stored turns whose request continues this new turn, written before it by a faster writer: they become
    its children. One in an inferred session of its own brings that session along."""
    turn, key = it.turn, session_key(it.session)
    waiting = [c for h in it.continuations for c in graph.by_parent_hash.get((*owner_of(it.record), h), ())]
    for child in waiting:
        if (
            child.turn_type != MAIN
            or order_key(child) <= order_key(turn)
            or getattr(child, "parent_ref", None) is turn
        ):
            continue
        if session_key(child) != key:
            if not graph.inferred_sessions.get(child.session_id) or child.session_id not in graph.locked:
                continue  # a session the client named keeps its turns
            if all(source != child.session_id for source, _ in graph.merges):
                graph.merges.append((child.session_id, it.session))
        _set_parent(child, turn, graph, ready, now)


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


def _merge_session(source_id: int, target: Session, graph: Graph) -> bool:
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
