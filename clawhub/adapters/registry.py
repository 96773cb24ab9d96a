"""Writes of the registry of which upstream holds which adapter (``Upstream``, ``LoadedAdapter``).

The only module that writes the registry: the gateway's writer thread mirrors what each upstream holds
(``loaded_adapter_sync``), and the adapter worker records the loads it made itself and forgets the names it
unloaded (``loaded_adapter_record``, ``loaded_adapters_forget``), so that what holds what stays visible to
operators and promotion. These are system bookkeeping, not user actions, so they leave no audit rows.
"""

from datetime import datetime

from django.utils import timezone

from clawhub.adapters.models import LoadedAdapter, Upstream


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


def loaded_adapter_record(*, url: str, base_model: str, adapter_name: str,
                          adapter_version_id: int | None) -> LoadedAdapter:
    """One load the adapter worker made itself (promotion's pre-load): the upstream's row if it has none yet,
    and the adapter's row pointing at its version."""
    upstream, _ = Upstream.objects.get_or_create(url=url,
                                                 defaults={"base_model": base_model, "healthy": True})
    row, _ = LoadedAdapter.objects.update_or_create(
        upstream=upstream, adapter_name=adapter_name, defaults={"adapter_version_id": adapter_version_id})
    return row


def loaded_adapters_forget(*, adapter_name: str) -> int:
    """The adapter was unloaded from every upstream: its rows go, on all of them."""
    deleted, _ = LoadedAdapter.objects.filter(adapter_name=adapter_name).delete()
    return deleted
