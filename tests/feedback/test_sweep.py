"""The judge sweep: a turn whose judge task was never published is judged later, by the beat schedule."""

from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from clawhub.conversations.models import Turn
from clawhub.feedback.models import Judgment
from tests.feedback.conftest import capture_exchange
from workers.celery import app
from workers.tasks import judging

pytestmark = pytest.mark.django_db


@pytest.fixture
def published(monkeypatch):
    """Sending judge_turn (by name, as every sender does) as the broker would run it, or failing like a broker
    that is down."""
    state = {"broker_down": False, "published": []}
    send_task = app.send_task

    def send(name, args=None, kwargs=None, **options):
        if name != judging.judge_turn.name:
            return send_task(name, args=args, kwargs=kwargs, **options)
        if state["broker_down"]:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        state["published"].append(args[0])
        return judging.judge_turn.apply(args=args)

    monkeypatch.setattr(app, "send_task", send)
    return state


def test_a_turn_whose_judge_publish_failed_is_judged_by_the_sweep(key, published, settings,
                                                                   django_capture_on_commit_callbacks):
    settings.CLAWHUB_JUDGE = "rule"
    published["broker_down"] = True
    with django_capture_on_commit_callbacks(execute=True):
        turn = capture_exchange(key, "That's wrong, I said no bold text.")[0]
    assert turn.next_state is not None and not Judgment.objects.filter(turn=turn).exists()
    published["broker_down"] = False

    # Not yet: a task may still be on its way within the bound.
    settings.CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS = 900
    assert judging.sweep_unjudged.apply().get() == 0
    # Past the bound the beat's sweep finds it and judges it.
    Turn.objects.filter(pk=turn.pk).update(next_state_at=timezone.now() - timedelta(seconds=901))
    assert judging.sweep_unjudged.apply().get() == 1
    judgment = Judgment.objects.get(turn=turn)
    assert judgment.status == Judgment.Status.OK and judgment.reward == -1
    # Judged turns are left alone; a second sweep enqueues nothing.
    assert judging.sweep_unjudged.apply().get() == 0
    assert published["published"] == [turn.pk]


def test_closed_turns_without_a_next_state_are_swept_too(key, published, settings):
    settings.CLAWHUB_JUDGE = "rule"
    turn = capture_exchange(key, None)[0]
    assert judging.sweep_unjudged.apply().get() == 0  # open: not ready for judging
    Turn.objects.filter(pk=turn.pk).update(closed_without_next=True)
    turn.session.__class__.objects.filter(pk=turn.session_id).update(
        closed_at=timezone.now() - timedelta(hours=1))
    assert judging.sweep_unjudged.apply().get() == 1
    assert Judgment.objects.filter(turn=turn).count() == 1


def test_the_sweep_runs_on_the_beat_schedule():
    entry = next(e for e in app.conf.beat_schedule.values() if e["task"] == "clawhub.judge.sweep")
    assert entry["schedule"] <= 900 and entry["options"]["queue"] == "judge"
