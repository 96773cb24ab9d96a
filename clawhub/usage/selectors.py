"""Reads for usage: who may see which rows (the scope), and the sums per day, model, key, user or group.

A user sees their own usage; group owners and admins see their group's; members see their own part of it;
staff see anyone's.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db.models import F, Q, QuerySet, Sum

from clawhub.accounts.models import User
from clawhub.core.exceptions import PermissionDenied
from clawhub.groups.models import Group
from clawhub.tenants.access import TenantAccess
from clawhub.usage.models import SUMMED, UsageDaily

BY = ("day", "model", "key", "user", "group")
# Per ``by``: the output column -> the field path it reads. A column named like a field of UsageDaily must be
# that field itself (``values()`` refuses an annotation that shadows a field: ``group`` -> ``group__slug``
# raised ValueError), so related columns get their own names.
_GROUPING = {
    "day": {"day": "day"},
    "model": {"model": "model"},
    "key": {
        "key_id": "key_id",
        "key_name": "key__name",
        "key_prefix": "key__prefix",
        "key_last4": "key__last4",
    },
    "user": {"user_id": "user_id", "user_email": "user__email"},
    "group": {"group_id": "group_id", "group_slug": "group__slug", "group_name": "group__name"},
}
_COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "streams",
             "avg_latency_ms", "avg_ttft_ms")


def usage_columns(*, by: str) -> list[str]:
    """The columns of a ``usage_summary`` row, in order (the CSV header, also when there are no rows)."""
    return [*_GROUPING[by], *_COUNTERS]


@dataclass(frozen=True)
class UsageScope:
    """The rows a request may read: one user's, one group's (optionally one member's), or everyone's."""

    user_id: int | None = None
    group: Group | None = None
    everything: bool = False

    def filter(self) -> Q:
        where = Q()
        if self.group is not None:
            where &= Q(group=self.group)
        if self.user_id is not None:
            where &= Q(user_id=self.user_id)
        if not where and not self.everything:
            raise ValueError("an unrestricted usage scope must say so")
        return where


def usage_scope(
    *, actor: User, access: TenantAccess | None = None, user_id: int | None = None, everything: bool = False
) -> UsageScope:
    """Turns what a request asks to see into what it may see, or refuses. ``access`` is the caller's access to
    the group asked for, which the view resolves (``tenants.access.group_access(staff=True)``: non-members get
    404, staff see every group)."""
    others = user_id is not None and user_id != actor.pk
    if access is not None:
        if access.can_manage:
            return UsageScope(group=access.group, user_id=user_id)
        if others:
            raise PermissionDenied("Only the group's owner and admins see other members' usage.")
        return UsageScope(group=access.group, user_id=actor.pk)
    if everything or others:
        if not actor.is_staff:
            raise PermissionDenied("Only staff see other users' usage.")
        return UsageScope(user_id=user_id, everything=user_id is None)
    return UsageScope(user_id=actor.pk)


def usage_default_range(*, until: date | None = None) -> tuple[date, date]:
    """The USAGE_DEFAULT_DAYS days up to ``until`` (default today, UTC)."""
    until = until or datetime.now(tz=UTC).date()
    return until - timedelta(days=settings.USAGE_DEFAULT_DAYS - 1), until


def _rows(*, scope: UsageScope, since: date, until: date, key_id: int | None, model: str | None) -> QuerySet:
    rows = UsageDaily.objects.filter(scope.filter(), day__gte=since, day__lte=until)
    if key_id is not None:
        rows = rows.filter(key_id=key_id)
    if model:
        rows = rows.filter(model=model)
    return rows


def _finish(row: dict) -> dict:
    """The summed row as published: its grouping columns, then ``_COUNTERS`` in order."""
    sums = {name: row.pop(name) or 0 for name in SUMMED}
    requests, streams = sums["requests"], sums["streams"]
    return {
        **row,
        "requests": requests,
        "errors": sums["errors"],
        "prompt_tokens": sums["prompt_tokens"],
        "completion_tokens": sums["completion_tokens"],
        "total_tokens": sums["prompt_tokens"] + sums["completion_tokens"],
        "streams": streams,
        "avg_latency_ms": round(sums["latency_ms_sum"] / requests, 1) if requests else None,
        "avg_ttft_ms": round(sums["ttft_ms_sum"] / streams, 1) if streams else None,
    }


def usage_summary(
    *,
    scope: UsageScope,
    since: date,
    until: date,
    by: str = "day",
    key_id: int | None = None,
    model: str | None = None,
) -> list[dict]:
    """One flat row per day (newest first), model, key, user or group (busiest first) with the sums."""
    grouping = _GROUPING[by]
    rows = (
        _rows(scope=scope, since=since, until=until, key_id=key_id, model=model)
        .values(
            *[path for alias, path in grouping.items() if alias == path],
            **{alias: F(path) for alias, path in grouping.items() if alias != path},
        )
        .annotate(**{name: Sum(name) for name in SUMMED})
        .order_by(*(["-day"] if by == "day" else ["-requests", *grouping]))
    )
    return [_finish(dict(row)) for row in rows]


def usage_totals(
    *, scope: UsageScope, since: date, until: date, key_id: int | None = None, model: str | None = None
) -> dict:
    totals = _rows(scope=scope, since=since, until=until, key_id=key_id, model=model).aggregate(
        **{name: Sum(name) for name in SUMMED}
    )
    return _finish(totals)


def usage_of_keys(*, user: User, key_ids: list[int], since: date, until: date) -> dict[int, dict]:
    """Each of the user's keys' sums over the range (only keys that made a request are in it): the key list's
    columns. A key's rows all carry its owner, so the owner's scope finds them."""
    rows = usage_summary(scope=usage_scope(actor=user), since=since, until=until, by="key")
    wanted = set(key_ids)
    return {row["key_id"]: row for row in rows if row["key_id"] in wanted}


def usage_of_key(*, user: User, key_id: int, since: date, until: date) -> dict:
    """One key's usage as the key page shows it: its totals over the range and since it was made, by day
    and by model over the range."""
    scope = usage_scope(actor=user)
    return {
        "since": since,
        "until": until,
        "totals": usage_totals(scope=scope, since=since, until=until, key_id=key_id),
        "all_time": usage_totals(scope=scope, since=date.min, until=until, key_id=key_id),
        "by_day": usage_summary(scope=scope, by="day", since=since, until=until, key_id=key_id),
        "by_model": usage_summary(scope=scope, by="model", since=since, until=until, key_id=key_id),
    }
