"""The OpenClaw-RL objectives (Binary RL, OPD, Combine; clipped PPO surrogate) as small pure functions.

Shapes: B samples x T response positions. `mask` is 1.0 on real response tokens and 0.0 on padding; the
advantage functions return a (possibly narrower) mask too, because Binary RL and OPD switch whole turns off.
Everything that is not pi_theta (old and teacher log-probs, rewards) is treated as a constant: callers pass
detached tensors, and the advantage functions detach again so a slip cannot leak gradient into the teacher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] for each position; at least float32 whatever the logits' dtype (bf16
    log-probs are too coarse for a ratio near 1)."""
    logits = at_least_float32(logits)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def at_least_float32(x: Tensor) -> Tensor:
    """bf16/fp16 to float32; float32 and float64 (the exactness tests) as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


# Response positions whose full-vocabulary logits exist at once: 1024 x 151,936 x 4 bytes = 0.6 GB (float32).
LOGIT_CHUNK_TOKENS = 1024


def _chunk_logprobs(hidden: Tensor, targets: Tensor, head: torch.nn.Module) -> tuple[Tensor, Tensor]:
    return _chunk_logits_logprobs(head(hidden), targets)


def _chunk_logits_logprobs(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    logits = at_least_float32(logits)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def chunked_token_logprobs(
    hidden: Tensor,
    targets: Tensor,
    head: torch.nn.Module,
    *,
    chunk: int = LOGIT_CHUNK_TOKENS,
    topk: int = 0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """log pi(target) and the entropy at each of N positions from their (N, d) hidden states, float32, with
    the LM head applied `chunk` positions at a time: the (N, V) logits never exist at once, and when a
    gradient is needed each chunk's logits are recomputed in the backward pass instead of kept (activation
    checkpointing per chunk), so the head's memory is one chunk's logits, not N's. Returns (logp (N,),
    entropy (N,), detached: reported, not trained; top-k ids (N, k) or None); equal to token_logprobs over
    the full logits."""
    from torch.utils.checkpoint import checkpoint

    logps, entropies, tops = [], [], []
    grad = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start : start + chunk], targets[start : start + chunk]
        if grad:
            logp, entropy = checkpoint(_chunk_logprobs, h, y, head, use_reentrant=False)
            if topk:
                with torch.no_grad():
                    tops.append(torch.topk(head(h), k=topk, dim=-1).indices)
        else:
            logits = head(h)
            logp, entropy = _chunk_logits_logprobs(logits, y)
            if topk:
                tops.append(torch.topk(logits, k=min(topk, logits.shape[-1]), dim=-1).indices)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, empty, (targets.new_zeros((0, topk)) if topk else None)
    top = torch.cat(tops) if topk else None
    return torch.cat(logps), torch.cat(entropies).detach(), top


def ratio(logp_new: Tensor, logp_old: Tensor) -> Tensor:
    """rho = pi_theta / pi_old per token."""
    return torch.exp(logp_new - logp_old)


def clipped_surrogate(
    logp_new: Tensor, logp_old: Tensor, advantages: Tensor, eps_low: float = 0.2, eps_high: float = 0.28
) -> Tensor:
    """Per-token PPO loss max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)); asymmetric clip (DAPO)."""
    rho = ratio(logp_new, logp_old)
    return torch.maximum(-advantages * rho, -advantages * rho.clamp(1 - eps_low, 1 + eps_high))


def masked_mean_per_sample(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over each sample's unmasked tokens, shape (B,); 0 for a sample with no unmasked token."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def aggregate(
    per_token: Tensor, mask: Tensor, num_samples: int | None = None, weights: Tensor | None = None
) -> Tensor:
    """Masked token mean per sample, then mean over the samples that have any unmasked token.

    num_samples overrides the denominator: gradient accumulation passes the count of active samples in the
    whole optimizer step, so that the summed micro-batch losses equal the loss of the step done in one go.
    weights (B,), optional: each sample's mean is multiplied by its weight before the sum; the denominator
    stays the sample count, so a weight below 1 shrinks that sample's pull without growing the others'.
    """
    active = (mask.sum(-1) > 0).sum()
    denominator = active.clamp(min=1) if num_samples is None else max(num_samples, 1)
    per_sample = masked_mean_per_sample(per_token, mask)
    if weights is not None:
        per_sample = per_sample * weights.detach().to(per_sample.dtype)
    return per_sample.sum() / denominator


# --------------------------------------------------------------------------------------------- advantages


def binary_rl_advantages(rewards: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """A_t = r for every token of the turn; turns with r = 0 (ambiguous, or no next state) are masked out."""
    rewards = rewards.detach().to(mask.dtype)
    advantages = rewards[:, None].expand_as(mask)
    return advantages, mask * (rewards != 0)[:, None]


def opd_advantages(
    logp_teacher: Tensor, logp_old: Tensor, has_hint: Tensor, mask: Tensor, w_opd: float = 1.0
) -> tuple[Tensor, Tensor]:
    """A_t = w_opd (log pi_teacher(a_t | s + hint) - log pi_old(a_t | s)); turns without a hint are masked."""
    has_hint = has_hint.to(mask.dtype)[:, None]
    advantages = w_opd * (logp_teacher.detach() - logp_old.detach()) * has_hint
    return advantages, mask * has_hint


def combine_advantages(
    logp_teacher: Tensor,
    logp_old: Tensor,
    rewards: Tensor,
    has_hint: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """A_t = w_opd (log pi_teacher - log pi_old) + w_rl r.

    A turn with only a score has no teacher, so its OPD term is 0 (pure Binary RL); a turn with only a hint
    has r = 0 (pure OPD); a turn with neither is masked.
    """
    opd, _ = opd_advantages(logp_teacher, logp_old, has_hint, mask, w_opd)
    rewards = rewards.detach().to(mask.dtype)
    advantages = opd + w_rl * rewards[:, None]
    keep = (has_hint.to(torch.bool) | (rewards != 0)).to(mask.dtype)
    return advantages, mask * keep[:, None]


def kl_k3(logp_new: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref) on the sampled tokens: exp(d) - d - 1, d = ref - new.
    Non-negative and unbiased for samples from pi_theta (Schulman, "Approximating KL divergence")."""
    d = logp_ref.detach() - logp_new
    return torch.exp(d) - d - 1


# --------------------------------------------------------------------------------------------- the loss


@dataclass
class LossOutput:
    loss: Tensor
    clip_fraction: Tensor
    kl: Tensor


def policy_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    logp_ref: Tensor | None = None,
    num_samples: int | None = None,
    weights: Tensor | None = None,
) -> LossOutput:
    """The clipped surrogate aggregated per sample then over samples, plus kl_coef * KL to the reference.
    weights (B,), optional: per-sample loss weights, multiplied into both the surrogate and the KL term."""
    per_token = clipped_surrogate(logp_new, logp_old, advantages.detach(), eps_low, eps_high)
    loss = aggregate(per_token, mask, num_samples, weights)
    kl = torch.zeros((), device=loss.device)
    if kl_coef > 0:
        if logp_ref is None:
            raise ValueError("kl_coef > 0 needs the reference (base model) log-probs")
        kl = aggregate(kl_k3(logp_new, logp_ref), mask, num_samples, weights)
        loss = loss + kl_coef * kl
    with torch.no_grad():
        rho = ratio(logp_new, logp_old)
        clipped = ((rho < 1 - eps_low) | (rho > 1 + eps_high)).to(mask.dtype)
        clip_fraction = (clipped * mask).sum() / mask.sum().clamp(min=1)
    return LossOutput(loss=loss, clip_fraction=clip_fraction, kl=kl.detach())
