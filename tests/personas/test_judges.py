"""Judge agreement with the simulated users: cases with both kinds of users for every persona, the rule judge
with the benchmark's rules on the phrasings they were written for, and the LLM judge's path (scripted)."""

import httpx

from clawhub.devtools.personas import judges as J
from workers.judge.judges import LLMJudge


def test_cases_hold_pleased_and_displeased_users_for_every_persona_and_pool():
    found = J.cases(count=12)
    assert len(found) == 12 * 3 * 2 and found == J.cases(count=12)
    for persona in {c.persona for c in found}:
        for pool in J.PHRASINGS:
            mine = [c for c in found if (c.persona, c.phrasings) == (persona, pool)]
            assert {c.pleased for c in mine} == {True, False}, (persona, pool)


def test_the_rule_judge_reads_every_training_phrasing_as_the_user_meant_it():
    pairs = J.read_all(J.rule_judge(), J.cases(count=12))
    training = J.agreement(pairs)["training"]
    assert (training["coverage"], training["agreement"]) == (1.0, 1.0)


def test_the_llm_judge_is_measured_on_what_it_decides():
    """A judge model that always answers +1: it decides every case and agrees with the pleased ones only."""
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": "fine \\boxed{1}"}}]})

    judge = LLMJudge(base_url="http://judge.invalid/v1", model="m", votes=1, hint_votes=0,
                     transport=httpx.MockTransport(answer))
    found = J.cases(count=6)
    result = J.agreement(J.read_all(judge, found))["held-out"]
    held = [c for c in found if c.phrasings == "held-out"]
    assert result["decided"] == len(held) and result["agreement"] == round(
        sum(c.pleased for c in held) / len(held), 4)
