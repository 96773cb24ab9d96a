"""How well each judge reads the persona benchmark's simulated users: cases of (reply, the user's reaction,
whether the user was pleased), judged by the rule judge with the benchmark's rules and by the LLM judge, on
the training phrasings (which the rules were written against) and on the held-out ones (which nothing was
written against). Agreement counts only turns a judge decided (+1 or -1); coverage is the share it decided.

The replies are written here in the two shapes the real model produces (its long, formatted habit and a short
plain answer, some ending in a question), so that every persona has pleased and displeased users among the
cases. Plain Python, besides the judges themselves (``workers.judge``, no Django).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from clawhub.devtools.personas import personas as P
from workers.judge.judges import Judge, JudgeInput, RuleJudge, RuleSet

PHRASINGS = ("training", "held-out")


@dataclass(frozen=True)
class Case:
    persona: str
    phrasings: str
    question: str
    reply: str
    reaction: str
    pleased: bool


def replies_about(topic: str) -> tuple[str, ...]:
    subject = topic[0].upper() + topic[1:]
    return (
        f"{subject} is a broad subject with several parts worth knowing.\n\n"
        f"1. **What it is**: {topic} can be described in simple terms.\n"
        f"2. **Why it matters**: it affects everyday life in many ways.\n"
        f"3. **How it works**: there are a few steps to it.\n\n"
        f"In summary, {topic} is an important topic to understand.",
        f"{subject} is a topic many people wonder about. It has a long history and many parts. Experts "
        f"study it in detail and keep finding new things. Learning the basics takes a little time. Most "
        f"people find it rewarding once they start.",
        f"{subject} is easiest to grasp through its basic idea and one example.",
        f"{subject} has a simple core idea and a few surprising details. Which part interests you most?",
    )


def cases(*, count: int, seed: int = 0) -> list[Case]:
    """``count`` cases per persona and phrasing pool, over the training topics, in a fixed order."""
    found = []
    for name, persona in P.PERSONAS.items():
        for phrasings in PHRASINGS:
            rng = random.Random(f"{seed}:{name}:{phrasings}")
            user = P.ScriptedUser(persona=persona, rng=rng, phrasings=phrasings)
            for i in range(count):
                prompt = user.next_prompt()
                reply = replies_about(prompt.topic)[i % 4]
                reaction = user.react(reply, prompt, last=rng.random() < 0.3)
                found.append(Case(name, phrasings, prompt.question, reply, reaction.text, reaction.pleased))
    return found


def rule_judge() -> RuleJudge:
    spec = P.JUDGE_RULES
    return RuleJudge(RuleSet.build(negative=spec["negative_patterns"], positive=spec["positive_patterns"],
                                   hints=spec["hint_templates"], extend_defaults=spec["extend_defaults"]))


def read(judge: Judge, case: Case) -> int:
    return judge.judge(JudgeInput(
        messages=[{"role": "user", "content": case.question}],
        response={"role": "assistant", "content": case.reply},
        next_state=[{"role": "user", "content": case.reaction}],
    )).reward


def read_all(judge: Judge, found: list[Case], *, concurrency: int = 8) -> list[tuple[Case, int]]:
    """Every case judged; several at once (an LLM judge's endpoint batches them)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(zip(found, pool.map(lambda case: read(judge, case), found), strict=True))


def agreement(pairs: Iterable[tuple[Case, int]]) -> dict[str, Any]:
    """Per phrasing pool: cases, decided, coverage, agreement (over the decided)."""
    pairs = list(pairs)
    out: dict[str, Any] = {}
    for phrasings in PHRASINGS:
        chosen = [(case, reward) for case, reward in pairs if case.phrasings == phrasings]
        decided = [(case, reward) for case, reward in chosen if reward]
        agree = sum((reward > 0) == case.pleased for case, reward in decided)
        out[phrasings] = {
            "cases": len(chosen), "decided": len(decided),
            "coverage": round(len(decided) / len(chosen), 4) if chosen else None,
            "agreement": round(agree / len(decided), 4) if decided else None,
            "pleased": sum(case.pleased for case, _ in chosen),
        }
    return out
