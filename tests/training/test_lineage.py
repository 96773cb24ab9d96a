"""Lineage without races, in this process: a tenant's next run waits behind its candidate, the parent is
resolved when training starts, a version whose parent was retired gives its samples back, the sweeper
re-drives forgotten candidates and gives up on hopeless ones, and a batch that keeps timing out stops being
claimed. After each, every approved sample is in the lineage or waiting with a reason (never "lost")."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.adapters import services as adapter_services
from clawhub.adapters.models import AdapterVersion
from clawhub.core.exceptions import Conflict
from clawhub.review.models import Sample
from clawhub.training import lineage_services, services
from clawhub.training.models import TrainingRun
from clawhub.training.selectors import sample_standing, samples_held_back
from tests.adapters.conftest import make_version
from tests.factories import make_user
from tests.training.conftest import approved_samples

State = AdapterVersion.State


@pytest.fixture(autouse=True)
def _batch_of_four(settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 4
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 4


def finish(run: TrainingRun, *, state=State.CANDIDATE) -> AdapterVersion:
    """What the train task does, without the trainer: resolve the parent, make the version, succeed."""
    run = services.run_resolve_parent(run_id=run.pk)
    version = adapter_services.adapter_version_create(tenant=run.tenant, parent=run.parent_version)
    services.run_attach_version(run=run, version=version)
    services.run_mark_running(run_id=run.pk, task_id="t")
    assert services.run_succeed(
        run_id=run.pk, metrics=[], trained_sample_ids=run.sample_ids, dropped=[], resumed_from_step=None
    )
    AdapterVersion.objects.filter(pk=version.pk).update(state=state)
    version.refresh_from_db()
    return version


def activate(version: AdapterVersion) -> None:
    AdapterVersion.objects.filter(tenant=version.tenant, state=State.ACTIVE).update(state=State.RETIRED)
    AdapterVersion.objects.filter(pk=version.pk).update(state=State.ACTIVE)


def assert_nothing_lost(tenant) -> dict[int, str]:
    standing = sample_standing(tenant=tenant)
    assert "lost" not in standing.values(), standing
    return standing


def test_a_kick_while_a_candidate_is_in_flight_waits_and_the_parent_is_resolved_at_training(db, sent):
    user = make_user()
    approved_samples(user, 4)
    first = TrainingRun.objects.get(pk=services.runs_kick()[0])
    assert first.sample_ids and len(first.heldout_ids) == 1  # every 4th sample is held out
    v1 = finish(first)

    approved_samples(user, 4)
    assert services.runs_kick() == []  # v1 is still on its way: the next batch queues behind it
    with pytest.raises(Conflict) as err:
        services.run_start(tenant=user.tenant)
    assert err.value.code == "candidate_in_flight"
    standing = assert_nothing_lost(user.tenant)
    assert sorted(set(standing.values())) == [
        "held out: the eval gate's held-out slice",
        "waiting: the next batch",
        "waiting: v1 being evaluated and promoted",
    ]

    # Claimed now, but the parent is only fixed when the run starts training: after v1 was promoted.
    activate(v1)
    second = TrainingRun.objects.get(pk=services.runs_kick(tenant_ids=[user.tenant.pk])[0])
    assert second.parent_version is None and second.parent_resolved_at is None
    v2 = finish(second)
    assert v2.parent_id == v1.pk
    activate(v2)
    standing = assert_nothing_lost(user.tenant)
    trained = [s for s in standing.values() if s.startswith("in ")]
    assert sorted(trained) == ["in v1"] * 3 + ["in v2"] * 3


def test_a_version_whose_parent_was_retired_while_training_gives_its_samples_back(db, sent):
    from workers.tasks.promotion import promote

    user = make_user()
    v1 = make_version(user.tenant, 1, State.ACTIVE)
    approved_samples(user, 4)
    run = TrainingRun.objects.get(pk=services.runs_kick()[0])
    run = services.run_resolve_parent(run_id=run.pk)
    assert run.parent_version == v1
    v0 = make_version(user.tenant, 2, State.RETIRED)
    activate(v0)  # a rollback while the run trains: v1 is retired
    v3 = finish(run)
    assert v3.parent_id == v1.pk
    assert promote.apply(args=[v3.pk]).get()["outcome"] == "requeued"
    v3.refresh_from_db()
    assert v3.state == State.REJECTED and v3.decision == "stale_parent"
    assert "retired while it trained" in v3.decision_reason
    back = Sample.objects.filter(pk__in=run.sample_ids, training_run_id__isnull=True, trained_at__isnull=True)
    assert back.count() == len(run.sample_ids) == 3
    standing = assert_nothing_lost(user.tenant)
    assert list(standing.values()).count("waiting: the next batch") == 3


def test_the_sweeper_redrives_a_forgotten_candidate_and_gives_up_after_the_bound(
    db, sent, settings, django_capture_on_commit_callbacks
):
    settings.CLAWHUB_PROMOTION_STUCK_SECONDS = 60
    settings.CLAWHUB_PROMOTION_MAX_REDRIVES = 2
    user = make_user()
    approved_samples(user, 4)
    run = TrainingRun.objects.get(pk=services.runs_kick()[0])
    version = finish(run)
    now = timezone.now()
    assert lineage_services.promotions_sweep(now=now)["redriven"] == []  # not stuck yet
    later = now + timedelta(seconds=61)
    with django_capture_on_commit_callbacks(execute=True):
        assert lineage_services.promotions_sweep(now=later)["redriven"] == [version.upstream_name]
    assert sent.named("clawhub.train.promote") == [("clawhub.train.promote", [version.pk], {}, {})]
    assert lineage_services.promotions_sweep(now=later)["redriven"] == []  # re-sent once per bound
    AdapterVersion.objects.filter(pk=version.pk).update(state=State.EVALUATING, promotion_error="boom")
    assert lineage_services.promotions_sweep(now=later + timedelta(seconds=61))["redriven"] == [
        version.upstream_name
    ]
    swept = lineage_services.promotions_sweep(now=later + timedelta(seconds=200))
    assert swept["given_up"] == [version.upstream_name]
    version.refresh_from_db()
    assert version.state == State.REJECTED and version.decision == "promotion_failed"
    assert "after 3 attempts" in version.decision_reason and "boom" in version.decision_reason
    standing = assert_nothing_lost(user.tenant)
    assert list(standing.values()).count("waiting: the next batch") == 3  # trained samples are back


def test_a_batch_that_keeps_timing_out_is_no_longer_claimed_and_says_why(db, sent, settings):
    settings.CLAWHUB_TRAIN_MAX_TIMEOUTS = 2
    user = make_user()
    approved_samples(user, 4)
    for _ in range(2):
        run = TrainingRun.objects.get(pk=services.runs_kick()[0])
        services.run_fail(run_id=run.pk, error="soft time limit", failure=TrainingRun.Failure.TIMEOUT)
    held = samples_held_back(tenant=user.tenant)
    assert len(held) == 3 and all("timed out 2 times" in why for why in held.values())
    assert services.runs_kick() == []  # only the held-out sample and nothing else is claimable
    standing = assert_nothing_lost(user.tenant)
    assert sum("timed out 2 times" in s for s in standing.values()) == 3
    approved_samples(user, 4)
    fresh = TrainingRun.objects.get(pk=services.runs_kick()[0])
    assert not set(fresh.sample_ids + fresh.heldout_ids) & set(held)
    # A run started by hand takes them again (e.g. after the time limit was raised).
    services.run_fail(run_id=fresh.pk, error="x")
    from clawhub.tenants.access import tenant_access

    access = tenant_access(actor=user, tenant_id=user.tenant.pk)
    manual = services.run_start(tenant=user.tenant, access=access)
    assert set(held) <= set(manual.sample_ids + manual.heldout_ids)


def gated_candidate(user) -> tuple[AdapterVersion, AdapterVersion, TrainingRun]:
    """v1 retired (active once), v2 active, and a run trained on v2 whose candidate v3 waits for its gate."""
    make_version(user.tenant, 1, State.RETIRED)
    v2 = make_version(user.tenant, 2, State.ACTIVE)
    approved_samples(user, 4)
    run = TrainingRun.objects.get(pk=services.runs_kick()[0])
    v3 = finish(run)
    assert v3.parent_id == v2.pk
    return v2, v3, run


def passing_gate(monkeypatch, *, meanwhile=lambda: None):
    """The promote task's gate, passing, with `meanwhile` done by someone else while it runs."""
    import workers.tasks.promotion as task
    from clawhub.adapters.evaluation import PROMOTE, Decision

    def gate(version):
        version = adapter_services.adapter_evaluation_start(version=version)
        meanwhile()
        return lineage_services.adapter_record_decision(
            version=version, decision=Decision(PROMOTE, "the preference margin rose"))

    monkeypatch.setattr(task, "_gate", gate)


