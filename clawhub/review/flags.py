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

CONSENSUS = "consensus_disagreement"
MEMBER_OUTLIER = "member_outlier"
NEAR_DUPLICATE = "near_duplicate"
NEW_KEY = "new_key"
REVOKED_KEY = "revoked_key"
SPLIT_VOTES = "split_votes"
EXPLICIT_OVERRIDES_JUDGE = "explicit_overrides_judge"
CODES = (CONSENSUS, MEMBER_OUTLIER, NEAR_DUPLICATE, NEW_KEY, REVOKED_KEY, SPLIT_VOTES,
         EXPLICIT_OVERRIDES_JUDGE)


@dataclass(frozen=True)
class Flag:
    code: str
    detail: str
    # What a reviewer needs to check the flag (e.g. the disagreeing pairs); plain JSON values.
    evidence: tuple[dict[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "detail": self.detail}
        if self.evidence:
            data["evidence"] = list(self.evidence)
        return data


@dataclass(frozen=True)
class MemberStats:
    """One member's samples in a group over the outlier window."""

    total: int
    negative: int

    @property
    def rate(self) -> float:
        return self.negative / self.total if self.total else 0.0


def rate_z(a: MemberStats, b: MemberStats) -> float:
    """The two-proportion z statistic of two members' negative rates (pooled standard error): how many
    standard errors apart the rates are. 0 when neither or both are all negative (no spread to judge by)."""
    pooled = (a.negative + b.negative) / (a.total + b.total)
    variance = pooled * (1 - pooled) * (1 / a.total + 1 / b.total)
    return abs(a.rate - b.rate) / math.sqrt(variance) if variance > 0 else 0.0


def member_outlier(
    member: MemberStats,
    others: Sequence[MemberStats],
    *,
    rate_diff: float = 0.4,
    min_samples: int = 5,
    volume_factor: float = 3.0,
    z_min: float = 2.5,
) -> Flag | None:
    """A member whose negative-feedback rate, or whose volume, stands far from the rest of the group.

    Rate: the member's rate is more than ``rate_diff`` from *every* other member's who has ``min_samples``
    samples, and at least ``z_min`` standard errors from each (``rate_z``). Against each member, not against
    the others pooled: with one adversary among three, an honest member's "others" pooled are half honest and
    half adversary, so the honest member would stand out from that mix; compared one by one, they sit next
    to the other honest member. And the standard errors, because a handful of samples (a session is three
    correlated turns) puts two honest members' rates 0.5 apart by luck: on the persona bench, honest members
    of an all-honest group were flagged at "100 % against the group's 33 % over 5 samples", and rejecting
    their samples starved the group's training. Simulated (3 members, sessions of 3 turns, 10 % noise,
    compliance rising from 0.1 to 0.9 over 150 samples each, 300 runs): pooled without z, an honest member is
    flagged in 34 runs of all-honest groups and 228 with one adversary; this rule, 1 and 4; the adversary is
    still flagged in 274 (and the consensus guard looks at them on the same reply style).

    Volume: more than ``volume_factor`` times the other members' median (those with samples in the window).
    Compared with the *other* members, so a member who floods the group cannot drag the group's figures
    towards their own. Below ``min_samples`` there is too little to judge.
    """
    others = [o for o in others if o.total > 0]
    if member.total < min_samples or not others:
        return None
    judged = [o for o in others if o.total >= min_samples]
    if judged and all(abs(member.rate - o.rate) > rate_diff and rate_z(member, o) >= z_min for o in judged):
        rates = ", ".join(f"{o.rate:.0%}" for o in sorted(judged, key=lambda o: o.rate))
        return Flag(MEMBER_OUTLIER, f"negative rate {member.rate:.0%} over {member.total} samples against "
                                    f"every other member's ({rates}), each at least {z_min:g} standard "
                                    f"errors away")
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


# --- consensus: does a member reward a kind of reply the way the rest of the group does? ----------------

_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
_NUMBERED = re.compile(r"(?m)^\s*\d+[.)]\s+\S")
_BULLETS = re.compile(r"(?m)^\s*[-*•]\s+\S")
_HEADING = re.compile(r"(?m)^\s*#{1,6}\s+\S")
_CODE = re.compile(r"```")
_TOOL_CALL = re.compile(r'<tool_call>|"tool_calls"')
_LIST_MARKER = re.compile(r"(?m)^\s*(?:\d+[.)]|[-*•])\s+")
_SENTENCE = re.compile(r"[^.!?\n]*\w[^.!?\n]*(?:[.!?]+|\n|$)")


def reply_style(text: str) -> str:
    """A reply's style signature: which markup it uses and how developed it is, e.g. ``"bold+numbered|terse"``
    (fewer than 3 sentences or lines: an answer without its steps; 3 to 7: a worked answer; 8 or more: long).

    Replies with the same signature are "similar" for the consensus guard. Why style and not an embedding: a
    group's shared preference is mostly about how replies are written (markup, lists, length), and a member
    who steers the adapter rewards the opposite of the group on exactly those features; a few regexes over
    the text cost microseconds on the CPU judge workers, need no model, and give a reviewer a reason they can
    read ("+1 on bold+numbered replies, which the others score -1"). Prompts differ from member to member,
    so comparing on prompts would find few pairs in a small group.
    """
    text = text or ""
    marks = [name for name, pattern in (("bold", _BOLD), ("numbered", _NUMBERED), ("bullets", _BULLETS),
                                        ("heading", _HEADING), ("code", _CODE), ("tool", _TOOL_CALL))
             if pattern.search(text)]
    sentences = len(_SENTENCE.findall(_LIST_MARKER.sub("", text)))
    size = "terse" if sentences < 3 else "worked" if sentences < 8 else "long"
    return f"{'+'.join(marks) or 'plain'}|{size}"


def coarse_style(style: str) -> str:
    """The signature with its markup folded to "marked" or "plain" ("bold+numbered|worked" ->
    "marked|worked"): where nobody else scored a reply's exact style, the guard compares on this, so that a
    small group's few samples still meet."""
    markup, _, size = style.partition("|")
    return f"{'plain' if markup == 'plain' else 'marked'}|{size}"


@dataclass(frozen=True)
class Judged:
    """One judged reply of a group member: the sample, its reward and the reply's style signature."""

    sample_id: int | None
    member_id: int
    reward: int
    style: str


@dataclass(frozen=True)
class Agreement:
    """A member's agreement with one other member: comparable counts the member's replies whose style the
    other has scored with a clear lean (their mean reward on it at least ``lean`` from 0, over at least
    ``min_scored`` of their samples); disagreeing, those the member scored with the opposite sign."""

    other_id: int
    comparable: int
    disagreeing: int
    pairs: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Consensus:
    """One way of the comparison: a member's replies against each other member's lean (``against``, one
    ``Agreement`` per other member, those with nothing comparable left out)."""

    member_id: int
    against: tuple[Agreement, ...]


def consensus_of(member_id: int, judged: Sequence[Judged], *, lean: float = 0.34, min_scored: int = 2,
                 max_pairs: int = 3) -> Consensus:
    """How often ``member_id`` rewarded a reply the opposite way from each other member on the same style.

    Member against member, not against the others pooled: with one adversary among three, an honest
    member's pooled "others" are one honest member and the adversary, so a pooled consensus is either split
    (nothing to compare) or, while one side has scored a style and the other has not, the adversary alone;
    the persona bench flagged an honest owner so (their "group consensus" on a style was the adversary's
    -1 over three samples and the other honest member's -1 over two noisy ones). Compared one by one, an
    honest member agrees with the other honest members and disagrees with the adversary, and the verdict
    (``group_verdicts``) asks whether they disagree with most of the others. Each other member counts once,
    whatever their volume, so a member who floods the group cannot outvote the rest.

    The other member's lean on a style is their mean reward over at least ``min_scored`` of their samples of
    it (one noisy reaction is not a lean), on the exact signature where they have that many, else on its
    coarse form (``coarse_style``). ``pairs``: up to ``max_pairs`` disagreeing examples per other member,
    each the member's sample and one of the other's samples of that style with the opposite reward.
    """
    scored: dict[int, dict[str, list[int]]] = {}  # other member -> style (exact and coarse) -> rewards
    examples: dict[tuple[int, str, int], int | None] = {}  # (other, style, sign) -> one of their samples
    for j in judged:
        if j.reward == 0 or j.member_id == member_id:
            continue
        for style in {j.style, coarse_style(j.style)}:
            scored.setdefault(j.member_id, {}).setdefault(style, []).append(j.reward)
            examples.setdefault((j.member_id, style, 1 if j.reward > 0 else -1), j.sample_id)
    mine = [j for j in judged if j.member_id == member_id and j.reward != 0]
    against = []
    for other, styles in sorted(scored.items()):
        comparable = disagreeing = 0
        pairs: list[dict[str, Any]] = []
        for j in mine:
            style = j.style if len(styles.get(j.style, ())) >= min_scored else coarse_style(j.style)
            rewards = styles.get(style, ())
            if len(rewards) < min_scored or abs(mean := sum(rewards) / len(rewards)) < lean:
                continue
            comparable += 1
            if (j.reward > 0) != (mean > 0):
                disagreeing += 1
                if len(pairs) < max_pairs:
                    pairs.append({"sample": j.sample_id, "reward": j.reward, "style": style,
                                  "other_member": other, "other_mean": round(mean, 2),
                                  "other_sample": examples.get((other, style, 1 if mean > 0 else -1))})
        if comparable:
            against.append(Agreement(other, comparable, disagreeing, tuple(pairs)))
    return Consensus(member_id=member_id, against=tuple(against))


# How sure the guard must be before it calls two members agreeing or disagreeing: the one-sided 95 % bound.
CONFIDENCE_Z = 1.64
AGREE, DISAGREE, UNDECIDED = "agree", "disagree", "undecided"
AGREES, DISAGREES, NOT_COMPARED = "agrees", "disagrees", "not_compared"


def wilson_interval(k: int, n: int, z: float = CONFIDENCE_Z) -> tuple[float, float]:
    """The Wilson score interval of a rate of ``k`` in ``n`` (``n`` > 0): unlike the normal one it stays
    inside [0, 1] and is honest about small counts, which is all a group's first sessions give."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return centre - half, centre + half


@dataclass(frozen=True)
class Pair:
    """Two members compared both ways: each one's replies against the other's lean, summed (``comparable``,
    ``disagreeing``), and what the guard concludes: ``agree``, ``disagree`` or ``undecided``. ``pairs``: the
    member's disagreeing examples (``consensus_of``)."""

    other_id: int
    comparable: int
    disagreeing: int
    verdict: str
    pairs: tuple[dict[str, Any], ...] = ()

    @property
    def rate(self) -> float:
        return self.disagreeing / self.comparable if self.comparable else 0.0


@dataclass(frozen=True)
class Verdict:
    """Where the guard stands with a member: ``disagrees`` (with more than half of the others they can be
    compared with), ``agrees``, ``undecided``, or ``not_compared`` (fewer than two others to compare with)."""

    member_id: int
    state: str
    pairs: tuple[Pair, ...]


def group_verdicts(judged: Sequence[Judged], *, threshold: float = 0.5, min_pairs: int = 6,
                   z: float = CONFIDENCE_Z, lean: float = 0.34, min_scored: int = 2) -> dict[int, Verdict]:
    """The guard's verdict on every member of ``judged``.

    Two members are compared both ways (``consensus_of``: each one's replies against the other's lean on the
    same style) and the counts summed: the relation is symmetric, and one side's few samples of a style are
    then not the whole story. They ``disagree`` when the Wilson bound (``wilson_interval``) puts their
    disagreeing share above ``threshold``, ``agree`` when it puts it below, over at least ``min_pairs``
    comparable replies; else ``undecided``.

    A member ``disagrees`` with the group when they disagree with more than half of the others they can be
    compared with: with one adversary among three an honest member disagrees with one of two, and with two
    among five with two of four, while an adversary disagrees with every honest member. A member ``agrees``
    when the others they agree with outnumber those they neither agree with nor are backed against by a
    flag (the others undecided, or disagreeing but not flagged themselves): an honest member of a group
    with a flagged adversary agrees, but where two members disagree and a third agrees with both, as noise
    can make it on a group's first sessions, neither of the two is cleared until more replies tell them
    apart.

    The comparisons of one member's replies against a lean reuse the samples behind that lean, so they are
    not independent and the bound is not an exact 95 %; what it gives is measured by ``manage.py
    bench_consensus`` (clawhub.devtools.consensus_sim: three members, sessions of three replies, a plain and
    a marked style whose share moves from 45 % to 95 % plain, 100 runs of 14 sessions per member). With 10 %
    noise the adversary is flagged by its 5th sample (median; 90 % by the 9th), never cleared first, and no
    honest member of 200 is flagged; with 20 % noise the adversary by its 8th (15th), and 4 of 200 honest
    members are flagged; with two adversaries among five and 10 % noise, 4 of 300 honest members (one
    member's replies against each other's lean one way only, with a fixed 0.6 share, flagged 138 of those
    300).
    """
    one_way = {m: consensus_of(m, judged, lean=lean, min_scored=min_scored)
               for m in sorted({j.member_id for j in judged})}
    counts = {(m, a.other_id): a for m, c in one_way.items() for a in c.against}
    pairs: dict[int, list[Pair]] = {m: [] for m in one_way}
    for m in one_way:
        for o in one_way:
            mine, theirs = counts.get((m, o)), counts.get((o, m))
            if o == m or (mine is None and theirs is None):
                continue
            comparable = (mine.comparable if mine else 0) + (theirs.comparable if theirs else 0)
            disagreeing = (mine.disagreeing if mine else 0) + (theirs.disagreeing if theirs else 0)
            verdict = UNDECIDED
            if comparable >= min_pairs:
                low, high = wilson_interval(disagreeing, comparable, z)
                verdict = DISAGREE if low > threshold else AGREE if high < threshold else UNDECIDED
            pairs[m].append(Pair(o, comparable, disagreeing, verdict, mine.pairs if mine else ()))
    flagged = {m for m, ps in pairs.items()
               if len(ps) >= 2 and 2 * sum(p.verdict == DISAGREE for p in ps) > len(ps)}
    verdicts = {}
    for m, ps in pairs.items():
        agree = sum(p.verdict == AGREE for p in ps)
        unbacked = sum(p.verdict != AGREE and p.other_id not in flagged for p in ps)
        state = (NOT_COMPARED if len(ps) < 2 else DISAGREES if m in flagged else AGREES if agree > unbacked
                 else UNDECIDED)
        verdicts[m] = Verdict(m, state, tuple(ps))
    return verdicts


def consensus_disagreement(verdict: Verdict, *, threshold: float = 0.5, min_pairs: int = 6) -> Flag | None:
    """The flag of a member the guard finds disagreeing (``group_verdicts``), with the pairs as evidence."""
    if verdict.state != DISAGREES:
        return None
    against = [p for p in verdict.pairs if p.verdict == DISAGREE]
    rates = ", ".join(f"{p.disagreeing} of {p.comparable} ({p.rate:.0%})" for p in against)
    return Flag(CONSENSUS, f"rewarded replies against {len(against)} of the {len(verdict.pairs)} other "
                           f"members they can be compared with, on the same reply style: {rates} of the "
                           f"replies compared both ways disagree (above {threshold:.0%} at 95 % confidence, "
                           f"over at least {min_pairs})",
                evidence=tuple(e for p in against for e in p.pairs))


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
