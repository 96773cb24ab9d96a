"""What one tenant may cost the shared training workers: GPU-seconds per day and runs per hour, and the order
in which the periodic kick serves tenants.

GPU-seconds are derived from the tenant's runs' own timestamps (``started_at`` to ``finished_at``, or to now
for a run still going), over the last 24 hours; no separate ledger can drift from what actually ran. A tenant
over either budget is refused with a 429 (``training_budget``) that says what was used, the limit and when to
try again; staff starting a run by hand are not held to it.

Fairness: each tenant has at most one run queued or running (a partial unique constraint on the run), so the
train queue holds one item per tenant, and the kick offers new runs to the tenants that used the least
GPU-time today first and skips those over budget. A tenant that trains all day cannot keep the others waiting.
"""

from datetime import datetime, timedelta
from math import ceil
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from clawhub.core.exceptions import RateLimited
from clawhub.tenants.models import Tenant
from clawhub.training.models import TrainingRun

if TYPE_CHECKING:
    from clawhub.tenants.access import TenantAccess

DAY, HOUR = timedelta(days=1), timedelta(hours=1)


def gpu_seconds_used(*, tenant_id: int, now: datetime | None = None) -> float:
    """Seconds of training worker time the tenant's runs took in the 24 hours before ``now``."""
    now = now or timezone.now()
    since = now - DAY
    spans = (TrainingRun.objects.filter(tenant_id=tenant_id, started_at__isnull=False)
             .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=since))
             .values_list("started_at", "finished_at"))
    return sum(max(0.0, ((finished or now) - max(started, since)).total_seconds())
               for started, finished in spans)


def _runs_last_hour(*, tenant_id: int, now: datetime) -> list[datetime]:
    return list(TrainingRun.objects.filter(tenant_id=tenant_id, created_at__gt=now - HOUR)
                .order_by("created_at").values_list("created_at", flat=True))


def budget_refusal(*, tenant_id: int, now: datetime | None = None) -> RateLimited | None:
    """The refusal a new run of this tenant gets now, or None when it is within both budgets."""
    now = now or timezone.now()
    per_hour = settings.CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR
    if per_hour:
        recent = _runs_last_hour(tenant_id=tenant_id, now=now)
        if len(recent) >= per_hour:
            retry = ceil((recent[0] + HOUR - now).total_seconds())
            return RateLimited(
                f"This tenant started {len(recent)} training runs in the last hour; the limit is {per_hour}.",
                retry_after=max(1, retry), code="training_budget", budget="runs_per_hour",
                used=len(recent), limit=per_hour,
            )
    per_day = settings.CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY
    if per_day:
        used = gpu_seconds_used(tenant_id=tenant_id, now=now)
        if used >= per_day:
            # Usage falls out of the window as it ages: at the latest, a day after the oldest run in it began.
            oldest = (TrainingRun.objects.filter(tenant_id=tenant_id, started_at__gt=now - DAY)
                      .order_by("started_at").values_list("started_at", flat=True).first())
            retry = ceil((oldest + DAY - now).total_seconds()) if oldest else 3600
            return RateLimited(
                f"This tenant used {used / 3600:.1f} GPU-hours of training in the last 24 hours; the limit "
                f"is {per_day / 3600:.1f}.",
                retry_after=max(1, retry), code="training_budget", budget="gpu_seconds_per_day",
                used=round(used), limit=per_day,
            )
    return None


def budget_check(*, tenant: Tenant, access: "TenantAccess | None" = None) -> None:
    """Raises the tenant's budget refusal (429, Retry-After), unless site staff start the run by hand."""
    if access is not None and access.is_staff:
        return
    refusal = budget_refusal(tenant_id=tenant.pk)
    if refusal is not None:
        raise refusal


def fair_order(rows: Any) -> list[dict]:
    """The kick's candidate rows (``{"tenant_id", …}``) that are within budget, least GPU-time used today
    first (then the lowest tenant id, so the order is stable)."""
    now = timezone.now()
    within = [row for row in rows if budget_refusal(tenant_id=row["tenant_id"], now=now) is None]
    return sorted(within, key=lambda row: (gpu_seconds_used(tenant_id=row["tenant_id"], now=now),
                                           row["tenant_id"]))
