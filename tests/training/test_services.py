"""Runs and claims: one open run per tenant, samples claimed atomically and never trained twice, cancel and
failure give samples back, the periodic kick starts runs only for full batches."""

import re
import threading

import pytest
from django.db import connection

from clawhub.core.exceptions import Conflict, PermissionDenied, ValidationFailed
from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from clawhub.training import services, settings_services
from clawhub.training.models import TrainingRun, TrainingSettings
from tests.factories import make_user
from tests.training.conftest import approved_samples


def access_of(user):
    return tenant_access(actor=user, tenant_id=user.tenant.pk)


def test_run_start_claims_the_batch_and_enqueues_the_task_after_commit(
    db, sent, settings, django_capture_on_commit_callbacks
):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 3
    user = make_user()
    samples = approved_samples(user, 5)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = services.run_start(tenant=user.tenant, access=access_of(user))
        assert sent.calls == []  # nothing is enqueued before the claim commits
    for callback in callbacks:
        callback()
    assert sent.named("clawhub.train.run") == [("clawhub.train.run", [run.pk], {}, {})]
    run.refresh_from_db()
    assert run.state == TrainingRun.State.QUEUED and run.task_id == "task-1"
    assert run.sample_ids == [s.pk for s in samples[:3]]  # oldest first, one batch
    assert set(Sample.objects.filter(training_run_id=run.pk).values_list("pk", flat=True)) == set(
        run.sample_ids
    )
    assert run.started_by == user
    # Unique beyond the id: a fresh database reuses ids, and an old checkpoint must never be resumed.
    assert re.fullmatch(rf".*/run-{run.pk}-[0-9a-f]{{8}}", run.workdir)
    assert run.config["method"] == "combine" and run.backend == "local"


def test_one_open_run_per_tenant(db, sent):
    user = make_user()
    approved_samples(user, 4)
    services.run_start(tenant=user.tenant, access=access_of(user))
    with pytest.raises(Conflict) as err:
        services.run_start(tenant=user.tenant, access=access_of(user))
    assert err.value.code == "run_in_progress"


