"""A real training run on CPU: the tiny model learns a style preference from rule-judged rewards.

The rule (OpenClaw-RL's "student" persona): no **bold** and no numbered lists; +1 if a response follows it,
-1 if not. The tiny model's corpus answers some questions with bold headings and numbered steps, so the base
model breaks the rule in about a quarter of its samples. On-policy loop: sample 16 prompts from the current
policy, judge, one optimizer step, 30 times (about 10 s per method here). Evaluation: 128 samples (64 held-out
prompts x 2) from the trained adapter vs the base model with the same seed.

Stated margin: the rule-passing fraction rises by at least 0.15 (measured: Binary RL 0.74 -> 0.99, Combine
0.74 -> 0.96). For Combine the hint is attached to every rule-breaking sample; the tiny model cannot read
instructions, so its hinted teacher adds little beyond the reward: the test shows Combine trains and does not
undo the RL signal, not that OPD alone helps (OPD alone does not, on a model this small).
"""

import random

import pytest

from tests.trainer.conftest import breaks_style, sampled_batch
from workers.trainer.backend import TrainConfig
from workers.trainer.local import LocalBackend

MARGIN = 0.15
ITERATIONS = 30
BATCH = 16


def pass_rate(backend, prompts, *, with_adapter: bool) -> float:
    out = backend.sample(prompts * 2, max_new_tokens=48, temperature=1.0, seed=123, with_adapter=with_adapter)
    return 1 - sum(breaks_style(s.text) for s in out) / len(out)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rl", "combine"])
def test_training_raises_the_rule_reward_over_the_base(method, tiny_model_dir, tmp_path, prompts):
    held_out = prompts[::4][:64]
    pool = [p for i, p in enumerate(prompts) if i % 4 != 0]
    backend = LocalBackend()
    config = TrainConfig(method=method, lr=2e-3, device="cpu", micro_batch_size=BATCH, seed=0)
    backend.start(str(tiny_model_dir), None, config, str(tmp_path))

    rng = random.Random(0)
    hinted = 0
    for iteration in range(ITERATIONS):
        batch = sampled_batch(
            backend,
            rng.sample(pool, BATCH),
            seed=iteration,
            first_id=iteration * BATCH,
            hints=method == "combine",
        )
        result = backend.train(batch)
        # A reply that is only the end-of-turn token passes the rule and is dropped (nothing to train on).
        assert result.steps == iteration + 1
        assert {d.reason for d in result.dropped} <= {"empty response"}
        hinted += sum(1 for entry in backend.prepared.values() if entry["hint"] is not None)

    trained, base = (
        pass_rate(backend, held_out, with_adapter=True),
        pass_rate(backend, held_out, with_adapter=False),
    )
    print(f"{method}: base {base:.3f} -> trained {trained:.3f}")
    assert 0.5 < base < 0.9  # the base model breaks the rule often enough for the test to mean something
    assert trained >= base + MARGIN
    assert (hinted > 0) == (method == "combine")  # Combine really used the teacher
