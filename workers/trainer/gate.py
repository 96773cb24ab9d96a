"""The promotion gate's measurements, on the train worker (torch): how a candidate adapter and its parent (or
the base model) score the tenant's held-out judged turns, and whether the candidate's own generations
degenerate. Plain data in and out; the decision rule is clawhub.adapters.evaluation.decide (no torch).

Per model, on the same held-out samples:
  logprob[id]   mean log-prob per token of the judged reply (positively judged replies should gain relative to
                negatively judged ones)
  kl[id]        on samples that carry a hint: mean over the reply's tokens of KL(model || hint-teacher), the
                teacher being the base model (adapter off) with the hint in the last user message, as in OPD
  away[id]      (every model but "parent") KL(model||T) - KL(parent||T) - KL(model||parent), which is
                exactly mean_t sum_v (pi_model - pi_parent)(log pi_parent - log pi_T): the growth of the KL to
                the teacher T that the update's own size does not explain, i.e. whether it moved probability
                towards tokens the teacher likes less than the parent does (> 0) or more (< 0)
  canaries      replies to fixed prompts no tenant can influence (Canaries, chosen by the base model's
                description, workers/base_models.py): empty-output share and repeated-3-gram share of tokens
  capability    for a real model, the canaries are the fixed factual questions (workers/trainer/capability.py)
                asked greedily: how many it answers right, and which it misses
  perplexity    on fixed texts: the questions' reference answers (a real model), or held chats of the tiny
                model's own corpus (its assistant replies given their prompts; it knows no facts)

Canaries and perplexity depend on nothing but the model (no tenant data), so a version's are measured once:
when it is scored as a candidate they are written beside its weights (gate_scores.json in its adapter
directory, keyed by a digest of the weights and of everything else they depend on), and when it is the
parent of a later candidate they are read back instead of sampled again; the base model's are kept in the
process. The base model itself is the train worker's resident one (workers/trainer/resident.py) when it is
idle and of the gate's dtype and device, instead of a fresh load per gate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from workers.base_models import describe
from workers.tiny_model.corpus.make_chats import MIXED_CHATS
from workers.trainer import capability
from workers.trainer import resident as resident_models
from workers.trainer.backend import TrainSample
from workers.trainer.batching import Batch, collate, encode_batch, teacher_prompt_ids
from workers.trainer.forward import (
    generate_samples,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    response_hidden,
)

log = logging.getLogger(__name__)

CORPUS = Path(__file__).resolve().parents[1] / "tiny_model" / "corpus" / "chats.jsonl"
FIXED_SCORES_FILE = "gate_scores.json"  # in an adapter directory: its canary and perplexity numbers
FIXED_FIELDS = ("canaries", "empty", "repetition", "perplexity", "capability")
SCORE_DTYPE = torch.float32  # on the CPU ("auto"); a GPU worker scores in its resident base's bf16


@dataclass
class ModelScores:
    logprob: dict[str, float] = field(default_factory=dict)
    kl: dict[str, float] = field(default_factory=dict)
    away: dict[str, float] = field(default_factory=dict)
    canaries: list[str] = field(default_factory=list)
    empty: float = 0.0
    repetition: float = 0.0
    perplexity: float | None = None
    # Real models: {"right": n, "asked": n, "missed": [questions answered wrong]}; None for the tiny model.
    capability: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def corpus_chats(path: Path = CORPUS, *, count: int = 16) -> tuple[list[list[dict]], list[TrainSample]]:
    """(canary prompts, perplexity samples) from the tiny model's corpus, always the same ones: the last
    chats of its shuffled mix (the opening user turn as a canary prompt, the whole chat's last reply for
    perplexity). Not the contrastive chats the file ends with: they ask each question three times, so their
    opening turns would be near-copies of one another."""
    lines = [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]
    chosen = lines[:MIXED_CHATS][-count:]
    canaries, texts = [], []
    for i, messages in enumerate(chosen):
        first_user = next(j for j, m in enumerate(messages) if m["role"] == "user")
        canaries.append(messages[: first_user + 1])
        last = max(j for j, m in enumerate(messages) if m["role"] == "assistant")
        reply = messages[last]["content"]
        texts.append(TrainSample(sample_id=f"corpus-{i}", messages=messages[:last], response_text=reply))
    return canaries[:4], texts


@dataclass(frozen=True)
class Canaries:
    """What the gate asks every version, whatever the tenant sent: prompts whose replies must not come back
    empty or repetitive (and, with answers, must stay right), and texts whose perplexity must not rise."""

    kind: str  # BaseModelSpec.canaries: "capability" or "corpus"
    prompts: list[list[dict]]
    texts: list[TrainSample]
    max_new_tokens: int
    temperature: float  # 0 = greedy
    # (question, accepted answers) behind each prompt, when the replies are scored for being right
    questions: list[tuple[str, tuple[str, ...]]] | None = None

    def fingerprint(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, default=str).encode()


# The tiny model's corpus canaries are sampled (temperature 1, fixed seed), as the gate always did for it.
CORPUS_CANARY_TOKENS = 48


def canaries_for(base_model: str, corpus: Path = CORPUS) -> Canaries:
    """The canaries of the base model's description: the capability questions, greedy and short, for a real
    model; the tiny model's corpus chats for the tiny model."""
    if describe(base_model).canaries == "corpus":
        prompts, texts = corpus_chats(corpus)
        return Canaries("corpus", prompts, texts, max_new_tokens=CORPUS_CANARY_TOKENS, temperature=1.0)
    prompts = [capability.messages(q) for q, _ in capability.QUESTIONS]
    texts = [TrainSample(sample_id=f"reference-{i}", messages=m, response_text=answer)
             for i, (m, answer) in enumerate(zip(prompts, capability.REFERENCE_ANSWERS, strict=True))]
    return Canaries("capability", prompts, texts, max_new_tokens=capability.GATE_MAX_TOKENS, temperature=0.0,
                    questions=list(capability.QUESTIONS))


