"""From TrainSample to model inputs: served ids (or the chat template), response alignment, masks, padding.

The tokens trained on must be the tokens the policy was served and sampled, or the ratio rho is meaningless.
So a sample recorded with vLLM's prompt token ids and sampled token ids is trained on exactly those (prompt
ids + sampled ids, reasoning and tool-call tokens included, with the sampling-time log-probs as pi_old). Only
a sample without them (another backend, an older turn) is re-rendered: the chat template over the messages
(with the request's chat_template_kwargs), the recorded response ids when they decode back to the recorded
text, else the text re-tokenized with pi_old recomputed from the current policy before the update. Every
encoded sample says which path it took and why (``EncodedSample.alignment``).

A sample longer than max_seq_len loses the start of its prompt (left truncation, recorded; pi_old is then
recomputed, since the recorded log-probs were taken with the whole prompt): an OpenClaw turn's 13k-token
prompt still trains, on its most recent context. Only a response that alone does not fit is dropped, or cut
when truncate_response is set.

Positions: the model's output at sequence position p predicts token p + 1, so the response token t of a sample
whose prompt has P tokens is predicted at position P - 1 + t. `Batch.logit_index` holds those positions (in
the row `Batch.row_of` names), and everything downstream (log-probs, advantages, masks) lives on a (B, T)
grid of response tokens, one grid row per sample.

Micro-batches: `collate` pads samples into one row each; `collate_packed` puts them end to end in a single
row with no padding, position ids restarting at 0 at each sample and no attention mask, from which the model
builds a block-diagonal causal mask (transformers detects packed rows from the position ids): no token
attends across samples, so a packed sample's log-probs are those it has alone. `token_budget_groups` forms
the micro-batches from a token budget instead of a sample count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from workers.trainer.backend import HINT_TEMPLATE, DroppedSample, TrainSample

END_TOKENS = ("<|im_end|>", "<|endoftext|>")
SERVED = "served ids"
# Prompt tokens a left-truncated sample keeps at least: below that the response alone is too long.
MIN_PROMPT_TOKENS = 16


@dataclass
class EncodedSample:
    sample: TrainSample
    prompt_ids: list[int]
    response_ids: list[int]
    # Recorded log-probs aligned with response_ids, or None when pi_old must come from the current policy.
    old_logprobs: list[float] | None
    # How the sequence was obtained: "served ids", or "re-rendered: <why>; <how the response aligned>".
    alignment: str
    truncated: bool = False  # the response was cut to fit
    prompt_truncated: int = 0  # prompt tokens dropped from the left to fit max_seq_len

    @property
    def served(self) -> bool:
        return self.alignment.startswith(SERVED)


@dataclass
class Batch:
    input_ids: Tensor  # (R, L): R rows (one per sample when padded, one in all when packed)
    attention_mask: Tensor | None  # (R, L), or None for a packed row (the model masks by position ids)
    position_ids: Tensor  # (R, L), counted from each sample's first real token (left padding safe)
    logit_index: Tensor  # (B, T) position in row row_of[b] whose output predicts response token t
    targets: Tensor  # (B, T) response token ids
    mask: Tensor  # (B, T) float, 1.0 on real response tokens
    row_of: Tensor | None = None  # (B,) the row sample b sits in; None = row b

    def __post_init__(self) -> None:
        if self.row_of is None:
            self.row_of = torch.arange(self.logit_index.shape[0], device=self.logit_index.device)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            **{name: value.to(device) if value is not None else None for name, value in vars(self).items()}
        )

    @property
    def tokens(self) -> int:
        if self.attention_mask is None:
            return int(self.input_ids.numel())
        return int(self.attention_mask.sum())

    @property
    def packed(self) -> bool:
        return self.attention_mask is None

    def sample_spans(self) -> list[tuple[int, int]]:
        """(first, end) of each sample's tokens in the flattened (R * L) token order: what the per-tenant
        LoRA dispatch of a multi-tenant pass slices by. Padding lies outside every span."""
        width = self.input_ids.shape[1]
        spans = []
        for b, row in enumerate(self.row_of.tolist()):  # type: ignore[union-attr]  # set by __post_init__
            if self.packed:
                # A packed sample starts where its row's position ids restart, at or before its first logit.
                first_logit = int(self.logit_index[b, 0])
                restarts = (self.position_ids[row, : first_logit + 1] == 0).nonzero().flatten()
                start = int(restarts[-1])
                length = int(self.position_ids[row, first_logit]) + int(self.mask[b].sum()) + 1
            else:
                real = self.attention_mask[row].nonzero().flatten()  # type: ignore[index]  # not packed: a mask
                start, length = int(real[0]), len(real)
            spans.append((row * width + start, row * width + start + length))
        return spans

def end_token_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for token in END_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    ids.discard(None)
    return ids


def prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The chat template with add_generation_prompt=True, as the serving engine would render it."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
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


# vLLM's float32 log-prob of a near-certain token can round a hair above 0.
LOGPROB_SLACK = 1e-4


def recorded_logprobs(sample: TrainSample, token_ids: list[int]) -> tuple[list[float] | None, str]:
    """The sample's recorded log-probs as pi_old of `token_ids` (the ids they were recorded with), or None
    and why not: one per token, finite, <= 0, and of the mode and sampler the trainer scores the sample with
    (TrainSample.recorded_logprobs_problem)."""
    logprobs = sample.response_logprobs
    if logprobs is None:
        return None, "no recorded logprobs"
    if len(logprobs) != len(token_ids):
        return None, f"{len(logprobs)} recorded logprobs for {len(token_ids)} token ids"
    if not all(isinstance(x, int | float) and math.isfinite(x) and x <= LOGPROB_SLACK for x in logprobs):
        return None, "recorded logprobs not all finite and <= 0"
    problem = sample.recorded_logprobs_problem()
    if problem:
        return None, problem
    return [min(float(x), 0.0) for x in logprobs], ""


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
            logprobs, why = recorded_logprobs(sample, list(recorded))
            if logprobs is not None:
                return list(recorded), logprobs, "recorded"
            return list(recorded), None, f"recorded ids, pi_old recomputed: {why}"
        why = "recorded token ids do not decode to the response text"
    else:
        why = "no recorded token ids"
    # Re-tokenized turns are assumed complete, so they end with the end-of-turn token the policy would emit.
    ids = tokenizer.encode(sample.response_text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return ids, None, f"retokenized: {why}"


def _last_user_text(messages: list[dict[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return None  # how parts are rendered is the template's business: use the fallback
            return content or ""
    return None


def _boundary(tokenizer: Any, ids: list[int], text: str, position: int) -> int | None:
    """The k with decode(ids[:k]) == text[:position], by bisection (decoding is monotone in k), or None."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_decode(tokenizer, ids[:mid])) < position:
            lo = mid + 1
        else:
            hi = mid
    return lo if _decode(tokenizer, ids[:lo]) == text[:position] else None


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def teacher_prompt_ids(
    tokenizer: Any, enc: EncodedSample, hint: str, *, max_seq_len: int
) -> tuple[list[int], str]:
    """The OPD teacher's prompt: the student's prompt with the hint appended to the last user message.

    For a served sample the hint's tokens are inserted into the served prompt ids, right after the last user
    message's text, so that student and teacher contexts differ only by the hint. A re-rendered sample (or
    a served one whose last user message cannot be found in its ids) re-renders the hinted messages. The
    result is left-truncated like the student's prompt. Returns (ids, how they were built).
    """
    sample = enc.sample
    room = max_seq_len - len(enc.response_ids)
    if enc.served:
        user_text = _last_user_text(sample.messages)
        text = _decode(tokenizer, enc.prompt_ids)
        at = text.rfind(user_text) if user_text else -1
        if user_text and at >= 0:
            k = _boundary(tokenizer, enc.prompt_ids, text, at + len(user_text))
            if k is not None:
                suffix = tokenizer.encode(HINT_TEMPLATE.format(hint=hint), add_special_tokens=False)
                ids = enc.prompt_ids[:k] + suffix + enc.prompt_ids[k:]
                return ids[-room:] if len(ids) > room else ids, "hint inserted into the served ids"
    messages = with_hint(sample.messages, hint)
    ids = prompt_ids(tokenizer, messages, sample.tools, sample.chat_template_kwargs)
    return ids[-room:] if len(ids) > room else ids, "re-rendered with the hint"


