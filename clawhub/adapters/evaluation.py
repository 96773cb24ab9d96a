"""The promotion gate's decision rule: plain arithmetic on the scores the train worker measured
(workers.trainer.gate), kept free of rows and of torch so that the web process can import it and it is tested
on its own.

The rule, in order (every number behind it is stored on the version and shown on its page):

1. Degeneration, measured on canary prompts and fixed texts no tenant can influence (needs no feedback):
   reject when the candidate's empty replies exceed the parent's by more than MAX_EMPTY_RISE, its
   repeated-3-gram share exceeds both MAX_REPETITION and the parent's + MAX_REPETITION_RISE, or its
   perplexity on the fixed texts exceeds MAX_PERPLEXITY_RATIO times the parent's — and the same bounds
   against the base model, so that drift cannot compound across versions (each within the bound of its
   parent, and the lineage far from the base). For a real model the canaries are fixed factual questions
   with known answers, asked greedily (workers/trainer/capability.py), and the fixed texts their reference
   answers; for the tiny model (it knows no facts), chats of its own corpus.
1b. Capability (real models): reject when the candidate answers more than MAX_CAPABILITY_DROP of the
   questions fewer right than the base model does (2 of 53). Against the base, not the parent: a loss
   within the bound per version must not add up across versions.
2. Preference margin on the tenant's held-out judged turns (never trained on): for each turn, d = the
   candidate's mean log-prob per token of the reply minus the parent's; delta = mean d over positively judged
   turns - mean d over negatively judged ones (the candidate made liked replies more likely relative to the
   disliked ones). A stratified bootstrap gives a two-sided interval at CLAWHUB_GATE_CONFIDENCE:
     - upper bound < 0: reject (the margin fell);
     - lower bound > 0: the margin rose;
     - else: no measurable change.
   With fewer than MIN_PER_CLASS positive or negative turns, or fewer than CLAWHUB_GATE_MIN_SAMPLES in all,
   there is not enough evidence to tell.
3. KL to the hint-teacher T (base model + hint) on held-out hinted turns: any update changes the KL to T by
   about its own size KL(candidate || parent), in whatever direction it moves; what must not grow is the
   rest, KL(c||T) - KL(p||T) - KL(c||p) = E_t sum_v (pi_c - pi_p)(log pi_p - log pi_T), which is > 0 when the
   update moved probability towards tokens the teacher likes less than the parent did. Reject when the
   bootstrap lower bound of its mean over hinted turns exceeds KL_TOLERANCE nats per token. Needs
   MIN_PER_CLASS hinted turns. The raw change of the KL to T is reported beside it.
4. "promote" when the margin rose.
5. Otherwise there is no evidence of a gain (too few turns of a class, or an interval that includes 0), and
   the gate fails safe: with no gain to trade against, the candidate ships only when it is shown not to be
   worse on anything measured. Every safety check must pass, each recorded in numbers["safety"]:
     - degeneration (1.), and corpus perplexity within UNPROVEN_PERPLEXITY_RATIO of the parent's;
     - each class the tenant did judge, even alone, with at least MIN_PER_CLASS turns: positively judged
       held-out replies lose at most UNPROVEN_FIT_DROP nats/token of mean log-prob, negatively judged ones
       gain at most that much (with fewer, one short reply moves that much through noise alone: listed as
       not checked, and so are 1 to MIN_PER_CLASS - 1 hinted turns for the KL rule, 3.);
     - capability (1b.) within UNPROVEN_CAPABILITY_DROP of the base model's (1 of 53).
   All that could run pass: "not_enough_evidence", which promotes (a tenant's first updates must be able to
   ship), with the reason saying so ("…; every safety check that could run passed: …"). One fails: "reject",
   naming it.

The style rule (``style_reward``) is no longer part of the gate; it stays as an optional reward for the
benchmark's personas.
"""

import random
import re
from dataclasses import asdict, dataclass, field

