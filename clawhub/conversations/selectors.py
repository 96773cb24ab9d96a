"""Reads for sessions and turns. A user sees their own; review by admins belongs to the judging issue."""

from collections.abc import Iterable

from django.db.models import Count, Q, QuerySet

from clawhub.conversations.models import Session, Turn
from clawhub.core.exceptions import NotFound


def sessions_for_user(*, user, turn_type: str | None = None) -> QuerySet[Session]:
    """The user's sessions, newest activity first, with their main and side turn counts. ``turn_type`` keeps
    the sessions that have at least one turn of that type."""
    sessions = (
        Session.objects.filter(user=user)
        .select_related("key", "tenant__group")
        .annotate(
            main_turns=Count("turns", filter=Q(turns__turn_type=Turn.Type.MAIN)),
            side_turns=Count("turns", filter=Q(turns__turn_type=Turn.Type.SIDE)),
        )
        .order_by("-last_activity_at", "-id")
    )
    if turn_type == Turn.Type.MAIN:
        sessions = sessions.filter(main_turns__gt=0)
    elif turn_type == Turn.Type.SIDE:
        sessions = sessions.filter(side_turns__gt=0)
    return sessions


def session_get_for_user(*, user, session_id: int) -> Session:
    """One of the user's sessions. Anyone else's is "not found", so that ids do not reveal what exists."""
    session = Session.objects.select_related("key", "tenant__group").filter(pk=session_id, user=user).first()
    if session is None:
        raise NotFound("No such session.")
    return session


def turns_for_session(*, session: Session, turn_type: str | None = None) -> QuerySet[Turn]:
    """The session's turns in order. The sampled token ids and log-probs are left out: they are for training,
    large, and no page shows them."""
    turns = Turn.objects.filter(session=session, tenant_id=session.tenant_id).defer("token_ids", "logprobs")
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