def encode_sample(
    tokenizer: Any, sample: TrainSample, *, max_seq_len: int, truncate_response: bool = False
) -> EncodedSample | DroppedSample:
    if sample.prompt_token_ids and sample.response_token_ids:
        prompt = list(sample.prompt_token_ids)
        response = list(sample.response_token_ids)
        logprobs, why = recorded_logprobs(sample, response)
        alignment = SERVED
        if logprobs is None:
            given = sample.source.partition("; ")[2] if sample.source.startswith(SERVED) else ""
            alignment += "; " + (given or f"pi_old recomputed: {why}")
    else:
        why = sample.source.partition(": ")[2] if sample.source.startswith("re-rendered") else ""
        why = why or ("no served prompt ids" if not sample.prompt_token_ids else "no sampled token ids")
        try:
            prompt = prompt_ids(tokenizer, sample.messages, sample.tools, sample.chat_template_kwargs)
        except Exception as exc:  # a malformed prompt must not sink the whole batch
            return DroppedSample(sample.sample_id, f"chat template failed: {exc}")
        response, logprobs, how = align_response(tokenizer, sample)
        alignment = f"re-rendered: {why}; {how}"
        if not sample.response_text and len(response) <= 1:  # nothing but the stop token
            return DroppedSample(sample.sample_id, "empty response")
    if not response:
        return DroppedSample(sample.sample_id, "empty response")
    truncated, cut = False, 0
    if len(prompt) + len(response) > max_seq_len:
        room = max_seq_len - len(response)
        if room >= min(MIN_PROMPT_TOKENS, len(prompt)):
            # Left truncation: the newest context stays. The recorded log-probs were taken with the whole
            # prompt, so pi_old is recomputed on what the trainer sees.
            cut = len(prompt) - room
            prompt, logprobs = prompt[cut:], None
            alignment += f"; prompt left-truncated by {cut} tokens, pi_old recomputed"
        else:
            room = max_seq_len - min(MIN_PROMPT_TOKENS, len(prompt))
            if not truncate_response or room < 1:
                return DroppedSample(
                    sample.sample_id,
                    f"too long: the {len(response)}-token response alone leaves no room for the prompt "
                    f"in max_seq_len {max_seq_len}",
                )
            cut = max(0, len(prompt) - MIN_PROMPT_TOKENS)
            prompt = prompt[cut:]
            response, truncated = response[:room], True
            logprobs = None
            alignment += f"; prompt left-truncated by {cut} tokens, response cut to {room}"
    return EncodedSample(sample, prompt, response, logprobs, alignment, truncated, cut)


