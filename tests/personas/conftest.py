"""Helpers for the persona benchmark tests: hand-written replies in the tiny model's two styles, and the rule
judge with the benchmark's rules (what the worker would build from the tenant's JudgeRules)."""

import pytest

from clawhub.devtools.personas import personas as P
from workers.judge.judges import JudgeInput, RuleJudge, RuleSet

# The corpus's two answer styles, for "There are 4 boxes with 9 cookies in each box. ..."
PLAIN = ("Each box holds 9 cookies. Then there are 4 boxes, so we multiply 4 by 9. So 4 times 9 is 36. "
         "There are 36 cookies in all.")
FORMATTED = ("**Solution**\n\n1. Each box holds 9 cookies.\n2. There are 4 boxes, so we multiply 4 by 9.\n"
             "3. 4 times 9 is 36.\n\n**Answer:** There are 36 cookies in all.")
NUMBERED_ONLY = "1. Each box holds 9 cookies.\n2. We multiply 4 by 9.\n3. 4 times 9 is 36."
TOO_SHORT = "There are 36 cookies in all."
BOXES = P.Problem(question="There are 4 boxes with 9 cookies in each box. How many cookies are there in all?",
                  numbers=(4, 9), answer=36, topic="the boxes of cookies")


def judge_next_state(text: str):
    """The rule judge's verdict on a reply whose next state is ``text``, under the benchmark's rules."""
    spec = P.JUDGE_RULES
    rules = RuleSet.build(negative=spec["negative_patterns"], positive=spec["positive_patterns"],
                          hints=spec["hint_templates"], extend_defaults=spec["extend_defaults"])
    return RuleJudge(rules).judge(JudgeInput(
        messages=[{"role": "user", "content": BOXES.question}],
        response={"role": "assistant", "content": "an answer"},
        next_state=[{"role": "user", "content": text}],
    ))


@pytest.fixture
def boxes() -> P.Problem:
    return BOXES
