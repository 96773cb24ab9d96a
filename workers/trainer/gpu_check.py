"""The trainer's GPU check, one script that finishes in under 8 minutes on one H100/H200:

    python -m workers.trainer.gpu_check                # Qwen3-4B shape, random weights, bf16, CUDA
    python -m workers.trainer.gpu_check --smoke        # a tiny Qwen3 on CPU: the same code paths, seconds

1. Qwen3-4B-shaped model with random weights in bf16 (no download), LoRA r16 on all seven projections.
2. Packed update steps at 4k and 16k tokens per micro-batch (samples of 1k prompt + 1k response tokens,
   one packed row each, activation checkpointing on): tokens/s, MFU against the GPU's dense bf16 peak,
   peak memory. MFU counts model FLOPs (forward 2N per token + head at response positions + causal
   attention per sample; a LoRA backward is 2x the forward), not the checkpointing recompute.
3. 32 tenants with one small ready batch each: tenant updates/hour with the base reloaded from disk per
   update (measured load time + a resident update), resident one after another, and one multi-tenant pass.

One JSON line per figure on stdout, and the same lines in <dir>/gpu_check.jsonl with --out <dir>. Each part
checks the clock and is skipped (with a line saying so) once the budget is spent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workers.trainer import resident
from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.bench import TINY_MODEL_DIR, forward_flops, qwen3_4b_loader
from workers.trainer.local import LocalBackend, load_pretrained
from workers.trainer.multitenant import MultiTenantPass, TenantJob

# Dense bf16 tensor-core peaks (no sparsity), by device name.
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}
SMOKE_SHAPE = {
    "vocab_size": 8192, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
}


class Report:
    def __init__(self, budget_s: float, out: Path | None = None):
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.file = open(out / "gpu_check.jsonl", "a") if out else None  # noqa: SIM115

    def __call__(self, **row: Any) -> None:
        row["elapsed_s"] = round(time.monotonic() - self.started, 1)
        line = json.dumps(row)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


def synthetic_samples(
    count: int, prompt: int, response: int, *, vocab: int, prefix: str
) -> list[TrainSample]:
    """Served-id samples (prompt ids + sampled ids + log-probs), rewards +-1: no tokenizer round trip."""
    generator = torch.Generator().manual_seed(count * 7919 + prompt)
    out = []
    for i in range(count):
        ids = torch.randint(10, vocab - 10, (prompt + response,), generator=generator).tolist()
        out.append(TrainSample(
            sample_id=f"{prefix}-{i}", messages=[{"role": "user", "content": "x"}], response_text="",
            prompt_token_ids=ids[:prompt], response_token_ids=ids[prompt:],
            response_logprobs=[-2.0] * response, reward=1 if i % 2 == 0 else -1, source="served ids",
        ))
    return out


def peak_gb(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def packed_steps(report: Report, loader, config: TrainConfig, *, budget: int, sample: tuple[int, int],
                 steps: int, vocab: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        backend = LocalBackend(model_loader=loader, resident=True)
        backend.start(str(TINY_MODEL_DIR), None, config, workdir)
        per_step = max(1, budget // sum(sample))
        device = backend.device
        timings, tokens = [], 0
        for call in range(steps + 1):  # the first is a warm-up
            batch = synthetic_samples(per_step, *sample, vocab=vocab, prefix=f"b{budget}-{call}")
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            result = backend.train(batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if call:
                timings.append(sum(m.seconds for m in result.metrics))
                tokens = per_step * sum(sample)
        seconds = sum(timings) / len(timings)
        flops = 3 * forward_flops(backend.model, [sample] * per_step, False)
        peak = peak_flops(device)
        report(
            part="packed_update", micro_batch_tokens=budget, samples=per_step, tokens=tokens,
            seconds_per_step=round(seconds, 4), tokens_per_s=round(tokens / seconds, 1),
            model_tflops_per_step=round(flops / 1e12, 3),
            mfu=round(flops / seconds / peak, 4) if peak else None,
            peak_mem_gb=peak_gb(device),
            attention=backend.model.get_base_model().config._attn_implementation,
            gradient_checkpointing=backend.gradient_checkpointing,
            gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        )
        backend.close()


def tenants(
    report: Report, loader, config: TrainConfig, *, count: int, samples: int, sample: tuple[int, int],
    vocab: int, smoke: bool,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpu-check-tenants-"))
    batches = [synthetic_samples(samples, *sample, vocab=vocab, prefix=f"t{t}") for t in range(count)]
    # Reloaded: the base read from local disk, as a worker without a resident base does per update.
    warm = LocalBackend(model_loader=loader, resident=True)
    warm.start(str(TINY_MODEL_DIR), None, config, str(root / "warm"))
    base_dir = root / "base"
    lease = warm._lease
    warm.close()  # the adapter detached: the resident base saves as a plain checkpoint
    lease.model.save_pretrained(base_dir)
    lease.tokenizer.save_pretrained(base_dir)
    resident.reset()
    dtype = torch.float32 if smoke else torch.bfloat16
    device = torch.device("cpu" if smoke else "cuda")
    started = time.perf_counter()
    model, _ = load_pretrained(str(base_dir), dtype, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    del model
    resident.free_memory()
    report(part="base_load_from_disk", seconds=round(load_s, 2))

    def update(t: int, tag: str) -> None:
        backend = LocalBackend(model_loader=loader, resident=True)
        backend.start(str(TINY_MODEL_DIR), None, config, str(root / f"{tag}-{t}"))
        backend.train(batches[t])
        backend.export_adapter(str(root / "adapters" / f"{tag}-{t}"))
        backend.close()
        # A 4B model's r16 adapter + AdamW state is ~0.4 GB per copy: keep the disk (64 GB) free.
        shutil.rmtree(root / f"{tag}-{t}", ignore_errors=True)
        shutil.rmtree(root / "adapters" / f"{tag}-{t}", ignore_errors=True)

    update(0, "warm")  # the resident base is loaded before the first tenant
    sequential_n = count if report.left() > 150 else max(4, count // 4)
    started = time.perf_counter()
    for t in range(sequential_n):
        update(t, "seq")
    per_update = (time.perf_counter() - started) / sequential_n
    report(part="tenants_resident_sequential", tenants=sequential_n, seconds_per_update=round(per_update, 3),
           updates_per_hour=round(3600 / per_update, 1))
    report(part="tenants_reloaded", seconds_per_update=round(per_update + load_s, 3),
           updates_per_hour=round(3600 / (per_update + load_s), 1),
           how="measured disk load + the measured resident update")
    if report.left() < 60:
        report(part="tenants_multi_tenant_pass", skipped="time budget spent")
        return
    started = time.perf_counter()
    jobs = [TenantJob(f"t{t}", config, str(root / f"pass-{t}"), batches[t]) for t in range(count)]
    with MultiTenantPass(str(TINY_MODEL_DIR), jobs, model_loader=loader) as mt:
        outcomes = mt.train()
        for t, outcome in enumerate(outcomes):
            outcome.backend.export_adapter(str(root / "adapters" / f"pass-{t}"))
    seconds = time.perf_counter() - started
    shutil.rmtree(root, ignore_errors=True)
    errors = [o.error for o in outcomes if o.error]
    report(part="tenants_multi_tenant_pass", tenants=count, seconds=round(seconds, 2),
           updates_per_hour=round(3600 * count / seconds, 1), errors=errors[:3],
           peak_mem_gb=peak_gb(device))
    resident.reset()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny Qwen3 on CPU (checks the code paths)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting new parts after this")
    parser.add_argument("--out", type=Path, default=None, help="also write the lines to OUT/gpu_check.jsonl")
    args = parser.parse_args(argv)
    report = Report(args.budget_s, args.out)
    if not args.smoke and not torch.cuda.is_available():
        report(part="refused", reason="no CUDA GPU: run with --smoke for the CPU code-path check")
        raise SystemExit(2)
    shape = SMOKE_SHAPE if args.smoke else {}
    vocab = shape.get("vocab_size", 151936)
    loader = qwen3_4b_loader(TINY_MODEL_DIR, **shape)
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    common = dict(method="rl", lora_r=16, lora_alpha=32, device=device, dtype=dtype, lr=1e-5,
                  gradient_checkpointing=True, max_seq_len=32768)
    sample = (64, 64) if args.smoke else (1024, 1024)
    for budget in ((256, 1024) if args.smoke else (4096, 16384)):
        if report.left() < 90:
            report(part="packed_update", micro_batch_tokens=budget, skipped="time budget spent")
            continue
        config = TrainConfig(**common, micro_batch_tokens=budget, pack_row_tokens=budget)
        packed_steps(report, loader, config, budget=budget, sample=sample, steps=1 if args.smoke else 3,
                     vocab=vocab)
        resident.reset()
    config = TrainConfig(**common, micro_batch_tokens=16384, pack_row_tokens=4096)
    tenants(report, loader, config, count=4 if args.smoke else 32, samples=4,
            sample=(32, 32) if args.smoke else (512, 256), vocab=vocab, smoke=args.smoke)


if __name__ == "__main__":
    main()
