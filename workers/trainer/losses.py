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


@dataclass
class Sampler:
    """How a sampler turned logits into the distribution it drew from, one value per position (N,):
    temperature (> 0), top_p (1.0 = off) and top_k (0 = off). None for top_p / top_k: off everywhere."""

    temperature: Tensor
    top_p: Tensor | None = None
    top_k: Tensor | None = None

    def __getitem__(self, rows: slice | Tensor) -> Sampler:
        return Sampler(
            self.temperature[rows],
            None if self.top_p is None else self.top_p[rows],
            None if self.top_k is None else self.top_k[rows],
        )

    @classmethod
    def of(cls, rows: list[tuple[float, float, int]], device: torch.device | str = "cpu") -> Sampler | None:
        """One row per sample from (temperature, top_p, top_k) triples; None when every sample was drawn
        from the plain softmax (1.0, 1.0, 0), so the common case costs nothing."""
        if all(tuple(r) == (1.0, 1.0, 0) for r in rows):
            return None
        temperature = torch.tensor([float(r[0]) for r in rows], dtype=torch.float64, device=device)
        top_p = torch.tensor([float(r[1]) for r in rows], dtype=torch.float64, device=device)
        top_k = torch.tensor([int(r[2]) for r in rows], dtype=torch.long, device=device)
        return cls(
            temperature,
            None if bool((top_p >= 1).all()) else top_p,
            None if bool((top_k <= 0).all()) else top_k,
        )

    def at(self, where: Tensor) -> Sampler:
        """From one row per sample (B,) to one per selected position of a (B, T) grid (`where`, bool)."""

        def spread(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[:, None].expand(where.shape)[where]

        temperature = self.temperature[:, None].expand(where.shape)[where]  # always set, unlike the others
        return Sampler(temperature, spread(self.top_p), spread(self.top_k))


def sampled_logits(logits: Tensor, targets: Tensor, sampler: Sampler | None) -> Tensor:
    """The logits of the distribution the sampler drew each target from, in vLLM's order: divided by the
    temperature, then top-k (every token at least as large as the k-th stays), then top-p over what top-k
    left (the smallest tokens whose probabilities sum to at most 1 - p are dropped, the largest always
    stays); a dropped token's logit is -inf. The target always stays in the set: it was sampled from it
    under pi_old, so at theta = pi_old this is exactly the sampler's set, and later a target that theta
    pushed out keeps a finite log-prob (its ratio is then small and clipped) instead of -inf. Which tokens
    are dropped is a selection, not a function to differentiate: it is decided on detached values."""
    logits = at_least_float32(logits)
    if sampler is None:
        return logits
    scaled = logits / sampler.temperature.to(logits.dtype)[:, None]
    if sampler.top_k is None and sampler.top_p is None:
        return scaled
    ascending, order = scaled.detach().sort(dim=-1)
    vocab = scaled.shape[-1]
    if sampler.top_k is not None:
        k = torch.where(sampler.top_k > 0, sampler.top_k.clamp(max=vocab), vocab).to(torch.long)
        kth = ascending.gather(-1, (vocab - k)[:, None])
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    if sampler.top_p is not None:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        below = cumulative <= 1 - sampler.top_p.to(cumulative.dtype)[:, None]
        below[:, -1] = False
        ascending = ascending.masked_fill(below, float("-inf"))
    dropped = torch.zeros_like(scaled, dtype=torch.bool).scatter(-1, order, ascending == float("-inf"))
    dropped = dropped.scatter(-1, targets[:, None], False)
    return scaled.masked_fill(dropped, float("-inf"))


def sampled_logprobs(logits: Tensor, targets: Tensor, sampler: Sampler | None) -> Tensor:
    """log pi(target) under the distribution the sampler drew from (sampled_logits), float32 or wider: what
    vLLM returns with --logprobs-mode processed_logprobs. logits (N, V), targets (N,)."""
    z = sampled_logits(logits, targets, sampler)
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def at_least_float32(x: Tensor) -> Tensor:
    """bf16/fp16 to float32; float32 and float64 (the exactness tests) as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


# Response positions whose full-vocabulary logits exist at once: 1024 x 151,936 x 4 bytes = 0.6 GB (float32).
LOGIT_CHUNK_TOKENS = 1024


def _chunk_logprobs(
    hidden: Tensor, targets: Tensor, head: torch.nn.Module, sampler: Sampler | None = None
) -> tuple[Tensor, Tensor]:
    return _chunk_logits_logprobs(head(hidden), targets, sampler)


def _chunk_logits_logprobs(
    logits: Tensor, targets: Tensor, sampler: Sampler | None = None
) -> tuple[Tensor, Tensor]:
    z = sampled_logits(logits, targets, sampler)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    # p log p is 0 where p is 0 (a dropped token's -inf logit would make it nan).
    p_z = torch.softmax(z, dim=-1) * z
    entropy = lse - torch.where(torch.isfinite(z), p_z, 0.0).sum(-1)
    return logp, entropy


def chunked_token_logprobs(
    hidden: Tensor,
    targets: Tensor,
    head: torch.nn.Module,
    *,
    chunk: int = LOGIT_CHUNK_TOKENS,
    topk: int = 0,
    sampler: Sampler | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """log pi(target) and the entropy at each of N positions from their (N, d) hidden states, float32, with
    the LM head applied `chunk` positions at a time: the (N, V) logits never exist at once, and when a
    gradient is needed each chunk's logits are recomputed in the backward pass instead of kept (activation
    checkpointing per chunk), so the head's memory is one chunk's logits, not N's. Returns (logp (N,),
    entropy (N,), detached: reported, not trained; top-k ids (N, k) or None); equal to token_logprobs over
    the full logits. With a sampler (one row per position), pi is the distribution that sampler drew from
    (sampled_logprobs: the temperature, top-k, top-p); the top-k ids are the raw logits' either way."""
    from torch.utils.checkpoint import checkpoint

    logps, entropies, tops = [], [], []
    grad = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start : start + chunk], targets[start : start + chunk]
        part = None if sampler is None else sampler[start : start + chunk]
        if grad:
            logp, entropy = checkpoint(_chunk_logprobs, h, y, head, part, use_reentrant=False)
            if topk:
                with torch.no_grad():
                    tops.append(torch.topk(head(h), k=topk, dim=-1).indices)
        else:
            logits = head(h)
            logp, entropy = _chunk_logits_logprobs(logits, y, part)
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
    logp_teacher: Tensor,
    logp_old: Tensor,
    has_hint: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """A_t = w_opd clip(log pi_teacher(a_t | s + hint) - log pi_old(a_t | s), -clip, clip); turns without a
    hint are masked. clip None: unclipped. A token the teacher finds far likelier (or unlikelier) than the
    student did would otherwise carry an advantage of many nats and decide the update alone."""
    has_hint = has_hint.to(mask.dtype)[:, None]
    diff = logp_teacher.detach() - logp_old.detach()
    if clip is not None:
        diff = diff.clamp(-clip, clip)
    advantages = w_opd * diff * has_hint
    return advantages, mask * has_hint


def combine_advantages(
    logp_teacher: Tensor,
    logp_old: Tensor,
    rewards: Tensor,
    has_hint: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
    clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """A_t = w_opd clip(log pi_teacher - log pi_old) + w_rl r (the clip as in opd_advantages).

    A turn with only a score has no teacher, so its OPD term is 0 (pure Binary RL); a turn with only a hint
    has r = 0 (pure OPD); a turn with neither is masked.
    """
    opd, _ = opd_advantages(logp_teacher, logp_old, has_hint, mask, w_opd, clip)
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
