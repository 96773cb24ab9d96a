"""A real Celery train worker on real Redis, SIGKILLed in the middle of a run after at least one checkpoint:
the run resumes from its checkpoint on a new worker, and every claimed sample is trained exactly as planned
(no step repeated, no sample twice in an epoch, none lost)."""

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from clawhub.adapters.models import AdapterVersion
from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from clawhub.training import services
from clawhub.training.models import TrainingRun, TrainingSettings
from tests import celery_workers
from tests.celery_workers import VISIBILITY_TIMEOUT, stop
from tests.factories import make_user
from tests.training.conftest import approved_samples
from workers.celery import app

SAMPLES, EPOCHS = 8, 3
STEPS = SAMPLES * EPOCHS  # one sample per optimizer step

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def start_worker(tmp_path: Path, step_delay: float = 0.0, pool: str = "solo", **env: str) -> subprocess.Popen:
    """A train worker on the test database and broker; ``env`` adds or overrides its environment."""
    options = ("--pool", pool, "--concurrency", "1", "--prefetch-multiplier", "1")
    return celery_workers.start_worker("tests.training.slow_worker", "train", *options, **{
        "OMP_NUM_THREADS": "1",
        "CLAWHUB_TEST_STEP_DELAY": str(step_delay),
        "CLAWHUB_TRAIN_WORKDIR": str(tmp_path / "train"),
        "CLAWHUB_ADAPTER_DIR": str(tmp_path / "adapters"),
        # Nothing listens here: the promote task that follows the run just waits to retry.
        "CLAWHUB_UPSTREAMS": '[{"url": "http://127.0.0.1:9", "base_model": "tiny"}]',
        **env,
    })


def purge_train_queue() -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("train")
        conn.default_channel.client.delete("unacked", "unacked_index")


@pytest.fixture(autouse=True)
def empty_train_queue():
    purge_train_queue()
    yield
    purge_train_queue()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what} within {timeout} s")


def test_killed_worker_resumes_from_checkpoint_without_training_a_sample_twice(tmp_path, settings):
    """Over a minute (88 s in a two-worker run): two real train workers, each loading the tiny model and
    training on the CPU; the first is killed mid-run and the second resumes from its checkpoint."""
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")  # run_start names the workdir here
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0  # every claimed sample is trained: the step count is exact
    # A checkpoint after every step (the operator's cadence; by default a short run writes once, at its end).
    settings.CLAWHUB_TRAIN_DEFAULTS = {**settings.CLAWHUB_TRAIN_DEFAULTS, "checkpoint_seconds": 0}
    user = make_user()
    claimed = approved_samples(user, SAMPLES // 2, reward=1) + approved_samples(user, SAMPLES // 2, reward=-1)
    TrainingSettings.objects.create(
        tenant=user.tenant,
        method="rl",
        overrides={
            "micro_batch_size": 1,
            "grad_accum": 1,
            "epochs": EPOCHS,
            "max_seq_len": 256,
            "lr": 1e-3,
            "lora_r": 4,
            "lora_alpha": 8,
        },
    )
    worker = start_worker(tmp_path, step_delay=0.5)
    try:
        run = services.run_start(
            tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk)
        )
        wait_for(lambda: TrainingRun.objects.get(pk=run.pk).step >= 2, 120, "no second step")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        stop(worker)
    killed_at = TrainingRun.objects.get(pk=run.pk)
    assert killed_at.state == TrainingRun.State.RUNNING and 2 <= killed_at.step < STEPS, killed_at.step
    assert Sample.objects.filter(training_run_id=run.pk, trained_at__isnull=True).count() == SAMPLES

    time.sleep(VISIBILITY_TIMEOUT + 1)  # past the visibility timeout the message is delivered again
    worker = start_worker(tmp_path)
    try:
        wait_for(
            lambda: TrainingRun.objects.get(pk=run.pk).state != TrainingRun.State.RUNNING,
            240,
            "the run did not finish",
        )
    finally:
        stop(worker)

    run.refresh_from_db()
    assert run.state == TrainingRun.State.SUCCEEDED, run.error
    assert run.attempts >= 2 and run.resumed_from_step is not None
    assert killed_at.step <= run.resumed_from_step < STEPS  # resumed from the checkpoint, not from scratch
    assert [m["step"] for m in run.metrics] == list(range(1, STEPS + 1))  # each step exactly once
    trained = Counter(i for m in run.metrics for i in m["sample_ids"])
    assert trained == {s.pk: EPOCHS for s in claimed}  # every sample once per epoch: none twice, none lost
    assert set(
        Sample.objects.filter(training_run_id=run.pk, trained_at__isnull=False).values_list("pk", flat=True)
    ) == {s.pk for s in claimed}
    assert AdapterVersion.objects.filter(tenant=user.tenant).count() == 1
    assert (Path(run.adapter_version.artifact_path) / "adapter_model.safetensors").exists()
