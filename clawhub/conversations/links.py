"""Which turn a main turn continues, and what it is to that turn: next state, regenerate or fork.

Pure rules over turns already in memory (capture loads and writes them). A turn's *parent* is the stored main
turn whose prompt + reply its request extends (found by the continuation hash). The parent's children, in the
order their requests started (not the order writers committed them):

- a child whose prompt repeats an earlier sibling's prompt is a *regenerate* of that sibling (so is a child
  that repeats a sibling's whole prompt plus more user messages, without its reply: a retry. OpenClaw's keeps
  the message it retries, after a failed request and also after a served reply it could not use, such as a
  malformed tool call, which it drops from its history and retries with an instruction to answer);
- of the others, the first is the parent's *next* state, every later one a *fork* (the user went back and
  branched off);
- the parent's next state is what its first child's request added after the reply, taken from the first of
  that child and its regenerates that was served (a failed request still carried the user's reply, but its
  retry carries it whole).

Recomputing a family from scratch each time a child arrives makes the outcome independent of arrival order.
"""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from clawhub.conversations.models import Turn

FAILED = Turn.Status.FAILED


def order_key(turn: Turn) -> tuple[datetime, str]:
    return (turn.created_at, turn.request_id)


def _regenerates(child: Turn, earlier: Turn) -> bool:
    if child.prompt_hash and child.prompt_hash == earlier.prompt_hash:
        return True
    # A sibling's whole prompt and more user messages: the client dropped that sibling's reply (a failed
    # request, or a reply it could not use) and asks again. A branch would change a message, not keep it.
    retry = getattr(child, "retry_hashes", ())
    return bool(earlier.prompt_hash) and earlier.prompt_hash in retry


def relink(parent: Turn, children: Iterable[Turn], *, now: datetime) -> tuple[list[Turn], bool]:
    """Sets ``link`` and ``regenerate`` (the sibling regenerated, an attribute capture resolves to
    ``regenerate_of``) on every child and the parent's next state. Returns (children whose link changed,
    whether the parent just became ready for judging)."""
    kids = sorted(children, key=order_key)
    changed: list[Turn] = []
    firsts: list[Turn] = []  # the first turn of each group of regenerates
    group_of: dict[int, Turn] = {}
    for i, child in enumerate(kids):
        original = next((s for s in kids[:i] if _regenerates(child, s)), None)
        if original is not None:
            root = group_of[id(original)]
            new = (Turn.Link.REGENERATE, root)
            group_of[id(child)] = root
        else:
            firsts.append(child)
            group_of[id(child)] = child
            new = (Turn.Link.NEXT if len(firsts) == 1 else Turn.Link.FORK, None)
        if (child.link, getattr(child, "regenerate", None)) != new:
            child.link, child.regenerate = new
            changed.append(child)
    if not firsts or parent.closed_without_next:
        # A parent closed before its continuation arrived (session done or idle) was judged without one.
        return changed, False
    first = firsts[0]
    group = [k for k in kids if group_of[id(k)] is first]
    source = next((k for k in group if k.status != FAILED), first)
    was_ready = parent.ready_for_judging
    following = source.follows or []
    if following:
        if parent.next_state != following:
            parent.next_state, parent.next_state_at = following, now
            parent.links_changed = True
    else:
        # Nothing the user or a tool said (only internal context): the turn goes to judging without one.
        parent.closed_without_next = True
        parent.links_changed = True
    return changed, not was_ready


def describe(turn: Any) -> str:
    """How the conversation page names a turn's link."""
    return {
        Turn.Link.NEXT: "next state of",
        Turn.Link.REGENERATE: "regenerate of",
        Turn.Link.FORK: "fork from",
    }.get(turn.link, "")
