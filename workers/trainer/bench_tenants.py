"""Tenant updates per hour, the multi-tenant mode of bench_trainer (``--tenants 1,8,32``): N tenants with one
ready batch each, updated three ways (a fresh process per update, the resident base one tenant after another,
all of them in one multi-tenant pass). bench_cli.py parses the command line and runs ``--fresh-update`` here.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.bench import (
    REPO,
    TINY_MODEL_DIR,
    Shape,
    _prompt_ids,
    _response_ids,
    make_samples,
)
from workers.trainer.local import LocalBackend
from workers.trainer.measure import PeakMemory


def tenant_batches(
    count: int, *, samples_per_tenant: int, response_tokens: int = 48, seed: int = 0
) -> list[list[TrainSample]]:
    """One ready batch per tenant: samples drawn once from the tiny base (as the gateway records them),
    dealt round-robin, each tenant's with its own ids."""
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as workdir:
        probe = LocalBackend()
        probe.start(str(TINY_MODEL_DIR), None, TrainConfig(method="rl", device="cpu"), workdir)
        pool_size = min(16, count * samples_per_tenant)
        shape = Shape("tenants", pool_size, 8, prompt_tokens=None, response_tokens=response_tokens)
        pool = make_samples(probe, shape, seed=seed)
        probe.close()
    return [
        [
            TrainSample(**{**vars(pool[(t * samples_per_tenant + i) % len(pool)]),
                           "sample_id": f"t{t}-{i}", "hints": []})
            for i in range(samples_per_tenant)
        ]
        for t in range(count)
    ]


def _batch_tokens(tokenizer: Any, batch: list[TrainSample]) -> int:
    return sum(len(_prompt_ids(tokenizer, s.messages)) + len(_response_ids(s)) for s in batch)


def fresh_process_update(spec_path: Path) -> None:
    """`python -m workers.trainer.bench_cli --fresh-update SPEC`: today's path for one tenant update in a new
    process: import, load the base from disk, train, export, exit."""
    spec = json.loads(spec_path.read_text())
    backend = LocalBackend()
    backend.start(spec["base_model"], None, TrainConfig.from_dict(spec["config"]), spec["workdir"])
    backend.train([TrainSample(**s) for s in spec["samples"]])
    backend.export_adapter(spec["out"])
    backend.close()


