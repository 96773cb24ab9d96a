"""What the trainer's benchmarks and GPU checks measure with (bench.py, gpu_check.py, gate_memory.py): a
Qwen3-4B-shaped model with random weights built on the device, a model's FLOPs, and peak memory over a block.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path
from typing import Any

import torch

QWEN3_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
}


def qwen3_4b_loader(tokenizer_dir: Path, **overrides: Any):
    """A loader building Qwen3-4B's shape with random weights directly on the device (no download).
    The tiny model's tokenizer supplies the chat template; its ids are valid in the larger vocabulary.
    `overrides` shrink the shape (tests exercise this path on CPU)."""

    def load(base_model: str, dtype: torch.dtype, device: torch.device):
        from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(
            **{**QWEN3_4B, **overrides},
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            dtype=str(dtype).removeprefix("torch."),
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = Qwen3ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        return model.eval(), AutoTokenizer.from_pretrained(tokenizer_dir)

    return load


def matmul_params(model: Any) -> tuple[int, int, int]:
    """(decoder-layer matmul parameters, LM head parameters, layers * attention width) of a causal LM."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    layers = sum(
        p.numel() for n, p in base.named_parameters() if ".layers." in n and p.dim() == 2 and "lora_" not in n
    )
    head = cfg.vocab_size * cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return layers, head, cfg.num_hidden_layers * cfg.num_attention_heads * head_dim


def forward_flops(model: Any, lengths: list[tuple[int, int]], head_on_all: bool) -> float:
    """Model FLOPs of one forward over (prompt, response) sequences."""
    layers, head, attn = matmul_params(model)
    total = 0.0
    for prompt, response in lengths:
        n = prompt + response
        total += 2 * layers * n + 2 * head * (n if head_on_all else response) + 2 * n * n * attn
    return total


class PeakMemory:
    """Peak memory over a block: CUDA allocator peak on GPU, else resident set size sampled every 2 ms
    (tracemalloc does not see torch's allocations, and ru_maxrss only moves past the process's old peak)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = 0.0

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        release_freed_memory_to_os()
        self._base = self._rss()
        self._max = self._base
        self._stop = threading.Event()

        def watch() -> None:
            while not self._stop.wait(0.002):
                self._max = max(self._max, self._rss())

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20
            return
        self._stop.set()
        self._thread.join()
        self._max = max(self._max, self._rss())
        self.peak_mb = (self._max - self._base) / 2**20


def release_freed_memory_to_os() -> None:
    """On glibc, serve every allocation over 64 KiB with mmap so a freed tensor leaves the resident set at
    once; then RSS follows live tensor memory and its peak over a block measures that block's working set."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (a fixed value also stops glibc raising it)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
