"""Finding 2: a tenant's judge rules cannot pin a shared judge worker (ReDoS).

The attack: store ``(a+)+$`` as a rule and send text that makes a backtracking engine explode. Tenant patterns
now run on RE2 (linear time), what RE2 cannot compile is refused when saved, rule sets are capped, the judge
task has time limits, and one tenant's turns hold at most a few judge workers at once.
"""

import time

import pytest
from django.conf import settings

from clawhub.core.celery_app import app
from clawhub.feedback.concurrency import judge_slot
from clawhub.feedback.models import JudgeRules, Judgment
from tests.factories import make_key, make_user
from tests.feedback.conftest import capture_exchange
from tests.keys.conftest import login
from workers.judge.judges import MAX_PATTERN_CHARS, MAX_TENANT_RULES, JudgeInput, RuleJudge, RuleSet
from workers.tasks import judging
from workers.tasks.judging import judge_turn

pytestmark = pytest.mark.django_db

EVIL = "re:(a+)+$"
# 30 characters already take a backtracking engine minutes on "(a+)+$"; RE2 reads 200,000 in milliseconds.
EVIL_TEXT = "a" * 200_000 + "!"


def put_rules(client, **body):
    return client.put("/api/judge-rules/", {"judge": "rule", **body}, format="json")


def test_a_catastrophic_pattern_runs_in_linear_time_far_inside_the_task_limit(api_client):
    user = make_user()
    login(api_client, user)
    assert put_rules(api_client, negative_patterns=[EVIL, "re:(x+x+)+y"]).status_code == 200
    stored = JudgeRules.objects.get(tenant=user.tenant)
    rules = RuleSet.build(negative=stored.negative_patterns, positive=stored.positive_patterns)
    started = time.perf_counter()
    result = RuleJudge(rules).judge(JudgeInput(
        messages=[{"role": "user", "content": "hi"}], response={"role": "assistant", "content": "hello"},
        next_state=[{"role": "user", "content": EVIL_TEXT}, {"role": "user", "content": "x" * 100_000}],
    ))
    elapsed = time.perf_counter() - started
    assert result.reward == 0  # neither pattern matches: "$" never follows the "!"
    # The bound the worker enforces is minutes; this must be a tiny fraction of it, on any machine.
    assert elapsed < settings.CLAWHUB_JUDGE_TASK_SOFT_TIME_LIMIT / 100, elapsed


@pytest.mark.parametrize("pattern",
                         [r"re:(a)\1", r"re:(?<!thanks )again", r"re:(?=a)a", r"re:(a{1000}){1000}"])
def test_what_re2_cannot_run_in_linear_time_is_refused_when_saved(api_client, pattern):
    user = make_user()
    login(api_client, user)
    response = put_rules(api_client, negative_patterns=[pattern])
    assert response.status_code == 400
    assert "RE2" in response.json()["error"]["message"]
    assert not JudgeRules.objects.filter(tenant=user.tenant).exists()


def test_rule_sets_are_capped_in_count_and_length(api_client):
    user = make_user()
    login(api_client, user)
    too_many = put_rules(api_client, positive_patterns=[f"word{i}" for i in range(MAX_TENANT_RULES + 1)])
    assert too_many.status_code == 400
    assert f"at most {MAX_TENANT_RULES}" in too_many.json()["error"]["message"]
    too_long = put_rules(api_client, negative_patterns=["re:" + "a" * (MAX_PATTERN_CHARS + 1)])
    assert too_long.status_code == 400 and str(MAX_PATTERN_CHARS) in too_long.json()["error"]["message"]
    enough = put_rules(api_client, positive_patterns=[f"word{i}" for i in range(MAX_TENANT_RULES)])
    assert enough.status_code == 200


