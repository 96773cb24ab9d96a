"""The pages that explain learning, through Django's test client: the conversation page per turn (judge, own
rating, review, version, run) with its filters and rating form; the learning page; a run's live progress."""

import pytest
from django.test import Client

from clawhub.adapters import services as adapter_services
from clawhub.adapters.evaluation import NOT_ENOUGH, PROMOTE, REJECT, Decision
from clawhub.feedback.models import ExplicitFeedback, JudgeRules
from clawhub.review.models import Sample
from clawhub.review.services import sample_approve
from clawhub.tenants.access import review_access
from clawhub.training import services as training
from clawhub.training.lineage_services import adapter_record_decision
from clawhub.training.models import TrainingSettings
from tests.factories import make_user
from tests.gateway.conftest import activate_adapter
from tests.review.conftest import make_judgment, make_sample, make_turn, old_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def me():
    return make_user()


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_conversation_page_explains_each_turn_and_rates_it(me):
    key = old_key(me)
    v1 = activate_adapter(me.tenant)
    good = make_sample(me, key=key, reward=1, hints=["Say which fruit is cheapest."])
    good.turn.adapter_version = v1
    good.turn.save(update_fields=["adapter_version"])
    bad = make_turn(me, key=key, next_text="That's wrong, redo it.")
    bad.session = good.turn.session
    bad.index = 1
    bad.save(update_fields=["session", "index"])
    make_judgment(bad, reward=-1, votes=[-1, -1, 1])
    client = browser(me)
    page = client.get(f"/conversations/{good.turn.session_id}/").content.decode()
    assert "+1 good" in page and "votes +1, +1, +1" in page and "Say which fruit is cheapest." in page
    assert ">v1</a>" in page and "the base model" in page  # who answered each turn
    assert "approved by the review policy" in page and "waiting for the next run" in page
    assert "not judged yet" not in page

    response = client.post(f"/conversations/turns/{good.turn_id}/feedback/",
                           {"thumb": "down", "comment": "Too chatty.", "score": ""})
    assert response.status_code == 302 and response["Location"].endswith(f"#turn-{good.turn_id}")
    feedback = ExplicitFeedback.objects.get(turn=good.turn)
    assert (feedback.thumb, feedback.comment, feedback.source) == ("down", "Too chatty.", "web")
    # The answer is shown in the rated turn, where the redirect scrolls, not at the top of the page.
    page = client.get(response["Location"]).content.decode()
    rated = page[page.index(f'id="turn-{good.turn_id}"'):page.index(f'id="turn-{bad.pk}"')]
    assert "Thanks: your feedback is recorded" in rated
    assert page.count("Thanks: your feedback is recorded") == 1
    good.refresh_from_db()
    assert good.state == Sample.State.PENDING and good.reward == -1
    sample_approve(access=review_access(actor=me, tenant=good.tenant), sample_id=good.pk,
                   reason="yes, too chatty")
    TrainingSettings.objects.create(tenant=me.tenant, batch_size=1)
    run = training.run_start(tenant=me.tenant)
    page = client.get(f"/conversations/{good.turn.session_id}/").content.decode()
    assert "thumb down" in page and "Too chatty." in page and "outranks the judge" in page
    assert f"approved by {me.email}" in page and "yes, too chatty" in page
    assert f"run #{run.pk}</a> (queued)" in page
    assert "explicit_overrides_judge" in page

    # Filters: by what training takes (reward), flags, and the version that answered.
    only = client.get(f"/conversations/{good.turn.session_id}/", {"reward": "-1"}).content.decode()
    assert f'id="turn-{good.turn_id}"' in only and f'id="turn-{bad.pk}"' in only
    flagged = client.get(f"/conversations/{good.turn.session_id}/", {"flag": "any"}).content.decode()
    assert f'id="turn-{good.turn_id}"' in flagged and f'id="turn-{bad.pk}"' not in flagged
    by_v1 = client.get(f"/conversations/{good.turn.session_id}/", {"version": "1"}).content.decode()
    assert f'id="turn-{good.turn_id}"' in by_v1 and f'id="turn-{bad.pk}"' not in by_v1
    assert "1 of 2 turns" in by_v1

    # Another user can neither see nor rate it.
    stranger = browser(make_user())
    assert stranger.post(f"/conversations/turns/{bad.pk}/feedback/", {"thumb": "up"}).status_code == 404
    assert not ExplicitFeedback.objects.filter(turn=bad).exists()


def _decide(version, outcome, delta, low, high):
    adapter_record_decision(version=version, decision=Decision(
        outcome, f"margin {delta:+.3f}", {"confidence": 0.9, "held_out": 12,
                                          "margin": {"delta": delta, "low": low, "high": high}}))
    version.refresh_from_db()
    return version


