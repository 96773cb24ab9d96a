"""One real train worker process serves several tenants' runs on its resident base model: a run that fails
after a training step frees its adapter and memory and the next tenant's run succeeds on the same, once-loaded
base (the version's trainer figures say so); with multi-tenant passes on, one task trains three tenants'
queued runs together."""

import pytest

from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from clawhub.training import services
from clawhub.training.models import TrainingRun, TrainingSettings
from tests.factories import make_user
from tests.training.conftest import approved_samples
from tests.training.test_worker_kill import purge_train_queue, start_worker, stop, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

FAST = {"micro_batch_size": 1, "grad_accum": 1, "max_seq_len": 256, "lr": 1e-3, "lora_r": 4, "lora_alpha": 8}


@pytest.fixture(autouse=True)
def empty_train_queue():
    purge_train_queue()
    yield
    purge_train_queue()


def _finished(run_id: int):
    run = TrainingRun.objects.get(pk=run_id)
    return run if run.state not in (TrainingRun.State.QUEUED, TrainingRun.State.RUNNING) else None


def test_a_failed_run_frees_its_adapter_and_the_next_tenant_trains_on_the_same_base(tmp_path, settings):
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    first, second = make_user(), make_user()
    for user in (first, second):
        approved_samples(user, 2, reward=1)
        approved_samples(user, 2, reward=-1)
        TrainingSettings.objects.create(tenant=user.tenant, method="rl", overrides=FAST)
    worker = start_worker(tmp_path, CLAWHUB_TEST_FAIL_FIRST_RUN="1")
    try:
        failed = services.run_start(
            tenant=first.tenant, access=tenant_access(actor=first, tenant_id=first.tenant.pk)
        )
        failed = wait_for(lambda: _finished(failed.pk), 180, "the first run did not finish")
        ok = services.run_start(
            tenant=second.tenant, access=tenant_access(actor=second, tenant_id=second.tenant.pk)
        )
        ok = wait_for(lambda: _finished(ok.pk), 180, "the second run did not finish")
    finally:
        stop(worker)
    assert failed.state == TrainingRun.State.FAILED and "injected failure" in failed.error
    assert failed.step == 1  # it failed after training, with an adapter and optimizer state in memory
    assert ok.state == TrainingRun.State.SUCCEEDED, ok.error
    figures = ok.adapter_version.metrics["trainer"]["resident"]
    # One load for both runs; the failed run's LoRA matrices were garbage-collected before this one began.
    assert figures["loads"] == 1 and figures["runs_on_this_load"] == 2, figures
    assert figures["previous_adapter_freed"] is True and figures["evictions"] == 0, figures


def test_one_task_trains_three_tenants_queued_runs_in_one_pass(tmp_path, settings):
    """CLAWHUB_TRAIN_PASS_TENANTS=3: the first run's task takes the other two queued runs (oldest first)
    into one multi-tenant pass; every run succeeds with its own candidate version, and the two companions'
    own messages find their runs already done and send nothing twice."""
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    users = [make_user() for _ in range(3)]
    for user in users:
        approved_samples(user, 2, reward=1)
        approved_samples(user, 2, reward=-1)
        TrainingSettings.objects.create(tenant=user.tenant, method="rl", overrides=FAST)
    # All three queued before the worker starts, as when tenants' batches fill up together.
    runs = [
        services.run_start(tenant=u.tenant, access=tenant_access(actor=u, tenant_id=u.tenant.pk))
        for u in users
    ]
    worker = start_worker(tmp_path, CLAWHUB_TRAIN_PASS_TENANTS="3")
    try:
        done = [wait_for(lambda r=r: _finished(r.pk), 240, f"run {r.pk} did not finish") for r in runs]
    finally:
        stop(worker)
    assert [r.state for r in done] == [TrainingRun.State.SUCCEEDED] * 3, [r.error for r in done]
    owner = done[0].task_id
    assert all(r.remote_ids.get("pass_task") == owner for r in done[1:])  # taken in by the first run's task
    versions = [r.adapter_version for r in done]
    assert len({v.pk for v in versions}) == 3
    assert {v.tenant_id for v in versions} == {u.tenant.pk for u in users}
    assert all(v.metrics["trainer"]["pass_tenants"] == 3 for v in versions)
    # One sample per optimizer step: four joint steps, each recorded on every run once.
    assert all([m["step"] for m in r.metrics] == [1, 2, 3, 4] for r in done)
    for r in done:
        assert Sample.objects.filter(training_run_id=r.pk, trained_at__isnull=False).count() == 4
