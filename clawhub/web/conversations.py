"""Server-rendered pages: the user's conversations, and one conversation turn by turn, with what each turn
taught the model: its judgment, the person's own rating, its sample's review, the version that answered and
the run that trained on it. They show what feedback, review and training made of the conversations app's
turns, so they live with the pages that combine apps."""

from datetime import date

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from clawhub.conversations.identity import content_text, next_state_messages, reply_message
from clawhub.conversations.links import describe
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import (
    first_user_messages,
    session_get_for_user,
    sessions_for_user,
    turn_training_source,
    turns_for_session,
    turns_messages,
)
from clawhub.core.api import client_ip
from clawhub.core.exceptions import NotFound
from clawhub.core.views import messages_by_anchor, page_errors, post_and_redirect
from clawhub.feedback.models import ExplicitFeedback
from clawhub.feedback.selectors import turn_for_rating
from clawhub.review.services import feedback_submit
from clawhub.training.selectors import learning_for_turns

PER_PAGE = 50


def _turn_type(request: HttpRequest) -> str | None:
    value = request.GET.get("type")
    return value if value in Turn.Type.values else None


def _said(messages) -> list[dict]:
    return [{"role": m.get("role", ""), "text": content_text(m.get("content"))} for m in messages or []]


def _shown(turn: Turn, messages: list | None, index_of: dict[int, int], learned: dict | None = None) -> dict:
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
        **(learned or {}),
    }


# Filters over a conversation's turns: what the sample trains on (reward), whether the guards flagged it, and
# which adapter version answered.
REWARDS = {"1": 1, "0": 0, "-1": -1}


def _kept(row: dict, *, reward: str, flag: str, version: str) -> bool:
    sample = row.get("sample")
    if reward in REWARDS and (row.get("effective_reward") != REWARDS[reward]):
        return False
    if flag == "any" and not (sample and sample.flags):
        return False
    if flag == "none" and sample and sample.flags:
        return False
    if version:
        answered = row["turn"].adapter_version.version if row["turn"].adapter_version_id else "base"
        if str(answered) != version:
            return False
    return True


def _day(value: str | None) -> date | None:
    """A day given as YYYY-MM-DD; None for anything else."""
    try:
        return date.fromisoformat(value or "")
    except ValueError:
        return None


@login_required
def conversation_list(request: HttpRequest) -> HttpResponse:
    """The user's sessions, filtered by turn type, text, key and the days they were active in, each with the
    start of its first message."""
    from clawhub.keys.selectors import keys_for_user

    turn_type = _turn_type(request)
    text = request.GET.get("q", "").strip()[:200]
    keys = list(keys_for_user(user=request.user))
    key_id = next((k.pk for k in keys if str(k.pk) == request.GET.get("key")), None)
    since, until = _day(request.GET.get("from")), _day(request.GET.get("to"))
    sessions = sessions_for_user(user=request.user, turn_type=turn_type, text=text, key_id=key_id,
                                 since=since, until=until)
    page = Paginator(sessions, PER_PAGE).get_page(request.GET.get("page"))
    previews = first_user_messages(sessions=page.object_list)
    for session in page.object_list:
        session.preview = previews.get(session.pk, "")
    kept = request.GET.copy()
    kept.pop("page", None)
    return render(request, "conversations/list.html", {
        "page": page, "turn_type": turn_type, "q": text, "keys": keys, "key_id": key_id,
        "since": since.isoformat() if since else "", "last": until.isoformat() if until else "",
        "filtered": bool(turn_type or text or key_id or since or until), "query": kept.urlencode(),
    })


@login_required
def conversation_detail(request: HttpRequest, session_id: int) -> HttpResponse:
    try:
        session = session_get_for_user(user=request.user, session_id=session_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    turn_type = _turn_type(request)
    rows = list(turns_for_session(session=session, turn_type=turn_type).select_related("adapter_version"))
    messages = turns_messages(turns=rows)
    learned = learning_for_turns(turns=rows)
    index_of = dict(Turn.objects.filter(session=session).values_list("pk", "index"))
    turns = [_shown(t, messages.get(t.pk), index_of, learned.get(t.pk)) for t in rows]
    chosen = {name: request.GET.get(name, "") for name in ("reward", "flag", "version")}
    versions = sorted({t.adapter_version.version for t in rows if t.adapter_version_id})
    shown = [row for row in turns if _kept(row, **chosen)]
    # A rating's answer goes with the turn it rated: its redirect scrolls there, past the top of the page.
    top_messages, anchored = messages_by_anchor(request)
    for row in shown:
        row["messages"] = anchored.pop(f"turn-{row['turn'].pk}", [])
    top_messages += [message for placed in anchored.values() for message in placed]  # a turn filtered out
    return render(request, "conversations/detail.html",
                  {"session": session, "turns": shown, "turn_type": turn_type, "total": len(turns),
                   "versions": versions, "chosen": chosen, "thumbs": ExplicitFeedback.Thumb.values,
                   "top_messages": top_messages})


@login_required
@require_POST
@page_errors
def turn_feedback(request: HttpRequest, turn_id: int) -> HttpResponse:
    """The conversation page's rating form: the same service as the REST API and /v1/feedback."""
    turn = turn_for_rating(actor=request.user, turn_id=turn_id)
    form = request.POST
    fields = {}
    if "thumb" in form:
        fields["thumb"] = form["thumb"]
    if form.get("score", "") != "":
        try:
            fields["score"] = int(form["score"])
        except ValueError:
            fields["score"] = form["score"]  # refused by the service with a clear message
    for name in ("comment", "demonstration"):
        if name in form:
            fields[name] = form[name]
    return post_and_redirect(
        request,
        lambda: feedback_submit(actor=request.user, turn=turn, source=ExplicitFeedback.Source.WEB,
                                ip=client_ip(request), **fields),
        "Thanks: your feedback is recorded and goes to review with this turn.",
        f"/conversations/{turn.session_id}/#turn-{turn.pk}",
    )
