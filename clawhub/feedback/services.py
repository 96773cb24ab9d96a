"""Writes for judgments and judge rules.

Judgments are the system's own bookkeeping (written by the judge task), so they leave no audit rows; a change
to a tenant's judge rules is a person's decision and is audited.
"""

from typing import Any

from django.db import transaction

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record_for_tenant
from clawhub.conversations.models import Turn
from clawhub.core.exceptions import PermissionDenied, ValidationFailed
from clawhub.feedback.models import JudgeRules, Judgment
from clawhub.feedback.selectors import can_manage_judge_rules
from clawhub.tenants.models import Tenant
from workers.judge.judges import RuleSet

_VALID_REWARDS = (-1, 0, 1)


def _lock_turn(turn: Turn) -> Judgment | None:
    # Two deliveries of the same task may store at the same moment; the turn's row lock puts them one after
    # the other, so the second sees the first's judgment instead of failing on the one-to-one constraint.
    Turn.objects.select_for_update().filter(pk=turn.pk).values_list("pk").first()
    return Judgment.objects.filter(turn=turn).first()


def judgment_store(
    *,
    turn: Turn,
    reward: int,
    votes: list[int | None],
    hints: list[str],
    judge: str,
    prompt_version: str,
    raw_outputs: dict[str, Any],
    attempts: int = 1,
) -> tuple[Judgment, bool]:
    """Stores the judge's verdict on ``turn``. Idempotent: when the turn already has a successful judgment,
    that one is returned untouched and the second value is False. A failed judgment is replaced."""
    if reward not in _VALID_REWARDS:
        raise ValidationFailed("A reward is -1, 0 or 1.", reward=reward)
    with transaction.atomic():
        judgment = _lock_turn(turn)
        if judgment is not None and judgment.status == Judgment.Status.OK:
            return judgment, False
        judgment = judgment or Judgment(turn=turn, tenant_id=turn.tenant_id)
        judgment.reward = reward
        judgment.votes = list(votes)
        judgment.hints = list(hints)
        judgment.judge = judge
        judgment.prompt_version = prompt_version
        judgment.raw_outputs = raw_outputs
        judgment.status = Judgment.Status.OK
        judgment.error = ""
        judgment.attempts = attempts
        judgment.save()
    return judgment, True


def judgment_store_failure(
    *, turn: Turn, judge: str, prompt_version: str, error: str, attempts: int
) -> Judgment:
    """Records that the judge could not score ``turn`` (so that it shows, and can be judged again later).
    Never overwrites a successful judgment."""
    with transaction.atomic():
        judgment = _lock_turn(turn)
        if judgment is not None and judgment.status == Judgment.Status.OK:
            return judgment
        judgment = judgment or Judgment(turn=turn, tenant_id=turn.tenant_id)
        judgment.reward = 0
        judgment.judge = judge
        judgment.prompt_version = prompt_version
        judgment.status = Judgment.Status.FAILED
        judgment.error = error[:5000]
        judgment.attempts = attempts
        judgment.save()
    return judgment


def _pattern_list(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise ValidationFailed("A list of rules was expected.", field=field)
    return value


def judge_rules_set(
    *,
    tenant: Tenant,
    actor: User,
    negative_patterns: list | None = None,
    positive_patterns: list | None = None,
    hint_templates: dict[str, str] | None = None,
    extend_defaults: bool | None = None,
    judge: str | None = None,
    ip: str | None = None,
) -> JudgeRules:
    """Sets a tenant's judge rules (arguments left None keep their current value). The user of a personal
    tenant, a group's owner and admins, and site staff may."""
    if not can_manage_judge_rules(tenant=tenant, user=actor):
        raise PermissionDenied("Only the owner or an admin may change the judge rules.")
    with transaction.atomic():
        rules, _ = JudgeRules.objects.select_for_update().get_or_create(tenant=tenant)
        before = _rules_dict(rules)
        if negative_patterns is not None:
            rules.negative_patterns = _pattern_list(negative_patterns, "negative_patterns")
        if positive_patterns is not None:
            rules.positive_patterns = _pattern_list(positive_patterns, "positive_patterns")
        if hint_templates is not None:
            if not isinstance(hint_templates, dict):
                raise ValidationFailed("Hint templates map a rule name to a text.", field="hint_templates")
            rules.hint_templates = hint_templates
        if extend_defaults is not None:
            rules.extend_defaults = extend_defaults
        if judge is not None:
            if judge not in JudgeRules.Backend.values:
                raise ValidationFailed(f"Unknown judge {judge!r}.", field="judge",
                                       choices=list(JudgeRules.Backend.values))
            rules.judge = judge
        try:
            # The rule judge compiles the same way in the worker: a rule that does not compile here never
            # reaches it.
            RuleSet.build(negative=rules.negative_patterns, positive=rules.positive_patterns,
                          hints=rules.hint_templates, extend_defaults=rules.extend_defaults)
        except ValueError as exc:
            raise ValidationFailed(str(exc)) from exc
        rules.updated_by = actor
        rules.save()
        audit_record_for_tenant(actor=actor, action="judge_rules.update", target=rules, tenant=tenant, ip=ip,
                                before=before, after=_rules_dict(rules))
    return rules


def _rules_dict(rules: JudgeRules) -> dict[str, Any]:
    return {
        "judge": rules.judge,
        "negative_patterns": rules.negative_patterns,
        "positive_patterns": rules.positive_patterns,
        "hint_templates": rules.hint_templates,
        "extend_defaults": rules.extend_defaults,
    }
