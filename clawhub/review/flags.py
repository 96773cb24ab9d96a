"""Poisoning guards: one small pure function per rule.

Each rule looks at plain numbers and dates (the service gathers them from the database) and returns a Flag or
None. The policy then decides from the flags alone whether a sample waits for a human.
"""

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

MEMBER_OUTLIER = "member_outlier"
NEAR_DUPLICATE = "near_duplicate"
NEW_KEY = "new_key"
REVOKED_KEY = "revoked_key"
SPLIT_VOTES = "split_votes"
EXPLICIT_OVERRIDES_JUDGE = "explicit_overrides_judge"
CODES = (MEMBER_OUTLIER, NEAR_DUPLICATE, NEW_KEY, REVOKED_KEY, SPLIT_VOTES, EXPLICIT_OVERRIDES_JUDGE)


@dataclass(frozen=True)
class Flag:
    code: str
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}


@dataclass(frozen=True)
class MemberStats:
    """One member's samples in a group over the outlier window."""

    total: int
    negative: int

    @property
    def rate(self) -> float:
        return self.negative / self.total if self.total else 0.0


def member_outlier(
    member: MemberStats,
    others: Sequence[MemberStats],
    *,
    rate_diff: float = 0.4,
    min_samples: int = 5,
    volume_factor: float = 3.0,
) -> Flag | None:
    """A member whose negative-feedback rate, or whose volume, stands far from the rest of the group.

    Compared with the *other* members (those with samples in the window), so a member who floods the group
    cannot drag the group's figures towards their own. Below ``min_samples`` there is too little to judge.
    """
    others = [o for o in others if o.total > 0]
    if member.total < min_samples or not others:
        return None
    others_total = sum(o.total for o in others)
    if others_total >= min_samples:
        others_rate = sum(o.negative for o in others) / others_total
        if abs(member.rate - others_rate) > rate_diff:
            return Flag(MEMBER_OUTLIER, f"negative rate {member.rate:.0%} against the group's "
                                        f"{others_rate:.0%} over {member.total} samples")
    median = statistics.median(o.total for o in others)
    if member.total > volume_factor * median:
        return Flag(MEMBER_OUTLIER, f"{member.total} samples against a group median of {median:g}")
    return None


_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise_text(text: str) -> str:
    """Case, punctuation and spacing folded away, so "Redo it!!" and "redo  it" count as the same text."""
    return _NON_WORD.sub(" ", (text or "").casefold()).strip()


def near_duplicate(*, previous: int, threshold: int = 3) -> Flag | None:
    """``previous`` earlier samples from the same user carried the same normalised next state within the
    window; the ``threshold``-th copy and every one after it is flagged as spam."""
    if threshold < 1 or previous + 1 < threshold:
        return None
    return Flag(NEAR_DUPLICATE, f"the same next state {previous + 1} times within the window")


def new_key(*, key_created_at: datetime | None, at: datetime, min_age: timedelta) -> Flag | None:
    """Feedback through a key younger than ``min_age`` when the turn was made (a throwaway key)."""
    if key_created_at is None or at - key_created_at >= min_age:
        return None
    hours = max((at - key_created_at).total_seconds(), 0) / 3600
    return Flag(NEW_KEY, f"key was {hours:.1f} h old (threshold {min_age.total_seconds() / 3600:g} h)")


def revoked_key(*, key_revoked_at: datetime | None, at: datetime) -> Flag | None:
    """Feedback through a key that was already revoked when the turn was judged."""
    if key_revoked_at is None or key_revoked_at > at:
        return None
    return Flag(REVOKED_KEY, f"key revoked at {key_revoked_at:%Y-%m-%d %H:%M} UTC")


def vote_scores(votes: Iterable[Any]) -> list[int]:
    """The valid scores among the judge's votes ({"raw", "score"} dicts, or bare ints)."""
    scores = []
    for vote in votes or ():
        score = vote.get("score") if isinstance(vote, dict) else vote
        if isinstance(score, int) and not isinstance(score, bool):
            scores.append(score)
    return scores


def split_votes(votes: Iterable[Any]) -> Flag | None:
    """The judge's votes disagree. Invalid votes (no parsable score) are left out: they carry no opinion."""
    distinct = sorted(set(vote_scores(votes)))
    if len(distinct) <= 1:
        return None
    return Flag(SPLIT_VOTES, "votes " + ", ".join(f"{s:+d}" for s in distinct))


def explicit_overrides_judge(*, judge_reward: int, explicit_reward: int | None) -> Flag | None:
    """A person's own rating says the opposite of the judge's: it wins, but a human looks first (a mis-click,
    or a member steering a shared adapter against what the conversation showed)."""
    if explicit_reward is None or judge_reward * explicit_reward >= 0:
        return None
    return Flag(EXPLICIT_OVERRIDES_JUDGE, f"rated {explicit_reward:+d} against the judge's {judge_reward:+d}")


def member_cap(limit: int, share: float) -> int:
    """The most samples one member may put in a group batch of ``limit``: ceil(share × limit), at least 1."""
    return max(1, math.ceil(share * limit))


def initial_state(mode: str, flags: Sequence[Flag]) -> str:
    """Where a new sample starts under a tenant's review mode: ``manual`` holds everything for a human;
    ``auto`` and ``flagged`` both approve unflagged samples and hold flagged ones (``auto`` is the personal
    default, ``flagged`` the group default; they are kept apart so that each tenant kind's default stays
    visible and can diverge later)."""
    if mode == "manual" or flags:
        return "pending"
    return "approved"