def repeated_ngram_share(token_ids: list[int], n: int = 3) -> float:
    """Share of a reply's n-grams that already occurred in it: ~0 for prose, ~1 for "the the the ...". """
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


# Padded tokens per forward pass when scoring log-probs (training's micro_batch_tokens): a pass's decoder
# activations are about this many tokens' worth, however long the held-out turns are.
PASS_TOKENS = 8192
# Response positions per pass through the LM head: the full-vocabulary float32 tensors exist for this many
# positions at a time (the log-probs: logits + their float32 copy + logsumexp's; the KL part: the teacher's
# and every model's log-softmax), never for a whole sample.
HEAD_CHUNK_TOKENS = 256


class _Scorer:
    def __init__(self, model: Any, tokenizer: Any, device: torch.device, max_seq_len: int):
        self.model, self.tokenizer, self.device, self.max_seq_len = model, tokenizer, device, max_seq_len
        base = model.get_base_model() if isinstance(model, PeftModel) else model
        # The same head for every adapter: LoRA targets the decoder's projections only.
        self.head = base.get_output_embeddings()

    def batch(self, sequences: list[tuple[list[int], list[int]]]) -> Batch:
        return collate(sequences, pad_id=self.tokenizer.pad_token_id).to(self.device)

    def response_hiddens(self, sequences: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        """Each (prompt, response)'s last hidden states at its response positions, (T, d), in one forward
        pass: the LM head's input, a fraction of its output's size (d = 576 against a vocabulary of 49,152
        for SmolLM2)."""
        batch = self.batch(sequences)
        _, hidden = response_hidden(self.model, batch)
        return [hidden[j][batch.mask[j] > 0] for j in range(len(sequences))]

    def mean_logprobs(self, encoded: list, budget: int = PASS_TOKENS,
                      chunk: int = HEAD_CHUNK_TOKENS) -> dict[str, tuple[float, int]]:
        """Mean log-prob per token of each sample's response, shortest first, as many samples per forward
        pass as fit in `budget` padded tokens; the token log-probs are gathered through the LM head `chunk`
        response positions at a time, so no full-vocabulary tensor of a whole sample is kept."""
        out = {}
        for part in _passes(encoded, budget, lambda e: len(e.prompt_ids) + len(e.response_ids)):
            batch = self.batch([(e.prompt_ids, e.response_ids) for e in part])
            _, hidden = response_hidden(self.model, batch)
            where = batch.mask > 0
            hidden, targets = hidden[where], batch.targets[where]
            token = torch.cat([_token_logprobs(self.head(hidden[i : i + chunk]), targets[i : i + chunk])
                               for i in range(0, len(targets), chunk)])
            start = 0
            for e, n in zip(part, where.sum(-1).tolist(), strict=True):
                out[str(e.sample.sample_id)] = (float(token[start : start + n].sum()) / max(n, 1), n)
                start += n
        return out


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    z = logits.float()
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1)


