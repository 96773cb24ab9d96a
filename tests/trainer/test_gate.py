"""The promotion gate on the tiny model: candidates trained with LocalBackend, scored by
workers.trainer.gate against the base model on held-out judged turns (never trained on), decided by
clawhub.adapters.evaluation.decide. A candidate trained on the tenant's feedback passes, one trained on
inverted rewards is rejected, one collapsed to repetition is rejected, and too little held-out data says
so."""

import pytest

from clawhub.adapters.evaluation import NOT_ENOUGH, PROMOTE, REJECT, decide
from tests.trainer.conftest import sampled_batch
from tests.trainer.test_local import started
from workers.trainer.backend import TrainSample
from workers.trainer.gate import repeated_ngram_share, score_versions

pytestmark = pytest.mark.slow
RULE = {"min_samples": 6, "confidence": 0.9, "resamples": 1000}


@pytest.fixture(scope="module")
def tenant(tiny_model_dir, prompts, tmp_path_factory):
    """The tenant's judged turns as the base model served them: a training batch and a held-out set on other
    prompts (the style rule plays the judge)."""
    import torch

    torch.set_num_threads(1)
    probe = started(tiny_model_dir, tmp_path_factory.mktemp("probe"))
    pool = sampled_batch(probe, prompts[:48], seed=21)
    # A balanced batch: as many corrected replies as accepted ones, so the update is about the preference.
    train = [s for s in pool if s.reward < 0][:8] + [s for s in pool if s.reward > 0][:8]
    heldout = sampled_batch(probe, prompts[100:164], seed=22, first_id=1000)
    assert sum(s.reward < 0 for s in heldout) >= 3 and sum(s.reward > 0 for s in heldout) >= 3
    return {"train": train, "heldout": heldout}


def candidate(tiny_model_dir, tmp_path, batch, **config):
    config = {"method": "rl", "mini_batches": 2, "epochs": 3, "micro_batch_size": 8, **config}
    backend = started(tiny_model_dir, tmp_path / "run", **config)
    backend.train(batch)
    return backend.export_adapter(str(tmp_path / "candidate"))


def gate(tiny_model_dir, adapter, heldout):
    scores = score_versions(
        base_model=str(tiny_model_dir), adapters={"candidate": adapter, "parent": None}, samples=heldout,
        device="cpu",
    )
    rewards = {str(s.sample_id): s.reward for s in heldout}
    return decide(candidate=scores["candidate"].to_dict(), parent=scores["parent"].to_dict(), rewards=rewards,
                  **RULE)


def test_trained_on_the_tenants_feedback_passes(tiny_model_dir, tmp_path, tenant):
    adapter = candidate(tiny_model_dir, tmp_path, tenant["train"], lr=5e-3)
    decision = gate(tiny_model_dir, adapter, tenant["heldout"])
    print("feedback:", decision.outcome, decision.reason)
    assert decision.outcome == PROMOTE, decision.reason
    assert decision.numbers["margin"]["low"] > 0


def test_trained_on_inverted_rewards_is_rejected(tiny_model_dir, tmp_path, tenant):
    inverted = [TrainSample(**{**vars(s), "reward": -s.reward}) for s in tenant["train"]]
    adapter = candidate(tiny_model_dir, tmp_path, inverted, lr=5e-3)
    decision = gate(tiny_model_dir, adapter, tenant["heldout"])
    print("inverted:", decision.outcome, decision.reason)
    assert decision.outcome == REJECT and "preference margin fell" in decision.reason
    assert decision.numbers["margin"]["high"] < 0


def test_collapsed_to_repetition_is_rejected(tiny_model_dir, tmp_path, tenant, prompts):
    loop = [
        TrainSample(sample_id=i, messages=p, response_text="the the the the the the the the the the the " * 4,
                    reward=1)
        for i, p in enumerate(prompts[:16])
    ]
    adapter = candidate(tiny_model_dir, tmp_path, loop, lr=5e-3, epochs=6)
    decision = gate(tiny_model_dir, adapter, tenant["heldout"])
    print("collapsed:", decision.outcome, decision.reason)
    # The canaries caught it: its replies repeat ("the the the ...") or its own corpus became unlikely; which
    # of the two degeneration rules fires first depends on how far the collapse went, and the number behind
    # the rule that fired must show it.
    assert decision.outcome == REJECT
    canary = decision.numbers["canary"]
    if "repetition" in decision.reason:
        assert canary["repetition"]["candidate"] > 3 * canary["repetition"]["parent"] + 0.01
    else:
        assert "perplexity on the model's own corpus rose" in decision.reason
        assert canary["perplexity"]["candidate"] > 1.5 * canary["perplexity"]["parent"]


