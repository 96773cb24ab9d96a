"""What one run of the stack's persona benchmark (``driver.Bench``) is asked to do: the stack's address, the
methods and seed, the simulated users, and the limits of chatting, measuring and waiting."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.tracks import METHODS, check_users

# The trainer's own defaults (LoRA rate 1e-4): what a user of the real model gets.
DEFAULT_OVERRIDES: dict[str, Any] = {}


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    methods: tuple[str, ...] = METHODS
    seed: int = 0
    noise: float = P.NOISE_RATE  # share of the simulated users' reactions that are the opposite of deserved
    max_updates: int = 16
    judge: str = "rule"
    out_dir: Path = Path("bench-output")
    personas: tuple[str, ...] = (P.PRIMARY.name,)
    group: bool = False
    group_control: bool = True
    phrasings: str = "training"  # which half of each reaction pool the users speak from
    batch_size: int = 16
    turns_per_session: int = 2  # judged replies per session; one closing request follows
    overrides: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_OVERRIDES))
    # Short limits keep an update affordable on a CPU: at ~10 tokens/s, every token of every sample counts.
    chat_max_tokens: int = 96
    chat_temperature: float | None = 0.7  # exploration; None: the served default
    eval_max_tokens: int = 64  # a brief answer (<= ~45 words) finishes within it
    eval_temperature: float | None = None  # None: the served default, as a user's client gets
    eval_samples: int = P.EVAL_SAMPLES  # samples per held-out prompt
    eval_concurrency: int = 8
    # Sessions chatting at once while a batch is collected: vLLM batches them (one at a time, a CPU server
    # spends most of each step on overhead).
    parallel_sessions: int = 4
    capability: bool = True  # ask the capability guard of the base and every promoted version
    prompt_only: bool = True  # measure the base with the preference as its system prompt
    target: float = 0.8
    stop_at_target: bool = False
    update_timeout: float = 1800.0
    judge_wait: float = 180.0  # how long to wait for feedback already sent to be judged before chatting more
    serve_grace: float = 3.0  # the gateway caches a tenant's active adapter this long (GATEWAY_ADAPTER_CACHE)
    poll: float = 2.0

    def __post_init__(self) -> None:
        check_users(methods=self.methods, personas=self.personas, phrasings=self.phrasings, noise=self.noise)
        if self.judge not in ("rule", "llm"):
            raise ValueError("judge is 'rule' or 'llm'")
        if self.max_updates < 1 or self.batch_size < 1 or self.turns_per_session < 1:
            raise ValueError("max_updates, batch_size and turns_per_session must be at least 1")
