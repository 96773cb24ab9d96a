"""Server-rendered pages: the user's conversations, and one conversation turn by turn."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from clawhub.conversations.identity import content_text, next_state_messages, reply_message
from clawhub.conversations.links import describe
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import (
    session_get_for_user,
    sessions_for_user,
    turn_training_source,
    turns_for_session,
    turns_messages,
)
from clawhub.core.exceptions import NotFound

PER_PAGE = 50


def _turn_type(request: HttpRequest) -> str | None:
    value = request.GET.get("type")
    return value if value in Turn.Type.values else None


def _said(messages) -> list[dict]:
    return [{"role": m.get("role", ""), "text": content_text(m.get("content"))} for m in messages or []]


def _shown(turn: Turn, messages: list | None, index_of: dict[int, int]) -> dict:
    """What a person reading the conversation wants from a turn: what this request added (not the whole
    resent history), what came back, what followed, how it ended, what it continues, and what a training
    sample of it is built from."""
    reply = reply_message(turn.response) or {}
    prompt = turn.request.get("prompt") if isinstance(turn.request, dict) else None
    linked_to = turn.regenerate_of_id if turn.link == Turn.Link.REGENERATE else turn.parent_id
    source, why = turn_training_source(turn=turn)
    return {
        "ended": turn.ended,
        "cut": turn.cut,
        "link": describe(turn),
        "linked_to": linked_to,
        "linked_index": index_of.get(linked_to) if linked_to else None,
        "training_source": source,
        "training_why": why,
        "turn": turn,
        "added": _said(next_state_messages(messages)) if isinstance(messages, list) else
        [{"role": "prompt", "text": str(prompt or "")}],
        "reply": content_text(reply.get("content")) if reply else "",
        "tool_calls": [c.get("function") or {} for c in reply.get("tool_calls") or [] if isinstance(c, dict)],
        "next_state": _said(turn.next_state),
    }


@login_required
def conversation_list(request: HttpRequest) -> HttpResponse:
    turn_type = _turn_type(request)
    page = Paginator(sessions_for_user(user=request.user, turn_type=turn_type), PER_PAGE).get_page(
        request.GET.get("page"))
    return render(request, "conversations/list.html", {"page": page, "turn_type": turn_type})


@login_required
def conversation_detail(request: HttpRequest, session_id: int) -> HttpResponse:
    try:
        session = session_get_for_user(user=request.user, session_id=session_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    turn_type = _turn_type(request)
    rows = list(turns_for_session(session=session, turn_type=turn_type))
    messages = turns_messages(turns=rows)
    index_of = dict(Turn.objects.filter(session=session).values_list("pk", "index"))
    turns = [_shown(t, messages.get(t.pk), index_of) for t in rows]
    return render(request, "conversations/detail.html",
                  {"session": session, "turns": turns, "turn_type": turn_type})
