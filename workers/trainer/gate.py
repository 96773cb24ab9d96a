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
  canaries      replies sampled (fixed seed) to a few fixed prompts: empty-output share and repeated-3-gram
                share of the tokens
  perplexity    on held chats of the tiny model's own corpus (its assistant replies given their prompts)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from workers.trainer.backend import TrainSample
from workers.trainer.batching import collate, encode_batch, teacher_prompt_ids
from workers.trainer.local import generate_samples, load_pretrained, resolve_device, response_logits

CORPUS = Path(__file__).resolve().parent / "corpus" / "chats.jsonl"


@dataclass
class ModelScores:
    logprob: dict[str, float] = field(default_factory=dict)
    kl: dict[str, float] = field(default_factory=dict)
    away: dict[str, float] = field(default_factory=dict)
    canaries: list[str] = field(default_factory=list)
    empty: float = 0.0
    repetition: float = 0.0
    perplexity: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def corpus_chats(path: Path = CORPUS, *, count: int = 16) -> tuple[list[list[dict]], list[TrainSample]]:
    """(canary prompts, perplexity samples) from the tiny model's corpus, always the same ones: the last
    chats of the file (the opening user turn as a canary prompt, the whole chat's last reply for
    perplexity)."""
    lines = [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]
    chosen = lines[-count:]
    canaries, texts = [], []
    for i, messages in enumerate(chosen):
        first_user = next(j for j, m in enumerate(messages) if m["role"] == "user")
        canaries.append(messages[: first_user + 1])
        last = max(j for j, m in enumerate(messages) if m["role"] == "assistant")
        reply = messages[last]["content"]
        texts.append(TrainSample(sample_id=f"corpus-{i}", messages=messages[:last], response_text=reply))
    return canaries[:4], texts


def repeated_ngram_share(token_ids: list[int], n: int = 3) -> float:
    """Share of a reply's n-grams that already occurred in it: ~0 for prose, ~1 for "the the the ...". """
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


class _Scorer:
    def __init__(self, model: Any, tokenizer: Any, device: torch.device, max_seq_len: int):
        self.model, self.tokenizer, self.device, self.max_seq_len = model, tokenizer, device, max_seq_len

    def logits(self, sequences: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Log-softmax at each response position (B, T, V), the response mask, and the batch."""
        batch = collate(sequences, pad_id=self.tokenizer.pad_token_id).to(self.device)
        logp = torch.log_softmax(response_logits(self.model, batch).float(), -1)
        return logp, batch.mask, batch

    def mean_logprobs(self, encoded: list, chunk: int = 8) -> dict[str, tuple[float, int]]:
        out = {}
        for i in range(0, len(encoded), chunk):
            part = encoded[i : i + chunk]
            logp, mask, batch = self.logits([(e.prompt_ids, e.response_ids) for e in part])
            token = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) * mask
            for j, e in enumerate(part):
                n = int(mask[j].sum())
                out[str(e.sample.sample_id)] = (float(token[j].sum()) / max(n, 1), n)
        return out


@torch.no_grad()
def score_versions(
    *,
    base_model: str,
    adapters: dict[str, str | None],
    samples: list[TrainSample],
    corpus: Path = CORPUS,
    max_seq_len: int = 2048,
    max_new_tokens: int = 48,
    device: str = "auto",
    seed: int = 0,
) -> dict[str, ModelScores]:
    """Scores of each named adapter directory (None = the base model) on the same held-out samples."""
    dev = resolve_device(device)
    base, tokenizer = load_pretrained(base_model, torch.float32, dev)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    base.eval()
    model: Any = base
    for name, path in adapters.items():
        if path is None:
            continue
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name)
        else:
            model = PeftModel.from_pretrained(base, path, adapter_name=name)
    model.eval()
    scorer = _Scorer(model, tokenizer, dev, max_seq_len)
    encoded, _ = encode_batch(tokenizer, samples, max_seq_len=max_seq_len)
    canary_prompts, corpus_samples = corpus_chats(corpus)
    corpus_encoded, _ = encode_batch(tokenizer, corpus_samples, max_seq_len=max_seq_len)

    # The hint-teacher's distributions do not depend on the adapter: computed once, adapter off.
    hinted = [e for e in encoded if e.sample.hints]
    teacher: dict[str, torch.Tensor] = {}
    with _adapter(model, None):
        for e in hinted:
            prompt, _ = teacher_prompt_ids(tokenizer, e, e.sample.hints[0], max_seq_len=max_seq_len)
            logp, mask, _ = scorer.logits([(prompt, e.response_ids)])
            teacher[str(e.sample.sample_id)] = logp[0, : int(mask[0].sum())]

    scores = {}
    policies: dict[str, dict[str, torch.Tensor]] = {}
    for name, path in adapters.items():
        with _adapter(model, name if path is not None else None):
            result = ModelScores()
            result.logprob = {k: v for k, (v, _) in scorer.mean_logprobs(encoded).items()}
            for e in hinted:
                key = str(e.sample.sample_id)
                logp, mask, _ = scorer.logits([(e.prompt_ids, e.response_ids)])
                policy = logp[0, : int(mask[0].sum())]
                kl = (policy.exp() * (policy - teacher[key])).sum(-1).mean()
                result.kl[key] = float(kl)
                policies.setdefault(name, {})[key] = policy
            sampled = generate_samples(
                model, tokenizer, canary_prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed
            )
            result.canaries = [s.text[:300] for s in sampled]
            result.empty = sum(not s.text.strip() for s in sampled) / max(len(sampled), 1)
            result.repetition = sum(repeated_ngram_share(s.token_ids) for s in sampled) / max(len(sampled), 1)
            ppl = scorer.mean_logprobs(corpus_encoded)
            tokens = sum(n for _, n in ppl.values())
            if tokens:
                result.perplexity = math.exp(-sum(v * n for v, n in ppl.values()) / tokens)
            scores[name] = result
    parent = policies.get("parent", {})
    for name, by_key in policies.items():
        if name == "parent":
            continue
        for key, policy in by_key.items():
            if key in parent:
                away = ((policy.exp() - parent[key].exp()) * (parent[key] - teacher[key])).sum(-1).mean()
                scores[name].away[key] = float(away)
    return scores


class _adapter:
    """Context: run the model with one named adapter on, or with every adapter off (None = base model)."""

    def __init__(self, model: Any, name: str | None):
        self.model, self.name, self.off = model, name, None

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
