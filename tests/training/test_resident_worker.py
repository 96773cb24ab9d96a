"""One real train worker process serves two tenants' runs on its resident base model: the first run fails
after a training step, its adapter and memory are freed, and the second tenant's run succeeds on the same,
once-loaded base (the version's trainer figures say so)."""

import pytest

from clawhub.adapters.selectors import tenant_access
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
