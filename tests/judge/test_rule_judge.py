import pytest

from workers.judge import JudgeInput, RuleJudge, RuleSet
from workers.judge.judges import compile_rule
from workers.judge.parsing import boxed_score, majority_vote


def turn(*next_state: dict, messages: list | None = None) -> JudgeInput:
    return JudgeInput(
        messages=messages or [{"role": "user", "content": "Explain recursion."}],
        response={"role": "assistant", "content": "**Recursion** is when a function calls itself."},
        next_state=list(next_state) or None,
    )


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tool(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "call_1", "content": text}


@pytest.mark.parametrize(
    "text",
    ["Thanks, that helps!", "thank you", "Perfect. Next question: what is a closure?", "OK, moving on."],
)
def test_default_positive(text):
    assert RuleJudge().judge(turn(user(text))).reward == 1


@pytest.mark.parametrize(
    "text",
    ["Please don't use markdown.", "That's wrong.", "thats wrong", "That’s wrong", "Redo it.",
     "Try again.", "I said three items.", "This is not what I asked for", "you forgot the tests"],
)
def test_default_negative(text):
    assert RuleJudge().judge(turn(user(text))).reward == -1


def test_change_request_with_thanks_is_negative():
    assert RuleJudge().judge(turn(user("Thanks, but that's wrong: I said Python 3."))).reward == -1


def test_thanks_again_is_not_a_redo():
    assert RuleJudge().judge(turn(user("Thanks again!"))).reward == 1


def test_unclear_next_state_is_zero():
    result = RuleJudge().judge(turn(user("What time is it in Tokyo?")))
    assert result.reward == 0
    assert result.hints == []


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("Traceback (most recent call last):\n  File 'x.py'", -1),
        ("Error: file not found", -1),
        ("command exited with code 2", -1),
        ('{"stdout": "", "returncode": 1}', -1),
        ("3 files written, no errors", 1),
        ("exit code 0", 1),
        ("total 12\ndrwxr-xr-x 2 root root 4096 .", 1),
    ],
)
def test_tool_results(text, reward):
    assert RuleJudge().judge(turn(tool(text))).reward == reward


def test_votes_look_like_the_llm_judges():
    result = RuleJudge(votes=3).judge(turn(user("That's wrong.")))
    assert [v.score for v in result.votes] == [-1, -1, -1]
    # The raw text parses to the same verdict, so anything reading raw outputs sees one format.
    assert all(boxed_score(v.raw) == -1 for v in result.votes)
    assert majority_vote(v.score for v in result.votes) == result.reward
    assert result.judge == "rule"
    assert result.prompt_version.startswith("rules-")
    assert result.raw_outputs["prm"] == [v.raw for v in result.votes]


def test_closed_turn_without_next_state_scores_zero_without_votes():
    result = RuleJudge().judge(turn())
    assert (result.reward, result.votes, result.hints) == (0, [], [])


def test_side_turn_is_refused():
    inp = turn(user("thanks"))
    inp.turn_type = "side"
    with pytest.raises(ValueError):
        RuleJudge().judge(inp)


def test_tenant_rules_and_hint_template_keyed_by_rule():
    rules = RuleSet.build(
        negative=["no bold", {"name": "exclamations", "pattern": r"!{3,}"}],
        positive=["re:\\bship it\\b"],
        hints={"no bold": "The user does not want **bold** text; write plain sentences."},
    )
    judge = RuleJudge(rules)
    result = judge.judge(turn(user("No bold please, just text.")))
    assert result.reward == -1
    assert result.hints == ["The user does not want **bold** text; write plain sentences."]
    assert [v.score for v in result.hint_votes] == [1]
    assert judge.judge(turn(user("Stop that!!!"))).reward == -1
    assert judge.judge(turn(user("Good, ship it."))).reward == 1
    # The defaults still apply next to the tenant's own rules.
    assert judge.judge(turn(user("thanks!"))).reward == 1


def test_default_hint_quotes_the_feedback():
    result = RuleJudge().judge(turn(user("Not what I asked: I wanted a one-line answer.")))
    assert result.reward == -1
    assert any("I wanted a one-line answer." in h for h in result.hints)


def test_rules_without_defaults_replace_them():
    judge = RuleJudge(RuleSet.build(negative=["nope"], extend_defaults=False))
    assert judge.judge(turn(user("That's wrong."))).reward == 0
    assert judge.judge(turn(user("Nope."))).reward == -1


def test_fingerprint_changes_with_the_rules():
    assert RuleJudge().prompt_version == RuleJudge(RuleSet.build()).prompt_version
    assert RuleJudge().prompt_version != RuleJudge(RuleSet.build(negative=["meh"])).prompt_version


@pytest.mark.parametrize("spec", ["re:(unclosed", {"pattern": "   "}, 42, {"name": "x"}])
def test_invalid_rules_are_refused_with_a_reason(spec):
    with pytest.raises(ValueError):
        compile_rule(spec)