def _passes(items: list, budget: int, size: Any) -> list[list]:
    """The items, shortest first by size(item) (tokens), in groups whose padded size (count x longest) is
    at most `budget` tokens (a longer item alone)."""
    groups: list[list] = []
    for e in sorted(items, key=size):
        length = size(e)
        if groups and (len(groups[-1]) + 1) * length <= budget:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


@torch.no_grad()
def score_versions(
    *,
    base_model: str,
    adapters: dict[str, str | None],
    samples: list[TrainSample],
    canaries: Canaries | None = None,
    max_seq_len: int = 2048,
    device: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    timings: dict[str, Any] | None = None,
    reuse: bool = True,
    fixed_only: tuple[str, ...] = (),
) -> dict[str, ModelScores]:
    """Scores of each named adapter directory (None = the base model) on the same held-out samples; the
    models named in `fixed_only` get only their canary and perplexity numbers (the base model, which the gate
    checks degeneration against besides the parent: once measured, they are read back at no cost).
    `canaries`: None = the base model's (canaries_for).

    `timings`, when given, is filled with the seconds each part took and which models' canary and perplexity
    numbers were read back. `reuse=False` measures everything afresh on a private copy of the base (what the
    gate did before; the benchmark compares the two)."""
    timings = {} if timings is None else timings
    canaries = canaries_for(base_model) if canaries is None else canaries
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(timings.get(name, 0.0) + now - clock, 3)
        clock = now

    dev = resolve_device(device)
    # Training's dtype (TrainConfig.dtype): the resident base is shared instead of a private fp32 copy loaded
    # beside it (16 GB for a 4B model); log-probs are computed in fp32 from its logits either way.
    score_dtype = resolve_dtype(dtype, dev)
    lease = resident_models.acquire_if_idle(base_model, score_dtype, dev, load_pretrained) if reuse else None
    if lease is not None:
        base, tokenizer = lease.model, lease.tokenizer
    else:
        base, tokenizer = load_pretrained(base_model, score_dtype, dev)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    timings["resident_base"] = lease is not None
    was_training = base.training
    base.eval()
    model: Any = base
    lap("load")
    try:
        for name, path in adapters.items():
            if path is None:
                continue
            if isinstance(model, PeftModel):
                model.load_adapter(path, adapter_name=name)
            else:
                model = PeftModel.from_pretrained(base, path, adapter_name=name)
        model.eval()
        lap("adapters")
        key = _fixed_key(base_model, dev, score_dtype, canaries, max_seq_len, seed) if reuse else None
        scores = _score(model, tokenizer, dev, adapters=adapters, samples=samples, canaries=canaries,
                        max_seq_len=max_seq_len, seed=seed, fixed_only=fixed_only, key=key, lap=lap,
                        timings=timings)
        log.info("gate scoring took %.1f s (resident base: %s, canaries read back for: %s)",
                 sum(v for v in timings.values() if isinstance(v, float)), timings["resident_base"],
                 ", ".join(timings["reused"]) or "none")
        return scores
    finally:
        if lease is not None:
            # Detach every adapter put on the resident base (a half-attached one makes it evict the base).
            base.train(was_training)
            resident_models.release(lease, model if isinstance(model, PeftModel) else None)


def _score(
    model: Any, tokenizer: Any, dev: torch.device, *, adapters: dict[str, str | None],
    samples: list[TrainSample], canaries: Canaries, max_seq_len: int, seed: int, key: str | None, lap: Any,
    timings: dict[str, Any], fixed_only: tuple[str, ...] = (),
) -> dict[str, ModelScores]:
    scorer = _Scorer(model, tokenizer, dev, max_seq_len)
    encoded, _ = encode_batch(tokenizer, samples, max_seq_len=max_seq_len)
    texts_encoded, _ = encode_batch(tokenizer, canaries.texts, max_seq_len=max_seq_len)

    scores = {}
    reused = timings.setdefault("reused", [])
    for name, path in adapters.items():
        with _adapter(model, name if path is not None else None):
            result = ModelScores()
            held_out = [] if name in fixed_only else encoded
            result.logprob = {k: v for k, (v, _) in scorer.mean_logprobs(held_out).items()}
            lap(f"{name}.logprob")
            model_key = _model_key(key, path) if key is not None else None
            fixed = FIXED.get(model_key, path) if model_key is not None else None
            if fixed is not None:
                for field_name in FIXED_FIELDS:
                    setattr(result, field_name, fixed[field_name])
                reused.append(name)
            else:
                _ask_canaries(model, tokenizer, canaries, result, seed=seed)
                lap(f"{name}.canaries")
                ppl = scorer.mean_logprobs(texts_encoded)
                tokens = sum(n for _, n in ppl.values())
                if tokens:
                    result.perplexity = math.exp(-sum(v * n for v, n in ppl.values()) / tokens)
                if model_key is not None:
                    FIXED.put(model_key, path, {f: getattr(result, f) for f in FIXED_FIELDS})
            lap(f"{name}.perplexity")
            scores[name] = result
    _hint_teacher_scores(scorer, tokenizer, [e for e in encoded if e.sample.hints], scores,
                         adapters={n: p for n, p in adapters.items() if n not in fixed_only},
                         max_seq_len=max_seq_len)
    lap("kl")
    return scores


