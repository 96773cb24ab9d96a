"""Judges by name, each registered once as ``"module:Class"``. The tenant's choice (JudgeRules.judge),
CLAWHUB_JUDGE's validation and the judge task's factory all read this table, so a new judge is a ``Judge``
subclass with ``name`` and ``from_config`` plus one line here (and a choices-only migration of
clawhub/feedback, which Django asks for whenever choices change; names are at most 8 characters, the width
of JudgeRules.judge).

Classes are imported on use: naming a judge imports no judge (Django's model choices and settings read the
names in every process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.registry import registered_class

if TYPE_CHECKING:
    from workers.judge.judges import Judge

JUDGES: dict[str, str] = {
    "rule": "workers.judge.judges:RuleJudge",
    "llm": "workers.judge.judges:LLMJudge",
}


def judge_names() -> list[str]:
    return list(JUDGES)


def judge_class(name: str) -> type[Judge]:
    """The class registered under ``name``; a clear error for a name that is not registered."""
    from workers.judge.judges import Judge

    return registered_class(JUDGES, name, base=Judge, kind="judge")
