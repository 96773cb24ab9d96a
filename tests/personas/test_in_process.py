"""The in-process track of the persona benchmark on the tiny model: an update runs end to end and moves the
adapter; the samples it trains carry the sampler's temperature and log-probs the trainer recomputes at that
temperature; the judge reads the user's reaction only."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.in_process import InProcessBench, InProcessConfig, Reply, sample_replies
from tests.personas.conftest import HABIT, LONG_PROSE, WATER
from tests.trainer.conftest import TINY_MODEL_DIR
from workers.trainer.backend import TrainConfig
from workers.trainer.batching import collate, encode_batch, pad_values
from workers.trainer.forward import response_stats
from workers.trainer.local import LocalBackend
from workers.trainer.losses import Sampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(tmp_path, **kw) -> InProcessConfig:
    base = dict(model=TINY_MODEL_DIR, max_updates=1, batch_size=4, eval_samples=1, chat_max_tokens=16,
                eval_max_tokens=16, parallel_sessions=2, out_dir=tmp_path / "out", overrides={"lr": 1e-2})
    return InProcessConfig(**(base | kw))


def test_one_update_runs_end_to_end_and_changes_the_adapter(tmp_path):
    # What an earlier benchmark into the same folder left: its run must not be resumed as this one's.
    stale = tmp_path / "out" / "adapters" / "combine-brief" / "run-1" / "checkpoints" / "step-00000003"
    stale.mkdir(parents=True)
    (stale / "state.json").write_text('{"step": 3}')
    bench = InProcessBench(config(tmp_path), echo=lambda line: None, log=lambda line: None)
    [result] = bench.run()
    track = result["brief"]
    assert result["track"] == "in-process" and result["chat_temperature"] == 0.7
    assert len(track["compliance"]) == 2 and len(track["capability"]) == 2
    assert track["prompt_only"] is not None and track["gate"][0]["outcome"] == "active"
    assert track["judge_agreement"]["reactions"] >= 2
    # The exported version: a LoRA whose B matrices (zero when created) moved.
    weights = load_file(tmp_path / "out" / "adapters" / "combine-brief" / "v1" / "adapter_model.safetensors")
    moved = [name for name, w in weights.items() if "lora_B" in name and w.abs().max() > 0]
    assert moved
    lines = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    assert [line["update"] for line in lines] == [0, 1]
    assert lines[1]["train"]["trained"] == 4 and lines[1]["train"]["pi_old_recorded"] == 4
    assert sum(turn["replies"] for turn in lines[1]["sampled"].values()) == 4
    kept = (tmp_path / "out" / "batches" / "combine-brief-u1.jsonl").read_text().splitlines()
    assert len(kept) == 4 and {"reply", "reward", "hints"} <= set(json.loads(kept[0]))
    assert (tmp_path / "out" / "compliance.png").read_bytes().startswith(b"\x89PNG")


def test_trained_samples_carry_the_samplers_temperature_and_its_log_probs(tmp_path):
    """The recorded log-probs are of softmax(logits / 0.7): the trainer's own recomputation at the sample's
    sampler agrees, and at temperature 1 it does not."""
    bench = InProcessBench(config(tmp_path), echo=lambda line: None, log=lambda line: None)
    backend = LocalBackend()
    backend.start(str(TINY_MODEL_DIR), None, TrainConfig(device="cpu", dtype="float32"), str(tmp_path / "w"))
    try:
        user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random("0:brief"), noise=0.1)
        from clawhub.devtools.personas.tracks import Track

        track = Track(name="brief", persona=P.BRIEF, members=[], model="tiny")
        samples = bench.collect_batch(track, user, backend, 1, {})
        assert len(samples) == 4
        assert {(s.temperature, s.top_p, s.top_k, s.logprobs_mode) for s in samples} == {
            (0.7, 1.0, 0, "processed_logprobs")}
        assert all(s.recorded_logprobs_problem() == "" for s in samples)
        encoded, dropped = encode_batch(backend.tokenizer, samples, max_seq_len=4096)
        assert not dropped and all(e.old_logprobs is not None for e in encoded)
        batch = collate([(e.prompt_ids, e.response_ids) for e in encoded], pad_id=0)
        recorded = pad_values([e.old_logprobs for e in encoded], batch.mask.shape[1])
        with torch.no_grad():
            sampler = Sampler.of([s.sampler for s in samples], "cpu")
            at_t = response_stats(backend.model, batch, sampler=sampler)
            at_1 = response_stats(backend.model, batch)
        assert ((at_t.logp - recorded).abs() * batch.mask).max() < 1e-4
        assert ((at_1.logp - recorded).abs() * batch.mask).max() > 1e-2
    finally:
        backend.close()


def test_the_judge_reads_the_reaction_not_the_rubric(tmp_path):
    bench = InProcessBench(config(tmp_path), echo=lambda line: None, log=lambda line: None)
    reply = Reply(text=HABIT, token_ids=[5, 6, 2], logprobs=[-1.0, -1.0, -0.5], finish_reason="stop")
    brief = Reply(text="Water evaporates and falls back as rain.", token_ids=[5, 2], logprobs=[-1.0, -0.5],
                  finish_reason="stop")
    messages = [{"role": "user", "content": WATER.question}]
    complaint = P.BRIEF.complaints.training[0].format(topic=WATER.topic)
    for text in (reply, brief):  # the same complaint gets the same verdict whatever the reply was
        sample = bench.judged_sample("a", messages, [1, 2], text, complaint)
        assert sample.reward == -1 and sample.hints and complaint in sample.hints[0]
    # A reaction the rules were not written for gives no sample, even for a reply the rubric refuses.
    held_out = P.BRIEF.complaints.held_out[0].format(topic=WATER.topic)
    assert not P.BRIEF.complies(LONG_PROSE)
    assert bench.judged_sample("b", messages, [1, 2], reply, held_out) is None
    thanks = P.THANKS.training[0].format(next="Tell me more.")
    assert bench.judged_sample("c", messages, [1, 2], reply, thanks).reward == 1


def test_sampling_is_reproducible_and_stops_on_the_end_token(tmp_path):
    backend = LocalBackend()
    backend.start(str(TINY_MODEL_DIR), None, TrainConfig(device="cpu"), str(tmp_path / "w"))
    try:
        from workers.trainer.batching import prompt_ids

        prompts = [prompt_ids(backend.tokenizer, P.held_out_messages(p), None)
                   for p in P.held_out_prompts()[:4]]
        first = sample_replies(backend.model, backend.tokenizer, prompts, max_new_tokens=24, temperature=0.7,
                               seed=3)
        again = sample_replies(backend.model, backend.tokenizer, prompts, max_new_tokens=24, temperature=0.7,
                               seed=3)
        assert [r.token_ids for r in first] == [r.token_ids for r in again]
        for r in first:
            assert len(r.logprobs) == len(r.token_ids) and all(lp <= 0 for lp in r.logprobs)
            assert (r.finish_reason == "stop") == (r.token_ids[-1] in {backend.tokenizer.eos_token_id,
                                                                        *backend.tokenizer.convert_tokens_to_ids(
                                                                            ["<|im_end|>"])})
    finally:
        backend.close()


def test_the_null_control_keeps_each_batchs_rewards_but_not_which_reply_earned_them():
    from clawhub.devtools.personas.in_process import shuffled_rewards
    from workers.trainer.backend import TrainSample

    batch = [TrainSample(sample_id=f"s{i}", messages=[{"role": "user", "content": "Explain tides."}],
                         response_text=f"reply {i}", reward=reward,
                         hints=["Keep it short."] if reward < 0 else [])
             for i, reward in enumerate([1, 1, -1, -1, -1, 0, 1, -1])]
    shuffled = shuffled_rewards(batch, random.Random("0:brief:1"))
    assert sorted(s.reward for s in shuffled) == sorted(s.reward for s in batch)
    assert [s.reward for s in shuffled] != [s.reward for s in batch]
    assert [s.response_text for s in shuffled] == [s.response_text for s in batch]
    assert all(s.hints == [] for s in shuffled) and batch[2].hints == ["Keep it short."]
    again = shuffled_rewards(batch, random.Random("0:brief:1"))
    assert [s.reward for s in again] == [s.reward for s in shuffled]


def test_rescore_measures_the_base_the_prompt_only_baseline_and_saved_versions_at_its_limit(tmp_path,
                                                                                             monkeypatch):
    """Through the command, as it is run: a version a run exported, scored at another --eval-max-tokens. At
    2 tokens every reply is cut, so nothing complies; at 48 some replies finish. (Three held-out prompts
    instead of all, for time.)"""
    from django.core.management import CommandError, call_command

    prompts = P.held_out_prompts()[:3]
    monkeypatch.setattr(P, "held_out_prompts", lambda: prompts)
    backend = LocalBackend(resident=True)
    backend.start(str(TINY_MODEL_DIR), None, TrainConfig(device="cpu", dtype="float32"), str(tmp_path / "w"))
    version = backend.export_adapter(str(tmp_path / "v1"))
    backend.close()

    def rescore(limit: int) -> list[dict]:
        out = _Lines()
        call_command("bench_personas", "--in-process", "--rescore", version, "--personas", "plain",
                     "--seeds", "3", "--eval-max-tokens", str(limit), "--eval-samples", "1",
                     "--model", str(TINY_MODEL_DIR), "--out", str(tmp_path / "out"), stdout=out,
                     stderr=_Lines())
        return [json.loads(line) for line in out.lines]

    cut_short = rescore(2)
    assert [r["model"] for r in cut_short] == ["base", "prompt-only", version]
    held_out = len(prompts)
    assert all(r["cut"] == held_out and r["compliance"] == 0 and r["eval_max_tokens"] == 2 for r in cut_short)
    assert any(r["cut"] < held_out for r in rescore(48))
    with pytest.raises(CommandError, match="not an exported version"):
        call_command("bench_personas", "--in-process", "--rescore", str(tmp_path), "--personas", "plain",
                     stdout=_Lines(), stderr=_Lines())


class _Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, s):
        self.lines += [line for line in s.splitlines() if line.strip()]


def test_the_capability_gate_rejects_a_version_that_forgot_and_continues_the_last_promoted(tmp_path,
                                                                                          monkeypatch):
    """Guard accuracies base 1.0, then 0.9 (5 of 53 lost: over the gate's 2) and 1.0: the first version is
    rejected, the second run starts again from the base (its parent), and two attempts make one update."""
    guards = iter([1.0, 0.9, 1.0])
    monkeypatch.setattr(InProcessBench, "capability", lambda self, backend: next(guards))
    bench = InProcessBench(config(tmp_path, capability_gate=True, batch_size=2), echo=lambda line: None,
                           log=lambda line: None)
    parents = []
    start = InProcessBench._backend

    def backend(self, method, parent, workdir):
        parents.append(parent)
        return start(self, method, parent, workdir)

    monkeypatch.setattr(InProcessBench, "_backend", backend)
    [result] = bench.run()
    track = result["brief"]
    assert parents == [None, None]
    assert (track["updates_attempted"], track["updates_promoted"], track["updates_rejected"]) == (2, 1, 1)
    assert [g["outcome"] for g in track["gate"]] == ["rejected", "active"]
    assert "forgot: 5 of 53" in track["gate"][0]["reason"]
    assert track["capability"] == [1.0, 1.0]  # the base and the promoted version only
