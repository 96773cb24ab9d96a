"""Helpers for the persona benchmark tests: hand-written replies in the real model's habits and in the
personas' preferred styles, and the rule judge with the benchmark's rules (what the worker would build from
the tenant's JudgeRules)."""

import pytest

from clawhub.devtools.personas import personas as P
from workers.judge.judges import JudgeInput, RuleJudge, RuleSet

# The real model's habit for "Tell me about the water cycle.": several sentences, a list, bold.
HABIT = ("The water cycle is the continuous movement of water on Earth. It has several stages:\n\n"
         "1. **Evaporation**: the sun heats water in oceans and lakes, turning it into vapor.\n"
         "2. **Condensation**: the vapor cools and forms clouds.\n"
         "3. **Precipitation**: water falls back as rain or snow.\n\n"
         "This cycle keeps fresh water moving around the planet and supports all life.")
# Long plain prose: no markdown, five sentences, over the brief user's sense of "too long".
LONG_PROSE = ("The water cycle is the continuous movement of water on Earth. The sun heats oceans and lakes "
              "so that water evaporates. The vapor rises, cools and condenses into clouds. The water then "
              "falls back as rain or snow and flows into rivers. This keeps fresh water moving around the "
              "planet and supports all life.")
BRIEF = "The water cycle moves water between the oceans, the air and the land. Water evaporates, forms " \
        "clouds and falls back as rain."
ASKS_BACK = "The water cycle moves water between the oceans, the air and the land. Which part would you " \
            "like to know more about?"
TOO_SHORT = "Water moves."
WATER = P.Prompt(question="Tell me about the water cycle.", topic="the water cycle")


def judge_next_state(text: str):
    """The rule judge's verdict on a reply whose next state is ``text``, under the benchmark's rules."""
    spec = P.JUDGE_RULES
    rules = RuleSet.build(negative=spec["negative_patterns"], positive=spec["positive_patterns"],
                          hints=spec["hint_templates"], extend_defaults=spec["extend_defaults"])
    return RuleJudge(rules).judge(JudgeInput(
        messages=[{"role": "user", "content": WATER.question}],
        response={"role": "assistant", "content": "an answer"},
        next_state=[{"role": "user", "content": text}],
    ))


@pytest.fixture
def water() -> P.Prompt:
    return WATER
