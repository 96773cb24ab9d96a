"""Simulates the consensus guard (review.flags.group_verdicts) on scripted groups, without a database.

Each run is one group: members take turns at sessions of three replies; a reply is "plain" (what the group
wants) with a probability that moves from ``start`` to ``end`` over the run (the adapter learning), else
"marked"; an honest member rewards plain +1 and marked -1, an adversary the opposite, and each reaction is
flipped with probability ``noise``. After every reply the guard's verdicts are taken for every member, as the
claim of a training run would. Reported per role: when a member was first flagged and first cleared
(counted in their own samples), and how many honest members were ever flagged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from clawhub.review import flags

PLAIN, MARKED = "plain|worked", "bold+numbered|worked"


@dataclass(frozen=True)
class Outcome:
    roles: str
    noise: float
    runs: int
    adversary_flagged_at: list[int | None]  # per adversary and run: its sample count when first flagged
    adversary_cleared_first: int  # adversaries the guard cleared before (or without) flagging them
    honest_flagged: int
    honest_members: int
    honest_cleared_at: list[int | None]


def run_once(rng: random.Random, roles: str, *, noise: float, sessions: int, turns: int = 3,
             start: float = 0.45, end: float = 0.95) -> tuple[dict[int, int], dict[int, int]]:
    """One group's run: (member -> own sample count when first flagged, ... when first cleared)."""
    judged: list[flags.Judged] = []
    own: dict[int, int] = {}
    flagged: dict[int, int] = {}
    cleared: dict[int, int] = {}
    total = sessions * len(roles)
    for session in range(total):
        member = session % len(roles)
        plain_share = start + (end - start) * session / total
        for _ in range(turns):
            plain = rng.random() < plain_share
            reward = 1 if plain else -1
            if roles[member] == "A":
                reward = -reward
            if rng.random() < noise:
                reward = -reward
            judged.append(flags.Judged(len(judged), member, reward, PLAIN if plain else MARKED))
            own[member] = own.get(member, 0) + 1
            for m, verdict in flags.group_verdicts(judged).items():
                if verdict.state == flags.DISAGREES:
                    flagged.setdefault(m, own[m])
                elif verdict.state == flags.AGREES:
                    cleared.setdefault(m, own[m])
    return flagged, cleared


def simulate(roles: str, *, noise: float, runs: int, sessions: int, seed: int = 0) -> Outcome:
    """``roles``: one letter per member, H honest or A adversary (e.g. "HHA")."""
    rng = random.Random(seed)
    adversary_at: list[int | None] = []
    honest_at: list[int | None] = []
    adversary_cleared_first = honest_flagged = 0
    for _ in range(runs):
        flagged, cleared = run_once(rng, roles, noise=noise, sessions=sessions)
        for m, role in enumerate(roles):
            if role == "A":
                adversary_at.append(flagged.get(m))
                if m in cleared and cleared[m] < flagged.get(m, float("inf")):
                    adversary_cleared_first += 1
            else:
                honest_flagged += m in flagged
                honest_at.append(cleared.get(m))
    return Outcome(roles, noise, runs, adversary_at, adversary_cleared_first, honest_flagged,
                   roles.count("H") * runs, honest_at)


def quantile(values: Sequence[int | None], q: float) -> int | None:
    """The q-quantile of the counts, None (never) counting as the largest."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    return ordered[int(q * (len(ordered) - 1))]


def report(outcome: Outcome) -> str:
    adversaries = outcome.adversary_flagged_at
    never = sum(v is None for v in adversaries)
    line = f"{outcome.roles} noise {outcome.noise:g}, {outcome.runs} runs:"
    if adversaries:
        line += (f" adversary flagged by its sample {quantile(adversaries, 0.5)} (median), "
                 f"{quantile(adversaries, 0.9)} (90 %), never in {never} of {len(adversaries)}; cleared "
                 f"before being flagged in {outcome.adversary_cleared_first};")
    line += (f" honest members flagged {outcome.honest_flagged} of {outcome.honest_members}, cleared by "
             f"their sample {quantile(outcome.honest_cleared_at, 0.5)} (median), "
             f"{quantile(outcome.honest_cleared_at, 0.9)} (90 %)")
    return line
