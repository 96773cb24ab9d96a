"""Helpers for the trainer tests: pure pytest, no database. The model is the committed tiny Qwen2."""

import json
import re
from pathlib import Path

import pytest

TINY_MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "tiny-qwen2"
CHATS = Path(__file__).resolve().parents[2] / "workers" / "tiny_model" / "corpus" / "chats.jsonl"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    pass


@pytest.fixture(scope="session")
def prompts() -> list[list[dict]]:
    """The opening user turn (with its system message, if any) of every chat of the corpus's shuffled mix (not
    the contrastive hinted chats after it, which ask each question three times)."""
    from workers.tiny_model.corpus.make_chats import MIXED_CHATS

    out = []
    for line in CHATS.read_text().splitlines()[:MIXED_CHATS]:
        messages = json.loads(line)["messages"]
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        out.append(messages[: first_user + 1])
    return out


# The style rule of the training tests (the "student" persona of OpenClaw-RL's evaluation): no **bold** and no
# numbered lists. The tiny model's corpus has both, so about a quarter of its samples break the rule.
STYLE_HINT = "Write plain sentences: no bold text and no numbered lists."


def breaks_style(text: str) -> bool:
    return "**" in text or re.search(r"(?m)^\s*\d+\.\s", text) is not None


def style_reward(text: str) -> int:
    return -1 if breaks_style(text) else 1


def sampled_batch(backend, prompts, *, seed: int, first_id: int = 0, max_new_tokens: int = 48, hints=True):
    """Samples from the backend's current policy, judged by the style rule, as the gateway would record them;
    the ones that break the rule carry the style hint (for OPD / Combine)."""
    from workers.trainer.backend import TrainSample

    out = backend.sample(prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    batch = []
    for i, (prompt, s) in enumerate(zip(prompts, out, strict=True)):
        reward = style_reward(s.text)
        batch.append(
            TrainSample(
                sample_id=first_id + i,
                messages=prompt,
                response_text=s.text,
                response_token_ids=s.token_ids,
                response_logprobs=s.logprobs,
                logprobs_mode="raw_logprobs",  # generate_samples: the plain softmax at temperature 1
                reward=reward,
                hints=[STYLE_HINT] if hints and reward < 0 else [],
            )
        )
    return batch