def test_the_learning_page_answers_from_the_gate_the_judged_days_and_the_timeline(me):
    for reward in (1, 1, -1):
        make_sample(me, key=old_key(me), reward=reward)
    v1 = _decide(adapter_services.adapter_version_create(tenant=me.tenant, parent=None), NOT_ENOUGH,
                 0.05, -0.1, 0.2)
    adapter_services.adapter_activate(version=v1, upstreams=[])
    v2 = _decide(adapter_services.adapter_version_create(tenant=me.tenant, parent=v1), REJECT,
                 -0.3, -0.4, -0.2)
    v3 = _decide(adapter_services.adapter_version_create(tenant=me.tenant, parent=v1), PROMOTE,
                 0.22, 0.18, 0.27)
    adapter_services.adapter_activate(version=v3, upstreams=[])
    adapter_services.adapter_activate(version=v1, upstreams=[], reason="rollback", actor=me)
    assert v2.state == "rejected"

    page = browser(me).get("/learning/", follow=True).content.decode()
    assert "Is my model getting better?" in page
    assert "Yes: v3 made the replies you liked likelier" in page and "[+0.180, +0.270]" in page
    assert "[-0.400, -0.200]" in page and "<svg" in page and "Preference margin vs the parent" in page
    assert "67 %" in page  # two of the three judged turns were positive
    for event in ("promoted", "rolled back to", "gate: reject", "trained"):
        assert event in page
    assert browser(make_user()).get(f"/learning/{me.tenant.pk}/").status_code == 404


def test_the_learning_page_says_which_judge_scores_the_turns_and_why(me, settings):
    settings.CLAWHUB_JUDGE = "rule"
    page = browser(me).get(f"/learning/{me.tenant.pk}/").content.decode()
    assert "The <strong>rule judge</strong>" in page and "72 of 72" in page and "/api/judge-rules/" in page
    JudgeRules.objects.create(tenant=me.tenant, judge=JudgeRules.Backend.LLM)  # the tenant's own choice wins
    page = browser(me).get(f"/learning/{me.tenant.pk}/").content.decode()
    assert "language model judge" in page and "rule judge" not in page


def test_a_runs_progress_says_where_it_is_and_what_comes_next(me):
    for _ in range(2):
        make_sample(me, key=old_key(me), reward=1)
    TrainingSettings.objects.create(tenant=me.tenant, batch_size=2, overrides={"mini_batches": 4})
    run = training.run_start(tenant=me.tenant)
    client = browser(me)

    def progress():
        return client.get(f"/training/runs/{run.pk}/progress/").json()

    assert progress()["phase"] == "queued" and progress()["done"] is False and progress()["open"] is True
    assert 'class="run-live' in client.get(f"/training/runs/{run.pk}/").content.decode()
    assert 'class="run-live' in client.get(f"/training/{me.tenant.pk}/").content.decode()
    training.run_mark_running(run_id=run.pk, task_id="t")
    training.run_record_step(run_id=run.pk, metrics={"step": 1, "loss": 0.5, "mean_reward": 1.0,
                                                     "mean_advantage": 1.0, "tokens": 10, "seconds": 1.0,
                                                     "samples": 1})
    now = progress()
    assert (now["phase"], now["step"], now["loss"], now["samples"]) == ("training", 1, 0.5, 2)
    assert now["planned_steps"] and 0 < now["percent"] < 100 and "promotion gate" in now["next"]
    version = adapter_services.adapter_version_create(tenant=me.tenant, parent=None)
    training.run_attach_version(run=run, version=version)
    training.run_succeed(run_id=run.pk, metrics=[], trained_sample_ids=[], dropped=[], resumed_from_step=None)
    assert progress()["phase"] == "evaluating" and progress()["percent"] == 100
    adapter_services.adapter_activate(version=version, upstreams=[])
    done = progress()
    assert done["phase"] == "serving" and done["done"] is True and "v1 is promoted" in done["next"]
    assert done["open"] is False  # the page hides its Cancel button
    assert browser(make_user()).get(f"/training/runs/{run.pk}/progress/").status_code == 404


def test_the_run_page_draws_the_loss_and_the_reward_of_each_step_it_stored(me):
    from tests.factories import make_run

    run = make_run(me.tenant, started_by=me)
    client = browser(me)
    assert 'id="run-curves"' not in client.get(f"/training/runs/{run.pk}/").content.decode()  # no step yet
    training.run_mark_running(run_id=run.pk, task_id="t")
    for step, loss, reward in ((1, 0.52, -0.5), (2, 0.31, 0.25), (3, 0.12, 1.0)):
        metrics = {"step": step, "loss": loss, "mean_reward": reward, "mean_advantage": reward, "tokens": 10,
                   "seconds": 1.0, "samples": 2}
        training.run_record_step(run_id=run.pk, metrics=metrics)
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    curves = html[html.index('id="run-curves"'):]
    assert curves.count('class="step-chart"') == 2
    assert "loss over 3 steps: from 0.52 at step 1 to 0.12 at step 3" in curves
    assert "mean reward over 3 steps: from -0.5 at step 1 to 1 at step 3" in curves
    assert "<title>step 2: loss 0.31</title>" in curves