# Torch threads while generating on a CPU. A decode step is hundreds of small operations, and with several
# threads on busy cores each of them waits for the slowest thread's time slice: SmolLM2 answering the 42
# questions on 2 cores at load ~10 took 117 s and 68 s with 2 threads, 37 s and 25 s with 1 (alternated).
GENERATE_CPU_THREADS = 1


def _ask_canaries(model: Any, tokenizer: Any, canaries: Canaries, result: ModelScores, *, seed: int) -> None:
    """The model's replies to the canary prompts, all in one batched generate: empty and repeated shares,
    and for questions with answers, how many it got right."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    threads = torch.get_num_threads()
    if on_cpu:
        torch.set_num_threads(min(threads, GENERATE_CPU_THREADS))
    try:
        sampled = generate_samples(model, tokenizer, canaries.prompts, max_new_tokens=canaries.max_new_tokens,
                                   temperature=canaries.temperature, seed=seed, logprobs=False)
    finally:
        torch.set_num_threads(threads)
    result.canaries = [s.text[:300] for s in sampled]
    result.empty = sum(not s.text.strip() for s in sampled) / max(len(sampled), 1)
    result.repetition = sum(repeated_ngram_share(s.token_ids) for s in sampled) / max(len(sampled), 1)
    if canaries.questions is not None:
        missed = [question for (question, answers), s in zip(canaries.questions, sampled, strict=True)
                  if not capability.is_right(s.text, answers)]
        result.capability = {"right": len(sampled) - len(missed), "asked": len(sampled), "missed": missed}


def _hint_teacher_scores(
    scorer: _Scorer, tokenizer: Any, hinted: list, scores: dict[str, ModelScores], *,
    adapters: dict[str, str | None], max_seq_len: int, chunk: int = HEAD_CHUNK_TOKENS,
    budget: int = PASS_TOKENS,
) -> None:
    """kl and away (see the module docstring) of each model on the hinted samples: as many samples per
    forward pass as fit in `budget` padded tokens (the teacher's and each model's one pass per group),
    then through the LM head one sample and `chunk` response positions at a time. What a group keeps is
    each model's last hidden states at the response positions (T, d per sample); the full-vocabulary
    distributions exist for one chunk of positions only (a whole reply's were 7.5 GiB at 2,048 tokens of a
    4B model; workers/trainer/gate_memory.py)."""
    model, head = scorer.model, scorer.head
    teacher_prompts = {id(e): teacher_prompt_ids(tokenizer, e, e.sample.hints[0], max_seq_len=max_seq_len)[0]
                       for e in hinted}
    for group in _passes(hinted, budget, lambda e: len(teacher_prompts[id(e)]) + len(e.response_ids)):
        # The hint-teacher: the base model, the hint in the last user message.
        hidden: dict[str | None, list[torch.Tensor]] = {}
        with _adapter(model, None):
            hidden[None] = scorer.response_hiddens([(teacher_prompts[id(e)], e.response_ids) for e in group])
        for name, path in adapters.items():
            with _adapter(model, name if path is not None else None):
                hidden[name] = scorer.response_hiddens([(e.prompt_ids, e.response_ids) for e in group])
        for k, e in enumerate(group):
            _sample_kl(head, {name: h[k] for name, h in hidden.items()}, str(e.sample.sample_id), scores,
                       chunk=chunk)
        del hidden


def _sample_kl(head: Any, hidden: dict[str | None, torch.Tensor], key: str, scores: dict[str, ModelScores], *,
               chunk: int) -> None:
    """One hinted sample's kl and away per model from the last hidden states at its reply (None: the
    teacher's), `chunk` positions at a time."""
    names = [name for name in hidden if name is not None]
    length = min(len(h) for h in hidden.values())
    kl = dict.fromkeys(names, 0.0)
    away = dict.fromkeys(names, 0.0)
    for start in range(0, length, chunk):
        logp = {name: torch.log_softmax(head(h[start : start + chunk]).float(), -1)
                for name, h in hidden.items()}
        teacher, parent = logp.pop(None), logp.get("parent")
        for name, policy in logp.items():
            kl[name] += float((policy.exp() * (policy - teacher)).sum())  # type: ignore[index]  # None popped
            if name != "parent" and parent is not None:
                away[name] += float(((policy.exp() - parent.exp()) * (parent - teacher)).sum())  # type: ignore[index]
        del logp, teacher, parent
    for name in names:
        scores[name].kl[key] = kl[name] / max(length, 1)
        if name != "parent" and "parent" in names:
            scores[name].away[key] = away[name] / max(length, 1)


