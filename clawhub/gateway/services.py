"""Writes the gateway makes from its writer thread: the upstream/adapter registry and keys' last use.

These are system bookkeeping, not user actions, so they leave no audit rows.
"""

from datetime import datetime

from django.utils import timezone

from clawhub.gateway.models import LoadedAdapter, Upstream
from clawhub.keys.models import ApiKey


def upstream_record_health(*, url: str, base_model: str, max_adapters: int, healthy: bool,
                           at: datetime | None = None) -> Upstream:
    upstream, _ = Upstream.objects.update_or_create(
        url=url,
        defaults={"base_model": base_model, "max_adapters": max_adapters, "healthy": healthy,
                  "last_checked": at or timezone.now()},
    )
    return upstream


def loaded_adapter_sync(*, url: str, base_model: str, max_adapters: int, adapter_names: list[str],
                        version_ids: dict[str, int | None], last_used: dict[str, datetime]) -> None:
    """Makes the registry rows of one upstream match what it holds now."""
    upstream = upstream_record_health(url=url, base_model=base_model, max_adapters=max_adapters, healthy=True)
    LoadedAdapter.objects.filter(upstream=upstream).exclude(adapter_name__in=adapter_names).delete()
    existing = set(LoadedAdapter.objects.filter(upstream=upstream).values_list("adapter_name", flat=True))
    for name in adapter_names:
        if name not in existing:
            LoadedAdapter.objects.create(upstream=upstream, adapter_name=name,
                                         adapter_version_id=version_ids.get(name),
                                         last_used_at=last_used.get(name))
        elif name in last_used:
            LoadedAdapter.objects.filter(upstream=upstream, adapter_name=name).update(
                last_used_at=last_used[name])


def api_keys_mark_used(*, key_ids: list[int], at: datetime | None = None) -> int:
    return ApiKey.objects.filter(pk__in=key_ids).update(last_used_at=at or timezone.now())
