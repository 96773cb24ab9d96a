"""Explicit feedback through the REST API: each kind, who may rate, rating again, and what training gets."""
# The review tests' fixtures (api_as, team) are imported, so test arguments shadow them by design.
# ruff: noqa: F811

import pytest
from rest_framework.test import APIClient

from clawhub.accounts.models import AuditLog
from clawhub.feedback.models import ExplicitFeedback, Judgment
from clawhub.feedback.services import judgment_store
from clawhub.review.models import Sample
from clawhub.review.services import sample_approve, sample_follow_judge
from clawhub.tenants.access import review_access
from clawhub.training import services as training
from clawhub.training.models import TrainingSettings
from clawhub.training.selectors import samples_of_run
from tests.factories import make_key
from tests.review.conftest import (  # noqa: F401  (fixtures)
    ApiAs,
    api_as,
    make_judgment,
    make_sample,
    make_turn,
    old_key,
    team,
)
from workers.tasks.training import train_sample

pytestmark = pytest.mark.django_db


def url(turn_id: int) -> str:
    return f"/api/turns/{turn_id}/feedback/"


@pytest.fixture
def me(db):
    from tests.factories import make_user

    return make_user()


@pytest.fixture
def judged(me):
    """An approved sample of one of ``me``'s turns that the judge scored +1."""
    sample = make_sample(me, key=old_key(me), reward=1)
    assert sample.state == Sample.State.APPROVED
    return sample


def rate(api_as, user, turn_id, **body):
    return api_as(user).post(url(turn_id), body)


def test_thumb_down_with_comment_outranks_the_judge_and_both_are_kept(me, judged, api_as):
    response = rate(api_as, me, judged.turn_id, thumb="down", comment="Too long; answer in one line.")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["thumb"] == "down" and body["reward"] == -1 and body["source"] == "api"
    assert body["completion_id"] == f"chatcmpl-{judged.turn.request_id}"
    assert body["judge"]["reward"] == 1 and body["judge"]["votes"] == [1, 1, 1]  # the judge's vote stays
    assert body["sample"]["reward"] == -1 and body["sample"]["has_hint"] is True
    judged.refresh_from_db()
    assert judged.reward == -1 and judged.judgment.reward == 1
    # A rating against the judge waits for a human, even under the personal "auto" policy.
    assert judged.state == Sample.State.PENDING and "explicit_overrides_judge" in judged.flag_codes
    assert train_sample(judged).hints == ["Too long; answer in one line."]
    assert AuditLog.objects.filter(action="feedback.rate", actor=me).count() == 1


@pytest.mark.parametrize(("fields", "reward"), [
    ({"thumb": "up"}, 1), ({"score": 1}, -1), ({"score": 2}, -1), ({"score": 3}, 0), ({"score": 5}, 1),
])
def test_thumbs_and_scores_set_the_reward(me, api_as, fields, reward):
    sample = make_sample(me, key=old_key(me), reward=-1, hints=["Be brief."])
    response = rate(api_as, me, sample.turn_id, **fields)
    assert response.status_code == 201, response.content
    sample.refresh_from_db()
    assert response.json()["reward"] == reward and sample.reward == reward
    # No comment: the judge's hint is still the one the trainer ranks.
    assert train_sample(sample).hints == ["Be brief."]


def test_a_comment_alone_keeps_the_judges_reward_and_becomes_the_hint(me, judged, api_as):
    response = rate(api_as, me, judged.turn_id, comment="Use a table next time.")
    assert response.status_code == 201 and response.json()["reward"] is None
    judged.refresh_from_db()
    assert judged.reward == 1 and judged.state == Sample.State.APPROVED and judged.has_hint
    assert train_sample(judged).hints == ["Use a table next time."]


