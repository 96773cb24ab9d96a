"""Adapter lifecycle against the fake upstream: the eval gate promotes or rejects, promotion pre-loads the new
name and switches atomically, the old version drains and is unloaded after the grace period, a pin holds
candidates back, rollback re-activates an earlier version under its own name."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.accounts.models import AuditLog
from clawhub.adapters import services
from clawhub.adapters.models import AdapterPin, AdapterVersion
from clawhub.adapters.selectors import active_adapter_for_tenant, tenant_access
from clawhub.core.exceptions import Conflict
from clawhub.gateway.models import LoadedAdapter
from tests.adapters.conftest import make_version
from tests.factories import make_user
from tests.review.conftest import make_turn

State = AdapterVersion.State


def prefers(*names):
    """A reward function for the gate: the fake upstream names the model in every answer."""

    def reward(messages, text):
        return 1.0 if text.split()[0] in names else -1.0

    return reward


@pytest.fixture
def reward(settings, monkeypatch):
    import tests.adapters.test_lifecycle as me

    def use(fn):
        monkeypatch.setattr(me, "REWARD", fn, raising=False)
        settings.CLAWHUB_EVAL_REWARD = "tests.adapters.test_lifecycle:current_reward"

    return use


REWARD = None


def current_reward(messages, text):
    return REWARD(messages, text)


def test_gate_promotes_a_candidate_that_is_not_worse(
    db, fake, reward, sent_tasks, django_capture_on_commit_callbacks
):
    user = make_user()
    for _ in range(3):
        make_turn(user)
    old = make_version(user.tenant, 1, State.ACTIVE)
    new = make_version(user.tenant, 2, parent=old)
    reward(prefers(new.upstream_name))
    assert services.adapter_evaluate(version=new)
    new.refresh_from_db()
    assert (new.state, new.eval_score, new.baseline_score) == (State.EVALUATING, 1.0, -1.0)
    assert new.metrics["eval"]["prompts"] == 3 and new.metrics["eval"]["baseline"]["version"] == 1
    assert fake.stats()["load_calls"].get(new.upstream_name) == 1  # loaded to generate with it

    with django_capture_on_commit_callbacks(execute=True):
        services.adapter_activate(version=new)
    new.refresh_from_db()
    old.refresh_from_db()
    assert new.state == State.ACTIVE and active_adapter_for_tenant(tenant_id=user.tenant.pk) == new
    assert old.state == State.RETIRED and old.draining and old.drain_until > timezone.now()
    assert LoadedAdapter.objects.filter(adapter_name=new.upstream_name, adapter_version=new).exists()
    assert AuditLog.objects.filter(action="adapter.promoted", target_id=str(new.pk)).exists()
    unload = [c for c in sent_tasks if c[0] == "clawhub.train.unload_drained"]
    assert unload and unload[0][3]["queue"] == "judge" and unload[0][3]["countdown"] > 1


def test_gate_rejects_a_worse_candidate_and_unloads_it(db, fake, reward, settings):
    settings.CLAWHUB_EVAL_MARGIN = 0.5
    user = make_user()
    make_turn(user)
    make_version(user.tenant, 1, State.ACTIVE)
    new = make_version(user.tenant, 2)
    reward(prefers(f"t{user.tenant.pk}-v1"))
    assert not services.adapter_evaluate(version=new)
    new.refresh_from_db()
    assert (new.state, new.eval_score, new.baseline_score) == (State.REJECTED, -1.0, 1.0)
    assert new.metrics["eval"]["passed"] is False and new.metrics["eval"]["margin"] == 0.5
    assert new.upstream_name not in fake.stats()["adapters"]


def test_first_version_is_compared_with_the_base_model(db, fake, reward):
    user = make_user()
    make_turn(user)
    new = make_version(user.tenant, 1)
    reward(prefers("tiny"))  # the base model is better: rejected
    assert not services.adapter_evaluate(version=new)
    assert AdapterVersion.objects.get(pk=new.pk).metrics["eval"]["baseline"]["model"] == "tiny"


def test_the_held_out_set_leaves_out_the_batch(db, fake, reward):
    user = make_user()
    batch = [make_turn(user) for _ in range(2)]
    make_turn(user)
    new = make_version(user.tenant, 1)
    reward(prefers(new.upstream_name))
    services.adapter_evaluate(version=new, exclude_turn_ids=[t.pk for t in batch])
    assert AdapterVersion.objects.get(pk=new.pk).metrics["eval"]["prompts"] == 1


def test_drained_versions_are_unloaded_after_the_grace_period(db, fake, sent_tasks):
    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    v2 = make_version(user.tenant, 2)
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


def test_rollback_reactivates_an_earlier_version_under_its_own_name(db, fake, sent_tasks):
    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    v2 = make_version(user.tenant, 2)
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


def test_pin_holds_a_passing_candidate_back(db, fake, reward, sent):
    from workers.tasks.training import promote

    user = make_user()
    make_turn(user)
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    access = tenant_access(actor=user, tenant_id=user.tenant.pk)
    services.adapter_pin(access=access, reason="demo")
    v2 = make_version(user.tenant, 2, parent=v1)
    reward(prefers(v2.upstream_name))
    assert promote.apply(args=[v2.pk]).get()["outcome"] == "held"
    v2.refresh_from_db()
    assert v2.state == State.CANDIDATE and v2.metrics["eval"]["passed"] is True
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


def test_promote_task_runs_gate_then_switch(db, fake, reward, sent):
    from workers.tasks.training import promote

    user = make_user()
    make_turn(user)
    v1 = make_version(user.tenant, 1)
    reward(prefers(v1.upstream_name))
    assert promote.apply(args=[v1.pk]).get()["outcome"] == "active"
    loads = fake.stats()["load_calls"][v1.upstream_name]
    assert promote.apply(args=[v1.pk]).get()["outcome"] == "active"  # redelivered: nothing more to do
    assert fake.stats()["load_calls"][v1.upstream_name] == loads
