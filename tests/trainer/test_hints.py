"""Overlap-guided hint selection: O_k = sum_t |topK(pi_old)_t & topK(pi_teacher,k)_t|, argmax, ties to the
shortest."""

import pytest
import torch

from workers.trainer.hints import choose_hint, dedupe_hints, topk_ids, topk_overlap


def test_overlap_counts_shared_tokens_per_position():
    policy = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    teacher = torch.tensor([[4, 3, 9, 10], [5, 6, 7, 8]])  # 2 shared at t=0 (order ignored), 4 at t=1
    assert topk_overlap(policy, teacher) == 6
    assert topk_overlap(policy, teacher, mask=torch.tensor([1, 0])) == 2  # padding does not count


def test_choose_hint_takes_the_argmax():
    assert choose_hint(["a long hint", "b", "medium one"], [3, 5, 4]) == 1


def test_choose_hint_ties_go_to_the_shortest_then_the_first():
    assert choose_hint(["a much longer hint", "short", "tiny"], [7, 7, 2]) == 1
    assert choose_hint(["same", "also", "zzzz"], [1, 1, 1]) == 0
    with pytest.raises(ValueError):
        choose_hint(["a"], [1, 2])


def test_dedupe_drops_empties_and_whitespace_repeats():
    assert dedupe_hints(["  Use plain text. ", "Use  plain text.", "", "  ", "Be brief."]) == [
        "Use plain text.",
        "Be brief.",
    ]


def test_topk_ids_per_position():
    logits = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7]])
    assert sorted(topk_ids(logits, 2)[0].tolist()) == [1, 4]


def test_the_backend_picks_the_hint_whose_teacher_agrees_most(tiny_model_dir, tmp_path, prompts):
    """End to end through LocalBackend: the chosen hint is the argmax of the overlaps it computed."""
    from workers.trainer.backend import TrainConfig, TrainSample
    from workers.trainer.local import LocalBackend

    backend = LocalBackend()
    backend.start(str(tiny_model_dir), None, TrainConfig(method="opd", lr=1e-3, device="cpu"), str(tmp_path))
    [sampled] = backend.sample([prompts[0]], max_new_tokens=24, seed=0)
    hints = [
        "Write plain sentences: no bold text and no numbered lists.",
        "zq xv kw " * 12,  # noise: moves the teacher's distribution far from the policy's
        "Write plain sentences: no bold text and no numbered lists. ",  # a duplicate once stripped
    ]
    sample = TrainSample(
        sample_id="s",
        messages=prompts[0],
        response_text=sampled.text,
        response_token_ids=sampled.token_ids,
        response_logprobs=sampled.logprobs,
        hints=hints,
    )
    backend.train([sample])
    entry = backend.prepared["s"]
    assert len(entry["overlaps"]) == 2  # the duplicate was not scored twice
    assert entry["hint"] == dedupe_hints(hints)[choose_hint(dedupe_hints(hints), entry["overlaps"])]
    assert len(entry["teacher_logprobs"]) == len(sampled.token_ids)