def encode_batch(
    tokenizer: Any, samples: list[TrainSample], *, max_seq_len: int, truncate_response: bool = False
) -> tuple[list[EncodedSample], list[DroppedSample]]:
    encoded: list[EncodedSample] = []
    dropped: list[DroppedSample] = []
    for sample in samples:
        result = encode_sample(
            tokenizer, sample, max_seq_len=max_seq_len, truncate_response=truncate_response
        )
        if isinstance(result, DroppedSample):
            dropped.append(result)
        else:
            encoded.append(result)
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


def collate_packed(
    sequences: list[tuple[list[int], list[int]]], *, pad_id: int, row_tokens: int | None = None
) -> Batch:
    """(prompt ids, response ids) pairs end to end in rows of at most `row_tokens` tokens (one row when None;
    a longer sample gets a row alone), position ids restarting at each sample, no attention mask. Rows are
    filled up to the longest with a padding block whose positions restart too, so it is a "sample" of its
    own that nothing attends to. The (B, T) response grid is the same as `collate`'s."""
    lengths = [len(p) + len(r) for p, r in sequences]
    rows = token_budget_groups(lengths, row_tokens) if row_tokens else [list(range(len(sequences)))]
    length = max(sum(lengths[i] for i in row) for row in rows)
    width = max(len(r) for _, r in sequences)
    size = len(sequences)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    logit_index = torch.zeros((size, width), dtype=torch.long)
    targets = torch.full((size, width), pad_id, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.float32)
    row_of = torch.zeros(size, dtype=torch.long)
    for r, row in enumerate(rows):
        used = 0
        for i in row:
            prompt, response = sequences[i]
            n = lengths[i]
            input_ids[r, used : used + n] = torch.tensor(prompt + response)
            position_ids[r, used : used + n] = torch.arange(n)
            first = used + len(prompt) - 1
            logit_index[i, : len(response)] = torch.arange(first, first + len(response))
            targets[i, : len(response)] = torch.tensor(response)
            mask[i, : len(response)] = 1.0
            row_of[i] = r
            used += n
        position_ids[r, used:] = torch.arange(length - used)
    return Batch(input_ids, None, position_ids, logit_index, targets, mask, row_of)


def token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of consecutive items grouped so that each group's lengths sum to at most `budget` (an item
    longer than the budget forms a group alone). Order is kept: the groups concatenated are 0..n-1."""
    groups: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if groups and used + n <= budget:
            groups[-1].append(i)
            used += n
        else:
            groups.append([i])
            used = n
    return groups


def pad_values(rows: list[list[float]], width: int, value: float = 0.0) -> Tensor:
    """Per-sample float lists (log-probs) on the (B, T) response grid."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
