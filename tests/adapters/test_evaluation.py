"""The gate's decision rule on hand-written scores (clawhub.adapters.evaluation.decide: plain arithmetic, no
model): drift that compounds across versions is caught against the base model, and the promote task hands
the base model's numbers to the rule."""

import pytest

from clawhub.adapters import lineage_services
from clawhub.adapters.evaluation import NOT_ENOUGH, PROMOTE, REJECT, decide
from clawhub.adapters.models import AdapterVersion
from tests.adapters.conftest import make_version
from tests.factories import make_user
from workers.trainer.backend import TrainConfig

RULE = {"min_samples": 6, "confidence": 0.9, "resamples": 500}
# Three liked and three disliked held-out turns; every candidate below gains 0.2 nats/token on the liked ones:
# the margin rises, so only the degeneration rule can stop it.
REWARDS = {"p1": 1, "p2": 1, "p3": 1, "n1": -1, "n2": -1, "n3": -1}


def scores(perplexity: float, *, gain: float) -> dict:
    return {
        "logprob": {k: (gain if r > 0 else 0.0) + 0.01 * i for i, (k, r) in enumerate(REWARDS.items())},
        "kl": {}, "away": {}, "canaries": [], "empty": 0.0, "repetition": 0.02, "perplexity": perplexity,
    }


def test_drift_compounding_across_three_versions_is_caught_against_the_base():
    """Each version's corpus perplexity is x1.2 its parent's (within the per-parent bound, x1.5); v3's is
    x1.73 the base model's."""
    base = scores(10.0, gain=0.0)
    v1, v2, v3 = (scores(10.0 * 1.2**k, gain=0.2 * k) for k in (1, 2, 3))
    first = decide(candidate=v1, parent=base, base=None, rewards=REWARDS, **RULE)  # its parent is the base
    second = decide(candidate=v2, parent=v1, base=base, rewards=REWARDS, **RULE)
    third = decide(candidate=v3, parent=v2, base=base, rewards=REWARDS, **RULE)
    assert (first.outcome, second.outcome) == (PROMOTE, PROMOTE), (first.reason, second.reason)
    assert third.outcome == REJECT
    assert third.reason == ("perplexity on the model's own corpus rose from 10.00 to 17.28 against the base "
                            "model: drift compounded across versions")
    assert third.numbers["canary"]["perplexity"] == {
        "candidate": pytest.approx(17.28), "parent": pytest.approx(14.4), "base": 10.0}
    # Against its parent alone, v3 would have passed: this is what the base check adds.
    assert decide(candidate=v3, parent=v2, rewards=REWARDS, **RULE).outcome == PROMOTE


def test_canaries_that_drifted_into_repetition_are_caught_against_the_base():
    base = scores(10.0, gain=0.0)
    parent = {**scores(10.0, gain=0.1), "repetition": 0.12}
    candidate = {**scores(10.0, gain=0.3), "repetition": 0.2}  # +0.08 on its parent, +0.18 on the base
    decision = decide(candidate=candidate, parent=parent, base=base, rewards=REWARDS, **RULE)
    assert decision.outcome == REJECT and decision.reason.endswith("vs 2% for the base model)")


def test_the_promote_task_checks_the_candidate_against_the_base_model(db, monkeypatch, settings):
    """The train worker's gate (workers.tasks.promotion._gate) asks for the base model's numbers besides the
    parent's (canaries and perplexity only) and the rule reads them: v3 of the drift above is rejected."""
    import sys
    import types

    import workers.tasks.promotion as task

    user = make_user()
    v2 = make_version(user.tenant, 2, AdapterVersion.State.ACTIVE)
    v3 = make_version(user.tenant, 3, parent=v2)
    by_path = {None: scores(10.0, gain=0.0), v2.artifact_path: scores(14.4, gain=0.4),
               v3.artifact_path: scores(17.28, gain=0.6)}
    asked = {}

    class Scores:  # workers.trainer.gate.ModelScores as the task reads it
        def __init__(self, numbers):
            self.numbers, self.canaries = numbers, numbers["canaries"]

        def to_dict(self):
            return self.numbers

    def score_versions(*, adapters, fixed_only=(), max_seq_len, device, dtype, **_):
        asked.update(adapters=adapters, fixed_only=fixed_only, max_seq_len=max_seq_len, device=device,
                     dtype=dtype)
        return {name: Scores(by_path[path]) for name, path in adapters.items()}

    # The measuring module, replaced (importing it would import torch): the rule and the wiring are tested.
    fake = types.ModuleType("workers.trainer.gate")
    fake.score_versions = score_versions
    monkeypatch.setitem(sys.modules, "workers.trainer.gate", fake)
    monkeypatch.setattr(task, "train_sample", lambda s: s)
    monkeypatch.setattr(task, "heldout_samples", lambda **_: [
        type("Held", (), {"sample_id": k, "reward": r}) for k, r in REWARDS.items()])
    assert task._gate(v3) is False
    assert asked == {"adapters": {"candidate": v3.artifact_path, "parent": v2.artifact_path, "base": None},
                     "fixed_only": ("base",), "max_seq_len": TrainConfig().max_seq_len,  # training's: 32,768
                     "device": "auto", "dtype": "auto"}  # training's: the resident base's
    v3.refresh_from_db()
    assert v3.state == AdapterVersion.State.REJECTED
    assert "against the base model: drift compounded" in v3.decision_reason
    assert v3.metrics["eval"]["numbers"]["canary"]["perplexity"]["base"] == 10.0
    assert lineage_services.adapter_parent_is_current(version=v3)


def knowing(perplexity: float, *, gain: float, missed: int) -> dict:
    """scores() of a real model that answers all but `missed` of the 42 capability questions."""
    return {**scores(perplexity, gain=gain),
            "capability": {"right": 42 - missed, "asked": 42, "missed": [f"q{i}" for i in range(missed)]}}


def test_forgetting_that_adds_up_across_versions_is_caught_against_the_base():
    """Each version answers two capability questions fewer than its parent (within the bound, 2 of 42); v2
    answers four fewer than the base model. Its gain on the tenant's turns does not buy that back."""
    base = knowing(10.0, gain=0.0, missed=0)
    v1, v2 = knowing(10.0, gain=0.2, missed=2), knowing(10.0, gain=0.4, missed=4)
    first = decide(candidate=v1, parent=base, base=None, rewards=REWARDS, **RULE)
    assert first.outcome == PROMOTE, first.reason
    assert first.numbers["capability"] | {"forgotten": None} == {
        "candidate": 40, "parent": 42, "base": 42, "asked": 42, "lost": 2, "bound": 2, "unproven_bound": 1,
        "forgotten": None}
    second = decide(candidate=v2, parent=v1, base=base, rewards=REWARDS, **RULE)
    assert second.outcome == REJECT
    assert second.reason == (
        "the update made the model forget what the base model knows: it answers 38 of 42 fixed factual "
        'questions right, the base model 42 (at most 2 fewer allowed); it no longer answers "q0"; "q1"; "q2"')


def test_without_a_measured_gain_a_candidate_may_lose_at_most_one_answer():
    base = knowing(10.0, gain=0.0, missed=0)
    for missed, outcome in ((1, NOT_ENOUGH), (2, REJECT)):
        decision = decide(candidate=knowing(10.0, gain=0.0, missed=missed), parent=base, rewards=REWARDS,
                          **RULE)
        assert decision.outcome == outcome, decision.reason
    assert decision.reason.endswith("a safety check failed: 40 of 42 fixed factual questions answered right, "
                                    "the base model 42 (at most 1 fewer)")
