"""A generation bump the shared cache does not take is kept in the database and made by the periodic
sweep: a revocation committed during a Redis outage still reaches gateways that kept confirming the old
generation."""

import pytest
from django.utils import timezone

from clawhub.core import generations, metrics
from clawhub.core.models import PendingGenerationBump
from clawhub.keys.cache import key_cache_generation, key_cache_generation_now
from clawhub.keys.services import key_revoke
from tests.factories import make_key, make_user

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: every cache call is refused at once.
UNREACHABLE = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": "redis://127.0.0.1:1/0"}}


def deferred() -> float:
    return metrics.GENERATION_BUMPS_DEFERRED._value.get()


def test_a_revocation_while_the_cache_is_away_is_bumped_by_the_sweep(
        settings, django_capture_on_commit_callbacks):
    owner = make_user()
    key, _ = make_key(owner)
    before = key_cache_generation(key_id=key.pk)  # what a gateway's cached lookup was made under
    real_caches, count = settings.CACHES, deferred()

    settings.CACHES = UNREACHABLE
    with django_capture_on_commit_callbacks(execute=True):
        key_revoke(key=key, actor=owner)  # commits, and its bump fails without failing the request
    settings.CACHES = real_caches

    key.refresh_from_db()
    assert key.revoked_at is not None
    assert key_cache_generation_now(key_id=key.pk) == before  # the bump did not happen
    assert list(PendingGenerationBump.objects.values_list("name", flat=True)) == [f"keygen:{key.pk}"]
    assert deferred() == count + 1

    assert generations.generations_bump_pending() == 1
    assert key_cache_generation_now(key_id=key.pk) != before
    assert not PendingGenerationBump.objects.exists()


def test_the_sweep_keeps_what_still_fails_and_stops_there(settings):
    names = [f"test-gen-{i}" for i in range(3)]
    for name in names:
        PendingGenerationBump.objects.create(name=name, failed_at=timezone.now())
    settings.CACHES = UNREACHABLE
    assert generations.generations_bump_pending() == 0
    assert PendingGenerationBump.objects.count() == 3


def test_a_failure_after_the_sweeps_bump_stays_pending(monkeypatch):
    """Another change of the same thing whose bump failed while the sweep was bumping: its row is not
    removed with the one the sweep made (that bump came before the change)."""
    PendingGenerationBump.objects.create(name="test-gen-race", failed_at=timezone.now())
    bump = generations._bump

    def bump_then_fail_again(name: str) -> None:
        bump(name)
        PendingGenerationBump.objects.filter(name=name).update(failed_at=timezone.now())

    monkeypatch.setattr(generations, "_bump", bump_then_fail_again)
    assert generations.generations_bump_pending() == 1
    assert PendingGenerationBump.objects.filter(name="test-gen-race").exists()
    monkeypatch.setattr(generations, "_bump", bump)
    assert generations.generations_bump_pending() == 1
    assert not PendingGenerationBump.objects.exists()


def test_the_sweep_runs_on_the_beat_schedule_on_housekeeping():
    from clawhub.core import tasks
    from workers.celery import app

    [entry] = [e for e in app.conf.beat_schedule.values() if e["task"] == tasks.GENERATIONS_SWEEP]
    assert entry["schedule"] <= 60 and entry["options"]["queue"] == tasks.HOUSEKEEPING_QUEUE