def test_a_demonstration_trains_the_corrected_reply(me, judged, api_as):
    response = rate(api_as, me, judged.turn_id, thumb="down", demonstration="Apple, pear, plum.")
    assert response.status_code == 201, response.content
    judged.refresh_from_db()
    train = train_sample(judged)
    assert train.response_text == "Apple, pear, plum."
    assert train.response_token_ids is None and train.response_logprobs is None  # never sampled: re-rendered
    assert train.reward == 1 and "demonstration" in train.source
    # The teacher context carries the corrected reply: its target is that reply.
    assert len(train.hints) == 1 and "Apple, pear, plum." in train.hints[0]


def test_rating_twice_updates_the_same_feedback(me, judged, api_as):
    first = rate(api_as, me, judged.turn_id, thumb="down", comment="wrong")
    second = rate(api_as, me, judged.turn_id, thumb="up")
    assert (first.status_code, second.status_code) == (201, 200)
    assert ExplicitFeedback.objects.filter(turn_id=judged.turn_id).count() == 1
    feedback = ExplicitFeedback.objects.get(turn_id=judged.turn_id)
    assert feedback.thumb == "up" and feedback.comment == "wrong"  # fields left out keep their value
    judged.refresh_from_db()
    assert judged.reward == 1 and "explicit_overrides_judge" not in judged.flag_codes
    cleared = rate(api_as, me, judged.turn_id, comment=None)
    assert cleared.status_code == 200 and cleared.json()["comment"] == ""
    assert api_as(me).get(url(judged.turn_id)).json()["thumb"] == "up"


