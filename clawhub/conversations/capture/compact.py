"""Each new turn's messages and prompt token ids stored as what they add to its base turn's (O(n) per
session), with a small memory of the prompts this process wrote lately, so that the next turn of a
conversation finds its base without reading it back."""

import threading
from collections import OrderedDict

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
        base_messages = base_ids = None
        if base is not None:
            if base.pk is None:
                source = by_turn[id(base)]
                base_messages = source.messages
                base_ids = _packed_context(source)
            else:
                base_messages, base_ids = known.get(base.pk, (None, None))
        if it.messages is not None:
            turn.messages_shared, turn.messages_added = split_messages(it.messages, base_messages)
        else:
            turn.messages_shared, turn.messages_added = 0, ""
        packed = _packed(it)
        if packed is not None:
            turn.prompt_token_count = len(packed) // 4
            turn.prompt_token_ids_shared, turn.prompt_token_ids_added = split_ids(packed, base_ids)
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


def _packed_context(it: Item) -> bytes | None:
    """Prompt ids then reply ids, packed: what the next turn's prompt ids start with."""
    packed = _packed(it)
    return None if packed is None else packed + pack_ids(it.record.token_ids or ())


def remember(it: Item) -> None:
    if it.turn is None or it.turn.pk is None or it.messages is None or it.turn_type != MAIN:
        return
    context = _packed_context(it)
    with _recent_lock:
        _RECENT[it.turn.pk] = (it.messages, context)
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.popitem(last=False)


def _prompts_of(turn_ids: set[int], graph: Graph) -> dict[int, tuple[list | None, list[int] | None]]:
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
