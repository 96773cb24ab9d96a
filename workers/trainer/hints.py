"""Overlap-guided hint selection (OpenClaw-RL's OPD): when the judge accepted several hints for one turn,
use the one whose hinted teacher agrees most with the policy's own top-K candidates, token by token.

O_k = sum_t |topK(pi_old)_t  intersect  topK(pi_teacher,k)_t|   (K = 4), over the response tokens.

A hint the teacher's distribution barely moves under is uninformative, and one that moves it everywhere is
likely off-topic; high overlap picks the hint that edits the policy's choices rather than replacing them.
Ties go to the shortest hint (less context to misread).
"""

from __future__ import annotations

import torch
from torch import Tensor


def dedupe_hints(hints: list[str]) -> list[str]:
    """Strip, drop empties, and drop repeats that differ only in whitespace; first occurrence order kept."""
    seen: set[str] = set()
    unique = []
    for hint in hints:
        text = (hint or "").strip()
        key = " ".join(text.split())
        if text and key not in seen:
            seen.add(key)
            unique.append(text)
    return unique


def topk_overlap(policy_topk: Tensor, teacher_topk: Tensor, mask: Tensor | None = None) -> int:
    """sum_t |policy_topk[t] intersect teacher_topk[t]| for (T, K) tensors of token ids; mask (T,) skips
    positions (padding)."""
    # Token ids within one row of a top-K are distinct, so counting pairwise matches counts the intersection.
    per_token = (policy_topk[:, :, None] == teacher_topk[:, None, :]).any(-1).sum(-1)
    if mask is not None:
        per_token = per_token * mask.to(per_token.dtype)
    return int(per_token.sum())


def choose_hint(candidates: list[str], overlaps: list[int]) -> int:
    """Index of the argmax overlap; ties go to the shortest hint, then to the earliest."""
    if not candidates or len(candidates) != len(overlaps):
        raise ValueError("choose_hint needs one overlap per candidate and at least one candidate")
    return min(range(len(candidates)), key=lambda i: (-overlaps[i], len(candidates[i]), i))


def topk_ids(logits: Tensor, k: int) -> Tensor:
    """Top-k token ids per position of (..., V) logits."""
    return torch.topk(logits, k=min(k, logits.shape[-1]), dim=-1).indices
