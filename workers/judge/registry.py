"""Judges by name, each registered once as ``"module:Class"``. The tenant's choice (JudgeRules.judge),
CLAWHUB_JUDGE's validation and the judge task's factory all read this table, so a new judge is a ``Judge``
subclass with ``name`` and ``from_config`` plus one line here (and a choices-only migration of
clawhub/feedback, which Django asks for whenever choices change; names are at most 8 characters, the width
of JudgeRules.judge)."""

import importlib

from workers.judge.judges import Judge

JUDGES: dict[str, str] = {
    "rule": "workers.judge.judges:RuleJudge",
    "llm": "workers.judge.judges:LLMJudge",
}


def judge_names() -> list[str]:
    return list(JUDGES)


def judge_class(name: str) -> type[Judge]:
    """The class registered under ``name``; a clear error for a name that is not registered."""
    try:
        module, _, attr = JUDGES[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown judge {name!r}: one of {', '.join(JUDGES)}") from None
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Judge)) or cls.name != name:
        raise TypeError(f"{JUDGES[name]} is not the Judge named {name!r}")
    return cls
