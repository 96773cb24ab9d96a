"""Writes for judgments and judge rules.

Judgments are the system's own bookkeeping (written by the judge task), so they leave no audit rows; a change
to a tenant's judge rules is a person's decision and is audited.
"""

from typing import Any

from django.db import transaction
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record_for_tenant
from clawhub.conversations.models import Turn
from clawhub.core.exceptions import Conflict, PermissionDenied, ValidationFailed
from clawhub.feedback.models import ExplicitFeedback, JudgeRules, Judgment
from clawhub.feedback.selectors import can_manage_judge_rules
from clawhub.tenants.models import Tenant
from workers.judge.judges import MAX_TENANT_RULES, RuleSet

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
    that one is returned untouched and the second value is False. A failed judgment is replaced. Samples are
    review's: the judge task hands a stored judgment on (``sample_follow_judge``, then review's
    ``sample_create_for_judgment``) in the same transaction."""
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


def sample_follow_judge(*, judgment_id: int) -> None:
    """A person rated the turn before the judge ran, so its sample exists already: the judge's reward and
    hints, just stored, now count wherever the person's rating leaves them open. Nothing to do otherwise."""
    from clawhub.review.models import Sample

    sample = Sample.objects.select_for_update().filter(judgment_id=judgment_id).first()
    if sample is None or sample.claimed:
        return
    feedback = ExplicitFeedback.objects.filter(turn_id=sample.turn_id).first()
    if feedback is not None:
        judgment = Judgment.objects.get(pk=judgment_id)
        _sample_follow_feedback(sample=sample, judgment=judgment, feedback=feedback)


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


# --- explicit feedback --------------------------------------------------------------------------------------

COMMENT_MAX = 4000
DEMONSTRATION_MAX = 32000
_UNSET: Any = object()


def _clean_feedback(*, thumb: Any, score: Any, comment: Any, demonstration: Any) -> dict[str, Any]:
    """The fields the caller gave, checked; ``_UNSET`` ones are left out (they keep their stored value)."""
    fields: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    if thumb is not _UNSET:
        if thumb in (None, ""):
            fields["thumb"] = ""
        elif thumb in ExplicitFeedback.Thumb.values:
            fields["thumb"] = thumb
        else:
            errors["thumb"] = ['"up", "down" or null.']
    if score is not _UNSET:
        if score is None:
            fields["score"] = None
        elif isinstance(score, int) and not isinstance(score, bool) and 1 <= score <= 5:
            fields["score"] = score
        else:
            errors["score"] = ["An integer from 1 to 5, or null."]
    for name, value, limit in (("comment", comment, COMMENT_MAX),
                               ("demonstration", demonstration, DEMONSTRATION_MAX)):
        if value is _UNSET:
            continue
        if value is None:
            value = ""
        if not isinstance(value, str):
            errors[name] = ["A string."]
        elif len(value) > limit:
            errors[name] = [f"At most {limit} characters."]
        else:
            fields[name] = value.strip()
    if errors:
        raise ValidationFailed("The feedback is not valid.", fields=errors)
    return fields


def _sample_follow_feedback(*, sample, judgment: Judgment, feedback: ExplicitFeedback) -> None:
    """Brings an existing, unclaimed sample in line with the judge's verdict and the person's rating. An
    approved sample is decided again by the tenant's policy (a rating against the judge waits for a human);
    a pending one keeps waiting; a rejected or deleted one keeps its state, with the new reward on record."""
    from clawhub.review import flags as guards
    from clawhub.review.models import Sample
    from clawhub.review.selectors import review_policy_for, sample_signal

    signal = sample_signal(judgment=judgment, explicit=feedback)
    flags = [f for f in sample.flags or [] if f.get("code") != guards.EXPLICIT_OVERRIDES_JUDGE]
    flags += [f.as_json() for f in signal.flags]
    state = sample.state
    if state == Sample.State.APPROVED:
        state = guards.initial_state(review_policy_for(tenant=sample.tenant).mode, flags)
    if (sample.reward, sample.has_hint, sample.flags, sample.state) == (signal.reward, bool(signal.hints),
                                                                         flags, state):
        return
    if state != sample.state:
        sample.decided_by, sample.decided_at, sample.reason = None, None, ""
    sample.reward, sample.has_hint = signal.reward, bool(signal.hints)
    sample.flags, sample.state = flags, state
    sample.save(update_fields=["reward", "has_hint", "flags", "state", "decided_by", "decided_at", "reason"])


