"""The benchmark's code paths (numbers are reported, not asserted): the tiny run, the Qwen3-shaped GPU path
scaled down to run on CPU, and the refusal to run the 4B shape without a GPU."""

import json

import pytest
import torch

from workers.trainer import bench, bench_cli, bench_tenants, measure
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
        bench_cli.main(["--model-shape", "qwen3-4b"])
    assert exit_info.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err


def test_the_qwen3_path_works_scaled_down(tmp_path):
    """What the GPU run does (random Qwen3 built in place, long synthetic turns, both loops), on a small
    Qwen3 so it runs on CPU."""
    loader = measure.qwen3_4b_loader(
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
    layers, head, attn = measure.matmul_params(backend.model)
    assert head == 8192 * 64 and attn == 2 * 2 * 32
    assert measure.forward_flops(backend.model, lengths, False) == 4 * (
        2 * layers * 148 + 2 * head * 48 + 2 * 148 * 148 * attn
    )


def test_the_multi_tenant_mode_prints_the_three_paths_and_their_ratios():
    """One fresh process (the slow part, ~8 s here) and N = 1, 2: every path reports updates/hour, tokens/s
    and peak memory, and the summary lines their ratios."""
    lines = []
    bench_tenants.bench_tenants(
        tenants=(1, 2), samples_per_tenant=2, response_tokens=16, fresh_runs=1, log=lines.append
    )
    rows = [json.loads(line) for line in lines]
    assert rows[0]["mode"] == "a_fresh_process" and rows[0]["updates_per_hour"] > 0
    modes = [(r.get("tenants"), r.get("mode")) for r in rows[1:] if "mode" in r]
    passes = ["c_resident_batched", "c_resident_batched_per_span"]  # the grouped LoRA layer, the reference
    assert modes == [(n, m) for n in (1, 2) for m in ["b_resident_sequential", *passes]]
    for r in rows[1:]:
        if "mode" in r:
            assert r["updates_per_hour"] > 0 and r["tokens_per_s"] > 0 and r["peak_mem_mb"] >= 0
    summaries = [r for r in rows if "ratio_c_over_b" in r]
    assert [s["tenants"] for s in summaries] == [1, 2] and all(s["ratio_b_over_a"] > 0 for s in summaries)
    assert all(s["ratio_c_over_c_per_span"] > 0 for s in summaries)
    with pytest.raises(ValueError, match="--tenants"):
        bench_cli.parse_tenants("1,x")


def test_the_gpu_check_script_runs_its_code_paths_on_cpu(capsys, monkeypatch, tmp_path):
    """The GPU check (workers/trainer/gpu_check.py) with a tiny Qwen3 on CPU, so that the script run once on
    a GPU machine does not fail on a code path: versions first, its FLOP convention named, every part, and no
    temporary file left behind; with no budget left, every part is skipped and says so."""
    import tempfile

    from workers.trainer import gpu_check

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the check's temporary files go
    gpu_check.main(["--smoke"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["part"] for r in rows] == [
        "versions", "flop_convention", "packed_update", "packed_update", "base_load_from_disk",
        "tenants_resident_sequential", "tenants_reloaded", "tenants_multi_tenant_pass"]
    assert {"torch", "transformers", "peft", "device"} <= set(rows[0])
    assert "2x forward" in rows[1]["convention"] and "6N" in rows[1]["convention"]
    packed = [r for r in rows if r["part"] == "packed_update"]
    assert all(r["seconds_per_step"] > 0 and r["lora_tflops_per_step"] > 0 for r in packed), packed
    assert all(r["pack_row_tokens"] == 64 for r in packed)  # one sample per row: no uncounted attention
    assert list(tmp_path.iterdir()) == []

    gpu_check.main(["--smoke", "--budget-s", "0"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["part"], "skipped" in r) for r in rows] == [
        ("versions", False), ("flop_convention", False), ("packed_update", True), ("packed_update", True),
        ("tenants", True)]


def test_the_gpu_checks_lora_flops_count_the_frozen_base_at_twice_its_forward():
    """Forward + activation gradients for the matmuls (the frozen base needs no weight gradients), attention
    at 3x its causal forward; the 6N figure is 6 x parameters x tokens."""
    from workers.trainer.gpu_check import SMOKE_SHAPE, lora_step_flops
    from workers.trainer.measure import matmul_params, qwen3_4b_loader

    model, _ = qwen3_4b_loader(bench.TINY_MODEL_DIR, **SMOKE_SHAPE)(str(bench.TINY_MODEL_DIR), torch.float32,
                                                                           torch.device("cpu"))
    layers, head, attn = matmul_params(model)
    flops = lora_step_flops(model, [(30, 10), (20, 20)])
    forward_matmuls = 2 * layers * 80 + 2 * head * 30
    forward_attention = 2 * (40 * 40 + 40 * 40) * attn
    assert flops["lora"] == 2 * forward_matmuls + 3 * forward_attention
    assert flops["lora_attention"] == 3 * forward_attention
    assert flops["6n"] == 6 * (layers + head) * 80
