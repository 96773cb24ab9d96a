"""The judge (Django-free): scores an assistant turn by its next state and extracts hindsight hints.

Only plain data crosses this boundary; ``workers.tasks.judging`` loads rows and stores results.
"""

from typing import TYPE_CHECKING, Any

from workers.judge.parsing import boxed_score, extract_hint, majority_vote
from workers.judge.prompts import PROMPT_VERSION

if TYPE_CHECKING:
    from workers.judge.judges import (
        Judge,
        JudgeError,
        JudgeInput,
        JudgeResult,
        LLMJudge,
        RuleJudge,
        RuleSet,
        TransientJudgeError,
        Vote,
    )

# The judges module (httpx, re2, a thread pool) loads on first use of one of these names: every Django process
# reads the judges' names (workers.judge.registry, for model choices and settings), and only the code that
# runs a judge or checks a tenant's rules needs the module itself.
_FROM_JUDGES = frozenset({"Judge", "JudgeError", "JudgeInput", "JudgeResult", "LLMJudge", "RuleJudge",
                          "RuleSet", "TransientJudgeError", "Vote"})


def __getattr__(name: str) -> Any:
    if name in _FROM_JUDGES:
        from workers.judge import judges

        value = getattr(judges, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PROMPT_VERSION",
    "Judge",
    "JudgeError",
    "JudgeInput",
    "JudgeResult",
    "LLMJudge",
    "RuleJudge",
    "RuleSet",
    "TransientJudgeError",
    "Vote",
    "boxed_score",
    "extract_hint",
    "majority_vote",
]
