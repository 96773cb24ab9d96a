"""Adapter lifecycle against the fake upstream: the eval gate promotes or rejects, promotion pre-loads the new
name and switches atomically, the old version drains and is unloaded after the grace period, a pin holds
candidates back, rollback re-activates an earlier version under its own name."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.accounts.models import AuditLog
from clawhub.adapters import services
from clawhub.adapters.evaluation import PROMOTE, REJECT, Decision
from clawhub.adapters.models import AdapterPin, AdapterVersion, LoadedAdapter
from clawhub.adapters.selectors import active_adapter_for_tenant
from clawhub.core.exceptions import Conflict
from clawhub.tenants.access import tenant_access
from clawhub.training.lineage_services import adapter_record_decision
from tests.adapters.conftest import make_version
from tests.factories import make_user
from tests.review.conftest import make_turn
from workers.celery import app

State = AdapterVersion.State


@pytest.fixture
def gate(monkeypatch):
    """The promote task's gate, replaced by a recorded decision (the gate's own measurements are tested in
    tests/trainer/test_gate.py and end to end by the race tests' real workers)."""
    import workers.tasks.promotion as tasks

    def use(outcome=PROMOTE, reason="the preference margin rose"):
        def fake_gate(version):
            version = services.adapter_evaluation_start(version=version)
            return adapter_record_decision(version=version, decision=Decision(outcome, reason))

        monkeypatch.setattr(tasks, "_gate", fake_gate)

    use()
    return use


def test_a_passing_decision_is_recorded_and_the_switch_retires_the_parent(
    db, fake, sent_tasks, django_capture_on_commit_callbacks
):
    user = make_user()
    old = make_version(user.tenant, 1, State.ACTIVE)
    new = make_version(user.tenant, 2, parent=old)
    services.adapter_evaluation_start(version=new)
    numbers = {"margin": {"delta": 0.2, "low": 0.1, "high": 0.3}, "positives": 5, "negatives": 4}
    assert adapter_record_decision(
        version=new, decision=Decision(PROMOTE, "the preference margin rose", numbers)
    )
    new.refresh_from_db()
    assert (new.state, new.decision, new.eval_score) == (State.EVALUATING, PROMOTE, 0.2)
    assert new.evaluating_since is not None and new.metrics["eval"]["baseline"]["version"] == 1
    assert new.metrics["eval"]["numbers"]["positives"] == 5

    with django_capture_on_commit_callbacks(execute=True):
        services.adapter_activate(version=new)
    new.refresh_from_db()
    old.refresh_from_db()
    assert new.state == State.ACTIVE and active_adapter_for_tenant(tenant_id=user.tenant.pk) == new
    assert old.state == State.RETIRED and old.draining and old.drain_until > timezone.now()
    assert LoadedAdapter.objects.filter(adapter_name=new.upstream_name, adapter_version=new).exists()
    assert AuditLog.objects.filter(action="adapter.promoted", target_id=str(new.pk)).exists()
    unload = [c for c in sent_tasks if c[0] == "clawhub.train.unload_drained"]
    assert unload and unload[0][3]["countdown"] > 1
    assert app.amqp.router.route(unload[0][3], unload[0][0])["queue"].name == "housekeeping"


def test_a_rejecting_decision_ends_the_candidate(db, fake):
    user = make_user()
    make_version(user.tenant, 1, State.ACTIVE)
    new = make_version(user.tenant, 2)
    services.adapter_evaluation_start(version=new)
    assert not adapter_record_decision(
        version=new, decision=Decision(REJECT, "the preference margin fell")
    )
    new.refresh_from_db()
    assert (new.state, new.decision) == (State.REJECTED, REJECT)
    assert new.decision_reason == "the preference margin fell"
    assert new.metrics["eval"]["passed"] is False
    assert AuditLog.objects.filter(action="adapter.evaluated", target_id=str(new.pk)).exists()


def test_drained_versions_are_unloaded_after_the_grace_period(db, fake, sent_tasks):
    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    v2 = make_version(user.tenant, 2, parent=v1)
    from clawhub.adapters import serving

    # v1 was loaded by a gateway before
    up = serving.configured_upstreams()[0]
    serving.load_adapter(up, name=v1.upstream_name, path=v1.artifact_path)
    services.adapter_activate(version=v2)
    assert services.adapter_unload_drained() == []  # still draining
    assert v1.upstream_name in fake.stats()["adapters"]
    later = timezone.now() + timedelta(seconds=services.settings.CLAWHUB_ADAPTER_DRAIN_SECONDS + 1)
    assert services.adapter_unload_drained(now=later) == [v1.upstream_name]
    assert v1.upstream_name not in fake.stats()["adapters"]
    assert v2.upstream_name in fake.stats()["adapters"]
    v1.refresh_from_db()
    assert v1.unloaded_at is not None and not v1.draining


