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
from workers.judge.judges import MAX_TENANT_RULES, RuleSet

_VALID_REWARDS = (-1, 0, 1)


def turn_lock(*, turn: Turn) -> Judgment | None:
    """Locks ``turn``'s row and returns its judgment, if any. Two deliveries of the same task may store at the
    same moment; the lock puts them (and a person's rating of the turn) one after the other, so the second
    sees the first's judgment instead of failing on the one-to-one constraint."""
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
    that one is returned untouched and the second value is False. A failed judgment is replaced. Samples are
    review's: the judge task hands a stored judgment on (``clawhub.review.services.sample_follow_judge``,
    then ``sample_create_for_judgment``) in the same transaction."""
    if reward not in _VALID_REWARDS:
        raise ValidationFailed("A reward is -1, 0 or 1.", reward=reward)
    with transaction.atomic():
        judgment = turn_lock(turn=turn)
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
        judgment = turn_lock(turn=turn)
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


# What a tenant may write (checked here, where rules are set: rules stored before these caps still judge).
MAX_RULE_NAME_CHARS = 200
MAX_HINT_TEMPLATES = 2 * MAX_TENANT_RULES  # one per rule, negative and positive
MAX_HINT_CHARS = 1000


def _no_nul(value: Any, field: str) -> None:
    """Refuses a NUL character anywhere in ``value`` (its texts, and an object's names): PostgreSQL's JSON
    cannot store one."""
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, dict):
        texts = list(value)
        for item in value.values():
            _no_nul(item, field)
    elif isinstance(value, list):
        texts = []
        for item in value:
            _no_nul(item, field)
    else:
        return
    if any(isinstance(text, str) and "\x00" in text for text in texts):
        raise ValidationFailed("Rules may not contain NUL characters.", field=field)


def _pattern_list(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise ValidationFailed("A list of rules was expected.", field=field)
    _no_nul(value, field)
    for rule in value:
        if isinstance(rule, dict):
            _rule_object(rule, field)
    return value


# A rule written as an object: its fields and their JSON types (the judge would read "regex": 0 as false and
# a name of 0 as "0", and ignore any other field).
_RULE_FIELDS = {"name": str, "pattern": str, "regex": bool}


def _rule_object(rule: dict, field: str) -> None:
    unknown = sorted(set(rule) - set(_RULE_FIELDS))
    if unknown:
        raise ValidationFailed(f"A rule has only name, pattern and regex, not {', '.join(unknown)}.",
                               field=field)
    for name, kind in _RULE_FIELDS.items():
        if name in rule and not isinstance(rule[name], kind):
            raise ValidationFailed(f"A rule's {name} must be a {'boolean' if kind is bool else 'text'}.",
                                   field=field)
    if len(rule.get("name", "")) > MAX_RULE_NAME_CHARS:
        raise ValidationFailed(f"A rule's name has at most {MAX_RULE_NAME_CHARS} characters.", field=field)


def _hint_templates(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValidationFailed("Hint templates map a rule name to a text.", field="hint_templates")
    if len(value) > MAX_HINT_TEMPLATES:
        raise ValidationFailed(f"At most {MAX_HINT_TEMPLATES} hint templates.", field="hint_templates")
    _no_nul(value, "hint_templates")
    for name, text in value.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise ValidationFailed("Hint templates map a rule name to a text.", field="hint_templates")
        if len(name) > MAX_RULE_NAME_CHARS or len(text) > MAX_HINT_CHARS:
            raise ValidationFailed(f"A hint template names a rule in at most {MAX_RULE_NAME_CHARS} "
                                   f"characters and says its hint in at most {MAX_HINT_CHARS}.",
                                   field="hint_templates")
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
            rules.hint_templates = _hint_templates(hint_templates)
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