MIN_PER_CLASS = 3
MAX_EMPTY_RISE = 0.25
MAX_REPETITION = 0.15
MAX_REPETITION_RISE = 0.1
MAX_PERPLEXITY_RATIO = 1.5
KL_TOLERANCE = 0.02
# Shares of the capability questions a candidate may answer wrong that the base model answers right.
MAX_CAPABILITY_DROP = 0.05
# Without evidence of a gain, nothing may get measurably worse: a bound at the noise level of a small update.
UNPROVEN_PERPLEXITY_RATIO = 1.1
UNPROVEN_FIT_DROP = 0.05
UNPROVEN_CAPABILITY_DROP = 0.025

PROMOTE, REJECT, NOT_ENOUGH = "promote", "reject", "not_enough_evidence"


def style_reward(messages: list[dict], text: str) -> float:
    """The benchmark's "student" style rule (plain sentences: no **bold**, no numbered lists)."""
    breaks = "**" in text or re.search(r"(?m)^\s*\d+\.\s", text) is not None
    return -1.0 if breaks else 1.0


@dataclass
class Decision:
    outcome: str  # PROMOTE, REJECT or NOT_ENOUGH
    reason: str
    numbers: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.outcome != REJECT

    def to_dict(self) -> dict:
        return asdict(self)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _quantile(sorted_xs: list[float], q: float) -> float:
    i = min(len(sorted_xs) - 1, max(0, round(q * (len(sorted_xs) - 1))))
    return sorted_xs[i]


def bootstrap_interval(
    groups: list[list[float]], statistic, *, confidence: float, resamples: int, seed: int = 0
) -> tuple[float, float]:
    """Two-sided percentile interval of ``statistic(*groups)``, each group resampled with replacement on its
    own (stratified), with a fixed seed so that a decision can be recomputed."""
    rng = random.Random(seed)
    values = sorted(
        statistic(*[[g[rng.randrange(len(g))] for _ in g] for g in groups]) for _ in range(resamples)
    )
    alpha = (1 - confidence) / 2
    return _quantile(values, alpha), _quantile(values, 1 - alpha)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"


