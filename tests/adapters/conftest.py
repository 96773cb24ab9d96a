"""Fixtures for the adapter lifecycle: a vLLM-shaped fake upstream (the gateway tests' one) that the worker
side loads and unloads adapters on, and settings that point CLAWHUB_UPSTREAMS at it."""

import pytest

from clawhub.adapters.models import AdapterVersion
from tests.gateway.conftest import gateway_factory, start_fake

__all__ = ["gateway_factory"]  # the gateway tests' fixture: a real gateway in a thread


@pytest.fixture(scope="module")
def fake_server():
    fake = start_fake(FAKE_LOAD_DELAY="0.01")
    yield fake
    fake.stop()


@pytest.fixture
def fake(fake_server, settings):
    fake_server.reset()
    settings.CLAWHUB_UPSTREAMS = [
        {"url": fake_server.url, "base_model": "tiny", "max_adapters": 8, "api_key": ""}
    ]
    return fake_server


def make_version(tenant, version: int, state=AdapterVersion.State.CANDIDATE, **fields) -> AdapterVersion:
    fields.setdefault("artifact_path", f"/srv/adapters/t{tenant.pk}/v{version}")
    return AdapterVersion.objects.create(tenant=tenant, version=version, state=state, **fields)


@pytest.fixture
def sent_tasks(monkeypatch):
    """Celery's send_task, recorded: (name, args, kwargs, options)."""
    from workers.celery import app

    calls = []
    monkeypatch.setattr(
        app,
        "send_task",
        lambda name, args=None, kwargs=None, **options: calls.append(
            (name, list(args or []), dict(kwargs or {}), options)
        ),
    )
    return calls


@pytest.fixture
def sent(sent_tasks):
    return sent_tasks
