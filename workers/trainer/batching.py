"""From TrainSample to model inputs: chat template, response alignment, masks, padding.

The response tokens trained on must be the tokens the policy sampled, or the ratio rho is meaningless. So we
prefer the token ids recorded at sampling time, and accept them only if they decode back to the recorded text;
otherwise the text is re-tokenized and the recorded log-probs are dropped (pi_old is then recomputed from the
current policy before the update). A sample that cannot be aligned is dropped with a reason the run reports.

Positions: the model's output at sequence position p predicts token p + 1, so the response token t of a sample
whose prompt has P tokens is predicted at position P - 1 + t. `Batch.logit_index` holds those positions, and
everything downstream (log-probs, advantages, masks) lives on a (B, T) grid of response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from workers.trainer.backend import HINT_TEMPLATE, DroppedSample, TrainSample

END_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass
class EncodedSample:
    sample: TrainSample
    prompt_ids: list[int]
    response_ids: list[int]
    # Recorded log-probs aligned with response_ids, or None when pi_old must come from the current policy.
    old_logprobs: list[float] | None
    # How the response was obtained: "recorded", or "retokenized: <why>".
    alignment: str
    truncated: bool = False


@dataclass
class Batch:
    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    position_ids: Tensor  # (B, L), counted from each sample's first real token (left padding safe)
    logit_index: Tensor  # (B, T) position whose output predicts response token t
    targets: Tensor  # (B, T) response token ids
    mask: Tensor  # (B, T) float, 1.0 on real response tokens

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{name: value.to(device) for name, value in vars(self).items()})

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def end_token_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for token in END_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    ids.discard(None)
    return ids


def prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The chat template with add_generation_prompt=True, as the serving engine rendered it."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=True
    )
    # The template already wrote the special tokens; add_special_tokens would add a BOS some models define.
    return tokenizer.encode(text, add_special_tokens=False)


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The teacher's context: the prompt with the hint appended to the last user message (a copy)."""
    messages = [dict(m) for m in messages]
    suffix = HINT_TEMPLATE.format(hint=hint)
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            message["content"] = [*content, {"type": "text", "text": suffix}]
        else:
            message["content"] = (content or "") + suffix
        return messages
    # No user message (a tool-only continuation): the hint still has to reach the teacher somewhere.
    return [*messages, {"role": "user", "content": suffix.lstrip()}]


def align_response(tokenizer: Any, sample: TrainSample) -> tuple[list[int], list[float] | None, str]:
    """(response ids, their recorded log-probs or None, how they were obtained)."""
    ends = end_token_ids(tokenizer)
    recorded = sample.response_token_ids
    if recorded:
        body = list(recorded)
        while body and body[-1] in ends:  # the stop token is sampled but is not part of the text
            body.pop()
        decoded = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if decoded == sample.response_text:
            logprobs = sample.response_logprobs
            if logprobs is not None and len(logprobs) == len(recorded):
                return list(recorded), list(logprobs), "recorded"
            why = "no recorded logprobs" if logprobs is None else "logprobs length != token ids length"
            return list(recorded), None, f"recorded ids, {why}"
        why = "recorded token ids do not decode to the response text"
    else:
        why = "no recorded token ids"
    # Re-tokenized turns are assumed complete, so they end with the end-of-turn token the policy would emit.
    ids = tokenizer.encode(sample.response_text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return ids, None, f"retokenized: {why}"


def encode_sample(
    tokenizer: Any, sample: TrainSample, *, max_seq_len: int, truncate_response: bool = False
) -> EncodedSample | DroppedSample:
    try:
        prompt = prompt_ids(tokenizer, sample.messages, sample.tools)
    except Exception as exc:  # a malformed prompt must not sink the whole batch
        return DroppedSample(sample.sample_id, f"chat template failed: {exc}")
    response, logprobs, alignment = align_response(tokenizer, sample)
    if not sample.response_text and len(response) <= 1:  # nothing but the stop token
        return DroppedSample(sample.sample_id, "empty response")
    truncated = False
    if len(prompt) + len(response) > max_seq_len:
        room = max_seq_len - len(prompt)
        if not truncate_response or room < 1:
            return DroppedSample(
                sample.sample_id,
                f"too long: {len(prompt)} prompt + {len(response)} response tokens "
                f"> max_seq_len {max_seq_len}",
            )
        response, truncated = response[:room], True
        logprobs = logprobs[:room] if logprobs is not None else None
    return EncodedSample(sample, prompt, response, logprobs, alignment, truncated)


def encode_batch(
    tokenizer: Any, samples: list[TrainSample], *, max_seq_len: int, truncate_response: bool = False
) -> tuple[list[EncodedSample], list[DroppedSample]]:
    encoded, dropped = [], []
    for sample in samples:
        result = encode_sample(
            tokenizer, sample, max_seq_len=max_seq_len, truncate_response=truncate_response
        )
        (dropped if isinstance(result, DroppedSample) else encoded).append(result)
    return encoded, dropped


def collate(
    sequences: list[tuple[list[int], list[int]]], *, pad_id: int, padding_side: str = "right"
) -> Batch:
    """Pad (prompt ids, response ids) pairs into one Batch."""
    length = max(len(p) + len(r) for p, r in sequences)
    width = max(len(r) for _, r in sequences)
    size = len(sequences)
    input_ids = torch.full((size, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((size, length), dtype=torch.long)
    logit_index = torch.zeros((size, width), dtype=torch.long)
    targets = torch.full((size, width), pad_id, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.float32)
    for i, (prompt, response) in enumerate(sequences):
        n = len(prompt) + len(response)
        offset = length - n if padding_side == "left" else 0
        input_ids[i, offset : offset + n] = torch.tensor(prompt + response)
        attention_mask[i, offset : offset + n] = 1
        first = offset + len(prompt) - 1
        logit_index[i, : len(response)] = torch.arange(first, first + len(response))
        targets[i, : len(response)] = torch.tensor(response)
        mask[i, : len(response)] = 1.0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(input_ids, attention_mask, position_ids, logit_index, targets, mask)


def pad_values(rows: list[list[float]], width: int, value: float = 0.0) -> Tensor:
    """Per-sample float lists (log-probs) on the (B, T) response grid."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
