"""Each new turn's messages and prompt token ids stored as what they add to its base turn's (O(n) per
session), with a small memory of the prompts this process wrote lately, so that the next turn of a
conversation finds its base without reading it back."""

import threading
from collections import OrderedDict
from dataclasses import dataclass

from clawhub.conversations.capture.graph import Graph
from clawhub.conversations.capture.items import UNPACKED, Item
from clawhub.conversations.capture.records import RawIds
from clawhub.conversations.identity import (
    MAIN,
)
from clawhub.conversations.selectors import stored_prompt_chains
from clawhub.conversations.storage import pack_ids, split_ids, split_messages


def compact(items: list[Item], graph: Graph) -> None:
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
        turn = it.turn
        base = getattr(turn, "base_ref", None)
        base_messages, base_context = None, None
        if base is not None:
            if base.pk is None:
                source = by_turn[id(base)]
                base_messages, base_context = source.messages, _context(source)
            else:
                base_messages, base_context = known.get(base.pk, (None, None))
        if it.messages is not None:
            turn.messages_shared, turn.messages_added = split_messages(it.messages, base_messages)
        else:
            turn.messages_shared, turn.messages_added = 0, ""
        split = _split_past(it, base_context)
        if split is None:  # not text that extends the base's: every id parsed and compared
            packed = _packed(it)
            if packed is not None:
                shared, added = split_ids(packed, base_context.ids() if base_context else None)
                split = (shared, added, len(packed) // 4)
        if split is not None:
            turn.prompt_token_ids_shared, turn.prompt_token_ids_added, turn.prompt_token_count = split
        if not (turn.messages_shared or turn.prompt_token_ids_shared):
            turn.base_ref = None


@dataclass(slots=True)
class Context:
    """What the prompt ids of a turn's next state start with: the turn's prompt ids, then its reply's.

    When the prompt's ids came as vLLM's text (RawIds), the text is kept: the next turn's text usually starts
    with it (an agent resends its whole conversation, 15k ids and more), so only what follows it is parsed.
    ``text`` is set only once the ids in it are known to be a list of uint32 (they were parsed once)."""

    reply: bytes  # the reply's ids, packed
    packed: bytes | None = None  # the prompt's ids, packed; None until needed when ``text`` is set
    text: bytes | None = None
    count: int = 0  # how many ids ``text`` holds

    def ids(self) -> bytes:
        """Prompt then reply ids, packed."""
        if self.packed is None:
            self.packed = RawIds(self.text or b"[]").packed() or b""
        return self.packed + self.reply


def _split_past(it: Item, base: "Context | None") -> tuple[int, bytes, int] | None:
    """(ids shared with the base's context, the rest packed, the prompt's id count) when the record's ids are
    text that starts with the base prompt's text: only the ids after it are parsed. None otherwise."""
    ids = it.record.prompt_token_ids
    if not isinstance(ids, RawIds) or base is None or base.text is None or not base.count:
        return None
    head = len(base.text) - 1  # the base's text without its "]"
    raw = ids.raw
    if not raw.startswith(base.text[:head]) or raw[head:head + 1] not in (b",", b"]"):
        return None  # "[1,2" is no prefix of "[1,23": an id must end where the base's text ends
    rest = RawIds(b"[" + raw[head + 1:]).packed() if raw[head:head + 1] == b"," else b""
    if rest is None:
        return None  # not ids after all: the full parse says so for the whole text
    shared, added = split_ids(rest, base.reply)
    count = base.count + len(rest) // 4
    it.context = Context(reply=pack_ids(it.record.token_ids or ()), text=raw, count=count)
    return base.count + shared, added, count


# Prompts of turns this process wrote lately, so that the next turn of a conversation finds its base here
# instead of rebuilding it from the database: turn id -> (messages, its Context).
_RECENT: "OrderedDict[int, tuple[list | None, Context | None]]" = OrderedDict()
_RECENT_MAX = 128
_recent_lock = threading.Lock()


def forget_recent_prompts() -> None:
    """Empties the writer's memory of recent prompts (tests, and anything that must read bases afresh)."""
    with _recent_lock:
        _RECENT.clear()


def _packed(it: Item) -> bytes | None:
    """The record's prompt ids, packed once (a 32 KB agent prompt has thousands); None without any (or when
    the gateway's RawIds are not a list of uint32)."""
    if it.packed_ids is UNPACKED:
        ids = it.record.prompt_token_ids
        if isinstance(ids, RawIds):
            it.packed_ids = ids.packed()  # the one parse of vLLM's text
        else:
            it.packed_ids = pack_ids(ids) if ids is not None else None
    return it.packed_ids


def _context(it: Item) -> Context | None:
    """The item's Context (None without valid prompt ids), made once."""
    if it.context is None:
        packed = _packed(it)
        if packed is None:
            return None
        ids = it.record.prompt_token_ids
        text = ids.raw if isinstance(ids, RawIds) else None
        it.context = Context(reply=pack_ids(it.record.token_ids or ()), packed=packed, text=text,
                             count=len(packed) // 4)
    return it.context


def remember(it: Item) -> None:
    if it.turn is None or it.turn.pk is None or it.messages is None or it.turn_type != MAIN:
        return
    context = _context(it)
    with _recent_lock:
        _RECENT[it.turn.pk] = (it.messages, context)
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.popitem(last=False)


def _prompts_of(turn_ids: set[int], graph: Graph) -> dict[int, tuple[list | None, Context | None]]:
    out: dict[int, tuple[list | None, Context | None]] = {}
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
                context = Context(reply=pack_ids(response or ()), packed=pack_ids(ids)) if ids is not None \
                    else None
                out[pk] = (messages, context)
                if messages is not None:
                    _RECENT[pk] = out[pk]  # a base read once (a repeated prompt's first turn) is read again
            while len(_RECENT) > _RECENT_MAX:
                _RECENT.popitem(last=False)
    return out
