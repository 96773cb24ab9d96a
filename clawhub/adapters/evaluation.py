"""The eval gate's arithmetic: generate with a model on held-out prompts, score each answer, average.

Kept free of rows so that it reads (and is tested) on its own; ``services.adapter_evaluate`` loads the rows,
picks the upstream and stores the outcome.

The score of an answer comes from a reward function ``(messages, text) -> float`` named by the setting
CLAWHUB_EVAL_REWARD ("module:function"). The default, ``style_reward``, is the deterministic style rule the
trainer is tested with (OpenClaw-RL's "student" persona: plain sentences, no **bold**, no numbered lists); a
deployment with its own preference points the setting at its own rule. The judge that scores live turns reads
the user's *next* message, which held-out prompts do not have, so it cannot be reused here as is.
"""

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

RewardFn = Callable[[list[dict], str], float]
GenerateFn = Callable[[str, list[dict]], str]  # (upstream model name, messages) -> text


def style_reward(messages: list[dict], text: str) -> float:
    breaks = "**" in text or re.search(r"(?m)^\s*\d+\.\s", text) is not None
    return -1.0 if breaks else 1.0


def reward_function(path: str) -> RewardFn:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"CLAWHUB_EVAL_REWARD={path!r}: use 'package.module:function'")
    return getattr(importlib.import_module(module), attr)


@dataclass
class Score:
    model: str
    mean: float | None
    rewards: list[float] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)  # a few answers, for people reading the version page

    def to_dict(self) -> dict:
        return {"model": self.model, "mean": self.mean, "rewards": self.rewards, "samples": self.samples}


def score_model(
    model: str, prompts: list[list[dict]], generate: GenerateFn, reward: RewardFn, keep_samples: int = 3
) -> Score:
    rewards, samples = [], []
    for messages in prompts:
        text = generate(model, messages)
        rewards.append(float(reward(messages, text)))
        if len(samples) < keep_samples:
            samples.append(text[:500])
    mean = sum(rewards) / len(rewards) if rewards else None
    return Score(model=model, mean=mean, rewards=rewards, samples=samples)


def passes(candidate: Score, baseline: Score, margin: float) -> bool:
    """Promote only if the candidate is not worse than the baseline by more than ``margin``. With no held-out
    prompts there is nothing to measure, and a first version has nothing to lose: it passes."""
    if candidate.mean is None or baseline.mean is None:
        return True
    return candidate.mean >= baseline.mean - margin
