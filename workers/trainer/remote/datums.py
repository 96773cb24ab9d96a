"""What one sample becomes on the wire of a Tinker-style service: its advantages and its datum.

Datum layout (OpenClaw-RL's Tinker path): model_input = (prompt + response)[:-1], target_tokens = (prompt +
response)[1:]; logprobs and advantages are 0 on the P - 1 prompt targets and carry pi_old and A_t on the R
response targets. Tinker's "ppo" loss SUMS the per-token clipped surrogate over the datums of a
forward_backward, while ClawHub's objective is a masked token mean per sample, then a mean over the step's
samples; since that surrogate is positively homogeneous in A, sending A_t / (R_i * N) (R_i response tokens of
sample i, N samples in the optimizer step) makes the remote loss and gradient equal to the local one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workers.trainer.backend import TrainConfig, TrainSample


@dataclass
class PreparedSample:
    """One trainable sample on the wire grid."""

    sample: TrainSample
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]  # per response token, before the 1 / (R * N) aggregation scale
    hint: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def build_advantages(
    config: TrainConfig, reward: int, old: list[float], teacher: list[float] | None
) -> list[float] | None:
    """A_t per response token for the configured method, or None when the turn carries no signal (masked).

    rl: A_t = r, r = 0 masked. opd: A_t = w_opd (teacher - old), no hint masked. combine: the sum of both
    terms, a turn with only a score has the OPD term 0 and one with only a hint has r = 0. The OPD log-ratio
    is clipped to +-config.opd_clip as in losses.opd_advantages."""
    if config.method == "rl":
        return [float(reward)] * len(old) if reward != 0 else None
    bound = config.opd_clip if config.opd_clip is not None else math.inf
    opd = (
        [config.w_opd * max(-bound, min(bound, t - o)) for t, o in zip(teacher, old, strict=True)]
        if teacher is not None
        else None
    )
    if config.method == "opd":
        return opd
    if opd is None and reward == 0:
        return None
    opd = opd or [0.0] * len(old)
    return [a + config.w_rl * reward for a in opd]


def datum_arrays(prepared: PreparedSample, scale: float) -> dict[str, list]:
    """(prompt + response)[:-1] as input, the shifted targets, and pi_old / A on the response targets only."""
    tokens = prepared.tokens
    pad = len(prepared.prompt_ids) - 1
    return {
        "model_input": tokens[:-1],
        "target_tokens": tokens[1:],
        "logprobs": [0.0] * pad + [float(x) for x in prepared.old_logprobs],
        "advantages": [0.0] * pad + [a * scale for a in prepared.advantages],
    }
