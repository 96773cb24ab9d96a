"""The gate's log-probs and KL numbers come through the LM head a chunk of positions at a time (no
full-vocabulary tensor of a whole sample is kept) and equal what the full-vocabulary computation gives."""

import pytest


def test_chunked_log_probs_and_kl_equal_the_full_vocabulary_computation(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel

    from workers.tiny_model.builder import make_lora_adapter
    from workers.trainer import gate
    from workers.trainer.batching import collate, encode_batch, teacher_prompt_ids
    from workers.trainer.forward import load_pretrained
    from workers.trainer.gate_bench import heldout

    torch.set_num_threads(1)
    base, tokenizer = load_pretrained(str(tiny_model_dir), torch.float32, torch.device("cpu"))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = PeftModel.from_pretrained(base, str(make_lora_adapter(tiny_model_dir, tmp_path / "c", seed=3)),
                                      adapter_name="candidate").eval()
    encoded, _ = encode_batch(tokenizer, heldout(6), max_seq_len=2048)
    scorer = gate._Scorer(model, tokenizer, torch.device("cpu"), 2048)

    def full(prompt, response):  # the whole reply's (T, V) log-softmax at once: what the gate used to keep
        batch = collate([(prompt, response)], pad_id=tokenizer.pad_token_id)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return torch.log_softmax(logits[0, batch.logit_index[0]].float(), -1)[: len(response)]

    with torch.no_grad():
        one_per_pass = scorer.mean_logprobs(encoded, budget=1)
        packed = scorer.mean_logprobs(encoded)
        for e in encoded:
            expected = full(e.prompt_ids, e.response_ids).gather(
                -1, torch.tensor(e.response_ids)[:, None]).mean()
            assert one_per_pass[str(e.sample.sample_id)][0] == pytest.approx(float(expected), abs=1e-5)
            assert packed[str(e.sample.sample_id)][0] == pytest.approx(float(expected), abs=1e-5)

        hinted = [e for e in encoded if e.sample.hints]
        scores = {name: gate.ModelScores() for name in ("candidate", "parent")}
        # 3 positions per head chunk, every hinted sample in one forward pass per model
        gate._hint_teacher_scores(scorer, tokenizer, hinted, scores, max_seq_len=2048, chunk=3,
                                  adapters={"candidate": "c", "parent": None})
        for e in hinted:
            with gate._adapter(model, None):
                prompt, _ = teacher_prompt_ids(tokenizer, e, e.sample.hints[0], max_seq_len=2048)
                teacher, parent = full(prompt, e.response_ids), full(e.prompt_ids, e.response_ids)
            with gate._adapter(model, "candidate"):
                candidate = full(e.prompt_ids, e.response_ids)
            key = str(e.sample.sample_id)
            kl = float((candidate.exp() * (candidate - teacher)).sum(-1).mean())
            away = float(((candidate.exp() - parent.exp()) * (parent - teacher)).sum(-1).mean())
            assert scores["candidate"].kl[key] == pytest.approx(kl, abs=1e-5)
            assert scores["candidate"].away[key] == pytest.approx(away, abs=1e-5)
            assert scores["parent"].kl[key] == pytest.approx(float((parent.exp() * (parent - teacher)).sum(-1)
                                                                   .mean()), abs=1e-5)
    size = lambda e: len(e.prompt_ids) + len(e.response_ids)  # noqa: E731
    assert len(hinted) >= 2
    assert len(gate._passes(encoded, 1, size)) == 6 > len(gate._passes(encoded, 8192, size)) == 1
