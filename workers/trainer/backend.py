"""The training-backend interface: plain data in, a PEFT adapter directory out.

Every backend (local torch+peft, Tinker, Fireworks) implements `TrainingBackend` and speaks only the plain
dataclasses below, so the Celery train task can load samples through Django selectors, hand them over, and
store what comes back through Django services without the trainer knowing about Django (workers/trainer
imports nothing from Django or clawhub; the Celery tasks are the only bridge).

This module imports neither torch nor Django on purpose: the web process builds `TrainSample`/`TrainConfig`
and must never pull torch into `sys.modules`.

Lifecycle, per training run:

    backend = backend_class("local")()           # workers.trainer.registry: backends by name
    backend.start(base_model, parent_adapter_dir, config, workdir)  # resumes from a checkpoint in workdir
    result = backend.train(samples, on_step=report_progress)        # may be called again with more samples
    backend.export_adapter(out_dir)              # adapter_config.json + adapter_model.safetensors
    backend.close()

Redelivery: a task killed mid-run calls start() with the same workdir and train() with the same samples; the
backend continues after the last completed optimizer step and never repeats one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from workers import base_models

# Below this temperature vLLM samples greedily (its _SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5

Method = Literal["rl", "opd", "combine"]
METHODS = ("rl", "opd", "combine")
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")

# Attention and MLP projections of Qwen2/Qwen3/Llama-style models (OpenClaw-RL's LoRA: all attn + MLP), as the
# base models' descriptions name them.
DEFAULT_TARGET_MODULES = base_models.PROJECTIONS

# Where an exported adapter keeps each backend's optimizer state (vLLM reads only the adapter files at the
# top level, so the state travels with the version without being served).
OPTIMIZER_STATE_DIR = "optimizer_state"

# How a hint enters the teacher's context (On-Policy Distillation): appended to the last user message.
HINT_TEMPLATE = "\n\n[user's hint / instruction]\n{hint}"


@dataclass
class TrainSample:
    """One judged assistant turn, as recorded by the gateway.

    messages: the prompt (OpenAI chat messages) the model answered; tools: the tool schemas sent with it.
    response_text: the assistant output exactly as the model wrote it (content and, for tool calls, the
        model's own tool-call text such as `<tool_call>...</tool_call>`), without the end-of-turn token.
    response_token_ids / response_logprobs: the sampled token ids and their log-probs under the serving
        policy. Optional: without them, or when they do not decode to response_text, the text is
        re-tokenized and pi_old becomes the current policy's log-probs.
    temperature / top_p / top_k: how the reply was sampled (the request's values, else the served defaults);
        the trainer scores pi_theta, pi_old, the teacher and the reference as that sampler did (logits / T,
        then top-k and top-p). temperature 0 is greedy decoding: scored at temperature 1, unfiltered, and
        the recorded log-probs are not used (greedy replies have no sampling distribution to match).
    logprobs_mode: what the recorded log-probs are (vLLM's --logprobs-mode): "processed_logprobs" (after
        temperature, top-k and top-p: the distribution sampled from), "raw_logprobs" (before them: only
        valid as pi_old when temperature is 1 and nothing was filtered), "" unknown (never used).
    version_lag: how many adapter versions the one that served the turn is behind the one being trained
        (0 = the parent itself); None = unknown (no lineage, e.g. served outside the parent's lineage).
    reward: the judge's score -1/0/+1 (0 = ambiguous or no next state: no RL signal).
    hints: candidate OPD hints accepted by the judge (may be empty).
    member_id: who produced the turn (group batches cap each member's share; the trainer only reports it).
    prompt_token_ids: the prompt's token ids exactly as the serving engine rendered them (vLLM's
        ``prompt_token_ids``). With response_token_ids, the sample is trained on exactly the served sequence
        (reasoning and tool-call tokens included); without, the prompt is re-rendered from messages with
        the chat template (and chat_template_kwargs, e.g. enable_thinking) as a fallback.
    chat_template_kwargs: what the request passed to the chat template, for that fallback.
    source: which path the caller chose and why ("served ids", or "re-rendered: <why>"); the trainer
        reports what it actually used per sample.
    weight: how much the sample counts in the loss (>= 0, default 1): its per-sample surrogate and KL terms
        are multiplied by it, the denominator (the step's sample count) is not. Group tenants use it to bound
        each member's share of an update's advantage mass; 1.0 everywhere is the unweighted objective.
    """

    sample_id: int | str
    messages: list[dict[str, Any]]
    response_text: str
    tools: list[dict[str, Any]] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    reward: int = 0
    hints: list[str] = field(default_factory=list)
    member_id: int | str | None = None
    prompt_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    source: str = ""
    weight: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    logprobs_mode: str = ""
    version_lag: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight, int | float) or not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(
                f"sample {self.sample_id}: weight must be a finite number >= 0, got {self.weight!r}"
            )
        if self.reward not in (-1, 0, 1):
            raise ValueError(f"sample {self.sample_id}: reward must be -1, 0 or +1, got {self.reward!r}")
        if not self.messages:
            raise ValueError(f"sample {self.sample_id}: messages (the prompt) must not be empty")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"sample {self.sample_id}: temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                f"sample {self.sample_id}: top_p must be in (0, 1] and top_k >= 0 (0 = off), "
                f"got {self.top_p!r}, {self.top_k!r}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def sampler(self) -> tuple[float, float, int]:
        """(temperature, top_p, top_k) the trainer scores this sample with; greedy replies: (1, 1, 0)."""
        if self.greedy:
            return 1.0, 1.0, 0
        return float(self.temperature), float(self.top_p), int(self.top_k)

    def recorded_logprobs_problem(self) -> str:
        """Why the recorded log-probs cannot be pi_old as the trainer scores this sample, or "" if they can
        (their count, values and token ids are checked where they are aligned: workers.trainer.batching)."""
        if self.greedy:
            return "greedy decoding (temperature 0)"
        if self.logprobs_mode == "processed_logprobs":
            return ""
        if self.logprobs_mode == "raw_logprobs":
            if self.sampler == (1.0, 1.0, 0):
                return ""
            return (
                f"raw log-probs (before temperature / top-k / top-p) of a reply sampled at "
                f"temperature {self.temperature}, top_p {self.top_p}, top_k {self.top_k}"
            )
        if not self.logprobs_mode:
            return "unknown log-probs mode"
        return f"log-probs mode {self.logprobs_mode!r}"


@dataclass
class TrainConfig:
    """Hyperparameters of one training run. Defaults follow OpenClaw-RL's published losses (PPO clip 0.2/0.28,
    w_opd = w_rl = 1).

    Objective
      method: "rl" (Binary RL: A = r, turns with r = 0 masked), "opd" (A = log pi_teacher - log pi_old, only
          turns with a hint), "combine" (A = w_opd * OPD term + w_rl * r; a turn needs a score or a hint).
      eps_low / eps_high: PPO clip range [1 - eps_low, 1 + eps_high] on the ratio.
      w_rl / w_opd: Combine weights (w_opd also scales "opd"; w_rl is ignored by "opd").
      opd_clip: the OPD term's log-ratio log pi_teacher - log pi_old is clipped to [-opd_clip, opd_clip]
          per token before w_opd scales it (OpenClaw-RL's ADV_DIFF_CLIP); None = unclipped. 1.0, the value
          OpenClaw-RL's launcher runs with (its code's default is 2.0), keeps one token's OPD term on the
          scale of the +-1 Binary RL reward it is added to in Combine.
      kl_coef: weight of a k3 KL estimate to the base model (adapter off); 0 disables it and its forward.
      topk_overlap: K of the overlap-guided hint choice among several hints.
    LoRA / optimiser
      lora_r, lora_alpha, lora_dropout, target_modules: PEFT LoraConfig (ignored when continuing a parent
          adapter, whose own config is kept so the new version stays loadable next to it).
      lr, betas, weight_decay, max_grad_norm: AdamW and gradient clipping.
    Batching
      micro_batch_tokens: token budget of one forward/backward: a step's samples are packed end to end into
          rows of at most this many tokens (no padding, no attention across samples, position ids restarting
          per sample; a longer sample gets a row alone). 0 = micro_batch_size samples per forward/backward,
          padded to the longest.
      pack_row_tokens: longest packed row: a micro-batch's tokens go into rows of at most this many (without
          a variable-length attention kernel a row's attention costs its length squared, so rows stay short
          of the budget); a longer sample gets a row alone.
      micro_batch_size: samples per forward/backward when micro_batch_tokens is 0. grad_accum: micro-batches
          of micro_batch_size samples per optimizer step (also with packing: it sizes the step); None = the
          batch is split into `mini_batches` optimizer steps instead.
      mini_batches: optimizer steps per pass over the batch when grad_accum is None (1 = OpenClaw-RL's one
          update per batch of 16; PPO uses several, so that the clip bounds the later steps of a run).
      epochs: passes over the batch; max_steps: cap on optimizer steps per train() call (None = no cap).
      old_policy: what pi_old (the ratio's denominator, and the OPD advantage's student term) is, fixed
          across the train() call's steps (so later mini-batch steps are clipped against it: PPO's trust
          region).
          "recorded" (default) = the log-probs vLLM served with the turn, i.e. the policy that actually
          sampled it (at its temperature / top-k / top-p), wherever they are valid: one per sampled token,
          finite and <= 0, on the very token ids trained, of a mode that matches how the trainer scores the
          sample (TrainSample.recorded_logprobs_problem). Elsewhere the policy at the start of the call, and
          the sample's alignment says why. A sample served by an older version than the parent then has its
          ratio taken against the version that served it: the importance ratio corrects for the lag.
          "start" = always the policy at the start of the call (step 1 has rho = 1).
      max_version_lag: samples served by an adapter version more than this many versions behind the one
          being trained are not trained (dropped with the lag as the reason); None = no bound. The recorded
          log-probs correct the ratio for a small lag, but the further the policy moved since, the more of
          the sample's tokens fall outside the clip range (no gradient) and the noisier the rest; with one
          run per batch the lag is 0 or 1 in normal operation, and more means a backlog.
      max_seq_len: prompt + response tokens; a longer sample loses the start of its prompt (left truncation,
          recorded in its alignment); only one whose response alone does not fit is dropped with a reason, or
          its response cut to fit when truncate_response is True.
      padding_side: "right" or "left" (positions are derived from the attention mask, so both give the same
          log-probs).
    Runtime
      seed; dtype: "auto" = bfloat16 on CUDA, float32 on CPU (float64 for exactness tests);
      device: "auto" = cuda if available, else cpu;
      gradient_checkpointing: trade compute for activation memory on long sequences; None = on for CUDA,
          off on CPU (where the tiny model's activations are small).
      checkpoint_seconds: how often a run writes its full state (adapter, optimizer, prepared batch) to its
          workdir: after a step when at least this many seconds have passed since the run's last checkpoint
          (or since it started), and always after the last step of a train() call, so a run that takes less
          writes once, at its end; a crash loses at most about this much training. 0 = after every step.
          The operator's (CLAWHUB_TRAIN_DEFAULTS): 32 tenants' full states at every step of a pass are GBs.
    """

    method: Method = "combine"
    # OpenClaw-RL's learning rate for LoRA (1e-5 is its full fine-tuning rate): a rank-16 adapter started at
    # zero needs the larger step to move in a few updates of 16 samples.
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    eps_low: float = 0.2
    eps_high: float = 0.28
    w_rl: float = 1.0
    w_opd: float = 1.0
    opd_clip: float | None = 1.0
    kl_coef: float = 0.0
    topk_overlap: int = 4
    micro_batch_size: int = 4
    micro_batch_tokens: int = 8192
    pack_row_tokens: int = 4096
    grad_accum: int | None = None
    mini_batches: int = 1
    epochs: int = 1
    old_policy: Literal["start", "recorded"] = "recorded"
    max_version_lag: int | None = 2
    max_steps: int | None = None
    max_seq_len: int = 32768
    truncate_response: bool = False
    padding_side: Literal["left", "right"] = "right"
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    gradient_checkpointing: bool | None = None
    checkpoint_seconds: float = 120.0

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        problems = list(self._problems())
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    def _problems(self):
        if self.method not in METHODS:
            yield f"method={self.method!r}: use one of {', '.join(METHODS)}"
        if not 0 < self.lr < 1:
            yield f"lr={self.lr}: must be in (0, 1); LoRA RL uses about 1e-6 to 1e-4"
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            yield f"betas={self.betas}: two numbers in [0, 1), e.g. (0.9, 0.98)"
        if self.weight_decay < 0 or self.max_grad_norm <= 0:
            yield "weight_decay must be >= 0 and max_grad_norm > 0"
        if self.lora_r < 1 or self.lora_alpha <= 0:
            yield f"lora_r={self.lora_r}, lora_alpha={self.lora_alpha}: rank >= 1, alpha > 0 (e.g. 16, 32)"
        if not 0 <= self.lora_dropout < 1:
            yield f"lora_dropout={self.lora_dropout}: must be in [0, 1)"
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            yield "target_modules must name at least one module, e.g. ('q_proj', 'v_proj')"
        if not 0 <= self.eps_low < 1 or self.eps_high < 0:
            yield f"eps_low={self.eps_low}, eps_high={self.eps_high}: need 0 <= eps_low < 1 and eps_high >= 0"
        if self.w_rl < 0 or self.w_opd < 0:
            yield f"w_rl={self.w_rl}, w_opd={self.w_opd}: weights must be >= 0"
        if self.method == "combine" and self.w_rl == 0 and self.w_opd == 0:
            yield "method='combine' with w_rl = w_opd = 0 trains nothing: set at least one weight above 0"
        if self.method == "opd" and self.w_opd == 0:
            yield "method='opd' with w_opd=0 trains nothing: set w_opd > 0 (default 1.0)"
        if self.opd_clip is not None and not self.opd_clip > 0:
            yield f"opd_clip={self.opd_clip}: must be > 0 (e.g. 1.0 or 2.0), or None for no clip"
        if self.max_version_lag is not None and self.max_version_lag < 0:
            yield f"max_version_lag={self.max_version_lag}: must be >= 0, or None for no bound"
        if self.kl_coef < 0:
            yield f"kl_coef={self.kl_coef}: must be >= 0 (0 disables the KL term)"
        if self.topk_overlap < 1:
            yield f"topk_overlap={self.topk_overlap}: must be >= 1 (OpenClaw-RL uses 4)"
        if self.micro_batch_size < 1:
            yield f"micro_batch_size={self.micro_batch_size}: must be >= 1"
        if self.pack_row_tokens < 16:
            yield f"pack_row_tokens={self.pack_row_tokens}: must be >= 16"
        if self.micro_batch_tokens < 0:
            yield f"micro_batch_tokens={self.micro_batch_tokens}: must be >= 0 (0 = micro_batch_size samples)"
        if not self.checkpoint_seconds >= 0:
            yield f"checkpoint_seconds={self.checkpoint_seconds}: must be >= 0 (0 = after every step)"
        if self.gradient_checkpointing not in (None, True, False):
            yield f"gradient_checkpointing={self.gradient_checkpointing!r}: use true, false or null (auto)"
        if self.grad_accum is not None and self.grad_accum < 1:
            yield f"grad_accum={self.grad_accum}: must be >= 1, or None for one optimizer step per batch"
        if self.mini_batches < 1:
            yield f"mini_batches={self.mini_batches}: must be >= 1 (optimizer steps per pass over the batch)"
        if self.epochs < 1:
            yield f"epochs={self.epochs}: must be >= 1"
        if self.old_policy not in ("start", "recorded"):
            yield f"old_policy={self.old_policy!r}: use 'start' or 'recorded'"
        if self.max_steps is not None and self.max_steps < 1:
            yield f"max_steps={self.max_steps}: must be >= 1, or None for no cap"
        if self.max_seq_len < 16:
            yield f"max_seq_len={self.max_seq_len}: must be >= 16 tokens"
        if self.padding_side not in ("left", "right"):
            yield f"padding_side={self.padding_side!r}: use 'left' or 'right'"
        if self.dtype not in DTYPES:
            yield f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)}"
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            yield f"device={self.device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"

    @property
    def samples_per_step(self) -> int | None:
        """Samples per optimizer step, or None when one step takes the whole batch."""
        return None if self.grad_accum is None else self.micro_batch_size * self.grad_accum

    def step_sizes(self, samples: int) -> list[int]:
        """Samples in each optimizer step of one pass over `samples` samples (every backend plans with it)."""
        if samples <= 0:
            return []
        if self.samples_per_step is not None:
            per_step = self.samples_per_step
            return [min(per_step, samples - i) for i in range(0, samples, per_step)]
        # Near-equal mini-batches: 16 samples in 3 steps are 6, 5, 5 (never an empty step).
        steps = min(self.mini_batches, samples)
        return [samples // steps + (1 if i < samples % steps else 0) for i in range(steps)]

    def planned_steps(self, samples: int) -> int:
        """Optimizer steps of a train() call on `samples` trainable samples."""
        steps = self.epochs * len(self.step_sizes(samples))
        return min(steps, self.max_steps) if self.max_steps else steps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        data["betas"] = list(self.betas)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """From stored JSON (site defaults merged with a tenant's overrides); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)


# Allowed ranges of the settings that decide how long a run holds its worker and how much memory it takes.
# The dataclass checks only what makes sense at all; these are what one tenant may ask of a shared GPU. The
# operator changes them with CLAWHUB_TRAIN_UPPER_BOUNDS (a JSON object of field -> maximum).
LOWER_BOUNDS: dict[str, int] = {
    "epochs": 1, "lora_r": 1, "lora_alpha": 1, "micro_batch_size": 1, "grad_accum": 1, "mini_batches": 1,
    "max_steps": 1, "max_seq_len": 16, "topk_overlap": 1, "micro_batch_tokens": 0,
    "pack_row_tokens": 16,
}
DEFAULT_UPPER_BOUNDS: dict[str, int] = {
    "epochs": 10, "lora_r": 128, "lora_alpha": 512, "micro_batch_size": 64, "grad_accum": 64,
    "mini_batches": 64, "max_steps": 2000, "max_seq_len": 32768, "topk_overlap": 64,
    "micro_batch_tokens": 65536, "pack_row_tokens": 32768,
}


def bound_problems(config: TrainConfig, upper: dict[str, int] | None = None) -> list[str]:
    """What in ``config`` is above its upper bound (``DEFAULT_UPPER_BOUNDS`` updated with ``upper``), each
    with the allowed range, so the message says what to ask for instead."""
    bounds = {**DEFAULT_UPPER_BOUNDS, **(upper or {})}
    problems = []
    for name, most in bounds.items():
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > most:
            problems.append(f"{name}={value}: allowed range is {LOWER_BOUNDS.get(name, 0)}–{most}")
    return problems


@dataclass
class DroppedSample:
    sample_id: int | str
    reason: str


@dataclass
class StepMetrics:
    """One optimizer step. loss includes the KL term; mean_* are over the step's trainable samples."""

    step: int
    loss: float
    mean_reward: float
    mean_advantage: float
    tokens: int
    seconds: float
    samples: int = 0
    sample_ids: list[int | str] = field(default_factory=list)
    clip_fraction: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    entropy: float = 0.0  # mean policy entropy per response token (nats), from the same chunked head pass
    dropped: list[DroppedSample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
        data = dict(data)
        data["dropped"] = [DroppedSample(**d) for d in data.get("dropped", [])]
        return cls(**data)


@dataclass
class TrainResult:
    """What train() did. adapter_dir holds the PEFT adapter after the last step (inside the workdir: call
    export_adapter to copy it somewhere permanent). steps counts all optimizer steps of the run so far."""

    adapter_dir: str
    steps: int
    metrics: list[StepMetrics] = field(default_factory=list)
    dropped: list[DroppedSample] = field(default_factory=list)
    trained_sample_ids: list[int | str] = field(default_factory=list)
    # Per trainable sample (by str(sample_id)): "pi_old" ("recorded", or "recomputed: <why>"), "version_lag"
    # and the "sampler" [temperature, top_p, top_k] it was scored with. Empty where a backend keeps none.
    sample_notes: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed_from_step: int | None = None
    # Optimizer continuity: the optimizer steps the parent version's state had taken when this run restored
    # it (None = the run started a fresh optimizer), and why it could not be restored when it was not.
    optimizer_resumed_at: int | None = None
    optimizer_note: str = ""
    # Where and how it ran (local backend): the resident base model's loads and runs in this worker process,
    # whether the run trained alone or in a multi-tenant pass, peak memory.
    runtime: dict[str, Any] = field(default_factory=dict)


OnStep = Callable[[StepMetrics], None]


class TrainingBackend(ABC):
    """What the train task needs from any backend. Implementations must be safe to re-run after a crash."""

    name: str = ""

    @classmethod
    def from_config(cls, config: Any) -> TrainingBackend:
        """The backend the train task uses: ``config`` has the settings as attributes (Django's settings, or
        any object); a backend with options or credentials reads its own here. Registered by name in
        workers.trainer.registry."""
        return cls()

    @abstractmethod
    def start(
        self, base_model: str, parent_adapter_dir: str | None, config: TrainConfig, workdir: str
    ) -> None:
        """Prepare a run of `base_model` (a local path or model id), continuing `parent_adapter_dir` (a PEFT
        directory) when given, else a fresh LoRA. If `workdir` holds a checkpoint of this run, resume from
        it."""

    @abstractmethod
    def train(self, batch: list[TrainSample], on_step: OnStep | None = None) -> TrainResult:
        """Run the optimizer steps for `batch`; call on_step after each step (after its checkpoint is saved).
        Calling it again with the same batch after a resume continues where the last checkpoint left off."""

    @abstractmethod
    def export_adapter(self, out_dir: str) -> str:
        """Write the current adapter as a PEFT directory vLLM can load (adapter_config.json +
        adapter_model.safetensors) and return its path. Backends that can continue an optimisation also
        write their optimizer state there, under OPTIMIZER_STATE_DIR/<backend name>/ (local: the AdamW
        moments and step; remote: the service's state path), which start() restores when that directory
        is the parent of a later run."""

    def remote_ids(self) -> dict[str, str]:
        """Ids of remote state (training client, job, checkpoint) to store on the run; {} when local."""
        return {}

    def close(self) -> None:  # noqa: B027 - only backends holding connections or GPU memory need it
        """Release what start() acquired."""

