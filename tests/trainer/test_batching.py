"""Batch building: chat template, alignment with the recorded tokens, dropping, padding, teacher context."""

import torch

from workers.trainer.backend import HINT_TEMPLATE, DroppedSample, TrainSample
from workers.trainer.batching import (
    align_response,
    collate,
    encode_batch,
    encode_sample,
    prompt_ids,
    teacher_prompt_ids,
    with_hint,
)

MESSAGES = [{"role": "user", "content": "How many legs does a spider have?"}]
TEXT = "A spider has eight legs."


def recorded(tokenizer, text=TEXT, **kw):
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    fields = {
        "response_token_ids": ids,
        "response_logprobs": [-0.1 * (i + 1) for i in range(len(ids))],
        "logprobs_mode": "processed_logprobs",
    }
    return TrainSample(
        **{"sample_id": 1, "messages": MESSAGES, "response_text": text, "reward": 1, **fields, **kw}
    )


def test_prompt_ids_are_the_chat_template_with_generation_prompt(tokenizer):
    ids = prompt_ids(tokenizer, MESSAGES, None)
    text = tokenizer.decode(ids)
    assert text.endswith(
        "<|im_start|>user\nHow many legs does a spider have?<|im_end|>\n<|im_start|>assistant\n"
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert "get_weather" in tokenizer.decode(prompt_ids(tokenizer, MESSAGES, tools))


def test_recorded_ids_that_decode_to_the_text_are_kept_with_their_logprobs(tokenizer):
    sample = recorded(tokenizer)
    ids, logprobs, how = align_response(tokenizer, sample)
    assert how == "recorded"
    assert ids == sample.response_token_ids  # including the trailing <|im_end|>
    assert logprobs == sample.response_logprobs


def test_a_different_but_equivalent_tokenization_is_kept(tokenizer):
    # vLLM may sample a split the BPE encoder would not produce; it still decodes to the same text.
    pieces = [tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "A spider"]
    sample = TrainSample(
        sample_id=1,
        messages=MESSAGES,
        response_text="A spider",
        response_token_ids=pieces,
        response_logprobs=[-1.0] * len(pieces),
        logprobs_mode="processed_logprobs",
        reward=1,
    )
    ids, logprobs, how = align_response(tokenizer, sample)
    assert (ids, how) == (pieces, "recorded")
    assert ids != tokenizer.encode("A spider", add_special_tokens=False)


def test_mismatched_ids_are_retokenized_and_the_old_logprobs_dropped(tokenizer):
    sample = recorded(
        tokenizer, response_token_ids=tokenizer.encode("Spiders have six legs.", add_special_tokens=False)
    )
    ids, logprobs, how = align_response(tokenizer, sample)
    assert how == "retokenized: recorded token ids do not decode to the response text"
    assert ids == tokenizer.encode(TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert logprobs is None  # pi_old will be the current policy's


def test_no_recorded_ids_means_retokenize(tokenizer):
    sample = TrainSample(sample_id=1, messages=MESSAGES, response_text=TEXT, reward=1)
    ids, logprobs, how = align_response(tokenizer, sample)
    assert how == "retokenized: no recorded token ids" and logprobs is None
    assert tokenizer.decode(ids) == TEXT + "<|im_end|>"


def test_logprobs_of_the_wrong_length_are_dropped_but_ids_kept(tokenizer):
    sample = recorded(tokenizer, response_logprobs=[-0.5])
    ids, logprobs, how = align_response(tokenizer, sample)
    assert ids == sample.response_token_ids and logprobs is None
    assert "1 recorded logprobs for" in how


def test_a_long_prompt_is_left_truncated_and_recorded(tokenizer):
    # Before, a sample over max_seq_len was dropped: every OpenClaw turn (13k+ prompt tokens) was lost.
    long_messages = [{"role": "system", "content": "Rules of the house. " * 200}, *MESSAGES]
    sample = recorded(tokenizer, messages=long_messages)
    prompt_len = len(prompt_ids(tokenizer, long_messages, None))
    response_len = len(sample.response_token_ids)
    limit = response_len + 40
    enc = encode_sample(tokenizer, sample, max_seq_len=limit)
    assert enc.prompt_truncated == prompt_len - 40 and len(enc.prompt_ids) == 40
    assert enc.prompt_ids == prompt_ids(tokenizer, long_messages, None)[-40:]  # the newest context stays
    assert enc.response_ids == sample.response_token_ids and not enc.truncated
    # The recorded log-probs saw the whole prompt: pi_old is recomputed on what the trainer sees.
    assert enc.old_logprobs is None and "left-truncated by" in enc.alignment


def test_a_response_that_alone_does_not_fit_is_dropped_or_cut_when_allowed(tokenizer):
    sample = recorded(tokenizer)
    limit = 16 + 3
    dropped = encode_sample(tokenizer, sample, max_seq_len=limit)
    assert isinstance(dropped, DroppedSample)
    assert (
        dropped.sample_id == 1
        and dropped.reason.startswith("too long:")
        and f"max_seq_len {limit}" in dropped.reason
    )
    cut = encode_sample(tokenizer, sample, max_seq_len=limit, truncate_response=True)
    assert cut.truncated and cut.response_ids == sample.response_token_ids[:3] and len(cut.prompt_ids) == 16


def test_served_ids_are_trained_exactly(tokenizer):
    """Prompt ids and sampled ids from the server are the sequence, whatever the template would render and
    whatever the parsed text says (reasoning and tool-call tokens are in the ids, not in response_text)."""
    served_prompt = prompt_ids(tokenizer, MESSAGES, None) + [7, 7]  # e.g. chat_template_kwargs at serve time
    sampled = tokenizer.encode("<think>\nlegs\n</think>\n\n" + TEXT, add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    sample = TrainSample(
        sample_id=3,
        messages=MESSAGES,
        response_text=TEXT,
        reward=1,
        prompt_token_ids=served_prompt,
        response_token_ids=sampled,
        response_logprobs=[-0.5] * len(sampled),
        logprobs_mode="processed_logprobs",
        source="served ids",
    )
    enc = encode_sample(tokenizer, sample, max_seq_len=4096)
    assert (enc.prompt_ids, enc.response_ids, enc.old_logprobs) == (
        served_prompt,
        sampled,
        [-0.5] * len(sampled),
    )
    assert enc.alignment == "served ids" and enc.served
    missing = TrainSample(
        sample_id=4,
        messages=MESSAGES,
        response_text=TEXT,
        reward=1,
        source="re-rendered: served without prompt token ids",
    )
    fallback = encode_sample(tokenizer, missing, max_seq_len=4096)
    assert fallback.alignment.startswith("re-rendered: served without prompt token ids; retokenized")
    assert not fallback.served


def test_the_teacher_prompt_is_the_served_ids_with_the_hint_inserted(tokenizer):
    messages = [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "Answer"},
        {"role": "user", "content": "Second question"},
    ]
    served = prompt_ids(tokenizer, messages, None)
    sample = TrainSample(
        sample_id=5,
        messages=messages,
        response_text="ok",
        reward=1,
        prompt_token_ids=served,
        response_token_ids=[tokenizer.eos_token_id],
        response_logprobs=[-0.1],
    )
    enc = encode_sample(tokenizer, sample, max_seq_len=4096)
    teacher, how = teacher_prompt_ids(tokenizer, enc, "Be brief.", max_seq_len=4096)
    hint = tokenizer.encode(HINT_TEMPLATE.format(hint="Be brief."), add_special_tokens=False)
    assert how == "hint inserted into the served ids"
    k = next(i for i in range(len(served)) if teacher[i] != served[i])
    # Student and teacher differ by exactly the hint's tokens, right after the last user message's text.
    assert teacher[:k] + teacher[k + len(hint) :] == served and teacher[k : k + len(hint)] == hint
    assert tokenizer.decode(teacher[:k]).endswith("Second question")


def test_encode_batch_separates_kept_and_dropped(tokenizer):
    long = TrainSample(sample_id=2, messages=MESSAGES, response_text="word " * 400, reward=1)
    kept, dropped = encode_batch(tokenizer, [recorded(tokenizer), long], max_seq_len=128)
    assert [e.sample.sample_id for e in kept] == [1]
    assert [d.sample_id for d in dropped] == [2]


def test_teacher_context_appends_the_hint_to_the_last_user_message():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question"},
    ]
    hinted = with_hint(messages, "Use plain sentences.")
    assert hinted[3]["content"] == "Second question\n\n[user's hint / instruction]\nUse plain sentences."
    assert hinted[:3] == messages[:3]
    assert messages[3]["content"] == "Second question"  # the original is not modified
    parts = with_hint([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "h")
    assert parts[0]["content"][-1] == {"type": "text", "text": HINT_TEMPLATE.format(hint="h")}


def test_collate_right_and_left_padding_point_at_the_same_tokens():
    sequences = [([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])]
    for side in ("right", "left"):
        batch = collate(sequences, pad_id=0, padding_side=side)
        assert batch.input_ids.shape == (2, 5)
        assert batch.targets.tolist() == [[8, 9, 0, 0], [8, 9, 10, 11]]
        assert batch.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
        # The output at logit_index predicts the target: the token right after it is the target.
        for i in range(2):
            for t in range(int(batch.mask[i].sum())):
                assert batch.input_ids[i, batch.logit_index[i, t] + 1] == batch.targets[i, t]
        real = batch.attention_mask.bool()
        assert batch.position_ids[real].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


def test_left_and_right_padding_give_the_same_logprobs(tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from workers.trainer.forward import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    a = prompt_ids(tokenizer, MESSAGES, None), tokenizer.encode(TEXT, add_special_tokens=False)
    b = (
        prompt_ids(tokenizer, [{"role": "user", "content": "Hi"}], None),
        tokenizer.encode("Hello", add_special_tokens=False),
    )
    with torch.no_grad():
        right, _ = response_logprobs(model, collate([a, b], pad_id=0, padding_side="right"))
        left, _ = response_logprobs(model, collate([a, b], pad_id=0, padding_side="left"))
        alone, _ = response_logprobs(model, collate([b], pad_id=0))
    mask = collate([a, b], pad_id=0).mask.bool()
    assert torch.allclose(right[mask], left[mask], atol=1e-5)
    assert torch.allclose(right[1, : alone.shape[1]], alone[0], atol=1e-5)
