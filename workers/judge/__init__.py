"""The judge (Django-free): scores an assistant turn by its next state and extracts hindsight hints.

Only plain data crosses this boundary; ``workers.tasks.judging`` loads rows and stores results.
"""

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
from workers.judge.parsing import boxed_score, extract_hint, majority_vote
from workers.judge.prompts import PROMPT_VERSION

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