def test_nothing_to_train_is_a_conflict(db, sent):
    user = make_user()
    with pytest.raises(Conflict) as err:
        services.run_start(tenant=user.tenant, access=access_of(user))
    assert err.value.code == "not_enough_samples"


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_make_one_run_and_never_share_a_sample(sent):
    user = make_user()
    approved_samples(user, 6)
    barrier = threading.Barrier(4)
    outcomes = []

    def start():
        try:
            barrier.wait(5)
            outcomes.append(services.run_start(tenant=user.tenant, access=access_of(user)).pk)
        except Conflict as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    runs = [o for o in outcomes if isinstance(o, int)]
    assert len(runs) == 1 and sorted(o for o in outcomes if isinstance(o, str)) == ["run_in_progress"] * 3
    run = TrainingRun.objects.get()
    claimed = list(
        Sample.objects.filter(training_run_id__isnull=False).values_list("training_run_id", flat=True)
    )
    assert claimed == [run.pk] * 6 and len(run.sample_ids) + len(run.heldout_ids) == 6


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_of_two_tenants_sharing_nothing_never_double_claim(sent):
    # Two different tenants race; each claims only its own rows, and every sample ends in exactly one run.
    a, b = make_user(), make_user()
    approved_samples(a, 4)
    approved_samples(b, 4)
    barrier = threading.Barrier(2)

    def start(u):
        barrier.wait(5)
        services.run_start(tenant=u.tenant, access=access_of(u))
        connection.close()

    threads = [threading.Thread(target=start, args=(u,)) for u in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for run in TrainingRun.objects.all():
        assert set(Sample.objects.filter(training_run_id=run.pk).values_list("tenant_id", flat=True)) == {
            run.tenant_id
        }
    assert Sample.objects.filter(training_run_id__isnull=True).count() == 0


def test_a_claimed_sample_is_skipped_by_the_next_run(db, sent, settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 2
    user = make_user()
    approved_samples(user, 3)
    first = services.run_start(tenant=user.tenant, access=access_of(user))
    services.run_fail(run_id=first.pk, error="boom")  # frees its two samples
    second = services.run_start(tenant=user.tenant, access=access_of(user))
    assert second.sample_ids == first.sample_ids  # the same oldest two, back in the pool
    services.run_mark_running(run_id=second.pk, task_id="t")
    assert services.run_succeed(
        run_id=second.pk, metrics=[], trained_sample_ids=second.sample_ids, dropped=[], resumed_from_step=None
    )
    third = services.run_start(tenant=user.tenant, access=access_of(user))
    assert set(third.sample_ids).isdisjoint(second.sample_ids) and len(third.sample_ids) == 1


def test_cancel_returns_samples_and_revokes_the_task(
    db, sent, monkeypatch, django_capture_on_commit_callbacks
):
    from workers.celery import app

    revoked = []
    monkeypatch.setattr(app.control, "revoke", lambda task_id, **kw: revoked.append(task_id))
    user = make_user()
    approved_samples(user, 3)
    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_start(tenant=user.tenant, access=access_of(user))
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(access=access_of(user), run=run)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.CANCELLED and revoked == [run.task_id]
    assert Sample.objects.filter(training_run_id__isnull=True, trained_at__isnull=True).count() == 3
    # A running task notices at its next step, and cannot mark anything trained.
    assert services.run_record_step(run_id=run.pk, metrics={"step": 1}) == TrainingRun.State.CANCELLED
    assert not services.run_succeed(
        run_id=run.pk, metrics=[], trained_sample_ids=[], dropped=[], resumed_from_step=None
    )
    assert Sample.objects.filter(trained_at__isnull=False).count() == 0
    with pytest.raises(Conflict):
        services.run_cancel(access=access_of(user), run=run)


def test_failure_returns_samples_with_the_error_recorded(db, sent):
    user = make_user()
    approved_samples(user, 2)
    run = services.run_start(tenant=user.tenant, access=access_of(user))
    services.run_mark_running(run_id=run.pk, task_id="t")
    services.run_fail(run_id=run.pk, error="RuntimeError: out of memory")
    run.refresh_from_db()
    assert run.state == TrainingRun.State.FAILED and "out of memory" in run.error and run.finished_at
    assert Sample.objects.filter(training_run_id__isnull=True, trained_at__isnull=True).count() == 2


def test_progress_replaces_a_step_recorded_twice(db, sent):
    user = make_user()
    approved_samples(user, 2)
    run = services.run_start(tenant=user.tenant, access=access_of(user))
    services.run_mark_running(run_id=run.pk, task_id="t")
    for loss in (0.5, 0.4):  # step 1 recorded, then recorded again by a resumed task
        services.run_record_step(
            run_id=run.pk,
            metrics={
                "step": 1,
                "loss": loss,
                "mean_reward": 1.0,
                "mean_advantage": 0.5,
                "tokens": 10,
                "seconds": 0.1,
            },
        )
    services.run_record_step(
        run_id=run.pk,
        metrics={
            "step": 2,
            "loss": 0.3,
            "mean_reward": 1.0,
            "mean_advantage": 0.2,
            "tokens": 12,
            "seconds": 0.2,
        },
    )
    run.refresh_from_db()
    assert [m["step"] for m in run.metrics] == [1, 2] and run.metrics[0]["loss"] == 0.4
    assert (run.step, run.loss, run.tokens, run.seconds) == (2, 0.3, 22, 0.3)


def test_kick_starts_runs_only_for_full_batches_with_auto_start(db, sent, settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 3
    full, short, off = make_user(), make_user(), make_user()
    approved_samples(full, 3)
    approved_samples(short, 2)
    approved_samples(off, 5)
    TrainingSettings.objects.create(tenant=off.tenant, auto_start=False)
    started = services.runs_kick()
    assert [TrainingRun.objects.get(pk=i).tenant_id for i in started] == [full.tenant.pk]
    assert TrainingRun.objects.get().started_by is None  # automatic
    assert services.runs_kick() == []  # the open run blocks another one


def test_settings_backend_is_staff_only_and_config_is_validated(db, team):
    group_tenant = team["tenant"]
    owner_access = tenant_access(actor=team["owner"], tenant_id=group_tenant.pk)
    ts = settings_services.training_settings_update(
        access=owner_access, method="rl", overrides={"lr": 1e-4}, batch_size=8
    )
    assert (ts.method, ts.overrides, ts.batch_size) == ("rl", {"lr": 1e-4}, 8)
    with pytest.raises(PermissionDenied):
        settings_services.training_settings_update(access=owner_access, backend="tinker")
    with pytest.raises(ValidationFailed):
        settings_services.training_settings_update(access=owner_access, overrides={"lr": 5})
    with pytest.raises(ValidationFailed):
        settings_services.training_settings_update(access=owner_access, overrides={"no_such_field": 1})
    staff_access = tenant_access(actor=team["staff"], tenant_id=group_tenant.pk)
    ts = settings_services.training_settings_update(access=staff_access, backend="tinker")
    assert ts.backend == "tinker"
    member_access = tenant_access(actor=team["member"], tenant_id=group_tenant.pk)
    with pytest.raises(PermissionDenied):
        settings_services.training_settings_update(access=member_access, method="opd")


def test_the_held_out_slice_is_whole_sessions_never_beside_a_trained_turn_of_the_batch(db, sent, settings):
    """Every second session of the batch is held out with all its turns (the old rule took every second
    sample, so sessions a, c and d had a held-out turn beside trained ones)."""
    from clawhub.conversations.models import Turn

    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 2
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 16
    user = make_user()
    samples = approved_samples(user, 8)
    sessions = {"a": samples[0:3], "b": samples[3:4], "c": samples[4:6], "d": samples[6:8]}
    for members in sessions.values():
        for index, sample in enumerate(members):  # the later turns join the first turn's session
            Turn.objects.filter(pk=sample.turn_id).update(session=members[0].turn.session, index=index)
    run = services.run_start(tenant=user.tenant, access=access_of(user))
    assert sorted(run.heldout_ids) == sorted(s.pk for s in sessions["b"] + sessions["d"])
    assert sorted(run.sample_ids) == sorted(s.pk for s in sessions["a"] + sessions["c"])
    session_of = dict(Sample.objects.values_list("pk", "turn__session_id"))
    trained = {session_of[pk] for pk in run.sample_ids}
    assert not trained & {session_of[pk] for pk in run.heldout_ids}
