"""What the learning pages say must agree with what they list: the learning page's verdict with its gate
table, a turn's review line with its sample's state and the user's own correction, the dashboard's "learned
from" counts with what the run trained on (not what it held out to check the version)."""

import re

import pytest
from django.test import Client

from clawhub.adapters import services as adapter_services
from clawhub.adapters.evaluation import NOT_ENOUGH, REJECT, Decision
from clawhub.privacy.services import sample_delete_own
from clawhub.review.models import Sample
from clawhub.review.services import feedback_submit
from clawhub.training.lineage_services import adapter_record_decision
from tests.factories import make_run, make_user
from tests.review.conftest import make_sample, old_key

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def text(html: str) -> str:
    """The page as a reader sees it: no tags, one space between words, none before a comma."""
    return re.sub(r" ([,.)])", r"\1", " ".join(re.sub(r"<[^>]+>", " ", html).split()))


def _decided_without_a_margin(tenant, outcome: str, reason: str):
    version = adapter_services.adapter_version_create(tenant=tenant, parent=None)
    decision = Decision(outcome, reason, {"held_out": 1})  # too few held-out turns: no margin measured
    adapter_record_decision(version=version, decision=decision)
    version.refresh_from_db()
    return version


def test_a_version_promoted_without_a_measured_margin_is_not_called_ungated():
    me = make_user()
    make_sample(me, key=old_key(me), reward=1)
    version = _decided_without_a_margin(me.tenant, NOT_ENOUGH, "not enough evidence yet: 1 held-out turn; "
                                        "promoted because every safety check passed")
    adapter_services.adapter_activate(version=version, upstreams=[])
    page = text(browser(me).get(f"/learning/{me.tenant.pk}/").content.decode())
    assert "not_enough_evidence" in page  # the gate table lists v1's decision
    assert "no version has been through the promotion gate" not in page
    assert "Not measured yet: v1 passed the promotion gate without a measured change" in page
    assert "promoted because every safety check passed" in page


def test_a_version_rejected_without_a_measured_margin_is_a_no():
    me = make_user()
    make_sample(me, key=old_key(me), reward=1)
    _decided_without_a_margin(me.tenant, REJECT, "a canary generation degenerated")
    page = text(browser(me).get(f"/learning/{me.tenant.pk}/").content.decode())
    assert "No: the promotion gate rejected v1 (a canary generation degenerated)." in page
    assert "no version has been through the promotion gate" not in page


def _review_line(client, sample) -> str:
    html = client.get(f"/conversations/{sample.turn.session_id}/").content.decode()
    return text(re.search(r'<dd class="review-state">(.*?)</dd>', html, re.S).group(1))


def test_a_deleted_sample_does_not_say_it_trains():
    me = make_user()
    sample = make_sample(me, key=old_key(me), reward=1)
    client = browser(me)
    assert _review_line(client, sample).startswith("approved · trains with reward +1")
    sample_delete_own(actor=me, sample_id=sample.pk)
    line = _review_line(client, sample)
    assert line.startswith("deleted · never trained on") and "trains" not in line


def test_a_thumb_down_with_a_corrected_reply_says_why_it_trains_at_plus_one():
    me = make_user()
    sample = make_sample(me, key=old_key(me), reward=-1)
    feedback_submit(actor=me, turn=sample.turn, source="web", thumb="down",
                    demonstration="Apples are cheapest, at 2 euros a kilo.")
    sample.refresh_from_db()
    assert sample.reward == 1  # the correction is what trains, as a good reply
    line = _review_line(browser(me), sample)
    assert "trains with reward +1" in line
    assert "Your corrected reply is what trains, at +1, in place of the reply shown here" in line
    assert "the thumb down says this reply was wrong" in line


def test_the_dashboard_counts_only_what_a_run_trained_on():
    me = make_user()
    key = old_key(me)
    trained, corrected, held_out = (make_sample(me, key=key, reward=r) for r in (1, -1, -1))
    run = make_run(me.tenant, state="succeeded", sample_ids=[trained.pk, corrected.pk],
                   heldout_ids=[held_out.pk])
    Sample.objects.filter(pk__in=[trained.pk, corrected.pk, held_out.pk]).update(training_run=run)
    run.adapter_version = adapter_services.adapter_version_create(tenant=me.tenant, parent=None)
    run.save(update_fields=["adapter_version"])
    page = text(browser(me).get("/dashboard/").content.decode())
    assert "1 positive, 1 correction" in page and "1 corrections" not in page and "2 corrections" not in page
    assert "1 more held out to check it at the gate, not trained on" in page

    line = _review_line(browser(me), held_out)
    assert "held out to check a version, not trained on" in line and "trains" not in line


