"""Helpers for the training tests: approved samples of a tenant (through the review test builders), a team
with one user of each role, and a stand-in for Celery's send_task that records what would have been
enqueued."""

import pytest

from clawhub.review.models import Sample
from tests.review.conftest import ApiAs, BrowserAs, approved_sample

__all__ = ["ApiAs", "BrowserAs", "approved_samples"]


def approved_samples(user, n: int, *, tenant=None, reward: int = 1) -> list[Sample]:
    return [approved_sample(user, tenant=tenant, reward=reward) for _ in range(n)]


class SentTasks:
    def __init__(self):
        self.calls: list[tuple[str, list, dict]] = []

    def __call__(self, name, args=None, kwargs=None, **options):
        self.calls.append((name, list(args or []), dict(kwargs or {}), options))

        class Result:
            id = f"task-{len(self.calls)}"

        return Result()

    def named(self, name: str) -> list:
        return [c for c in self.calls if c[0] == name]


@pytest.fixture
def sent(monkeypatch):
    """Celery's send_task, recorded instead of sent (tests that want a real worker start one)."""
    from workers.celery import app

    spy = SentTasks()
    monkeypatch.setattr(app, "send_task", spy)
    return spy


@pytest.fixture
def team(every_role):
    """The group with one user of each role (tests/conftest.py)."""
    return every_role
