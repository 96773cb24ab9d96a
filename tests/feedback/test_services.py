"""feedback.services: storing judgments idempotently, and judge rules with permissions and audit."""

import pytest

from clawhub.accounts.models import AuditLog
from clawhub.core.exceptions import PermissionDenied, ValidationFailed
from clawhub.feedback.models import JudgeRules, Judgment
from clawhub.feedback.services import judge_rules_set, judgment_store, judgment_store_failure
from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_user

pytestmark = pytest.mark.django_db


def store(turn, reward=1, **fields):
    values = dict(turn=turn, reward=reward, votes=[reward] * 3, hints=[], judge="rule", prompt_version="v1",
                  raw_outputs={"prm": ["\\boxed{1}"] * 3, "hint": []})
    values.update(fields)
    return judgment_store(**values)


def test_store_is_idempotent(judged_turn):
    first, stored = store(judged_turn, reward=-1)
    again, stored_again = store(judged_turn, reward=1)
    assert (stored, stored_again) == (True, False)
    assert again.pk == first.pk and Judgment.objects.get().reward == -1


def test_failure_does_not_overwrite_success_but_success_replaces_failure(judged_turn):
    failed = judgment_store_failure(turn=judged_turn, judge="llm", prompt_version="v1", error="503",
                                    attempts=4)
    assert failed.status == Judgment.Status.FAILED
    judgment, stored = store(judged_turn, reward=1, attempts=5)
    assert stored and judgment.pk == failed.pk and judgment.status == Judgment.Status.OK
    assert judgment_store_failure(turn=judged_turn, judge="llm", prompt_version="v1", error="x",
                                  attempts=1).status == Judgment.Status.OK


def test_reward_out_of_range_is_refused(judged_turn):
    with pytest.raises(ValidationFailed):
        store(judged_turn, reward=2)


def test_votes_split(judged_turn):
    judgment, _ = store(judged_turn, votes=[1, -1, 1])
    assert judgment.votes_split
    judgment.votes = [1, None, 1]
    assert not judgment.votes_split


def test_user_sets_personal_rules_and_it_is_audited():
    user = make_user()
    rules = judge_rules_set(tenant=user.tenant, actor=user, negative_patterns=["no bold", "re:^meh"],
                            hint_templates={"no bold": "Write plain sentences."}, judge="rule")
    assert (rules.negative_patterns, rules.judge, rules.updated_by) == (["no bold", "re:^meh"], "rule", user)
    log = AuditLog.objects.get(action="judge_rules.update")
    assert log.actor == user and log.data["after"]["negative_patterns"] == ["no bold", "re:^meh"]
    # Fields left out keep their value.
    rules = judge_rules_set(tenant=user.tenant, actor=user, extend_defaults=False)
    assert rules.negative_patterns == ["no bold", "re:^meh"] and rules.extend_defaults is False


@pytest.mark.parametrize(
    ("role", "allowed"),
    [(Role.OWNER, True), (Role.ADMIN, True), (Role.MEMBER, False), (Role.VIEWER, False), (None, False)],
)
def test_who_may_set_group_rules(role, allowed):
    owner = make_user()
    group = make_group(owner)
    actor = owner if role == Role.OWNER else make_user()
    if role not in (Role.OWNER, None):
        add_member(group, actor, role)
    if allowed:
        judge_rules_set(tenant=group.tenant, actor=actor, positive_patterns=["ship it"])
        assert JudgeRules.objects.get(tenant=group.tenant).positive_patterns == ["ship it"]
    else:
        with pytest.raises(PermissionDenied):
            judge_rules_set(tenant=group.tenant, actor=actor, positive_patterns=["ship it"])
        assert not JudgeRules.objects.exists()


def test_staff_may_set_anyones_rules_but_others_may_not():
    user = make_user()
    with pytest.raises(PermissionDenied):
        judge_rules_set(tenant=user.tenant, actor=make_user(), negative_patterns=["x"])
    judge_rules_set(tenant=user.tenant, actor=make_user(is_staff=True), negative_patterns=["x"])


@pytest.mark.parametrize(
    "fields",
    [{"negative_patterns": ["re:(unclosed"]}, {"positive_patterns": "not a list"}, {"judge": "oracle"},
     {"hint_templates": ["x"]}],
)
def test_invalid_rules_are_refused_and_nothing_changes(fields):
    user = make_user()
    with pytest.raises(ValidationFailed):
        judge_rules_set(tenant=user.tenant, actor=user, **fields)
    assert not JudgeRules.objects.exists()