def test_too_little_held_out_data_says_so(tiny_model_dir, tmp_path, tenant):
    adapter = candidate(tiny_model_dir, tmp_path, tenant["train"][:8], lr=1e-3, epochs=1)
    negatives = [s for s in tenant["heldout"] if s.reward < 0]
    few = negatives[:1] + [s for s in tenant["heldout"] if s.reward > 0][:2]
    decision = gate(tiny_model_dir, adapter, few)
    assert decision.outcome == NOT_ENOUGH and decision.passed, decision.reason
    assert decision.reason.startswith("not enough evidence yet: 2 positive and 1 negative")
    assert "promoted because every safety check that could run passed" in decision.reason
    # Two liked, one disliked and one hinted turn: too few to check any of them (noise alone moves one short
    # reply past the tolerance); the model's own canaries and perplexity are checked.
    assert [(c["check"], c["passed"]) for c in decision.numbers["safety"]] == [
        ("canaries", True), ("perplexity", True), ("liked replies", None), ("disliked replies", None),
        ("hint-teacher", None)]


def test_with_one_held_out_class_a_degenerate_candidate_is_refused(tiny_model_dir, tmp_path, tenant, prompts):
    """A mostly positive tenant: its held-out turns are all positively judged, so there is no margin to
    measure. A candidate drifting towards "the the the ..." (not yet far enough for the standard perplexity
    bound, x1.5) used to ship as "not enough evidence yet"; without a gain to trade against, the liked replies
    it made less likely and its corpus perplexity refuse it."""
    loop = [
        TrainSample(sample_id=i, messages=p, response_text="the the the the the the the the the the the " * 4,
                    reward=1)
        for i, p in enumerate(prompts[:16])
    ]
    adapter = candidate(tiny_model_dir, tmp_path, loop, lr=5e-3, epochs=2)
    liked = [s for s in tenant["heldout"] if s.reward > 0]
    decision = gate(tiny_model_dir, adapter, liked)
    print("one class, degenerate:", decision.outcome, decision.reason)
    canary = decision.numbers["canary"]["perplexity"]
    assert canary["candidate"] < 1.5 * canary["parent"]  # the standard degeneration rule lets it through
    assert decision.outcome == REJECT and not decision.passed
    assert decision.reason.startswith(f"not enough evidence of a gain ({len(liked)} positive and 0 negative")
    failed = {c["check"] for c in decision.numbers["safety"] if not c["passed"]}
    assert "liked replies" in failed, decision.numbers["safety"]


def test_repetition_share_counts_repeated_trigrams():
    assert repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    assert repeated_ngram_share([7] * 12) == pytest.approx(0.9)


