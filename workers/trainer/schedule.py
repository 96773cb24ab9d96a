"""Which tenants' ready batches go into the next multi-tenant pass.

Fair by construction: oldest-ready first, one batch per tenant per pass, and only tenants within their compute
budget (the caller passes clawhub.training.budget's check). A busy tenant with ten ready batches gets one
into a pass, like everyone else, and a quiet tenant's batch ages to the front; a tenant over its daily
GPU-seconds waits for the budget window, as with single runs. A pass holds one base model on one device and
dtype: the oldest ready batch decides which, the others wait for a pass of their own. The pass is bounded by
a tenant count and a token total (its memory and step time); the oldest batch always fits, however large.
No Django here: plain data in and out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReadyBatch:
    key: Any  # what to train (a run id)
    tenant_id: Hashable
    ready_at: float  # when the batch became ready (a timestamp; smaller = waiting longer)
    tokens: int  # prompt + response tokens of the batch
    group: tuple = ()  # (base model, device, dtype): batches of one pass share it


def choose_pass(
    ready: Iterable[ReadyBatch],
    *,
    within_budget: Callable[[Hashable], bool],
    max_tenants: int,
    max_tokens: int | None = None,
) -> list[ReadyBatch]:
    """The batches of the next pass, oldest-ready first (ties by tenant id, so the order is stable)."""
    if max_tenants < 1:
        raise ValueError(f"max_tenants={max_tenants}: a pass trains at least one tenant")
    chosen: list[ReadyBatch] = []
    seen: set[Hashable] = set()
    budget: dict[Hashable, bool] = {}
    group = None
    tokens = 0
    for batch in sorted(ready, key=lambda b: (b.ready_at, str(b.tenant_id))):
        if batch.tenant_id in seen:
            continue
        if batch.tenant_id not in budget:
            budget[batch.tenant_id] = within_budget(batch.tenant_id)
        if not budget[batch.tenant_id]:
            continue
        if group is None:
            group = batch.group
        elif batch.group != group:
            continue
        if chosen and max_tokens is not None and tokens + batch.tokens > max_tokens:
            continue
        chosen.append(batch)
        seen.add(batch.tenant_id)
        tokens += batch.tokens
        if len(chosen) == max_tenants:
            break
    return chosen
