"""Judging tasks: score a main turn by its next state, and close idle sessions (which hands their last turns
to judging). The bridge between ``clawhub`` (rows) and ``workers.judge`` (plain data).

``judge_turn`` is enqueued on commit by ``clawhub.conversations.hooks`` with a turn id (several turns ready at
once come as one ``judge_turns`` message that a judge worker fans out). It is idempotent: a turn with a
successful judgment is left alone, so a redelivered task (``acks_late``: a worker lost mid-task leaves the
message to be delivered again) costs one read.
"""

import logging
from typing import Any

from celery.exceptions import MaxRetriesExceededError, SoftTimeLimitExceeded
from django.apps import apps
from django.conf import settings
from django.db import transaction

from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import turn_request
from clawhub.conversations.services import session_close_idle
from clawhub.core import tasks
from clawhub.feedback.concurrency import TenantCappedJudgeTask
from clawhub.feedback.selectors import (
    judge_name_for_tenant,
    judge_rules_for_tenant,
    judgment_for_turn,
    turn_for_judging,
)
from clawhub.feedback.services import judgment_store, judgment_store_failure
from workers.celery import app
from workers.judge import Judge, JudgeError, JudgeInput, TransientJudgeError
from workers.judge.registry import judge_class

logger = logging.getLogger("workers.tasks.judging")

JUDGE_QUEUE = tasks.JUDGE_QUEUE


@app.task(
    name=tasks.JUDGE_TURN,
    queue=JUDGE_QUEUE,
    bind=True,
    base=TenantCappedJudgeTask,  # at most CLAWHUB_JUDGE_TENANT_CONCURRENCY of one tenant's turns at once
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=3,
    ignore_result=True,
    soft_time_limit=settings.CLAWHUB_JUDGE_TASK_SOFT_TIME_LIMIT,
    time_limit=settings.CLAWHUB_JUDGE_TASK_TIME_LIMIT,
)
def judge_turn(self, turn_id: int) -> dict[str, Any]:
    turn = turn_for_judging(turn_id=turn_id)
    if turn is None:
        return {"turn": turn_id, "outcome": "missing"}
    if turn.turn_type != Turn.Type.MAIN:
        return {"turn": turn_id, "outcome": "side"}  # side turns are served and logged, never judged
    if not turn.ready_for_judging:
        # Enqueued for a turn that has neither a next state nor a close: nothing to judge yet.
        return {"turn": turn_id, "outcome": "not_ready"}
    existing = judgment_for_turn(turn_id=turn_id)
    if existing is not None and existing.status == existing.Status.OK:
        return {"turn": turn_id, "outcome": "exists", "judgment": existing.pk}

    judge = judge_for_tenant(tenant_id=turn.tenant_id)
    attempts = self.request.retries + 1
    try:
        result = judge.judge(judge_input(turn))
    except TransientJudgeError as exc:
        try:
            delay = settings.CLAWHUB_JUDGE_TASK_RETRY_DELAY * 2**self.request.retries
            raise self.retry(exc=exc, countdown=delay)
        except MaxRetriesExceededError:
            return _failed(turn, judge, exc, attempts)
        except TransientJudgeError:
            # retry() re-raises exc itself once max_retries is spent
            return _failed(turn, judge, exc, attempts)
    except (JudgeError, SoftTimeLimitExceeded) as exc:
        # Out of time is final: the same turn would take as long again on the next worker.
        return _failed(turn, judge, exc, attempts)

    with transaction.atomic():
        # One transaction with the review hand-off: a worker lost in between leaves neither, and the
        # redelivered task does both; never a judgment that review did not see.
        judgment, stored = judgment_store(
            turn=turn,
            reward=result.reward,
            votes=[v.score for v in result.votes],
            hints=result.hints,
            judge=result.judge,
            prompt_version=result.prompt_version,
            raw_outputs={**result.raw_outputs, "hint_votes": [v.score for v in result.hint_votes]},
            attempts=attempts,
        )
        if stored:
            _hand_to_review(judgment.pk)
    return {"turn": turn_id, "outcome": "judged" if stored else "exists", "judgment": judgment.pk,
            "reward": judgment.reward}


def _failed(turn: Turn, judge: Judge, exc: Exception, attempts: int) -> dict[str, Any]:
    logger.warning("judging turn %s failed after %d attempts: %s", turn.pk, attempts, exc)
    judgment = judgment_store_failure(turn=turn, judge=judge.name, prompt_version=judge.prompt_version,
                                      error=str(exc), attempts=attempts)
    return {"turn": turn.pk, "outcome": "failed", "judgment": judgment.pk}