def test_a_drained_version_a_gateway_still_has_a_request_on_waits_for_the_next_sweep(db, fake, sent_tasks):
    import time

    import redis
    from django.conf import settings

    from clawhub.adapters import serving

    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    v2 = make_version(user.tenant, 2, parent=v1)
    serving.load_adapter(serving.configured_upstreams()[0], name=v1.upstream_name, path=v1.artifact_path)
    services.adapter_activate(version=v2)
    later = timezone.now() + timedelta(seconds=services.settings.CLAWHUB_ADAPTER_DRAIN_SECONDS + 1)
    client = redis.Redis.from_url(settings.REDIS_URL)
    busy = f"gw:busy:{v1.upstream_name}"
    client.zadd(busy, {"a-gateway-request": time.time() + 30})  # the lease a gateway holds while it streams
    try:
        assert services.adapter_unload_drained(now=later) == []
        assert v1.upstream_name in fake.stats()["adapters"]
        client.zrem(busy, "a-gateway-request")
        assert services.adapter_unload_drained(now=later) == [v1.upstream_name]
        assert v1.upstream_name not in fake.stats()["adapters"]
    finally:
        client.delete(busy)
        client.close()


def test_rollback_reactivates_an_earlier_version_under_its_own_name(db, fake, sent_tasks):
    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    v2 = make_version(user.tenant, 2, parent=v1)
    services.adapter_activate(version=v2)
    services.adapter_unload_drained(now=timezone.now() + timedelta(days=1))
    services.adapter_activate(version=AdapterVersion.objects.get(pk=v1.pk), reason="rollback")
    v1.refresh_from_db()
    v2.refresh_from_db()
    assert v1.state == State.ACTIVE and v1.unloaded_at is None and v1.drain_until is None
    assert v2.state == State.RETIRED and v2.draining
    assert fake.stats()["load_calls"][v1.upstream_name] == 1  # loaded again, same name, same weights
    assert AuditLog.objects.filter(action="adapter.rolled_back", target_id=str(v1.pk)).exists()


def test_a_failed_preload_switches_nothing(db, fake):
    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    broken = make_version(user.tenant, 2, artifact_path="/srv/missing")
    from clawhub.adapters.serving import UpstreamUnavailable

    with pytest.raises(UpstreamUnavailable):
        services.adapter_activate(version=broken)
    assert active_adapter_for_tenant(tenant_id=user.tenant.pk) == v1


def test_pin_holds_a_passing_candidate_back(db, fake, gate, sent):
    from workers.tasks.promotion import promote

    user = make_user()
    make_turn(user)
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    access = tenant_access(actor=user, tenant_id=user.tenant.pk)
    services.adapter_pin(access=access, reason="demo")
    v2 = make_version(user.tenant, 2, parent=v1)
    assert promote.apply(args=[v2.pk]).get()["outcome"] == "held"
    v2.refresh_from_db()
    assert v2.state == State.CANDIDATE and v2.metrics["eval"]["passed"] is True and v2.held_at is not None
    assert active_adapter_for_tenant(tenant_id=user.tenant.pk) == v1
    with pytest.raises(Conflict):
        services.adapter_rollback(access=access, version=v2)  # pinned: unpin first
    services.adapter_unpin(access=access)
    assert not AdapterPin.objects.exists()
    services.adapter_rollback(access=access, version=v2)
    assert (
        promote.apply(args=[v2.pk], kwargs={"rollback": True, "actor_id": user.pk}).get()["outcome"]
        == "active"
    )
    assert active_adapter_for_tenant(tenant_id=user.tenant.pk).pk == v2.pk


def test_promote_task_runs_gate_then_switch(db, fake, gate, sent):
    from workers.tasks.promotion import promote

    user = make_user()
    make_turn(user)
    v1 = make_version(user.tenant, 1)
    assert promote.apply(args=[v1.pk]).get()["outcome"] == "active"
    loads = fake.stats()["load_calls"][v1.upstream_name]
    assert promote.apply(args=[v1.pk]).get()["outcome"] == "active"  # redelivered: nothing more to do
    assert fake.stats()["load_calls"][v1.upstream_name] == loads
