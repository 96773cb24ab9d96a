"""A per-tenant cap on judge tasks running at once, so that one tenant's flood (or one slow rule set) cannot
take every judge worker while other tenants' turns wait.

Each tenant has ``CLAWHUB_JUDGE_TENANT_CONCURRENCY`` slots in the shared cache (Redis in production). A task
takes a free slot for as long as it runs; one that finds none is put back on the queue a little later
(``CLAWHUB_JUDGE_TENANT_BUSY_DELAY`` seconds) instead of waiting on a worker. A slot expires after the task's
hard time limit, so a worker killed mid-task cannot hold it for good.
"""

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from celery import Task
from django.conf import settings
from django.core.cache import cache

from clawhub.core.tasks import enqueue
from clawhub.feedback.selectors import turn_tenant_id


def _slot_key(tenant_id: int, index: int) -> str:
    return f"judge-slot:{tenant_id}:{index}"


@contextmanager
def judge_slot(*, tenant_id: int) -> Iterator[bool]:
    """Holds one of the tenant's judge slots while the block runs: yields True, or False when all are busy."""
    token = secrets.token_hex(8)
    ttl = int(settings.CLAWHUB_JUDGE_TASK_TIME_LIMIT) + 30
    for index in range(max(1, settings.CLAWHUB_JUDGE_TENANT_CONCURRENCY)):
        key = _slot_key(tenant_id, index)
        if cache.add(key, token, timeout=ttl):
            try:
                yield True
            finally:
                # Only our own slot: past its expiry another task may hold the same key now.
                if cache.get(key) == token:
                    cache.delete(key)
            return
    yield False


class TenantCappedJudgeTask(Task):
    """Base of the judge task (``judge_turn(turn_id)``): runs it inside one of the turn's tenant's slots, or
    re-queues it with a countdown when the tenant already has its share of workers."""

    def __call__(self, turn_id: int, *args, **kwargs):
        tenant_id = turn_tenant_id(turn_id=turn_id)
        if tenant_id is None or self.request.is_eager:
            # A vanished turn is the task's own business; eager calls (tests, the embedded stack) have no
            # queue to go back to.
            return super().__call__(turn_id, *args, **kwargs)
        with judge_slot(tenant_id=tenant_id) as held:
            if held:
                return super().__call__(turn_id, *args, **kwargs)
        enqueue(self.name, turn_id, *args, countdown=settings.CLAWHUB_JUDGE_TENANT_BUSY_DELAY, **kwargs)
        return {"turn": turn_id, "outcome": "deferred", "tenant": tenant_id}
