"""Reads for judgments, judge rules and explicit feedback."""

from django.conf import settings

from clawhub.accounts.models import User
from clawhub.conversations.models import Turn
from clawhub.core.exceptions import NotFound
from clawhub.feedback.models import ExplicitFeedback, JudgeRules, Judgment
from clawhub.groups.models import Role
from clawhub.groups.selectors import has_role
from clawhub.tenants.access import managed_tenants
from clawhub.tenants.models import Tenant


def turn_for_judging(*, turn_id: int) -> Turn | None:
    """The turn the judge task was given, or None if it is gone (deleted, or purged by retention)."""
    return Turn.objects.filter(pk=turn_id).first()


def turn_tenant_id(*, turn_id: int) -> int | None:
    """The tenant a turn belongs to, for the judge's per-tenant concurrency cap (one indexed read)."""
    return Turn.objects.filter(pk=turn_id).values_list("tenant_id", flat=True).first()


def judgment_for_turn(*, turn_id: int) -> Judgment | None:
    return Judgment.objects.filter(turn_id=turn_id).first()


def judge_rules_for_tenant(*, tenant_id: int) -> JudgeRules | None:
    """The tenant's own judge rules, or None when it uses the defaults."""
    return JudgeRules.objects.filter(tenant_id=tenant_id).first()


def judge_name_for_tenant(*, tenant_id: int, rules: JudgeRules | None = None) -> str:
    """The judge that scores the tenant's turns: its own choice if it made one, else settings.CLAWHUB_JUDGE
    (a name in workers.judge.registry). ``rules`` saves the read when the caller already has them."""
    rules = rules if rules is not None else judge_rules_for_tenant(tenant_id=tenant_id)
    if rules is not None and rules.judge != JudgeRules.Backend.DEFAULT:
        return rules.judge
    return settings.CLAWHUB_JUDGE


def can_manage_judge_rules(*, tenant: Tenant, user) -> bool:
    if not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    if tenant.kind == Tenant.Kind.USER:
        return tenant.user_id == user.pk
    return has_role(group=tenant.group, user=user, at_least=Role.ADMIN)  # type: ignore[arg-type]  # a group tenant


# --- explicit feedback --------------------------------------------------------------------------------------

def explicit_feedback_for_turn(*, turn_id: int) -> ExplicitFeedback | None:
    return ExplicitFeedback.objects.filter(turn_id=turn_id).first()


def turn_for_rating(*, actor: User, turn_id: int | None = None, request_id: str | None = None,
                    key_id: int | None = None) -> Turn:
    """The turn ``actor`` may rate: their own, or one of a tenant they review (their personal tenant; a group
    they own or administer; every tenant for staff). One's own turn of a group counts only while one may
    still steer the group's adapter (member or above, what a key bound to it needs): someone removed, gone or
    made a viewer adds no sample to it. Through a key on /v1 (``key_id``), only the turns that key served (a
    group key dies with its owner's membership). Anything else is "no such turn", so other tenants' turns do
    not leak."""
    turns = Turn.objects.select_related("tenant__group", "user", "key")
    turn = (turns.filter(pk=turn_id) if turn_id is not None else turns.filter(request_id=request_id)).first()
    if turn is None:
        raise NotFound("No such turn.")
    if key_id is not None:
        if turn.key_id != key_id:
            raise NotFound("No such turn.")
        return turn
    own = turn.user_id == actor.pk and (
        turn.tenant.kind == Tenant.Kind.USER
        or has_role(group=turn.tenant.group, user=actor, at_least=Role.MEMBER))  # type: ignore[arg-type]  # a group tenant
    if not own and not managed_tenants(actor=actor).filter(pk=turn.tenant_id).exists():
        raise NotFound("No such turn.")
    return turn