def decide(
    *,
    candidate: dict,
    parent: dict,
    base: dict | None = None,
    rewards: dict[str, int],
    min_samples: int,
    confidence: float,
    resamples: int,
    seed: int = 0,
) -> Decision:
    """``candidate`` / ``parent`` / ``base``: ModelScores.to_dict() of each (``base`` only needs the canary
    and perplexity numbers; None when the parent is the base model); ``rewards``: the held-out turns' judged
    rewards by sample id (str).

    Long on purpose: the rule of the module docstring, step by step in the same order and numbering, each step
    adding its numbers and returning its decision; split up, the order of the steps would no longer show."""
    numbers: dict = {"confidence": confidence, "held_out": len(rewards)}

    # 1. Degeneration, against the parent and against the base.
    numbers["canary"] = {
        k: {"candidate": candidate.get(k), "parent": parent.get(k),
            **({"base": base.get(k)} if base is not None else {})}
        for k in ("empty", "repetition", "perplexity")
    }
    for reference, name in ((parent, "the parent"), (base, "the base model")):
        why = _degenerated(candidate, reference, name) if reference is not None else None
        if why is not None:
            return Decision(REJECT, why, numbers)

    # 1b. Capability, against the base model (the parent, when it is the base).
    capability = _capability(candidate, parent, base if base is not None else parent)
    if capability is not None:
        numbers["capability"] = capability
        if capability["lost"] > capability["bound"]:
            return Decision(REJECT, _forgot(capability), numbers)

    # 2. Preference margin.
    diffs = {k: candidate["logprob"][k] - parent["logprob"][k] for k in rewards if k in candidate["logprob"]}
    pos = [d for k, d in diffs.items() if rewards[k] > 0]
    neg = [d for k, d in diffs.items() if rewards[k] < 0]
    numbers.update(positives=len(pos), negatives=len(neg))
    margin_rose = False
    evidence = len(pos) >= MIN_PER_CLASS and len(neg) >= MIN_PER_CLASS and len(pos) + len(neg) >= min_samples
    why_not = ""
    if evidence:
        delta = _mean(pos) - _mean(neg)
        low, high = bootstrap_interval(
            [pos, neg],
            lambda p, n: _mean(p) - _mean(n),
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        numbers["margin"] = {"delta": delta, "low": low, "high": high}
        numbers["accuracy"] = {
            "candidate": _pair_accuracy(candidate["logprob"], rewards),
            "parent": _pair_accuracy(parent["logprob"], rewards),
        }
        if high < 0:
            return Decision(REJECT, f"the preference margin fell: delta {_fmt(delta)} nats/token, "
                            f"{confidence:.0%} interval [{_fmt(low)}, {_fmt(high)}]", numbers)
        margin_rose = low > 0
        if not margin_rose:
            why_not = (f"preference margin delta {_fmt(delta)}, {confidence:.0%} interval [{_fmt(low)}, "
                       f"{_fmt(high)}] includes 0")
    else:
        why_not = (f"{len(pos)} positive and {len(neg)} negative held-out turns (need {MIN_PER_CLASS} of "
                   f"each and {min_samples} in all)")

    # 3. KL to the hint-teacher.
    kl = [candidate["kl"][k] - parent["kl"][k] for k in candidate.get("kl", {}) if k in parent.get("kl", {})]
    away = list(candidate.get("away", {}).values())
    numbers["hinted"] = len(kl)
    if len(away) >= MIN_PER_CLASS:
        low, high = bootstrap_interval(
            [away], _mean, confidence=confidence, resamples=resamples, seed=seed + 1
        )
        numbers["kl"] = {
            "delta": _mean(kl) if kl else None,
            "away": _mean(away),
            "low": low,
            "high": high,
            "tolerance": KL_TOLERANCE,
        }
        if low > KL_TOLERANCE:
            return Decision(REJECT, f"the update moved away from the hint-teacher: {_mean(away):.3f} "
                            f"nats/token of KL growth beyond its own size ({confidence:.0%} interval "
                            f"[{low:.3f}, {high:.3f}])", numbers)

    if margin_rose:
        m = numbers["margin"]
        return Decision(PROMOTE, f"the preference margin rose: delta {_fmt(m['delta'])} nats/token, "
                        f"{confidence:.0%} interval [{_fmt(m['low'])}, {_fmt(m['high'])}]", numbers)

    # 5. No evidence of a gain: fail safe.
    checks = _safety_checks(candidate, parent, pos=pos, neg=neg, away=away, capability=capability)
    numbers["safety"] = checks
    failed = next((c for c in checks if c["passed"] is False), None)
    if failed is not None:
        return Decision(REJECT, f"not enough evidence of a gain ({why_not}) and a safety check failed: "
                        f"{failed['detail']}", numbers)
    passed = "; ".join(c["detail"] for c in checks)
    return Decision(NOT_ENOUGH, f"not enough evidence yet: {why_not}; promoted because every safety check "
                    f"that could run passed: {passed}", numbers)


def _degenerated(candidate: dict, reference: dict, name: str) -> str | None:
    """Why the candidate's canaries or corpus perplexity degenerated relative to ``reference`` (or None)."""
    if candidate["empty"] > reference["empty"] + MAX_EMPTY_RISE:
        return (f"canary replies came back empty ({candidate['empty']:.0%} vs {reference['empty']:.0%} for "
                f"{name})")
    if candidate["repetition"] > max(MAX_REPETITION, reference["repetition"] + MAX_REPETITION_RISE):
        return (f"canary replies degenerated into repetition ({candidate['repetition']:.0%} repeated 3-grams "
                f"vs {reference['repetition']:.0%} for {name})")
    cp, rp = candidate.get("perplexity"), reference.get("perplexity")
    if cp is not None and rp is not None and cp > MAX_PERPLEXITY_RATIO * rp:
        return (f"perplexity on {_texts(candidate)} rose from {rp:.2f} to {cp:.2f}"
                + ("" if name == "the parent" else f" against {name}: drift compounded across versions"))
    return None


def _texts(scores: dict) -> str:
    """What the perplexity was measured on, in words."""
    return "the fixed questions' reference answers" if scores.get("capability") else "the model's own corpus"


def _capability(candidate: dict, parent: dict, base: dict) -> dict | None:
    """The capability numbers the page shows and rule 1b reads: questions answered right by each model,
    how many fewer than the base the candidate got right, the bound, and which answers it lost."""
    mine, theirs = candidate.get("capability"), base.get("capability")
    if not mine or not theirs:
        return None
    asked = mine["asked"]
    forgotten = [q for q in mine["missed"] if q not in set(theirs["missed"])]
    return {
        "candidate": mine["right"], "parent": (parent.get("capability") or {}).get("right"),
        "base": theirs["right"], "asked": asked, "lost": theirs["right"] - mine["right"],
        "bound": int(MAX_CAPABILITY_DROP * asked), "unproven_bound": int(UNPROVEN_CAPABILITY_DROP * asked),
        "forgotten": forgotten,
    }


def _forgot(c: dict) -> str:
    examples = "; ".join(f'"{q}"' for q in c["forgotten"][:3])
    return (f"the update made the model forget what the base model knows: it answers {c['candidate']} of "
            f"{c['asked']} fixed factual questions right, the base model {c['base']} (at most {c['bound']} "
            f"fewer allowed)" + (f"; it no longer answers {examples}" if examples else ""))


def _safety_checks(candidate: dict, parent: dict, *, pos: list[float], neg: list[float],
                   away: list[float], capability: dict | None) -> list[dict]:
    """What a candidate without a measured gain must show (rule 5): each check as {"check", "passed",
    "detail"}, in the order they are read. Degeneration's standard bounds have passed already (rule 1)."""
    checks = [{"check": "canaries", "passed": True, "detail": "canary replies neither empty nor repetitive"}]
    if capability is not None:
        checks.append({
            "check": "capability", "passed": capability["lost"] <= capability["unproven_bound"],
            "detail": f"{capability['candidate']} of {capability['asked']} fixed factual questions answered "
                      f"right, the base model {capability['base']} (at most {capability['unproven_bound']} "
                      f"fewer)",
        })
    cp, pp = candidate.get("perplexity"), parent.get("perplexity")
    if cp is not None and pp is not None:
        what = "reference-answer" if candidate.get("capability") else "corpus"
        checks.append({
            "check": "perplexity", "passed": cp <= UNPROVEN_PERPLEXITY_RATIO * pp,
            "detail": f"{what} perplexity {pp:.2f} -> {cp:.2f} (at most x{UNPROVEN_PERPLEXITY_RATIO})",
        })
    if len(pos) >= MIN_PER_CLASS:
        drop = _mean(pos)
        checks.append({
            "check": "liked replies", "passed": drop >= -UNPROVEN_FIT_DROP,
            "detail": f"{len(pos)} positively judged held-out replies {drop:+.3f} nats/token (may fall by "
                      f"at most {UNPROVEN_FIT_DROP})",
        })
    elif pos:
        checks.append(_too_few("liked replies", f"{len(pos)} positively judged held-out replies"))
    if len(neg) >= MIN_PER_CLASS:
        rise = _mean(neg)
        checks.append({
            "check": "disliked replies", "passed": rise <= UNPROVEN_FIT_DROP,
            "detail": f"{len(neg)} negatively judged held-out replies {rise:+.3f} nats/token (may rise by "
                      f"at most {UNPROVEN_FIT_DROP})",
        })
    elif neg:
        checks.append(_too_few("disliked replies", f"{len(neg)} negatively judged held-out replies"))
    if len(away) >= MIN_PER_CLASS:
        checks.append({"check": "hint-teacher", "passed": True,
                       "detail": f"KL to the hint-teacher within tolerance on {len(away)} hinted turns"})
    elif away:
        checks.append(_too_few("hint-teacher", f"{len(away)} hinted held-out turns"))
    return checks


def _too_few(check: str, what: str) -> dict:
    """A check on held-out turns with fewer than MIN_PER_CLASS of them: one short reply moves by more than
    any tolerance through noise alone, so it is listed as not checked (passed None), not failed."""
    return {"check": check, "passed": None, "detail": f"{what}: too few to check (needs {MIN_PER_CLASS})"}


def _pair_accuracy(logprob: dict[str, float], rewards: dict[str, int]) -> float | None:
    """Share of (positive, negative) held-out pairs in which the model gives the positive reply the higher
    mean log-prob per token."""
    pos = [logprob[k] for k, r in rewards.items() if r > 0 and k in logprob]
    neg = [logprob[k] for k, r in rewards.items() if r < 0 and k in logprob]
    if not pos or not neg:
        return None
    return sum(p > n for p in pos for n in neg) / (len(pos) * len(neg))
