"""The judge task: one judgment per turn, idempotent, retries only transient errors, never side turns."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.conversations import hooks
from clawhub.conversations.models import Session, Turn
from clawhub.feedback.models import Judgment
from clawhub.feedback.services import judge_rules_set
from tests.feedback.conftest import capture_exchange
from tests.judge.fake_openai import FakeOpenAI, prm_or_hint
from workers.celery import app
from workers.judge import RuleJudge, TransientJudgeError
from workers.tasks import judging
from workers.tasks.judging import close_idle_sessions, judge_turn

pytestmark = pytest.mark.django_db

HINT = "[HINT_START]Answer in plain text without any bold markup.[HINT_END] \\boxed{1}"


@pytest.fixture
def llm_settings(settings):
    """Points the LLM judge at a fake server, no retries inside a request (failures reach the task)."""

    def use(server: FakeOpenAI, http_retries: int = 0):
        settings.CLAWHUB_JUDGE = "llm"
        settings.CLAWHUB_JUDGE_BASE_URL = server.base_url
        settings.CLAWHUB_JUDGE_MODEL = "tiny"
        settings.CLAWHUB_JUDGE_HTTP_RETRIES = http_retries
        settings.CLAWHUB_JUDGE_TASK_RETRY_DELAY = 0

    return use


def test_task_stores_one_judgment_from_the_rule_judge(judged_turn, settings):
    settings.CLAWHUB_JUDGE = "rule"
    outcome = judge_turn.apply(args=[judged_turn.pk]).get()
    judgment = Judgment.objects.get(turn=judged_turn)
    assert outcome == {"turn": judged_turn.pk, "outcome": "judged", "judgment": judgment.pk, "reward": -1}
    assert judgment.tenant_id == judged_turn.tenant_id
    assert (judgment.reward, judgment.votes, judgment.status) == (-1, [-1, -1, -1], Judgment.Status.OK)
    assert judgment.judge == "rule" and judgment.prompt_version.startswith("rules-")
    assert len(judgment.raw_outputs["prm"]) == 3
    assert any("I said no bold text." in h for h in judgment.hints)
    assert judgment.attempts == 1


def test_delivered_twice_stores_one_judgment(judged_turn):
    first = judge_turn.apply(args=[judged_turn.pk]).get()
    second = judge_turn.apply(args=[judged_turn.pk]).get()
    assert Judgment.objects.filter(turn=judged_turn).count() == 1
    assert second == {"turn": judged_turn.pk, "outcome": "exists", "judgment": first["judgment"]}


def test_review_gets_each_new_judgment_once(judged_turn, monkeypatch):
    handed = []
    monkeypatch.setattr(judging, "_hand_to_review", handed.append)
    judge_turn.apply(args=[judged_turn.pk])
    judge_turn.apply(args=[judged_turn.pk])
    assert handed == [Judgment.objects.get(turn=judged_turn).pk]


def test_review_failure_leaves_no_judgment(judged_turn, monkeypatch):
    # The judgment and the review hand-off commit together, so a redelivered task does both again.
    def broken(judgment_id):
        raise RuntimeError("review is down")

    monkeypatch.setattr(judging, "_hand_to_review", broken)
    with pytest.raises(RuntimeError):
        judge_turn.apply(args=[judged_turn.pk], throw=True)
    assert not Judgment.objects.filter(turn=judged_turn).exists()


def test_llm_judge_through_the_task(judged_turn, llm_settings):
    with FakeOpenAI(prm_or_hint("(b) a correction \\boxed{-1}", HINT)) as server:
        llm_settings(server)
        judge_turn.apply(args=[judged_turn.pk])
    judgment = Judgment.objects.get(turn=judged_turn)
    assert (judgment.reward, judgment.judge, judgment.prompt_version) == (-1, "llm", "v1")
    assert judgment.hints == ["Answer in plain text without any bold markup."]
    assert judgment.raw_outputs["hint"] == [HINT] and judgment.raw_outputs["hint_votes"] == [1]
    assert server.requests[0]["model"] == "tiny"
    assert "I said no bold text." in server.requests[0]["messages"][0]["content"]


def test_transient_judge_failure_is_retried(judged_turn, llm_settings):
    with FakeOpenAI(prm_or_hint("\\boxed{1}", HINT)) as server:
        llm_settings(server)
        server.fail_next = [503]  # the first attempt's first request
        outcome = judge_turn.apply(args=[judged_turn.pk]).get()
    judgment = Judgment.objects.get(turn=judged_turn)
    assert outcome["outcome"] == "judged"
    assert (judgment.status, judgment.reward, judgment.attempts) == (Judgment.Status.OK, 1, 2)


def test_retries_are_bounded_then_the_failure_is_recorded(judged_turn, llm_settings):
    with FakeOpenAI() as server:
        llm_settings(server)
        server.fail_next = [503] * 50
        outcome = judge_turn.apply(args=[judged_turn.pk]).get()
    judgment = Judgment.objects.get(turn=judged_turn)
    assert outcome["outcome"] == "failed"
    assert (judgment.status, judgment.attempts) == (Judgment.Status.FAILED, 4)  # first try + max_retries 3
    assert "503" in judgment.error
    # A failed judgment does not block a later, successful one.
    with FakeOpenAI() as server:
        llm_settings(server)
        judge_turn.apply(args=[judged_turn.pk])
    judgment.refresh_from_db()
    assert (judgment.status, judgment.reward, judgment.error) == (Judgment.Status.OK, 1, "")


def test_a_refusal_is_not_retried(judged_turn, llm_settings):
    with FakeOpenAI() as server:
        llm_settings(server, http_retries=3)
        server.fail_next = [400] * 10
        judge_turn.apply(args=[judged_turn.pk])
    judgment = Judgment.objects.get(turn=judged_turn)
    assert (judgment.status, judgment.attempts) == (Judgment.Status.FAILED, 1)


def test_transient_error_from_any_judge_triggers_celery_retry(judged_turn, monkeypatch):
    calls = []

    class Flaky:
        name, prompt_version = "llm", "v1"

        def judge(self, inp):
            calls.append(inp)
            if len(calls) < 3:
                raise TransientJudgeError("connection refused")
            return RuleJudge().judge(inp)

    monkeypatch.setattr(judging, "judge_for_tenant", lambda tenant_id: Flaky())
    monkeypatch.setattr(judging.settings, "CLAWHUB_JUDGE_TASK_RETRY_DELAY", 0)
    judge_turn.apply(args=[judged_turn.pk])
    assert len(calls) == 3
    assert Judgment.objects.get(turn=judged_turn).attempts == 3


def test_side_turns_are_never_judged(key):
    side = capture_exchange(key, "thanks", turn_type="side", session_id="s-side")
    assert all(t.turn_type == Turn.Type.SIDE for t in side)
    Turn.objects.filter(pk=side[0].pk).update(next_state=[{"role": "user", "content": "thanks"}])
    assert judge_turn.apply(args=[side[0].pk]).get()["outcome"] == "side"
    assert not Judgment.objects.exists()


def test_turn_closed_without_next_state_gets_reward_zero(key):
    turn = capture_exchange(key, None, session_id="s-done", session_done=True)[0]
    assert turn.closed_without_next
    judge_turn.apply(args=[turn.pk])
    judgment = Judgment.objects.get(turn=turn)
    assert (judgment.reward, judgment.votes, judgment.hints) == (0, [], [])
    assert judgment.status == Judgment.Status.OK


def test_turn_not_ready_and_missing_turn_are_left_alone(key):
    waiting = capture_exchange(key, None)[0]
    assert judge_turn.apply(args=[waiting.pk]).get()["outcome"] == "not_ready"
    assert judge_turn.apply(args=[10**9]).get()["outcome"] == "missing"
    assert not Judgment.objects.exists()


def test_tenant_rules_drive_the_rule_judge(key):
    hint = "The user does not want **bold** text; write plain sentences."
    judge_rules_set(tenant=key.owner.tenant, actor=key.owner, negative_patterns=["no bold"],
                    hint_templates={"no bold": hint}, extend_defaults=False)
    turn = capture_exchange(key, "Looks fine, but no bold next time")[0]
    judge_turn.apply(args=[turn.pk])
    judgment = Judgment.objects.get(turn=turn)
    assert judgment.reward == -1
    assert judgment.hints == ["The user does not want **bold** text; write plain sentences."]


def test_tenant_can_choose_the_llm_judge(key, settings):
    settings.CLAWHUB_JUDGE = "rule"
    judge_rules_set(tenant=key.owner.tenant, actor=key.owner, judge="llm")
    turn = capture_exchange(key, "ok")[0]
    with FakeOpenAI(lambda prompt: "\\boxed{0}") as server:
        settings.CLAWHUB_JUDGE_BASE_URL = server.base_url
        judge_turn.apply(args=[turn.pk])
    assert Judgment.objects.get(turn=turn).judge == "llm"


def _judge_sends(monkeypatch, record, name=None):
    """Celery's send_task for the judge task (or ``name``), recorded as (args, queue the router picks) instead
    of sent."""
    def send_task(sent_name, args=None, kwargs=None, **options):
        assert sent_name == (name or judge_turn.name)
        record(list(args), app.amqp.router.route(options, sent_name)["queue"].name)

    monkeypatch.setattr(app, "send_task", send_task)


def test_hook_enqueues_one_task_per_turn_on_commit(key, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    _judge_sends(monkeypatch, lambda args, queue: sent.append((args, queue)))
    with django_capture_on_commit_callbacks(execute=True):
        turns = capture_exchange(key, "thanks!")
    assert sent == [([turns[0].pk], "judge")]


def test_hook_inside_a_transaction_waits_for_the_commit(key, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    _judge_sends(monkeypatch, lambda args, queue: sent.append(args))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        hooks.on_turn_ready_for_judging([1])
    assert sent == [] and len(callbacks) == 1


def test_turns_ready_together_go_as_one_message_that_a_judge_worker_fans_out(
        monkeypatch, django_capture_on_commit_callbacks):
    """Celery spends ~0.5 ms of CPU per message sent: the capture consumer sends one per batch, not one per
    turn."""
    monkeypatch.setattr(hooks, "FAN_OUT", 3)
    fan_outs = []
    _judge_sends(monkeypatch, lambda args, queue: fan_outs.append((args, queue)),
                 name=judging.judge_turns.name)
    with django_capture_on_commit_callbacks(execute=True):
        hooks.on_turn_ready_for_judging([11, 12, 13, 14])
    assert fan_outs == [([11, 12, 13], "judge"), ([14], "judge")]

    sent = []
    _judge_sends(monkeypatch, lambda args, queue: sent.append((args, queue)))
    assert judging.judge_turns.apply(args=[11, 12, 13]).get() == 3
    assert sent == [([11], "judge"), ([12], "judge"), ([13], "judge")]
    assert judging.judge_turns.acks_late and judging.judge_turns.reject_on_worker_lost


def test_close_idle_task_closes_sessions_and_hands_turns_to_judging(key, settings, monkeypatch,
                                                                    django_capture_on_commit_callbacks):
    sent = []
    _judge_sends(monkeypatch, lambda args, queue: sent.append(args[0]))
    turn = capture_exchange(key, None)[0]
    Session.objects.filter(pk=turn.session_id).update(last_activity_at=timezone.now() - timedelta(hours=2))
    settings.CONVERSATION_IDLE_TIMEOUT = timedelta(minutes=30)
    with django_capture_on_commit_callbacks(execute=True):
        assert close_idle_sessions.apply().get() == 1
    assert sent == [turn.pk]
    turn.refresh_from_db()
    assert turn.closed_without_next


def test_routes_and_beat_schedule():
    assert app.amqp.router.route({}, "clawhub.judge.turn")["queue"].name == "judge"
    assert app.amqp.router.route({}, "clawhub.judge.turns")["queue"].name == "judge"
    assert app.amqp.router.route({}, "clawhub.train.run")["queue"].name == "train"
    entry = app.conf.beat_schedule["close-idle-sessions"]
    assert entry["task"] == "clawhub.conversations.close_idle" and entry["schedule"] == 60.0
    assert close_idle_sessions.queue == "judge"
    assert judge_turn.acks_late and judge_turn.reject_on_worker_lost and judge_turn.max_retries == 3


def test_judged_turn_becomes_a_review_sample(judged_turn):
    from django.apps import apps

    if not apps.is_installed("clawhub.review"):
        pytest.skip("the review app is not installed")
    from clawhub.review.models import Sample

    judge_turn.apply(args=[judged_turn.pk])
    judge_turn.apply(args=[judged_turn.pk])
    judgment = Judgment.objects.get(turn=judged_turn)
    assert Sample.objects.filter(judgment=judgment).count() == 1


def test_a_turn_rated_before_the_judge_ran_takes_the_judges_reward_through_the_task(judged_turn, settings):
    from django.apps import apps

    if not apps.is_installed("clawhub.review"):
        pytest.skip("the review app is not installed")
    from clawhub.review.models import Sample
    from clawhub.review.services import feedback_submit

    settings.CLAWHUB_JUDGE = "rule"
    # A comment alone leaves the reward to the judge, which has not run yet.
    feedback_submit(actor=judged_turn.user, turn=judged_turn, source="api", comment="Plain text, please.")
    sample = Sample.objects.get(turn=judged_turn)
    assert sample.reward == 0
    judge_turn.apply(args=[judged_turn.pk])
    sample.refresh_from_db()
    assert Judgment.objects.get(turn=judged_turn).reward == -1 and sample.reward == -1
    assert Sample.objects.filter(turn=judged_turn).count() == 1
