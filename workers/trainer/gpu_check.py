"""The trainer's GPU check, one script that finishes within its budget (default 360 s, well under 10
minutes with the model's set-up) on one H100/H200:

    python3 -m workers.trainer.gpu_check --out /tmp/gpu-check  # Qwen3-4B shape, random weights, bf16, CUDA
    python3 -m workers.trainer.gpu_check --smoke               # a tiny Qwen3 on CPU: the same code paths

0. The versions of python, torch, transformers and peft and the device's name, first (a GPU machine's image
   may have older ones), then the FLOP convention the figures use.
1. Qwen3-4B-shaped model with random weights in bf16 (no download), LoRA r16 on all seven projections.
2. Packed update steps at 4k and 16k tokens per micro-batch (samples of 1k prompt + 1k response tokens, one
   sample per packed row, so that no row does attention the count leaves out; activation checkpointing on):
   tokens/s, MFU against the GPU's dense bf16 peak, peak memory. The clock is read after the device has
   finished (synchronised). FLOPs, LoRA convention: the base is frozen, so backward computes activation
   gradients only (no weight gradients): the matmuls cost forward + backward = 2x forward; attention (no
   weights: its backward computes dQ, dK and dV) is counted on its own at 3x its causal forward. The 6N
   "model FLOPs" figure (6 x parameters x tokens, the full fine-tuning convention most published MFU figures
   use, attention left out) is printed beside it, labelled, with its own MFU.
3. 32 tenants with one small ready batch each: tenant updates/hour with the base reloaded from disk per
   update (measured load time + a resident update), resident one after another, and one multi-tenant pass.

One JSON line per figure on stdout, and the same lines in <dir>/gpu_check.jsonl with --out <dir>. The
budget is checked inside every part (before each step and each tenant update); what no longer fits is skipped
with a line saying so. Temporary files (checkpoints, the base saved to disk, adapters) are removed on every
exit.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workers.trainer import resident
from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.bench import TINY_MODEL_DIR
from workers.trainer.forward import load_pretrained
from workers.trainer.local import LocalBackend
from workers.trainer.measure import matmul_params, qwen3_4b_loader
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


FLOP_CONVENTION = (
    "lora: matmuls 2x forward (forward + activation gradients; the frozen base needs no weight gradients), "
    "attention 3x its causal forward, counted per sample (one sample per packed row); "
    "6N: 6 x parameters x tokens (full fine-tuning convention, attention left out), for comparison with "
    "published MFU figures"
)


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work before a clock is read (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def versions(device: torch.device) -> dict[str, Any]:
    import peft
    import transformers

    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "peft": peft.__version__,
        "cuda": torch.version.cuda,
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or "cpu"),
    }


def lora_step_flops(model: Any, lengths: list[tuple[int, int]]) -> dict[str, float]:
    """FLOPs of one LoRA update over (prompt, response) samples, each attending only to itself: "lora" (the
    convention above: matmuls 2x forward, attention 3x forward) and "6n" (6 x parameters x tokens)."""
    layers, head, attn = matmul_params(model)
    matmul = attention = tokens = 0.0
    for prompt, response in lengths:
        n = prompt + response
        matmul += 2 * layers * n + 2 * head * response  # the head only at response positions
        attention += 2 * n * n * attn  # QK^T and AV, causal (half of 4 n^2 d per layer)
        tokens += n
    return {"lora": 2 * matmul + 3 * attention, "6n": 6 * (layers + head) * tokens,
            "lora_attention": 3 * attention}


def _tera(flops: float) -> float:
    return float(f"{flops / 1e12:.4g}")  # four significant digits: the smoke model's figures are tiny


def peak_gb(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def packed_steps(report: Report, loader, config: TrainConfig, *, budget: int, sample: tuple[int, int],
                 steps: int, vocab: int) -> None:
    """Timed update steps (after one warm-up) of `budget` tokens each: one optimizer step per train() call,
    timed around the call with the device synchronised on both sides (a step's own clock in the trainer is
    read before the queued backward and optimizer kernels finish)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        backend = LocalBackend(model_loader=loader, resident=True)
        try:
            backend.start(str(TINY_MODEL_DIR), None, config, workdir)
            per_step = max(1, budget // sum(sample))
            device = backend.device
            timings: list[float] = []
            calls: list[float] = []
            last = 0.0
            for call in range(steps + 1):  # the first is a warm-up
                if call and report.left() < 2 * last + 5:
                    break  # the budget, checked before each step
                batch = synthetic_samples(per_step, *sample, vocab=vocab, prefix=f"b{budget}-{call}")
                synchronize(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                started = time.perf_counter()
                result = backend.train(batch)
                synchronize(device)
                last = time.perf_counter() - started
                if call:
                    # The step's own time (forward, backward, optimizer; the trainer synchronises before its
                    # clock) and the whole call's (its preparation and the checkpoint it writes too).
                    timings.append(sum(m.seconds for m in result.metrics))
                    calls.append(last)
            if not timings:
                report(part="packed_update", micro_batch_tokens=budget,
                       skipped="time budget spent after the warm-up")
                return
            tokens = per_step * sum(sample)
            seconds = sum(timings) / len(timings)
            flops = lora_step_flops(backend.model, [sample] * per_step)
            peak = peak_flops(device)
            report(
                part="packed_update", micro_batch_tokens=budget, pack_row_tokens=config.pack_row_tokens,
                samples=per_step, tokens=tokens, steps_timed=len(timings),
                seconds_per_step=round(seconds, 4), seconds_per_call=round(sum(calls) / len(calls), 4),
                tokens_per_s=round(tokens / seconds, 1),
                lora_tflops_per_step=_tera(flops["lora"]),
                lora_attention_tflops_per_step=_tera(flops["lora_attention"]),
                mfu_lora=round(flops["lora"] / seconds / peak, 4) if peak else None,
                model_6n_tflops_per_step=_tera(flops["6n"]),
                mfu_6n=round(flops["6n"] / seconds / peak, 4) if peak else None,
                peak_mem_gb=peak_gb(device),
                attention=backend.model.get_base_model().config._attn_implementation,
                gradient_checkpointing=backend.gradient_checkpointing,
            )
        finally:
            backend.close()


def tenants(
    report: Report, loader, config: TrainConfig, *, count: int, samples: int, sample: tuple[int, int],
    vocab: int, smoke: bool,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpu-check-tenants-"))
    try:
        _tenants(report, loader, config, root, count=count, samples=samples, sample=sample, vocab=vocab,
                 smoke=smoke)
    finally:
        # The base saved to disk, checkpoints, adapters: removed on every exit.
        shutil.rmtree(root, ignore_errors=True)
        resident.reset()


def _tenants(
    report: Report, loader, config: TrainConfig, root: Path, *, count: int, samples: int,
    sample: tuple[int, int], vocab: int, smoke: bool,
) -> None:
    batches = [synthetic_samples(samples, *sample, vocab=vocab, prefix=f"t{t}") for t in range(count)]
    # Reloaded: the base read from local disk, as a worker without a resident base does per update.
    warm = LocalBackend(model_loader=loader, resident=True)
    warm.start(str(TINY_MODEL_DIR), None, config, str(root / "warm"))
    base_dir = root / "base"
    lease = warm._lease
    assert lease is not None  # start() leased the resident base
    warm.close()  # the adapter detached: the resident base saves as a plain checkpoint
    lease.model.save_pretrained(base_dir)
    lease.tokenizer.save_pretrained(base_dir)
    resident.reset()
    dtype = torch.float32 if smoke else torch.bfloat16
    device = torch.device("cpu" if smoke else "cuda")
    synchronize(device)
    started = time.perf_counter()
    model, _ = load_pretrained(str(base_dir), dtype, device)
    synchronize(device)
    load_s = time.perf_counter() - started
    del model
    resident.free_memory()
    shutil.rmtree(base_dir, ignore_errors=True)
    report(part="base_load_from_disk", seconds=round(load_s, 2))

    def update(t: int, tag: str) -> float:
        synchronize(device)
        started = time.perf_counter()
        backend = LocalBackend(model_loader=loader, resident=True)
        try:
            backend.start(str(TINY_MODEL_DIR), None, config, str(root / f"{tag}-{t}"))
            backend.train(batches[t])
            backend.export_adapter(str(root / "adapters" / f"{tag}-{t}"))
        finally:
            backend.close()
            # A 4B model's r16 adapter + AdamW state is ~0.4 GB per copy: keep the disk (64 GB) free.
            shutil.rmtree(root / f"{tag}-{t}", ignore_errors=True)
            shutil.rmtree(root / "adapters" / f"{tag}-{t}", ignore_errors=True)
        synchronize(device)
        return time.perf_counter() - started

    first = update(0, "warm")  # the resident base is loaded before the first tenant
    done: list[float] = []
    for t in range(count):
        if report.left() < 2 * (done[-1] if done else first) + 5:
            break  # the budget, checked before each update
        done.append(update(t, "seq"))
    if not done:
        report(part="tenants_resident_sequential", skipped="time budget spent")
        return
    per_update = sum(done) / len(done)
    report(part="tenants_resident_sequential", tenants=len(done), seconds_per_update=round(per_update, 3),
           updates_per_hour=round(3600 / per_update, 1))
    report(part="tenants_reloaded", seconds_per_update=round(per_update + load_s, 3),
           updates_per_hour=round(3600 / (per_update + load_s), 1),
           how="measured disk load + the measured resident update")
    # One call that cannot stop half-way: started only if it fits even as slow as the updates one by one.
    if report.left() < per_update * count + 10:
        report(part="tenants_multi_tenant_pass", skipped="time budget spent")
        return
    synchronize(device)
    started = time.perf_counter()
    jobs = [TenantJob(f"t{t}", config, str(root / f"pass-{t}"), batches[t]) for t in range(count)]
    with MultiTenantPass(str(TINY_MODEL_DIR), jobs, model_loader=loader) as mt:
        outcomes = mt.train()
        for t, outcome in enumerate(outcomes):
            outcome.backend.export_adapter(str(root / "adapters" / f"pass-{t}"))
    synchronize(device)
    seconds = time.perf_counter() - started
    errors = [o.error for o in outcomes if o.error]
    report(part="tenants_multi_tenant_pass", tenants=count, seconds=round(seconds, 2),
           updates_per_hour=round(3600 * count / seconds, 1), errors=errors[:3],
           peak_mem_gb=peak_gb(device))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny Qwen3 on CPU (checks the code paths)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="seconds for the whole check; every part checks it before each step or update")
    parser.add_argument("--out", type=Path, default=None, help="also write the lines to OUT/gpu_check.jsonl")
    args = parser.parse_args(argv)
    report = Report(args.budget_s, args.out)
    report(part="versions", **versions(torch.device("cuda" if torch.cuda.is_available() else "cpu")))
    report(part="flop_convention", convention=FLOP_CONVENTION)
    if not args.smoke and not torch.cuda.is_available():
        report(part="refused", reason="no CUDA GPU: run with --smoke for the CPU code-path check")
        raise SystemExit(2)
    shape = SMOKE_SHAPE if args.smoke else {}
    vocab = shape.get("vocab_size", 151936)
    loader = qwen3_4b_loader(TINY_MODEL_DIR, **shape)
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    common: dict[str, Any] = dict(method="rl", lora_r=16, lora_alpha=32, device=device, dtype=dtype, lr=1e-5,
                  gradient_checkpointing=True, max_seq_len=32768)
    sample = (32, 32) if args.smoke else (1024, 1024)
    for budget in ((64, 128) if args.smoke else (4096, 16384)):
        if report.left() < (5 if args.smoke else 90):
            report(part="packed_update", micro_batch_tokens=budget, skipped="time budget spent")
            continue
        # One sample per packed row: without a variable-length attention kernel a row of several samples does
        # attention across all of them (masked), work the FLOP count would leave out.
        config = TrainConfig(**common, micro_batch_tokens=budget, pack_row_tokens=sum(sample))
        packed_steps(report, loader, config, budget=budget, sample=sample, steps=1 if args.smoke else 3,
                     vocab=vocab)
        resident.reset()
    config = TrainConfig(**common, micro_batch_tokens=16384, pack_row_tokens=4096)
    if report.left() < (5 if args.smoke else 60):
        report(part="tenants", skipped="time budget spent")
        return
    tenants(report, loader, config, count=2 if args.smoke else 32, samples=2 if args.smoke else 4,
            sample=(16, 16) if args.smoke else (512, 256), vocab=vocab, smoke=args.smoke)


if __name__ == "__main__":
    main()