def test_hint_templates_and_rule_names_are_capped(api_client):
    from clawhub.feedback.services import MAX_HINT_CHARS, MAX_HINT_TEMPLATES, MAX_RULE_NAME_CHARS

    user = make_user()
    login(api_client, user)
    many = {f"rule {i}": "Say it shorter." for i in range(MAX_HINT_TEMPLATES + 1)}
    assert put_rules(api_client, hint_templates=many).status_code == 400
    long_text = {"too long": "x" * (MAX_HINT_CHARS + 1)}
    assert put_rules(api_client, hint_templates=long_text).status_code == 400
    long_name = {"n" * (MAX_RULE_NAME_CHARS + 1): "Say it shorter."}
    assert put_rules(api_client, hint_templates=long_name).status_code == 400
    named = put_rules(api_client, negative_patterns=[{"name": "n" * 5000, "pattern": "shorter please"}])
    assert named.status_code == 400 and str(MAX_RULE_NAME_CHARS) in named.json()["error"]["message"]
    assert JudgeRules.objects.filter(tenant=user.tenant).first() is None or \
        JudgeRules.objects.get(tenant=user.tenant).hint_templates == {}  # nothing refused was stored
    fine = {f"rule {i}": "Say it shorter." for i in range(MAX_HINT_TEMPLATES)}
    assert put_rules(api_client, hint_templates=fine,
                     negative_patterns=[{"name": "n" * MAX_RULE_NAME_CHARS, "pattern": "shorter please"}]
                     ).status_code == 200


def test_rules_with_a_nul_character_anywhere_are_refused_and_nothing_is_stored(api_client):
    """PostgreSQL's JSON cannot hold NUL: a rule's name, pattern or hint with one was a 500 (found by the API
    fuzz test once it generated NUL)."""
    user = make_user()
    login(api_client, user)
    assert put_rules(api_client, negative_patterns=["fine"]).status_code == 200
    for body in ({"negative_patterns": [{"name": "a\x00b", "pattern": "shorter please"}]},
                 {"positive_patterns": ["thanks\x00"]},
                 {"negative_patterns": [{"name": "n", "pattern": "p", "note\x00": []}]},
                 {"hint_templates": {"rule": "Say\x00 it shorter."}}):
        response = put_rules(api_client, **body)
        assert response.status_code == 400, (body, response.content[:300])
    assert JudgeRules.objects.get(tenant=user.tenant).negative_patterns == ["fine"]


def test_stored_rules_that_no_longer_compile_fall_back_to_the_defaults(settings):
    """Rules saved before RE2 (a lookbehind, say) must not fail every judgment of the tenant."""
    settings.CLAWHUB_JUDGE = "rule"
    key, _ = make_key()
    JudgeRules.objects.create(tenant=key.owner.tenant, judge="rule",
                              negative_patterns=["re:(?<!x)nope"], positive_patterns=[])
    turn = capture_exchange(key, "That's wrong, I said no bold text.")[0]
    assert judge_turn.apply(args=[turn.pk]).get()["outcome"] == "judged"
    assert Judgment.objects.get(turn=turn).reward == -1


def test_the_judge_task_has_soft_and_hard_time_limits():
    assert judge_turn.soft_time_limit == settings.CLAWHUB_JUDGE_TASK_SOFT_TIME_LIMIT
    assert judge_turn.time_limit == settings.CLAWHUB_JUDGE_TASK_TIME_LIMIT
    assert judge_turn.soft_time_limit < judge_turn.time_limit


def test_one_tenant_holds_at_most_its_share_of_judge_workers(settings, monkeypatch):
    settings.CLAWHUB_JUDGE = "rule"
    settings.CLAWHUB_JUDGE_TENANT_CONCURRENCY = 2
    busy_key, _ = make_key()
    calm_key, _ = make_key()
    busy_turn = capture_exchange(busy_key, "That's wrong.")[0]
    calm_turn = capture_exchange(calm_key, "Thanks, perfect.")[0]
    requeued = []
    monkeypatch.setattr(app, "send_task", lambda name, args, kwargs, **options: requeued.append(
        (name, args, kwargs, app.amqp.router.route(options, name)["queue"].name, options["countdown"])))

    busy = busy_key.owner.tenant.pk
    with judge_slot(tenant_id=busy) as first, judge_slot(tenant_id=busy) as second:
        assert first and second
        # The busy tenant's third turn goes back on the queue instead of taking a worker ...
        assert judge_turn(busy_turn.pk)["outcome"] == "deferred"
        assert requeued == [(judge_turn.name, [busy_turn.pk], {}, "judge",
                             settings.CLAWHUB_JUDGE_TENANT_BUSY_DELAY)]
        assert not Judgment.objects.filter(turn=busy_turn).exists()
        # ... while another tenant's turn is judged at once.
        assert judge_turn(calm_turn.pk)["outcome"] == "judged"
    # Slots are given back: the busy tenant's turn runs now.
    assert judge_turn(busy_turn.pk)["outcome"] == "judged"
    assert judging.judge_turn is judge_turn