def test_a_versions_canaries_are_measured_once_and_the_numbers_stay_the_same(tiny_model_dir, tmp_path):
    """Gate 1 scores v1 against the base, gate 2 v2 against v1: v1's canaries and perplexity come back from
    its own gate instead of being sampled again, on the resident base, and every number the decision reads is
    what scoring everything afresh on a private base gives."""
    from workers.tiny_model.builder import make_lora_adapter
    from workers.trainer import resident
    from workers.trainer.gate import FIXED, FIXED_SCORES_FILE
    from workers.trainer.gate_bench import heldout as judged_turns

    v1, v2 = (str(make_lora_adapter(tiny_model_dir, tmp_path / f"v{k}", seed=k, b_std=0.01)) for k in (1, 2))
    heldout = judged_turns(8)  # half of them hinted: the KL and "away" numbers are compared too
    resident.reset()
    FIXED.memory.clear()

    def gate_of(candidate, parent, **options):
        timings = {}
        scores = score_versions(base_model=str(tiny_model_dir), adapters={"candidate": candidate,
                                                                          "parent": parent},
                                samples=heldout, device="cpu", timings=timings, **options)
        return {name: s.to_dict() for name, s in scores.items()}, timings

    first, first_timings = gate_of(v1, None)
    assert first_timings["resident_base"] and first_timings["reused"] == []
    assert (tmp_path / "v1" / FIXED_SCORES_FILE).exists()
    FIXED.memory.clear()  # a restarted worker: v1's numbers come from its directory
    second, second_timings = gate_of(v2, v1)
    assert second_timings["reused"] == ["parent"] and "parent.canaries" not in second_timings
    assert second["parent"]["canaries"] == first["candidate"]["canaries"]
    afresh, afresh_timings = gate_of(v2, v1, reuse=False)
    assert not afresh_timings["resident_base"] and afresh_timings["reused"] == []
    assert second == afresh
    assert resident.stats()["loads"] == 1 and resident.stats()["previous_adapter_freed"]

    # The base model as the third model of a later gate (degeneration against it too): only its canary and
    # perplexity numbers are measured, the same as when it was gate 1's parent, and read back afterwards.
    for _ in range(2):
        timings = {}
        scores = score_versions(base_model=str(tiny_model_dir), samples=heldout, device="cpu",
                                timings=timings, adapters={"candidate": v2, "parent": v1, "base": None},
                                fixed_only=("base",))
    assert "base" in timings["reused"] and "base.canaries" not in timings
    base = scores["base"].to_dict()
    assert base["logprob"] == {} and base["kl"] == {} and base["away"] == {}
    assert base["canaries"] == first["parent"]["canaries"]
    assert base["perplexity"] == first["parent"]["perplexity"]
    assert scores["candidate"].to_dict() == afresh["candidate"]

    # Numbers written for other weights (or tampered with) are not used; v2's own, from gate 2, are.
    stored = tmp_path / "v1" / FIXED_SCORES_FILE
    stored.write_text(stored.read_text().replace('"key": "', '"key": "x'))
    FIXED.memory.clear()
    again, timings = gate_of(v2, v1)
    assert timings["reused"] == ["candidate"] and "parent.canaries" in timings
    assert again == afresh
    resident.reset()


def test_the_gate_leaves_a_busy_or_other_resident_base_alone(tiny_model_dir):
    import torch

    from workers.trainer import resident
    from workers.trainer.forward import load_pretrained

    resident.reset()
    cpu = torch.device("cpu")
    lease = resident.acquire(str(tiny_model_dir), torch.float32, cpu, load_pretrained)  # a run holds it
    assert resident.acquire_if_idle(str(tiny_model_dir), torch.float32, cpu, load_pretrained) is None
    resident.release(lease, None)
    # Another dtype would evict the training copy: the gate loads its own instead.
    assert resident.acquire_if_idle(str(tiny_model_dir), torch.float64, cpu, load_pretrained) is None
    idle = resident.acquire_if_idle(str(tiny_model_dir), torch.float32, cpu, load_pretrained)
    assert idle is lease and resident.stats()["loads"] == 1
    resident.release(idle, None)
    resident.reset()


def test_the_gate_scores_on_the_resident_base_in_trainings_dtype(tiny_model_dir):
    """A GPU train worker keeps its base resident in bf16; the gate used to score in fp32 and so loaded a
    private fp32 copy beside it (16 GB for a 4B model). Given training's dtype, it shares the resident base
    (bf16 here on the CPU, for the test) and computes its log-probs in fp32 from its logits."""
    import math

    import torch

    from workers.trainer import resident
    from workers.trainer.forward import load_pretrained
    from workers.trainer.gate_bench import heldout as judged_turns

    resident.reset()
    lease = resident.acquire(str(tiny_model_dir), torch.bfloat16, torch.device("cpu"), load_pretrained)
    resident.release(lease, None)  # idle between runs
    timings = {}
    scores = score_versions(base_model=str(tiny_model_dir), adapters={"candidate": None, "parent": None},
                            samples=judged_turns(4), device="cpu", dtype="bfloat16", timings=timings,
                            reuse=True)
    assert timings["resident_base"] and resident.stats()["loads"] == 1
    assert all(math.isfinite(v) for v in scores["candidate"].logprob.values())
    resident.reset()