# ---------------------------------------------------------------------------------- a version's fixed numbers


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _files_signature(folder: Path) -> bytes:
    """Names, sizes and modification times of a model folder's files (cheap; a rebuilt model changes it)."""
    if not folder.is_dir():
        return str(folder).encode()
    rows = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()]
    return json.dumps([str(folder.resolve()), rows]).encode()


def _fixed_key(
    base_model: str, dev: torch.device, dtype: torch.dtype, canaries: Canaries, max_seq_len: int, seed: int,
) -> str:
    """What a model's canaries and perplexity depend on besides its own weights."""
    setup = {"base": str(base_model), "device": dev.type, "dtype": str(dtype),
             "torch": torch.__version__, "max_seq_len": max_seq_len, "seed": seed}
    return _digest(json.dumps(setup, sort_keys=True).encode(), _files_signature(Path(base_model)),
                   canaries.fingerprint())


def _model_key(setup_key: str, adapter_dir: str | None) -> str | None:
    """setup_key and the adapter's weights and config (None = the base model); None when they are not
    readable."""
    if adapter_dir is None:
        return _digest(setup_key.encode(), b"base")
    folder = Path(adapter_dir)
    try:
        return _digest(setup_key.encode(), (folder / "adapter_config.json").read_bytes(),
                       (folder / "adapter_model.safetensors").read_bytes())
    except OSError:
        return None


class _FixedScores:
    """A model's canary and perplexity numbers by key: in this process, and for an adapter also in its
    directory (so that they outlive the worker and go where the version's weights go)."""

    def __init__(self) -> None:
        self.memory: dict[str, dict[str, Any]] = {}

    def get(self, key: str, adapter_dir: str | None) -> dict[str, Any] | None:
        if key in self.memory:
            return self.memory[key]
        if adapter_dir is None:
            return None
        try:
            stored = json.loads((Path(adapter_dir) / FIXED_SCORES_FILE).read_text())
        except (OSError, ValueError):
            return None
        if stored.get("key") != key or not all(f in stored.get("scores", {}) for f in FIXED_FIELDS):
            return None
        self.memory[key] = stored["scores"]
        return stored["scores"]

    def put(self, key: str, adapter_dir: str | None, scores: dict[str, Any]) -> None:
        self.memory[key] = scores
        if adapter_dir is None:
            return
        target = Path(adapter_dir) / FIXED_SCORES_FILE
        try:
            partial = target.with_suffix(".json.partial")
            partial.write_text(json.dumps({"key": key, "scores": scores}))
            partial.replace(target)
        except OSError as exc:  # a read-only adapter folder: the process still remembers them
            log.warning("could not write %s: %s", target, exc)


FIXED = _FixedScores()


class _adapter:
    """Context: run the model with one named adapter on, or with every adapter off (None = base model)."""

    def __init__(self, model: Any, name: str | None):
        self.model, self.name = model, name
        self.off: Any = None  # the adapter-off context while it is entered

    def __enter__(self):
        if not isinstance(self.model, PeftModel):
            return self.model
        if self.name is None:
            self.off = self.model.disable_adapter()
            self.off.__enter__()
        else:
            self.model.set_adapter(self.name)
        return self.model

    def __exit__(self, *exc):
        if self.off is not None:
            self.off.__exit__(*exc)
        return False
