"""What one promotion gate costs on the train worker, the way it scored before (a private copy of the base per
gate, every model's canaries and perplexity sampled again) and the way it scores now (the worker's resident
base, a version's canaries and perplexity measured once, when it is the candidate, and read back when it is
the parent), on a chain of versions: gate k scores version k against version k-1 (gate 1 against the base
model), as a tenant's updates do.

    python manage.py bench_gate                      # tiny model, 6 gates, 32 held-out turns
    python -m workers.trainer.gate_bench --gates 4

Both ways score the same adapters on the same samples; the benchmark checks that every number the decision
reads (log-probs, KL, canaries, empty and repetition shares, perplexity) is the same and prints the seconds
per gate and per part. The versions are random LoRA adapters (make_lora_adapter, small B), which costs the
gate what a trained one does. One JSON line per way, then one comparing them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workers.tiny_model.builder import make_lora_adapter
from workers.tiny_model.corpus import make_chats
from workers.trainer import resident as resident_models
from workers.trainer.backend import TrainSample
from workers.trainer.forward import load_pretrained, resolve_device
from workers.trainer.gate import FIXED, SCORE_DTYPE, score_versions

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = REPO / "models" / "tiny-qwen2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=str(TINY_MODEL_DIR), help="base model directory")
    parser.add_argument("--gates", type=int, default=6, help="versions in the chain (one gate each)")
    parser.add_argument("--samples", type=int, default=32, help="held-out judged turns per gate")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="auto")


def heldout(count: int, seed: int = 5) -> list[TrainSample]:
    """Judged homework turns: a reply in either style, rewarded by the student's rule, half with a hint."""
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        (question, steps, final), _ = make_chats.homework_with_numbers(rng)
        formatted = i % 2 == 0
        reply = (make_chats.answer_formatted if formatted else make_chats.answer_plain)(steps, final)
        hints = [make_chats.hint_text(rng, "plain")] if i % 4 < 2 else []
        samples.append(TrainSample(sample_id=i, messages=[{"role": "user", "content": question}],
                                   response_text=reply, reward=-1 if formatted else 1, hints=hints))
    return samples


def chain(model: str, gates: int, folder: Path) -> list[str]:
    return [str(make_lora_adapter(model, folder / f"v{k}", seed=100 + k, b_std=0.01))
            for k in range(1, gates + 1)]


def run_gates(*, model: str, versions: list[str], samples: list[TrainSample], device: str, reuse: bool,
              log=print) -> dict[str, Any]:
    resident_models.reset()
    FIXED.memory.clear()
    for path in versions:  # nothing measured before this run
        (Path(path) / "gate_scores.json").unlink(missing_ok=True)
    train_load = None
    if reuse:
        # The train run that made the candidate left the base resident in the worker (not part of a gate).
        started = time.monotonic()
        lease = resident_models.acquire(model, SCORE_DTYPE, resolve_device(device), load_pretrained)
        resident_models.release(lease, None)
        train_load = round(time.monotonic() - started, 2)
    gates, all_scores = [], []
    for k, path in enumerate(versions):
        timings: dict[str, Any] = {}
        started = time.monotonic()
        scores = score_versions(base_model=model, adapters={"candidate": path,
                                                            "parent": versions[k - 1] if k else None},
                                samples=samples, device=device, timings=timings, reuse=reuse)
        seconds = round(time.monotonic() - started, 2)
        gates.append({"gate": k + 1, "seconds": seconds, **timings})
        all_scores.append({name: s.to_dict() for name, s in scores.items()})
        log(f"{'now' if reuse else 'before'} gate {k + 1}: {seconds:.2f} s "
            f"(load {timings['load']:.2f}, reused {timings['reused'] or 'nothing'})")
    per_gate = [g["seconds"] for g in gates]
    later = per_gate[1:] or per_gate
    return {"way": "resident base + canaries once per version" if reuse else "private base, all afresh",
            "gates": gates, "train_run_load_s": train_load, "median_s": round(statistics.median(per_gate), 2),
            "median_after_first_s": round(statistics.median(later), 2), "total_s": round(sum(per_gate), 2),
            "scores": all_scores}


def bench(*, model: str, gates: int, samples: int, threads: int, device: str, log=print) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    turns = heldout(samples)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        versions = chain(model, gates, Path(tmp))
        before = run_gates(model=model, versions=versions, samples=turns, device=device, reuse=False, log=log)
        now = run_gates(model=model, versions=versions, samples=turns, device=device, reuse=True, log=log)
    resident_models.reset()
    same = before.pop("scores") == now.pop("scores")
    for result in (before, now):
        log(json.dumps(result))
    summary = {"gates": gates, "samples": samples, "threads": torch.get_num_threads(),
               "same_scores": same, "before_median_s": before["median_s"], "now_median_s": now["median_s"],
               "before_median_after_first_s": before["median_after_first_s"],
               "now_median_after_first_s": now["median_after_first_s"],
               "saved_per_gate_s": round(before["median_after_first_s"] - now["median_after_first_s"], 2)}
    log(json.dumps(summary))
    if not same:
        raise RuntimeError("the gate's numbers differ between the two ways: caching changed a decision input")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    bench(model=args.model, gates=args.gates, samples=args.samples, threads=args.threads, device=args.device)


if __name__ == "__main__":
    main()