def test_bad_feedback_is_a_clear_400(me, judged, api_as):
    for body, code in (({}, "empty_feedback"), ({"score": 9}, "invalid"), ({"thumb": "sideways"}, "invalid"),
                       ({"thumb": "up", "score": 1}, "contradictory_feedback")):
        response = rate(api_as, me, judged.turn_id, **body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["error"]["code"] == code, body
    # A request that agrees in itself but not with the feedback stored: the turn's state, 409.
    assert rate(api_as, me, judged.turn_id, thumb="down").status_code == 201
    response = rate(api_as, me, judged.turn_id, score=5)
    assert response.status_code == 409 and response.json()["error"]["code"] == "contradictory_feedback"
    assert ExplicitFeedback.objects.get(turn_id=judged.turn_id).score is None  # nothing stored changed
    side = make_turn(me, turn_type="side")
    response = rate(api_as, me, side.pk, thumb="up")
    assert response.status_code == 400 and response.json()["error"]["code"] == "side_turn"
    assert not ExplicitFeedback.objects.filter(turn=side).exists()


def test_a_playground_turn_becomes_a_sample_only_once_rated(me, api_as):
    from clawhub.review.services import sample_create_for_judgment

    turn = make_turn(me, key=old_key(me), turn_type="playground", next_text=None)
    # Were a judgment ever stored for it (the judge never runs on one), it would still teach nothing unrated.
    assert sample_create_for_judgment(judgment_id=make_judgment(turn, reward=1).pk) is None
    assert not Sample.objects.filter(turn=turn).exists()
    response = rate(api_as, me, turn.pk, thumb="down", comment="Shorter, please.")
    assert response.status_code == 201, response.content
    sample = Sample.objects.get(turn=turn)
    assert sample.reward == -1  # pending: the rating contradicts the judgment above, a flag for review


def test_nobody_rates_another_tenants_turn(me, judged, api_as):
    from tests.factories import make_user

    stranger = make_user()
    response = rate(api_as, stranger, judged.turn_id, thumb="down")
    assert response.status_code == 404
    assert api_as(stranger).get(url(judged.turn_id)).status_code == 404
    judged.refresh_from_db()
    assert judged.reward == 1 and not ExplicitFeedback.objects.exists()


def test_in_a_group_members_rate_their_own_turns_and_admins_any(team, api_as):
    sample = make_sample(team["author"], key=team["author_key"], reward=1)
    assert rate(api_as, team["member"], sample.turn_id, thumb="down").status_code == 404
    assert rate(api_as, team["viewer"], sample.turn_id, thumb="down").status_code == 404
    assert rate(api_as, team["author"], sample.turn_id, thumb="up").status_code == 201
    assert rate(api_as, team["admin"], sample.turn_id, thumb=None, score=2).status_code == 200
    assert ExplicitFeedback.objects.get(turn_id=sample.turn_id).rated_by == team["admin"]


def test_a_key_needs_the_admin_scope_to_rate_on_the_rest_api(me, judged):
    read_only = make_key(me, scopes=["read"])[1]
    admin = make_key(me, scopes=["admin"])[1]
    client = APIClient()
    refused = client.post(url(judged.turn_id), {"thumb": "down"}, format="json",
                          HTTP_AUTHORIZATION=f"Bearer {read_only}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
    assert not ExplicitFeedback.objects.exists()
    assert client.get(url(judged.turn_id), HTTP_AUTHORIZATION=f"Bearer {read_only}").status_code == 404
    done = client.post(url(judged.turn_id), {"thumb": "down"}, format="json",
                       HTTP_AUTHORIZATION=f"Bearer {admin}")
    assert done.status_code == 201, done.content
    assert ExplicitFeedback.objects.get().key.scopes == ["inference", "admin"]


def test_an_explicit_rating_changes_the_reward_in_the_next_training_batch(me, judged, api_as):
    TrainingSettings.objects.create(tenant=me.tenant, method="rl", batch_size=1)
    assert rate(api_as, me, judged.turn_id, thumb="down", comment="No.").status_code == 201
    sample_approve(access=review_access(actor=me, tenant=judged.tenant), sample_id=judged.pk)
    run = training.run_start(tenant=me.tenant)
    batch = [train_sample(s) for s in samples_of_run(run=run)]
    assert [(t.sample_id, t.reward, t.hints) for t in batch] == [(judged.pk, -1, ["No."])]
    # Claimed by the run: its feedback can no longer change what that run trains.
    late = rate(api_as, me, judged.turn_id, thumb="up")
    assert late.status_code == 409 and late.json()["error"]["code"] == "sample_trained"


def test_a_turn_rated_before_the_judge_ran_gets_its_sample_and_then_the_judges_vote(me, api_as):
    turn = make_turn(me, key=old_key(me), next_text="ok")
    response = rate(api_as, me, turn.pk, thumb="down")
    assert response.status_code == 201 and response.json()["judge"]["status"] == "awaiting"
    sample = Sample.objects.get(turn=turn)
    assert sample.reward == -1 and sample.state == Sample.State.APPROVED  # nothing contradicts it yet
    judgment, stored = judgment_store(turn=turn, reward=1, votes=[1, 1, 1], hints=["Say more."], judge="rule",
                                      prompt_version="t", raw_outputs={})
    assert stored and judgment.status == Judgment.Status.OK and judgment.reward == 1
    sample_follow_judge(judgment_id=judgment.pk)  # what the judge task does next
    sample.refresh_from_db()
    # The person's -1 outranks the judge's +1, which is recorded, and now flags the sample for a human.
    assert sample.reward == -1 and sample.state == Sample.State.PENDING
    assert "explicit_overrides_judge" in sample.flag_codes


def test_training_switched_off_records_feedback_but_makes_no_sample(me, api_as):
    me.training_enabled = False
    me.save(update_fields=["training_enabled"])
    turn = make_turn(me, next_text="ok")
    make_judgment(turn, reward=1)
    assert rate(api_as, me, turn.pk, thumb="down").status_code == 201
    assert not Sample.objects.filter(turn=turn).exists()


def test_the_completion_id_is_the_one_the_client_was_served(me, judged, api_as):
    from clawhub.conversations.models import Turn

    # Claude Code's turn: served as chat, answered with a Messages id, which /v1/feedback takes back.
    Turn.objects.filter(pk=judged.turn_id).update(api="messages")
    body = rate(api_as, me, judged.turn_id, thumb="up").json()
    assert body["completion_id"] == f"msg_{judged.turn.request_id}"
