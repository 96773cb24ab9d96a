"""The model side of the local trainer, as plain functions of a model and a batch: where a run executes
(device, dtype, activation checkpointing), loading a base model, the log-probs (entropy, top-k) of a batch's
response tokens through the LM head a chunk at a time, and sampling replies. LocalBackend (local.py), the
multi-tenant pass, the gate and the benchmarks share them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.trainer.batching import Batch, end_token_ids
from workers.trainer.batching import prompt_ids as render_prompt_ids
from workers.trainer.losses import LOGIT_CHUNK_TOKENS, Sampler, chunked_token_logprobs


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_gradient_checkpointing(setting: bool | None, device: torch.device) -> bool:
    """None (the default) = on for CUDA: activation memory, not compute, bounds 16k-token rows of 4B."""
    return device.type == "cuda" if setting is None else bool(setting)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bf16 on GPU halves memory at no accuracy cost for LoRA (peft keeps the adapter in fp32); CPU bf16
        # matmuls are slow and gain nothing.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


# ------------------------------------------------------------------------------------------ loading


def load_pretrained(base_model: str, dtype: torch.dtype, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) from a local directory or hub id, through the same code a real Qwen model uses."""
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype).to(device)
    return model, tokenizer


ModelLoader = Callable[[str, torch.dtype, torch.device], tuple[Any, Any]]


# ------------------------------------------------------------------------------------------ forward passes


def response_hidden(model: Any, batch: Batch) -> tuple[Any, torch.Tensor]:
    """(the causal LM under any peft wrapper, the last hidden states at the response positions (B, T, d)).

    Calling the decoder and head separately keeps peft's LoRA layers (they live inside them) and peft's
    disable_adapter() in force. A packed row has no attention mask: the model builds the block-diagonal
    causal mask from the position ids, which restart at each sample."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    assert batch.row_of is not None  # Batch.__post_init__ sets it
    hidden = base.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    return base, hidden[batch.row_of[:, None], batch.logit_index]


@dataclass
class ResponseStats:
    logp: torch.Tensor  # (B, T) log pi(response token), float32 (float64 in float64 runs), 0 off the mask
    entropy: torch.Tensor  # (B, T) policy entropy at each response position (detached)
    top: torch.Tensor | None = None  # (B, T, k) top-k token ids, when asked for


def response_stats(
    model: Any,
    batch: Batch,
    *,
    topk: int = 0,
    chunk: int = LOGIT_CHUNK_TOKENS,
    sampler: Sampler | None = None,
) -> ResponseStats:
    """Log-probs (and entropy, top-k) of the response tokens on the (B, T) grid, computed only at the real
    response positions and through the LM head `chunk` positions at a time (losses.chunked_token_logprobs).
    sampler: one row per sample, how its reply was sampled (temperature, top-p, top-k); None = the plain
    softmax."""
    base, hidden = response_hidden(model, batch)
    where = batch.mask > 0
    logp, entropy, top = chunked_token_logprobs(
        hidden[where],
        batch.targets[where],
        base.get_output_embeddings(),
        chunk=chunk,
        topk=topk,
        sampler=None if sampler is None else sampler.at(where),
    )
    grid = torch.zeros(batch.mask.shape, dtype=logp.dtype, device=hidden.device)
    stats = ResponseStats(grid.masked_scatter(where, logp), grid.detach().masked_scatter(where, entropy))
    if topk:
        assert top is not None  # asked for: topk > 0
        full = torch.zeros((*batch.mask.shape, top.shape[-1]), dtype=torch.long, device=hidden.device)
        full[where] = top
        stats.top = full
    return stats


def response_logprobs(model: Any, batch: Batch, *, topk: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token t) on the (B, T) grid, and optionally the top-k token ids at each position."""
    stats = response_stats(model, batch, topk=topk)
    return stats.logp, stats.top


@dataclass
class Sampled:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"


@torch.no_grad()
def generate_samples(
    model: Any,
    tokenizer: Any,
    prompts: list[list[dict[str, Any]]],
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    logprobs: bool = True,
) -> list[Sampled]:
    """Sample one response per prompt from the model as it is (policy when an adapter is on), all prompts in
    one batched generate (left padding, KV cache). temperature 0 = greedy, as in vLLM.

    generate() in transformers applies top_k=50 from the default generation config unless told otherwise,
    which would make the samples come from a truncated distribution whose log-probs are not the policy's;
    top_k=0 and top_p=1.0 sample the full distribution. The returned log-probs are the model's raw
    (temperature-1) ones, like vLLM's default raw logprobs, so they are exactly what the trainer recomputes
    (rho = 1 before an update). logprobs=False leaves them out (Sampled.logprobs empty) and saves keeping
    every step's full-vocabulary logits.
    """
    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    rows = [render_prompt_ids(tokenizer, messages, tools) for messages in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    ends = end_token_ids(tokenizer)
    was_training = model.training
    model.eval()
    greedy = temperature <= 0
    sampling = {"do_sample": False} if greedy else {
        "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        **sampling,
        # A resident base that trained with gradient checkpointing may have the cache off in its config.
        use_cache=True,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(ends),
        pad_token_id=pad,
        output_logits=logprobs,
        return_dict_in_generate=True,
    )
    model.train(was_training)
    new_tokens = out.sequences[:, width:]
    # Each step's log-prob of the token it chose, one step at a time (no (B, T, V) tensor).
    chosen = (torch.stack([torch.log_softmax(step.float(), -1).gather(-1, new_tokens[:, t, None]).squeeze(-1)
                           for t, step in enumerate(out.logits)], dim=1).tolist() if logprobs else None)
    results = []
    for i in range(len(rows)):
        ids, lps = [], []
        finish = "length"
        for t, token in enumerate(new_tokens[i].tolist()):
            ids.append(token)
            if chosen is not None:
                lps.append(chosen[i][t])
            if token in ends:
                finish = "stop"
                break
        text_ids = ids[:-1] if finish == "stop" else ids
        text = tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        results.append(Sampled(text=text, token_ids=ids, logprobs=lps, finish_reason=finish))
    return results