def test_a_rollback_made_while_the_gate_runs_wins(db, sent, settings, monkeypatch):
    """The promotion read its parent (v2) before a gate of minutes; an owner rolled back to v1 meanwhile (on
    another train worker). The switch re-reads the active version under the tenant's lock: v1 stays active,
    and v3, which continues v2, gives its samples back instead of overriding the rollback."""
    from workers.tasks.promotion import promote

    settings.CLAWHUB_UPSTREAMS = []
    user = make_user()
    v2, v3, run = gated_candidate(user)
    v1 = AdapterVersion.objects.get(tenant=user.tenant, version=1)
    passing_gate(monkeypatch, meanwhile=lambda: adapter_services.adapter_activate(
        version=AdapterVersion.objects.get(pk=v1.pk), actor=user, reason="rollback"))
    assert promote.apply(args=[v3.pk]).get()["outcome"] == "requeued"
    states = dict(AdapterVersion.objects.filter(tenant=user.tenant).values_list("version", "state"))
    assert states == {1: State.ACTIVE, 2: State.RETIRED, 3: State.REJECTED}
    v3.refresh_from_db()
    assert v3.decision == "stale_parent" and "(v1 is active)" in v3.decision_reason
    standing = assert_nothing_lost(user.tenant)
    assert list(standing.values()).count("waiting: the next batch") == len(run.sample_ids) == 3