def test_the_rating_buttons_are_named_by_what_they_show():
    """A screen reader (and a voice command: "click Good") names a button by what sighted users read on it."""
    me = make_user()
    sample = make_sample(me, key=old_key(me), reward=1)
    html = browser(me).get(f"/conversations/{sample.turn.session_id}/").content.decode()
    buttons = re.findall(r'<button[^>]*aria-label="([^"]+)"[^>]*>(.*?)</button>', html, re.S)
    assert len(buttons) == 2
    for name, shown in buttons:
        assert name.startswith(text(shown).replace("▲", "").replace("▼", "").strip()), (name, shown)


def test_the_learning_page_compares_the_serving_version_with_its_parent_in_words_with_replies():
    """v2 against v1: the gate's figures as sentences, the canary replies before and after, and the user's own
    playground comparison of v2 with the base model (stored turns: nothing is generated for the page)."""
    from clawhub.adapters.evaluation import PROMOTE
    from clawhub.conversations.models import Turn
    from tests.review.conftest import make_turn

    me = make_user()
    v1 = adapter_services.adapter_version_create(tenant=me.tenant, parent=None)
    adapter_services.adapter_activate(version=v1, upstreams=[])
    v2 = adapter_services.adapter_version_create(tenant=me.tenant, parent=v1)
    numbers = {
        "confidence": 0.9, "held_out": 14, "positives": 8, "negatives": 6, "hinted": 3,
        "margin": {"delta": 0.21, "low": 0.08, "high": 0.33},
        "accuracy": {"candidate": 0.75, "parent": 0.5},
        "kl": {"delta": 0.01, "away": 0.004, "low": -0.01, "high": 0.012, "tolerance": 0.02},
        "canary": {"empty": {"candidate": 0.0, "parent": 0.25, "base": 0.0},
                   "repetition": {"candidate": 0.05, "parent": 0.1, "base": 0.04},
                   "perplexity": {"candidate": 9.1, "parent": 9.4, "base": 9.0}},
        "canaries": {"parent": ["Paris is the capital of Franceee"], "candidate": ["Paris is the capital."]},
    }
    adapter_record_decision(version=v2, decision=Decision(PROMOTE, "margin rose", numbers))
    adapter_services.adapter_activate(version=v2, upstreams=[])
    base, mine = (make_turn(me, prompt="Name a red fruit.", reply=reply, next_text=None,
                            turn_type="playground") for reply in ("A banana.", "A strawberry."))
    Turn.objects.filter(pk=base.pk).update(model="base")
    Turn.objects.filter(pk=mine.pk).update(session=base.session, index=1, model="clawhub-personal:v2",
                                           adapter_version=v2)

    page = text(browser(me).get(f"/learning/{me.tenant.pk}/").content.decode())
    for sentence in (
        "v2 against v1",
        "Scored on 14 of your judged turns that no version was trained on (8 with a reply you liked, 6 with "
        "one you corrected, 3 with a hint).",
        "Compared with v1, it makes the replies you liked likelier relative to the ones you corrected by "
        "+0.210 nats per token (90% interval +0.080 to +0.330): a clear gain.",
        "it rates the liked one likelier in 75% of pairs (v1: 50%).",
        "0% empty replies (v1 25%, the base model 0%)",
        "Paris is the capital of Franceee",
        "Paris is the capital.",
        "Name a red fruit. A banana. A strawberry.",
    ):
        assert sentence in page, sentence


def test_the_dashboard_and_the_learning_page_say_why_feedback_does_not_train():
    """Replies cut at max_tokens (never judged) and samples held for review: both pages say so, and what to
    do; a tenant that has cut replies judged is not told to change anything."""
    from clawhub.conversations.models import ConversationSettings, Turn
    from tests.review.conftest import make_turn

    me = make_user()
    key = old_key(me)
    for n in range(4):
        turn = make_turn(me, key=key, next_text="go on")
        if n:  # three of four stopped at the limit their client asked for
            Turn.objects.filter(pk=turn.pk).update(ended=Turn.Ended.LENGTH,
                                                   request={**turn.request, "max_tokens": 16})
    held = make_sample(me, key=key, reward=1, votes=[1, -1, 1])  # split votes: waits for a reviewer
    assert held.state == Sample.State.PENDING
    for url in ("/dashboard/", f"/learning/{me.tenant.pk}/"):
        page = text(browser(me).get(url).content.decode())
        assert ("Most replies stop at the token limit, so little is learned: 3 of the last 5 main turns "
                "ended on max_tokens (your client asks for at most 16 tokens).") in page, url
        assert "1 sample waits for review before it can train" in page, url
    assert "0 of 16 approved samples toward the next one, and 1 more waiting for review." in text(
        browser(me).get("/dashboard/").content.decode())
    ConversationSettings.objects.create(tenant=me.tenant, include_length_turns=True)
    assert "token limit" not in text(browser(me).get(f"/learning/{me.tenant.pk}/").content.decode())