@app.task(name=tasks.JUDGE_TURNS, queue=JUDGE_QUEUE, acks_late=True, reject_on_worker_lost=True,
          ignore_result=True)
def judge_turns(*turn_ids: int) -> int:
    """One judge_turn task per id, sent here rather than by the capture consumer (which sends this one message
    per batch), through one producer. A redelivered fan-out sends some again, which judge_turn's idempotence
    absorbs; a lost one is re-driven by sweep_unjudged. Returns how many it sent."""
    with app.producer_or_acquire() as producer:
        for turn_id in turn_ids:
            tasks.enqueue(tasks.JUDGE_TURN, turn_id, producer=producer)
    return len(turn_ids)


def _hand_to_review(judgment_id: int) -> None:
    # The review app is optional here: judging works (and is tested) without it.
    if not apps.is_installed("clawhub.review"):
        return
    from clawhub.review.services import sample_create_for_judgment, sample_follow_judge

    sample_follow_judge(judgment_id=judgment_id)
    sample_create_for_judgment(judgment_id=judgment_id)


@app.task(name=tasks.CLOSE_IDLE, queue=JUDGE_QUEUE, ignore_result=True)
def close_idle_sessions() -> int:
    """Periodic (celery beat, see workers.celery): closes sessions idle for CONVERSATION_IDLE_TIMEOUT; their
    last main turns go to judging without a next state."""
    return session_close_idle(idle_for=settings.CONVERSATION_IDLE_TIMEOUT)


SWEEP_BATCH = 500


@app.task(name=tasks.JUDGE_SWEEP, queue=JUDGE_QUEUE, ignore_result=True)
def sweep_unjudged() -> int:
    """Periodic (celery beat, see workers.celery): main turns that have been ready for judging (a next state,
    or closed without one) for CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS and still have no judgment are enqueued
    again.

    This is what makes a lost hand-off harmless: a judge task whose publish failed after its commit, a broker
    that lost its queue, a worker that died without redelivery. judge_turn is idempotent, so a turn whose task
    is merely slow costs one read. At most SWEEP_BATCH turns per run, oldest first; returns how many.
    """
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from clawhub.conversations.selectors import turns_judgeable

    cutoff = timezone.now() - timedelta(seconds=settings.CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS)
    ready = (Q(next_state__isnull=False, next_state_at__lt=cutoff)
             | Q(closed_without_next=True, session__closed_at__lt=cutoff))
    candidates = (Turn.objects.filter(ready, turn_type=Turn.Type.MAIN, judgment__isnull=True)
                  .order_by("pk").values_list("pk", flat=True)[:SWEEP_BATCH])
    turn_ids = turns_judgeable(turn_ids=list(candidates))
    for turn_id in turn_ids:
        tasks.enqueue(tasks.JUDGE_TURN, turn_id)
    if turn_ids:
        logger.warning("judge sweep: %d ready turns had no judgment after %.0f s; enqueued again",
                       len(turn_ids), settings.CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS)
    return len(turn_ids)


# --- from rows to plain data --------------------------------------------------------------------------------


def judge_input(turn: Turn) -> JudgeInput:
    request = turn_request(turn=turn)  # the messages are stored as what each turn added: rebuilt here
    messages = request.get("messages")
    if not isinstance(messages, list):
        # /v1/completions: the prompt is the whole context.
        prompt = request.get("prompt")
        messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt or "")}]
    choice = turn.response[0] if turn.response else {}
    message = choice.get("message")
    response = message if isinstance(message, dict) else {"content": choice.get("text")}
    return JudgeInput(
        messages=messages,
        response=response,
        next_state=turn.next_state or None,
        tools=request.get("tools") or [],
        turn_type=turn.turn_type,
    )


def judge_for_tenant(*, tenant_id: int) -> Judge:
    """The tenant's choice of judge if it made one, else settings.CLAWHUB_JUDGE (names in
    workers.judge.registry), built from the settings and the tenant's rules."""
    rules = judge_rules_for_tenant(tenant_id=tenant_id)
    name = judge_name_for_tenant(tenant_id=tenant_id, rules=rules)
    plain = None if rules is None else {
        "tenant_id": tenant_id, "negative_patterns": rules.negative_patterns,
        "positive_patterns": rules.positive_patterns, "hint_templates": rules.hint_templates,
        "extend_defaults": rules.extend_defaults,
    }
    return judge_class(name).from_config(settings, rules=plain)
