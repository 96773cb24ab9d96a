"""The command line of bench_trainer's benchmarks (bench.py, bench_tenants.py, lora_bench.py), for
``python -m workers.trainer.bench_cli`` where Django is not installed (a GPU machine) and for the
bench_trainer command, which takes its options from here so that both entry points agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from workers.trainer.bench import SHAPES, bench
from workers.trainer.bench_tenants import bench_tenants, fresh_process_update


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--objectives", default="rl,opd,combine", help="comma-separated: rl, opd, combine")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per objective (after one warm-up)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--tenants", default="", help="multi-tenant mode: comma-separated tenant counts, e.g. 1,8,32"
    )
    parser.add_argument(
        "--lora-kernels", action="store_true",
        help="with --tenants: one LoRA layer's kernels and time per forward + backward vs tenants and spans, "
        "per-span vs grouped (workers/trainer/lora_bench.py)",
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--fresh-update", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fresh_update:
        fresh_process_update(args.fresh_update)
        return []
    try:
        if args.lora_kernels:
            return run_lora_kernels(args.tenants or "1,8,32", threads=args.threads or 1)
        if args.tenants:
            return bench_tenants(tenants=parse_tenants(args.tenants), threads=args.threads or 1)
        return bench(
            model_shape=args.model_shape,
            objectives=tuple(o.strip() for o in args.objectives.split(",") if o.strip()),
            steps=args.steps,
            threads=args.threads,
        )
    except (RuntimeError, ValueError) as exc:
        parser.exit(2, f"bench_trainer: {exc}\n")


def run_lora_kernels(tenants: str, *, threads: int, log=print) -> list[dict[str, Any]]:
    from workers.trainer.lora_bench import bench_lora_kernels

    torch.set_num_threads(threads)
    return bench_lora_kernels(tenants=parse_tenants(tenants), log=log)


def parse_tenants(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--tenants {text!r}: comma-separated tenant counts, e.g. 1,8,32") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--tenants {text!r}: each count must be >= 1")
    return counts


if __name__ == "__main__":
    main()