def feedback_submit(
    *,
    actor: User,
    turn: Turn,
    source: str,
    key_id: int | None = None,
    thumb: Any = _UNSET,
    score: Any = _UNSET,
    comment: Any = _UNSET,
    demonstration: Any = _UNSET,
    ip: str | None = None,
) -> tuple[ExplicitFeedback, bool]:
    """Records what ``actor`` says about ``turn`` (checked by ``feedback.selectors.turn_for_rating``) and
    hands it to review: the turn's sample is created, or updated, from it. Rating a turn again updates its
    feedback (fields left out keep their value; null clears one). Returns the feedback and whether it was
    new. A turn that has gone to training can no longer be rated differently (its run trains what it
    claimed)."""
    from clawhub.review.models import Sample
    from clawhub.review.services import sample_create_for_judgment

    if turn.turn_type == Turn.Type.SIDE:  # a playground turn may be rated: that is what trains on it
        raise ValidationFailed("Side turns (heartbeats, memory flushes) are never trained on; rate a main "
                               "turn.", code="side_turn")
    if source not in ExplicitFeedback.Source.values:
        raise ValidationFailed(f"Unknown source {source!r}.", field="source")
    fields = _clean_feedback(thumb=thumb, score=score, comment=comment, demonstration=demonstration)
    now = timezone.now()
    with transaction.atomic():
        judgment = _lock_turn(turn)
        sample = Sample.objects.select_for_update().filter(turn=turn).first()
        if sample is not None and sample.claimed:
            raise Conflict(f"This turn has already gone to training (run {sample.training_run_id}); its "
                           "feedback can no longer change.", code="sample_trained", sample=sample.pk)
        feedback = ExplicitFeedback.objects.filter(turn=turn).first()
        created = feedback is None
        feedback = feedback or ExplicitFeedback(turn=turn, tenant_id=turn.tenant_id, created_at=now)
        before = _feedback_dict(feedback) if not created else None
        for name, value in fields.items():
            setattr(feedback, name, value)
        if not (feedback.thumb or feedback.score is not None or feedback.comment or feedback.demonstration):
            raise ValidationFailed("Say something: a thumb, a score, a comment or a corrected reply.",
                                   code="empty_feedback")
        own = {feedback.thumb == ExplicitFeedback.Thumb.UP if feedback.thumb else None,
               None if feedback.score in (None, 3) else feedback.score > 3} - {None}
        if len(own) > 1:
            raise ValidationFailed("The thumb and the score disagree.", code="contradictory_feedback",
                                   fields={"score": [f"Thumb {feedback.thumb} with score {feedback.score}."]})
        feedback.rated_by, feedback.key_id, feedback.source, feedback.updated_at = actor, key_id, source, now
        feedback.save()
        if judgment is None:
            judgment = Judgment.objects.create(turn=turn, tenant_id=turn.tenant_id, judge="",
                                               status=Judgment.Status.AWAITING)
        if sample is None:
            sample_create_for_judgment(judgment_id=judgment.pk)
        else:
            _sample_follow_feedback(sample=sample, judgment=judgment, feedback=feedback)
        audit_record_for_tenant(actor=actor, action="feedback.rate", target=feedback, tenant=turn.tenant,
                                ip=ip, before=before, after=_feedback_dict(feedback), source=source,
                                turn=turn.pk)
    return feedback, created


def _feedback_dict(feedback: ExplicitFeedback) -> dict[str, Any]:
    return {"thumb": feedback.thumb, "score": feedback.score, "comment": feedback.comment[:200],
            "demonstration": len(feedback.demonstration)}
