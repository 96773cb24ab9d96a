"""What both tracks of the persona benchmark (the stack's driver and the in-process one) share: the
methods and the users' checks, a tenant under test with its members and update records, and the results'
figures and files."""

from __future__ import annotations

import json
import statistics
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.client import Api
from clawhub.devtools.personas.plots import line_chart_png

METHODS = ("rl", "opd", "combine")


def check_users(*, methods, personas, phrasings: str, noise: float) -> None:
    """What both tracks (the stack's and the in-process one) ask of the methods and the simulated users."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
    bad = [p for p in personas if p not in P.PERSONAS]
    if bad:
        raise ValueError(f"unknown personas {bad}; choose from {list(P.PERSONAS)}")
    if phrasings not in ("training", "held-out"):
        raise ValueError("phrasings is 'training' or 'held-out'")
    if not 0 <= noise < 0.5:
        raise ValueError("noise is a rate in [0, 0.5): above that the users mean the opposite")


@dataclass
class Member:
    email: str
    api: Api
    user: P.ScriptedUser
    secret: str = ""
    client: Any = None  # openai.OpenAI
    sessions: int = 0


@dataclass
class UpdateRecord:
    update: int  # promoted updates so far
    attempt: int
    run_id: int | None
    version: int | None
    outcome: str  # active, rejected, failed, timeout
    compliance: float | None
    sessions: int  # simulated sessions so far, all members together
    samples: int
    feedback_to_served_s: float | None  # newest feedback turn in the batch -> the adapter served
    oldest_feedback_to_served_s: float | None
    run_to_served_s: float | None
    capability: float | None = None  # the capability guard's accuracy of this version
    wall_s: float | None = None  # the whole update: chatting, judging, review, training, gate, measuring
    eval_score: float | None = None
    baseline_score: float | None = None
    decision: str = ""  # the promotion gate's decision and its reason, as the version page shows them
    decision_reason: str = ""
    # Where feedback→served went (seconds): see feedback_stages.
    stages: dict[str, float] = field(default_factory=dict)


@dataclass
class Track:
    """One tenant under test: its members (the first manages it), what it prefers, and its history."""

    name: str
    persona: P.Persona
    members: list[Member]
    model: str
    tenant_id: int = 0
    slug: str = ""
    records: list[UpdateRecord] = field(default_factory=list)
    base_compliance: float | None = None
    base_capability: float | None = None
    prompt_only_compliance: float | None = None  # the base with the preference as its system prompt
    sessions: int = 0
    attempts: int = 0
    done: bool = False
    error: str = ""
    feedback_sent: dict[str, float] = field(default_factory=dict)  # feedback text -> when it was sent
    truth: dict[str, bool] = field(default_factory=dict)  # feedback text -> whether the user was pleased
    judge_agreement: dict[str, Any] = field(default_factory=dict)
    # member email -> that member's sessions when the bench first saw the consensus guard flag them
    consensus_flagged: dict[str, int] = field(default_factory=dict)

    @property
    def owner(self) -> Member:
        return self.members[0]

    @property
    def promoted(self) -> list[UpdateRecord]:
        return [r for r in self.records if r.outcome == "active"]

    def curve(self) -> list[float | None]:
        return [self.base_compliance, *[r.compliance for r in self.promoted]]

    def capability_curve(self) -> list[float | None]:
        return [self.base_capability, *[r.capability for r in self.promoted]]

    def summary(self, target: float) -> dict[str, Any]:
        curve = self.curve()
        reached = next((i for i, c in enumerate(curve) if c is not None and c >= target), None)
        promoted = self.promoted
        served = [r.feedback_to_served_s for r in promoted if r.feedback_to_served_s is not None]
        return {
            "tenant": self.tenant_id,
            "compliance": [None if c is None else round(c, 4) for c in curve],
            "capability": [None if c is None else round(c, 4) for c in self.capability_curve()],
            "prompt_only": (None if self.prompt_only_compliance is None
                            else round(self.prompt_only_compliance, 4)),
            "update_wall_s": [None if r.wall_s is None else round(r.wall_s, 1) for r in promoted],
            "judge_agreement": self.judge_agreement or None,
            "updates_promoted": len(promoted),
            "updates_attempted": self.attempts,
            "updates_rejected": sum(r.outcome == "rejected" for r in self.records),
            "updates_to_target": reached,
            "sessions_to_target": None if reached is None else 0 if reached == 0
            else promoted[reached - 1].sessions,
            "sessions": self.sessions,
            "feedback_to_served_s": [round(s, 1) for s in served],
            "feedback_to_served_median_s": round(statistics.median(served), 1) if served else None,
            "feedback_to_served_stages_s": [r.stages for r in promoted],
            "eval_scores": [r.eval_score for r in promoted],
            "gate": [{"version": r.version, "outcome": r.outcome, "decision": r.decision,
                      "reason": r.decision_reason} for r in self.records if r.version is not None],
            "consensus_flagged_after_sessions": dict(self.consensus_flagged),
            "error": self.error or None,
        }


def agreement(truth: dict[str, bool], read: dict[str, int]) -> dict[str, Any]:
    """Reactions the judge read (+1 / -1) against what the users meant: ``agreement`` over those judged,
    ``coverage`` the share judged at all; ``pleased_read`` / ``displeased_read`` per class."""
    judged = [(truth[text], reward) for text, reward in read.items() if text in truth and reward]
    agree = sum((reward > 0) == pleased for pleased, reward in judged)
    pleased = [r for p, r in judged if p]
    displeased = [r for p, r in judged if not p]
    return {
        "reactions": len(truth), "judged": len(judged),
        "coverage": round(len(judged) / len(truth), 4) if truth else None,
        "agreement": round(agree / len(judged), 4) if judged else None,
        "pleased": sum(truth.values()), "pleased_read_positive": sum(r > 0 for r in pleased),
        "displeased": len(truth) - sum(truth.values()),
        "displeased_read_negative": sum(r < 0 for r in displeased),
    }


def request_seed(*parts: Any) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def adversary_shift(with_adversary: list[float | None], without: list[float | None]) -> dict[str, Any]:
    """How far the adversarial member moved the shared compliance: control minus adversarial group, at each
    update both reached, and at the last one."""
    pairs = [(w, c) for w, c in zip(with_adversary, without, strict=False) if w is not None and c is not None]
    diffs = [round(c - w, 4) for w, c in pairs]
    return {"per_update": diffs, "final": diffs[-1] if diffs else None,
            "max_abs": max((abs(d) for d in diffs), default=None)}


def compliance_png(tracks: dict[str, list[Track]], *, title: str, target: float) -> bytes:
    """Held-out compliance per update, one line per method and track."""
    series = {f"{method} {track.name}": track.curve() for method, of_method in tracks.items()
              for track in of_method}
    return line_chart_png(series, title=title, target=target)


def write_results(out: Path, results: list[dict[str, Any]], plot: bytes) -> Path:
    """``results.jsonl`` (one line per method) and ``compliance.png`` in ``out``; the plot's path."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for result in results:
            f.write(json.dumps(result) + "\n")
    path = out / "compliance.png"
    path.write_bytes(plot)
    return path
