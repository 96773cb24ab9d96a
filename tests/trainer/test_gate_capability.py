"""The gate's capability canaries: fixed factual questions no tenant can influence, asked greedily of every
version of a real model; a candidate that forgot answers the base model knows is refused, one that kept them
passes. The tiny model knows no facts, so here its own greedy replies to the questions stand in for the
answers it "knows" (what the base answers right), and random LoRA updates of two sizes make a candidate that
keeps them and one that forgets."""

from workers.base_models import SMOLLM2, TINY, describe
from workers.trainer import capability as C

RULE = {"min_samples": 6, "confidence": 0.9, "resamples": 200}


def test_every_reference_answer_is_a_right_answer():
    assert len(C.REFERENCE_ANSWERS) == len(C.QUESTIONS) == 53
    pairs = zip(C.REFERENCE_ANSWERS, C.QUESTIONS, strict=True)
    assert all(C.is_right(text, answers) for text, (_, answers) in pairs)
    assert not C.is_right("I am not sure.", ("Lisbon",)) and not C.is_right("Rome", ("Rom",))


def test_the_base_models_description_chooses_the_canaries(tiny_model_dir, tmp_path):
    from workers.trainer.gate import canaries_for

    assert (describe(tiny_model_dir), TINY.canaries, SMOLLM2.canaries) == (TINY, "corpus", "capability")
    tiny = canaries_for(str(tiny_model_dir))
    assert tiny.kind == "corpus" and tiny.questions is None
    real = canaries_for(str(tmp_path))  # any other folder: a real model (generic description)
    assert real.kind == "capability" and real.temperature == 0 and real.max_new_tokens == C.GATE_MAX_TOKENS
    assert [q for q, _ in real.questions] == [q for q, _ in C.QUESTIONS]
    assert real.prompts[0] == C.messages(C.QUESTIONS[0][0])
    assert real.texts[1].response_text == "The capital of Japan is Tokyo."


def test_a_candidate_that_forgot_the_answers_is_refused_one_that_kept_them_passes(tiny_model_dir, tmp_path):
    import torch

    from clawhub.adapters.evaluation import NOT_ENOUGH, REJECT, decide
    from workers.tiny_model.builder import make_lora_adapter
    from workers.trainer import resident
    from workers.trainer.forward import generate_samples, load_pretrained
    from workers.trainer.gate import FIXED, Canaries, canaries_for, score_versions

    torch.set_num_threads(1)
    resident.reset()
    FIXED.memory.clear()
    real = canaries_for(str(tmp_path))
    lease = resident.acquire(str(tiny_model_dir), torch.float32, torch.device("cpu"), load_pretrained)
    try:
        known = generate_samples(lease.model, lease.tokenizer, real.prompts, max_new_tokens=8, temperature=0,
                                 logprobs=False)
    finally:
        resident.release(lease, None)
    questions = [(q, (s.text,)) for (q, _), s in zip(real.questions, known, strict=True)]
    canaries = Canaries("capability", real.prompts, real.texts[:4], max_new_tokens=8, temperature=0,
                        questions=questions)
    kept = make_lora_adapter(tiny_model_dir, tmp_path / "kept", seed=1, b_std=0.0003)
    forgot = make_lora_adapter(tiny_model_dir, tmp_path / "forgot", seed=1, b_std=0.01)
    scores = score_versions(base_model=str(tiny_model_dir), samples=[], canaries=canaries, device="cpu",
                            adapters={"kept": str(kept), "forgot": str(forgot), "parent": None})
    resident.reset()
    parent = scores["parent"].to_dict()
    asked = len(C.QUESTIONS)
    assert parent["capability"] == {"right": asked, "asked": asked, "missed": []}

    refused = decide(candidate=scores["forgot"].to_dict(), parent=parent, rewards={}, **RULE)
    print("forgot:", refused.reason)
    lost = refused.numbers["capability"]
    assert refused.outcome == REJECT and lost["lost"] > lost["bound"] == 2
    assert refused.reason.startswith(
        f"the update made the model forget what the base model knows: it answers {lost['candidate']} of "
        f"{asked} fixed factual questions right, the base model {asked} (at most 2 fewer allowed); it no "
        'longer answers "')
    assert lost["forgotten"] == scores["forgot"].capability["missed"] and lost["forgotten"]

    passed = decide(candidate=scores["kept"].to_dict(), parent=parent, rewards={}, **RULE)
    print("kept:", passed.reason)
    assert passed.outcome == NOT_ENOUGH and passed.passed
    assert passed.numbers["capability"]["lost"] <= 1
    assert ("capability", True) in [(c["check"], c["passed"]) for c in passed.numbers["safety"]]
