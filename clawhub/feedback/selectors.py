"""Reads for judgments and judge rules."""

from django.db.models import QuerySet

from clawhub.conversations.models import Turn
from clawhub.feedback.models import JudgeRules, Judgment
from clawhub.groups.models import Role
from clawhub.groups.selectors import has_role
from clawhub.tenants.models import Tenant


def turn_for_judging(*, turn_id: int) -> Turn | None:
    """The turn the judge task was given, or None if it is gone (deleted, or purged by retention)."""
    return Turn.objects.filter(pk=turn_id).first()


def turn_tenant_id(*, turn_id: int) -> int | None:
    """The tenant a turn belongs to, for the judge's per-tenant concurrency cap (one indexed read)."""
    return Turn.objects.filter(pk=turn_id).values_list("tenant_id", flat=True).first()


def judgment_for_turn(*, turn_id: int) -> Judgment | None:
    return Judgment.objects.filter(turn_id=turn_id).first()


def judgments_for_tenant(*, tenant: Tenant, reward: int | None = None,
                         status: str | None = None) -> QuerySet[Judgment]:
    qs = Judgment.objects.filter(tenant=tenant).select_related("turn")
    if reward is not None:
        qs = qs.filter(reward=reward)
    if status:
        qs = qs.filter(status=status)
    return qs


def judge_rules_for_tenant(*, tenant_id: int) -> JudgeRules | None:
    """The tenant's own judge rules, or None when it uses the defaults."""
    return JudgeRules.objects.filter(tenant_id=tenant_id).first()


def can_manage_judge_rules(*, tenant: Tenant, user) -> bool:
    if not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    if tenant.kind == Tenant.Kind.USER:
        return tenant.user_id == user.pk
    return has_role(group=tenant.group, user=user, at_least=Role.ADMIN)
