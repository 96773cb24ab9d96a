"""Writes of the gateway's own: keys' last use. (The registry of which upstream holds which adapter is
written by ``clawhub.adapters.registry``.)"""

from datetime import datetime

from django.utils import timezone

from clawhub.keys.models import ApiKey


def api_keys_mark_used(*, key_ids: list[int], at: datetime | None = None) -> int:
    return ApiKey.objects.filter(pk__in=key_ids).update(last_used_at=at or timezone.now())
