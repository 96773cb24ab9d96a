"""Every gate decision and its numbers appear on the version's page."""

from clawhub.adapters import services
from clawhub.adapters.evaluation import NOT_ENOUGH, REJECT, Decision
from clawhub.adapters.models import AdapterVersion
from clawhub.training.lineage_services import adapter_record_decision
from tests.adapters.conftest import make_version
from tests.factories import make_user


def page(client, user) -> str:
    client.force_login(user)
    response = client.get(f"/adapters/{user.tenant.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_decisions_reasons_and_numbers_are_on_the_version_page(db, client):
    user = make_user()
    v1 = make_version(user.tenant, 1)
    services.adapter_evaluation_start(version=v1)
    adapter_record_decision(
        version=v1,
        decision=Decision(NOT_ENOUGH, "not enough evidence yet: 1 positive and 0 negative held-out turns; "
                          "promoted because every safety check that could run passed: …",
                          {"held_out": 1, "positives": 1, "negatives": 0, "hinted": 0, "confidence": 0.9,
                           "safety": [{"check": "perplexity", "passed": True,
                                       "detail": "corpus perplexity 4.80 -> 4.82 (at most x1.1)"},
                                      {"check": "liked replies", "passed": None,
                                       "detail": "1 positively judged held-out replies: too few to check"}]}),
    )
    v2 = make_version(user.tenant, 2, parent=v1, metrics={"optimizer_resumed_at": 3})
    services.adapter_evaluation_start(version=v2)
    numbers = {
        "held_out": 9, "positives": 5, "negatives": 4, "hinted": 3, "confidence": 0.9,
        "margin": {"delta": -0.25, "low": -0.4, "high": -0.1},
        "accuracy": {"candidate": 0.4, "parent": 0.6},
        "kl": {"delta": 0.05, "away": 0.01, "low": -0.01, "high": 0.03, "tolerance": 0.02},
        "canary": {
            "empty": {"candidate": 0.0, "parent": 0.0},
            "repetition": {"candidate": 0.1, "parent": 0.05},
            "perplexity": {"candidate": 5.1, "parent": 4.8},
        },
    }
    adapter_record_decision(
        version=v2, decision=Decision(REJECT, "the preference margin fell: delta -0.250", numbers)
    )
    assert AdapterVersion.objects.get(pk=v2.pk).state == AdapterVersion.State.REJECTED
    html = page(client, user)
    assert "promote: not enough evidence yet" in html and "1 positive and 0 negative" in html
    assert "promoted because every safety check that could run passed" in html
    assert "passed: corpus perplexity 4.80 -&gt; 4.82 (at most x1.1)" in html
    assert "not checked: 1 positively judged held-out replies: too few to check" in html
    assert "the preference margin fell" in html
    assert "-0.250 nats/token" in html and "[-0.400, -0.100]" in html  # the margin and its interval
    assert "repeated 3-grams 0.10" in html and "corpus perplexity 5.10" in html
    assert "optimizer continued from step 3" in html


def test_a_candidate_that_forgot_facts_is_refused_in_words_on_the_version_page(db, client):
    """The capability questions (real models): the reason says how many the candidate answers against the
    base model, the bound, and which it no longer answers; the numbers list them."""
    from clawhub.adapters.evaluation import decide

    def scores(missed: list[str]) -> dict:
        return {"logprob": {}, "kl": {}, "away": {}, "canaries": [], "empty": 0.0, "repetition": 0.0,
                "perplexity": 3.0, "capability": {"right": 42 - len(missed), "asked": 42, "missed": missed}}

    forgotten = ["What is the capital of Japan?", "What do bees make?", "Who painted the Mona Lisa?"]
    base = scores(["What is 2 plus 2?"])
    decision = decide(candidate=scores(["What is 2 plus 2?", *forgotten]), parent=base, rewards={},
                      min_samples=6, confidence=0.9, resamples=100)
    assert decision.outcome == REJECT
    user = make_user()
    v1 = make_version(user.tenant, 1)
    services.adapter_evaluation_start(version=v1)
    adapter_record_decision(version=v1, decision=decision)
    html = page(client, user)
    assert ("the update made the model forget what the base model knows: it answers 38 of 42 fixed factual "
            "questions right, the base model 41 (at most 2 fewer allowed); it no longer answers "
            "&quot;What is the capital of Japan?&quot;; &quot;What do bees make?&quot;") in html
    assert "38 of 42 right (parent 41, base model 41; at most 2 fewer than the base model)" in html
    assert "<li>Who painted the Mona Lisa?</li>" in html
    assert "reference-answer perplexity 3.00" in html
