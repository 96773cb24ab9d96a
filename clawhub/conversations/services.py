"""Writes for sessions and turns outside the capture path: closing idle sessions, handing turns to judging.

Capture itself (``clawhub.conversations.capture.store``) writes turns in batches for the gateway. These writes
are the system's own bookkeeping, not a person's change, so they leave no audit rows.
"""

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.audit import audit_record_for_tenant
from clawhub.conversations import hooks
from clawhub.conversations.models import ConversationSettings, Session, Turn
from clawhub.conversations.selectors import turns_awaiting_next, turns_judgeable, turns_judgeable_loaded
from clawhub.core.updates import model_update


def turns_ready_notify(*, turn_ids: Iterable[int] = (), turns: Iterable[Turn] = ()) -> None:
    """Hands the turns to the judging hook once the current transaction commits (never before: the task it
    enqueues must find the rows). A failing hook is logged by Django and does not undo the commit. Cut turns
    (max_tokens, a client that went away, an upstream error) are not handed over unless the tenant includes
    ``length`` ones: a cut reply judged as complete teaches the model from something it did not finish.
    ``turns``: saved turns in memory with their ``ended`` and ``tenant_id`` loaded, judged without reading
    them back."""
    ids = sorted({*turns_judgeable(turn_ids=turn_ids), *turns_judgeable_loaded(turns)})
    if ids:
        transaction.on_commit(lambda: hooks.on_turn_ready_for_judging(ids), robust=True)


def session_close_idle(*, idle_for: timedelta | None = None, batch_size: int = 500) -> int:
    """Closes open sessions with no turn for ``idle_for`` (default settings.CONVERSATION_IDLE_TIMEOUT); their
    last main turn is closed without a next state and handed to judging. Returns how many sessions closed.

    Runs in short transactions of ``batch_size`` sessions and skips rows capture holds locked at the moment:
    those are getting a turn and are not idle.
    """
    idle_for = idle_for if idle_for is not None else settings.CONVERSATION_IDLE_TIMEOUT
    now = timezone.now()
    cutoff = now - idle_for
    closed = 0
    while True:
        with transaction.atomic():
            session_ids = list(
                Session.objects.select_for_update(skip_locked=True)
                .filter(closed_at__isnull=True, last_activity_at__lt=cutoff)
                .order_by("id")
                .values_list("id", flat=True)[:batch_size]
            )
            if not session_ids:
                break
            turn_ids = list(turns_awaiting_next(session_ids=session_ids).values_list("id", flat=True))
            Turn.objects.filter(id__in=turn_ids).update(closed_without_next=True)
            Session.objects.filter(id__in=session_ids).update(
                closed_at=now, close_reason=Session.CloseReason.IDLE
            )
            turns_ready_notify(turn_ids=turn_ids)
        closed += len(session_ids)
        if len(session_ids) < batch_size:
            break
    return closed


def conversation_settings_update(*, access, include_length_turns: bool) -> ConversationSettings:
    """Sets whether the tenant's replies cut at max_tokens are judged and trained on (owners, admins and
    staff; ``access`` is a clawhub.tenants.access.TenantAccess), with an audit row."""
    access.require_manage("change which cut turns are judged")
    tenant, actor = access.tenant, access.actor
    settings_row, _ = ConversationSettings.objects.get_or_create(tenant=tenant)
    if model_update(instance=settings_row, fields=["include_length_turns"],
                    data={"include_length_turns": include_length_turns}):
        audit_record_for_tenant(actor=actor, action="conversations.settings_update", target=settings_row,
                                tenant=tenant, include_length_turns=include_length_turns)
    return settings_row
