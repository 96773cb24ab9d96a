"""The hand-off from judging to review, in one process: captured turns → judge task (rule judge) → sample
under the group's policy → an admin approves through the API → the training selector offers it."""

import time

import pytest

from clawhub.conversations.capture.records import TurnRecord
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.selectors import samples_for_training
from workers.tasks.judging import judge_turn

pytestmark = pytest.mark.django_db


def record(key, n: int, messages: list[dict], reply: str) -> TurnRecord:
    tenant = key.group.tenant
    return TurnRecord(
        request_id=f"pipeline-{key.pk}-{n}", route="chat", key_id=key.pk, user_id=key.owner_id,
        tenant_id=tenant.pk, group_id=key.group_id, model=tenant.model_id, upstream_model="base",
        adapter_version_id=None, upstream="http://127.0.0.1:8100", status="complete", http_status=200,
        started_at=time.time() - 60 + n, latency_ms=80.0, session_id="pipeline-session", turn_type="main",
        request={"messages": messages},
        choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}],
        prompt_tokens=10, completion_tokens=5,
    )


def test_judged_turn_becomes_a_sample_that_an_admin_approves_for_training(team, api_as, settings):
    settings.CLAWHUB_JUDGE = "rule"
    ReviewPolicy.objects.create(tenant=team["tenant"], mode=ReviewPolicy.Mode.MANUAL)
    key = team["author_key"]
    first = [{"role": "user", "content": "List the files, please."}]
    capture_store([record(key, 1, first, "Here are **the files**: a, b.")])
    follow_up = [*first, {"role": "assistant", "content": "Here are **the files**: a, b."},
                 {"role": "user", "content": "That's wrong, redo it without bold."}]
    capture_store([record(key, 2, follow_up, "Files: a, b.")])
    judged = Turn.objects.get(request_id=f"pipeline-{key.pk}-1")
    assert judged.next_state is not None

    judge_turn.apply(args=[judged.pk])
    judge_turn.apply(args=[judged.pk])  # delivered twice: still one judgment, one sample

    sample = Sample.objects.get()
    assert (sample.turn, sample.user, sample.reward) == (judged, team["author"], -1)
    assert sample.tenant == team["tenant"]
    assert (sample.state, sample.flags) == ("pending", [])  # manual: everything waits for a human
    assert samples_for_training(tenant=team["tenant"]) == []
    response = api_as(team["admin"]).post(f"/api/review/samples/{sample.pk}/approve/",
                                          {"reason": "genuine correction"})
    assert response.status_code == 200
    assert [s.pk for s in samples_for_training(tenant=team["tenant"])] == [sample.pk]