def test_a_pin_made_while_the_candidate_is_being_switched_in_wins(db, sent, settings, monkeypatch):
    """The pin lands after the promote task looked for one, while it pre-loads the candidate on the upstreams
    (seconds on a real vLLM): the switch sees it under the tenant's lock and holds the candidate; its
    pre-load is removed."""
    from clawhub.adapters import serving
    from clawhub.adapters.models import LoadedAdapter
    from clawhub.tenants.access import tenant_access
    from workers.tasks.promotion import promote

    settings.CLAWHUB_UPSTREAMS = []
    user = make_user()
    v2, v3, _ = gated_candidate(user)
    passing_gate(monkeypatch)
    up = serving.UpstreamTarget(url="http://upstream.invalid", base_model="tiny")
    monkeypatch.setattr(serving, "healthy_upstreams", lambda upstreams=None: [up])
    monkeypatch.setattr(serving, "load_adapter", lambda *a, **k: adapter_services.adapter_pin(
        access=tenant_access(actor=user, tenant_id=user.tenant.pk), reason="hold on"))
    assert promote.apply(args=[v3.pk]).get()["outcome"] == "held"
    v2.refresh_from_db()
    v3.refresh_from_db()
    assert v2.state == State.ACTIVE and v3.state == State.CANDIDATE and v3.held_at is not None
    assert not LoadedAdapter.objects.filter(adapter_name=v3.upstream_name).exists()


def test_a_batch_the_gate_rejected_goes_back_to_the_pool_once(db, sent):
    """A neutral update's interval can fall below 0 by chance, so the samples of a rejected batch train once
    more; rejected a second time, they stay out, and the version's reason (which the samples' standing
    shows) says why."""
    from clawhub.adapters.evaluation import REJECT, Decision

    def reject(version):
        adapter_services.adapter_evaluation_start(version=version)
        assert not lineage_services.adapter_record_decision(
            version=version, decision=Decision(REJECT, "the preference margin fell"))
        version.refresh_from_db()
        return version

    user = make_user()
    approved_samples(user, 4)
    first = TrainingRun.objects.get(pk=services.runs_kick()[0])
    v1 = reject(finish(first))
    assert v1.decision_reason == ("the preference margin fell; its 3 trained samples went back to the pool, "
                                  "to train once more")
    standing = assert_nothing_lost(user.tenant)
    assert [standing[pk] for pk in first.sample_ids] == ["waiting: the next batch"] * 3

    approved_samples(user, 1)  # the batch is full again: the three and a new one (held out: 4th session)
    second = TrainingRun.objects.get(pk=services.runs_kick()[0])
    assert sorted(second.sample_ids) == sorted(first.sample_ids)
    v2 = reject(finish(second))
    assert v2.decision_reason.endswith("3 samples stay out: they were in a batch the gate rejected before, "
                                       "and are retried only once")
    standing = assert_nothing_lost(user.tenant)
    assert [standing[pk] for pk in second.sample_ids] == [f"rejected: v2: {v2.decision_reason}"] * 3
    assert services.runs_kick() == []  # nothing is claimed again
