"""The benchmark's code paths (numbers are reported, not asserted): the tiny run, the Qwen3-shaped GPU path
scaled down to run on CPU, and the refusal to run the 4B shape without a GPU."""

import json

import pytest
import torch

from workers.trainer import bench
from workers.trainer.backend import TrainConfig
from workers.trainer.local import LocalBackend


def test_tiny_bench_prints_one_json_line_per_objective():
    lines = []
    rows = bench.bench(model_shape="tiny", objectives=("rl", "combine"), steps=1, log=lines.append)
    assert [json.loads(line)["objective"] for line in lines] == ["rl", "combine"]
    for row in rows:
        assert row["tokens_per_step"] > 0 and row["seconds_per_step"] > 0 and row["tokens_per_s"] > 0
        assert row["reference_seconds_per_step"] > 0 and row["speedup_vs_reference"] > 0
        assert row["peak_mem_mb"] >= 0 and row["model_tflops_per_step"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_the_4b_shape_refuses_to_run_without_a_gpu(capsys):
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.bench(model_shape="qwen3-4b")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model-shape", "qwen3-4b"])
    assert exit_info.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err


def test_the_qwen3_path_works_scaled_down(tmp_path):
    """What the GPU run does (random Qwen3 built in place, long synthetic turns, both loops), on a small
    Qwen3 so it runs on CPU."""
    loader = bench.qwen3_4b_loader(
        bench.TINY_MODEL_DIR,
        vocab_size=8192,  # covers the tiny model's tokenizer, whose ids these samples use
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    backend = LocalBackend(model_loader=loader)
    backend.start(str(bench.TINY_MODEL_DIR), None, TrainConfig(method="combine", device="cpu"), str(tmp_path))
    assert type(backend.model.get_base_model()).__name__ == "Qwen3ForCausalLM"
    shape = bench.Shape("small", batch_samples=4, micro_batch_size=2, prompt_tokens=96, response_tokens=48)
    samples = bench.make_samples(backend, shape, seed=0)
    assert len(samples) == 4 and all(len(s.response_token_ids) >= 40 for s in samples)
    timing = bench.optimized_step(backend, samples, call=0)
    assert timing["steps"] == 1  # nothing dropped: the synthetic turns align with their recorded ids
    assert bench.reference_step(backend, samples) > 0
    lengths = [(100, 48)] * 4
    layers, head, attn = bench.matmul_params(backend.model)
    assert head == 8192 * 64 and attn == 2 * 2 * 32
    assert bench.forward_flops(backend.model, lengths, False) == 4 * (
        2 * layers * 148 + 2 * head * 48 + 2 * 148 * 148 * attn
    )


def test_the_multi_tenant_mode_prints_the_three_paths_and_their_ratios():
    """One fresh process (the slow part, ~8 s here) and N = 1, 2: every path reports updates/hour, tokens/s
    and peak memory, and the summary lines their ratios."""
    lines = []
    bench.bench_tenants(
        tenants=(1, 2), samples_per_tenant=2, response_tokens=16, fresh_runs=1, log=lines.append
    )
    rows = [json.loads(line) for line in lines]
    assert rows[0]["mode"] == "a_fresh_process" and rows[0]["updates_per_hour"] > 0
    modes = [(r.get("tenants"), r.get("mode")) for r in rows[1:] if "mode" in r]
    assert modes == [(1, "b_resident_sequential"), (1, "c_resident_batched"),
                     (2, "b_resident_sequential"), (2, "c_resident_batched")]
    for r in rows[1:]:
        if "mode" in r:
            assert r["updates_per_hour"] > 0 and r["tokens_per_s"] > 0 and r["peak_mem_mb"] >= 0
    summaries = [r for r in rows if "ratio_c_over_b" in r]
    assert [s["tenants"] for s in summaries] == [1, 2] and all(s["ratio_b_over_a"] > 0 for s in summaries)
    with pytest.raises(ValueError, match="--tenants"):
        bench.parse_tenants("1,x")


def test_the_gpu_check_script_runs_its_code_paths_on_cpu(capsys):
    """The GPU check (workers/trainer/gpu_check.py) with a tiny Qwen3 on CPU, so that the script run once on
    a GPU machine does not fail on a code path; its figures are not asserted."""
    from workers.trainer import gpu_check

    gpu_check.main(["--smoke"])
    lines = capsys.readouterr().out.splitlines()
    parts = [json.loads(line)["part"] for line in lines if line.startswith("{")]
    assert parts == ["packed_update", "packed_update", "base_load_from_disk", "tenants_resident_sequential",
                     "tenants_reloaded", "tenants_multi_tenant_pass"]
