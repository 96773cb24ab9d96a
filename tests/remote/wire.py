"""What a remote backend should put on the wire for a sample, computed here independently from
workers.trainer.batching and the tiny model's own log-probs (the Tinker and Fireworks contract tests share
it)."""

from __future__ import annotations

import pytest

from workers.trainer.batching import encode_sample, prompt_ids, with_hint


def expected_wire(tokenizer, sample, advantages, old, samples_in_step):
    """(input tokens, targets, logprobs, advantages) the datum for `sample` must carry."""
    enc = encode_sample(tokenizer, sample, max_seq_len=512)
    tokens = enc.prompt_ids + enc.response_ids
    pad = len(enc.prompt_ids) - 1
    scale = 1.0 / (len(enc.response_ids) * samples_in_step)
    return (
        tokens[:-1],
        tokens[1:],
        [0.0] * pad + list(old),
        [0.0] * pad + [a * scale for a in advantages],
    )


def assert_datum(datum, want):
    tokens, targets, logprobs, advantages = want
    assert datum.input_tokens == tokens
    assert [int(t) for t in datum.loss_fn_inputs["target_tokens"]] == targets
    assert datum.loss_fn_inputs["logprobs"] == pytest.approx(logprobs, abs=1e-5)
    assert datum.loss_fn_inputs["advantages"] == pytest.approx(advantages, abs=1e-5)


def opd_teacher(tokenizer, reference, sample) -> tuple[list[int], list[float]]:
    """The teacher's prompt (the hint chosen by top-4 overlap, as the backend chooses it, in the prompt) and
    its log-probs of the response's tokens."""
    from workers.trainer.hints import choose_hint

    enc = encode_sample(tokenizer, sample, max_seq_len=512)
    n = len(enc.response_ids)
    contexts = [
        prompt_ids(tokenizer, with_hint(sample.messages, h), None) + enc.response_ids for h in sample.hints
    ]
    choice = 0
    if len(contexts) > 1:
        policy_ids, _ = reference.topk(enc.prompt_ids + enc.response_ids, 4)
        overlaps = []
        for ctx in contexts:
            teacher_ids, _ = reference.topk(ctx, 4)
            pairs = zip(policy_ids[-n:], teacher_ids[-n:], strict=True)
            overlaps.append(sum(len(set(a) & set(b)) for a, b in pairs))
        choice = choose_hint(sample.hints, overlaps)
    return contexts[choice], reference.token_logprobs(contexts[choice])[-n:]