def bench_tenants(
    *,
    tenants: tuple[int, ...] = (1, 8, 32),
    samples_per_tenant: int = 4,
    response_tokens: int = 48,
    fresh_runs: int = 2,
    threads: int | None = 1,
    lora_kernels: tuple[str, ...] = ("grouped", "per_span"),
    log=print,
) -> list[dict[str, Any]]:
    """Tenant updates per hour with one ready batch per tenant, three ways, measured in this one run:
    (a) a fresh process per update that loads the base (measured on `fresh_runs` updates: its rate does not
    depend on N), (b) the resident base, tenants one after another, (c) the resident base, all N tenants in
    one multi-tenant pass, once per LoRA layer implementation (c_resident_batched: the first of
    `lora_kernels`; c_resident_batched_<kernel> for the others). Each update = start (attach), train one
    optimizer step, export the adapter.

    Long on purpose: the three paths share one setup and are timed side by side, so that what each timing
    includes can be compared line by line."""
    import subprocess
    import sys
    from dataclasses import asdict

    from workers.trainer import resident
    from workers.trainer.multitenant import MultiTenantPass, TenantJob

    if threads:
        torch.set_num_threads(threads)
    config = TrainConfig(
        method="rl", device="cpu", lr=1e-4, lora_r=8, lora_alpha=16, pack_row_tokens=1024
    )
    batches = tenant_batches(
        max(tenants), samples_per_tenant=samples_per_tenant, response_tokens=response_tokens
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    rows: list[dict[str, Any]] = []

    def row(n: int, mode: str, seconds: float, tokens: int, memory: PeakMemory, **extra: Any) -> dict:
        out = {
            "tenants": n, "mode": mode, "seconds": round(seconds, 3),
            "updates_per_hour": round(3600 * n / seconds, 1) if mode != "a_fresh_process" else None,
            "tokens_per_s": round(tokens / seconds, 1), "peak_mem_mb": round(memory.peak_mb, 1), **extra,
        }
        log(json.dumps(out))
        rows.append(out)
        return out

    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as root:
        root_path = Path(root)
        # (a) fresh processes
        spawned = []
        env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
        for i in range(fresh_runs):
            spec = root_path / f"fresh-{i}.json"
            spec.write_text(json.dumps({
                "base_model": str(TINY_MODEL_DIR), "config": config.to_dict(),
                "samples": [asdict(s) for s in batches[i]], "workdir": str(root_path / f"fresh-{i}"),
                "out": str(root_path / "adapters" / f"fresh-{i}"),
            }))
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "workers.trainer.bench_cli", "--fresh-update", str(spec)],
                check=True, cwd=REPO, env=env, capture_output=True,
            )
            spawned.append(time.perf_counter() - started)
        fresh_seconds = sum(spawned) / len(spawned)
        fresh_rate = 3600 / fresh_seconds
        log(json.dumps({"mode": "a_fresh_process", "seconds_per_update": round(fresh_seconds, 3),
                        "updates_per_hour": round(fresh_rate, 1), "measured_updates": fresh_runs}))

        for n in tenants:
            jobs = batches[:n]
            tokens = sum(_batch_tokens(tokenizer, b) for b in jobs)
            # (b) resident, sequential
            resident.reset()
            warm = LocalBackend(resident=True)  # the worker's base is loaded before the first run
            warm.start(str(TINY_MODEL_DIR), None, config, str(root_path / f"warm-{n}"))
            warm.close()
            with PeakMemory(torch.device("cpu")) as memory:
                started = time.perf_counter()
                for t, batch in enumerate(jobs):
                    backend = LocalBackend(resident=True)
                    backend.start(str(TINY_MODEL_DIR), None, config, str(root_path / f"seq-{n}-{t}"))
                    backend.train(batch)
                    backend.export_adapter(str(root_path / "adapters" / f"seq-{n}-{t}"))
                    backend.close()
                sequential = time.perf_counter() - started
            b = row(n, "b_resident_sequential", sequential, tokens, memory)
            # (c) resident, one multi-tenant pass (per LoRA layer implementation)
            passes = {}
            for kernel in lora_kernels:
                with PeakMemory(torch.device("cpu")) as memory:
                    started = time.perf_counter()
                    pass_jobs = [
                        TenantJob(f"t{t}", config, str(root_path / f"pass-{kernel}-{n}-{t}"), batch)
                        for t, batch in enumerate(jobs)
                    ]
                    with MultiTenantPass(str(TINY_MODEL_DIR), pass_jobs, lora_kernel=kernel) as mt:
                        outcomes = mt.train()
                        for t, outcome in enumerate(outcomes):
                            if outcome.error:
                                raise RuntimeError(f"tenant {outcome.key}: {outcome.error}")
                            outcome.backend.export_adapter(str(root_path / "adapters" / f"pass-{n}-{t}"))
                    batched = time.perf_counter() - started
                mode = "c_resident_batched" + ("" if kernel == lora_kernels[0] else f"_{kernel}")
                passes[kernel] = row(n, mode, batched, tokens, memory, lora_kernel=kernel)
            c = passes[lora_kernels[0]]
            summary = {
                "tenants": n,
                "updates_per_hour": {"a_fresh_process": round(fresh_rate, 1),
                                     "b_resident_sequential": b["updates_per_hour"],
                                     "c_resident_batched": c["updates_per_hour"]},
                "ratio_b_over_a": round(b["updates_per_hour"] / fresh_rate, 2),
                "ratio_c_over_a": round(c["updates_per_hour"] / fresh_rate, 2),
                "ratio_c_over_b": round(c["updates_per_hour"] / b["updates_per_hour"], 2),
                **{f"ratio_c_over_c_{k}": round(c["updates_per_hour"] / passes[k]["updates_per_hour"], 2)
                   for k in lora_kernels[1:]},
            }
            log(json.dumps(summary))
            rows.append(summary)
        resident.reset()
    return rows
