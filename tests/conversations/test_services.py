"""The idle sweep: open sessions past the timeout close, and their waiting main turn goes to judging."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.conversations import hooks
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.services import session_close_idle
from tests.conversations.conftest import assistant, make_record, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def judged(monkeypatch):
    calls: list[list[int]] = []
    monkeypatch.setattr(hooks, "on_turn_ready_for_judging", lambda ids: calls.append(list(ids)))
    return calls


def _age(session_external_id: str, minutes: int) -> None:
    Session.objects.filter(external_id=session_external_id).update(
        last_activity_at=timezone.now() - timedelta(minutes=minutes)
    )


def test_idle_sessions_close_and_their_last_main_turn_goes_to_judging(
    key, judged, settings, django_capture_on_commit_callbacks
):
    settings.CONVERSATION_IDLE_TIMEOUT = timedelta(minutes=30)
    stale = [
        make_record(key, [user("a")], reply="A", session_id="stale"),
        make_record(key, [user("a"), assistant("A"), user("b")], reply="B", session_id="stale"),
        make_record(key, [user("ping")], session_id="stale", turn_type="side"),
    ]
    fresh = make_record(key, [user("c")], session_id="fresh")
    capture_store([*stale, fresh])
    _age("stale", 31)
    _age("fresh", 29)

    with django_capture_on_commit_callbacks(execute=True):
        assert session_close_idle() == 1

    closed = Session.objects.get(external_id="stale")
    assert closed.closed_at is not None and closed.close_reason == "idle"
    last_main = Turn.objects.get(request_id=stale[1].request_id)
    assert last_main.closed_without_next and last_main.next_state is None
    assert not Turn.objects.get(
        request_id=stale[2].request_id
    ).closed_without_next  # side turns are never judged
    assert judged == [[last_main.pk]]
    open_session = Session.objects.get(external_id="fresh")
    assert open_session.closed_at is None
    assert not Turn.objects.get(request_id=fresh.request_id).closed_without_next

    # A second sweep finds nothing more to do and hands nothing to judging again.
    with django_capture_on_commit_callbacks(execute=True):
        assert session_close_idle() == 0
    assert judged == [[last_main.pk]]


def test_the_timeout_is_an_argument_and_sweeps_run_in_batches(
    key, judged, django_capture_on_commit_callbacks
):
    capture_store([make_record(key, [user(f"q{i}")], session_id=f"s{i}") for i in range(5)])
    Session.objects.update(last_activity_at=timezone.now() - timedelta(minutes=10))
    assert session_close_idle(idle_for=timedelta(minutes=11)) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert session_close_idle(idle_for=timedelta(minutes=5), batch_size=2) == 5
    assert Session.objects.filter(closed_at__isnull=True).count() == 0
    assert sorted(i for call in judged for i in call) == sorted(Turn.objects.values_list("id", flat=True))


def test_a_session_with_a_linked_last_turn_closes_without_handing_anything(
    key, judged, django_capture_on_commit_callbacks
):
    capture_store([make_record(key, [user("a")], session_id="s", status="failed")])
    _age("s", 60)
    with django_capture_on_commit_callbacks(execute=True):
        assert session_close_idle() == 1
    assert judged == []
