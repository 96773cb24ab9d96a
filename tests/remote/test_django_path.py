"""The Django path with each remote backend: approved samples -> a run on the tenant's (staff-chosen) remote
backend -> the train task builds the backend from settings and trains against the fake service -> a candidate
AdapterVersion with the downloaded PEFT weights, the run's remote ids on its page and in the API. Then what
must never happen to credentials, and the faults: each ends in the documented run state, with the samples back
in the pool when the run fails."""

import json
import logging
from pathlib import Path

import pytest
from django.db import connection

from clawhub.adapters.models import AdapterVersion
from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from clawhub.training import services, settings_services
from clawhub.training.models import TrainingRun
from tests.factories import make_user
from tests.remote.conftest import FIREWORKS_ACCOUNT, FIREWORKS_KEY, TINKER_KEY, recorded_samples
from tests.remote.wire import assert_datum, expected_wire
from tests.training.conftest import ApiAs, BrowserAs

BACKENDS = ["tinker", "fireworks"]
KEYS = {"tinker": TINKER_KEY, "fireworks": FIREWORKS_KEY}
KEY_SETTING = {"tinker": "CLAWHUB_TINKER_API_KEY", "fireworks": "CLAWHUB_FIREWORKS_API_KEY"}
SMALL = {"lora_r": 8, "lora_alpha": 16, "max_seq_len": 512, "lr": 3e-5}


def remote_run(user, backend: str, *, method: str = "rl") -> TrainingRun:
    """Site staff put the tenant on `backend` (only they may), then its owner starts a run."""
    staff = make_user(is_staff=True)
    settings_services.training_settings_update(
        access=tenant_access(actor=staff, tenant_id=user.tenant.pk),
        backend=backend,
        method=method,
        overrides=SMALL,
    )
    return services.run_start(tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk))


def in_pool(samples) -> bool:
    """Every sample is unclaimed and untrained: the next run may take it."""
    return Sample.objects.filter(
        pk__in=[s.pk for s in samples], training_run_id__isnull=True, trained_at__isnull=True
    ).count() == len(samples)


@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_remote_run_becomes_a_candidate_version_with_its_remote_ids(
    backend, remote_site, tokenizer, tiny_model_dir, sent
):
    from workers.tasks.training import train_run, train_sample

    fake = remote_site(backend)
    user = make_user()
    samples = recorded_samples(user, tokenizer, [1, -1, 1, 0])
    run = remote_run(user, backend)
    assert run.backend == backend

    outcome = train_run.apply(args=[run.pk]).get()
    assert outcome["outcome"] == "succeeded", outcome
    run.refresh_from_db()
    assert run.state == TrainingRun.State.SUCCEEDED and run.error == "" and run.step == 1

    # What the SDK put on the wire is the batch the rows describe (the reward-0 sample is not sent).
    [call] = fake.forward_backward_batches
    assert call.loss_fn == "ppo" and len(call.data) == 3
    for datum, sample in zip(call.data, samples[:3], strict=True):
        ts = train_sample(sample)
        n = len(ts.response_token_ids)
        assert datum.input_tokens[-(n - 1) :] == ts.response_token_ids[:-1]  # the recorded tokens, as sampled
        assert_datum(datum, expected_wire(tokenizer, ts, [float(ts.reward)] * n, ts.response_logprobs, 3))
    assert [o["learning_rate"] for o in fake.optim_steps] == [pytest.approx(3e-5)]
    assert {r.header("x-api-key") for r in fake.calls("/api/v1/optim_step")} == {KEYS[backend]}

    # The remote ids are stored on the run; the weights came back as a PEFT adapter of OUR base model.
    ids = run.remote_ids
    assert ids["backend"] == backend and ids["training_run_id"] and ids["state_path"]
    if backend == "tinker":
        assert ids["base_model"] == "tiny-qwen2" and ids["weights_path"].startswith("tinker://")
    else:
        assert ids["base_model"] == "accounts/fireworks/models/tiny-qwen2"
        assert ids["model"].startswith(f"accounts/{FIREWORKS_ACCOUNT}/models/clawhub-step-")
        assert ids["training_session"].startswith("ts-")
    version = run.adapter_version
    assert version.state == AdapterVersion.State.CANDIDATE and version.metrics["backend"] == backend
    artifact = Path(version.artifact_path)
    config = json.loads((artifact / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir) and config["r"] == 8
    assert (artifact / "adapter_model.safetensors").stat().st_size > 0
    assert json.loads((artifact / "remote.json").read_text())["training_run_id"] == ids["training_run_id"]
    assert Sample.objects.filter(training_run_id=run.pk, trained_at__isnull=False).count() == 4
    assert sent.named("clawhub.train.promote") == [("clawhub.train.promote", [version.pk], {}, {})]

    # The run's API and page show the backend and the remote ids to the tenant.
    body = ApiAs(user).get(f"/api/training/runs/{run.pk}/").json()
    assert body["backend"] == backend and body["remote_ids"] == ids
    page = BrowserAs(user).get(f"/training/runs/{run.pk}/").content.decode()
    assert backend in page and "Remote ids" in page and ids["training_run_id"] in page


@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_credentials_are_in_no_table_and_no_log_line(backend, remote_site, tokenizer, sent, caplog, capfd):
    from workers.tasks.training import train_run

    caplog.set_level(logging.DEBUG)  # every logger, SDKs and HTTP clients included, at their most verbose
    fake = remote_site(backend)
    secret = KEYS[backend]
    user = make_user()
    recorded_samples(user, tokenizer, [1, -1])
    run = remote_run(user, backend)
    fake.faults.fail_next("/api/v1/forward_backward", status=500, times=1)  # a retry is logged too
    assert train_run.apply(args=[run.pk]).get()["outcome"] == "succeeded"
    assert any(r.header("x-api-key") == secret for r in fake.requests)  # the key did go over the wire

    # Every column of every row of every table, as text.
    tables = connection.introspection.table_names()
    with connection.cursor() as cursor:
        hits = []
        for table in tables:
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT count(*) FROM {quoted} AS t WHERE t::text LIKE %s", [f"%{secret}%"])
            if cursor.fetchone()[0]:
                hits.append(table)
    assert "training_trainingrun" in tables and hits == []

    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    lines = [formatter.format(r) for r in caplog.records]  # messages, arguments and tracebacks
    assert any("retry" in line for line in lines)  # the capture did see the run's own logging
    assert not [line for line in lines if secret in line]
    out, err = capfd.readouterr()
    assert secret not in out and secret not in err


# ---------------------------------------------------------------------------------------------- faults


@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_credentials_fail_the_run_at_once_and_release_the_samples(
    backend, remote_site, tokenizer, settings, sent, caplog
):
    from workers.tasks.training import train_run

    fake = remote_site(backend)
    wrong = {"tinker": "tml-wrong-0123456789", "fireworks": "fw-wrong-0123456789"}[backend]
    setattr(settings, KEY_SETTING[backend], wrong)
    user = make_user()
    samples = recorded_samples(user, tokenizer, [1, -1, 1])
    run = remote_run(user, backend)

    assert train_run.apply(args=[run.pk]).get()["outcome"] == "failed"
    run.refresh_from_db()
    assert run.state == TrainingRun.State.FAILED and run.attempts == 1  # an auth error is not retried
    assert f"{backend} refused the credentials" in run.error and "check the API key" in run.error
    assert wrong not in run.error + caplog.text
    assert fake.optim_steps == [] and not AdapterVersion.objects.exists()
    assert in_pool(samples)
    # ... and the next run claims them.
    setattr(settings, KEY_SETTING[backend], KEYS[backend])
    again = services.run_start(tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk))
    assert sorted(again.sample_ids) == sorted(s.pk for s in samples)


@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_500_then_success_completes_the_run(backend, remote_site, tokenizer, sent):
    from workers.tasks.training import train_run

    fake = remote_site(backend)
    user = make_user()
    samples = recorded_samples(user, tokenizer, [1, -1])
    run = remote_run(user, backend)
    fake.faults.fail_next("/api/v1/forward_backward", status=500, times=1)
    fake.faults.fail_next("/api/v1/optim_step", status=503, times=1)

    assert train_run.apply(args=[run.pk]).get()["outcome"] == "succeeded"
    run.refresh_from_db()
    assert run.state == TrainingRun.State.SUCCEEDED and run.attempts == 1  # retried inside the call budget
    assert ("status", "/api/v1/forward_backward") in fake.faults.injected
    assert ("status", "/api/v1/optim_step") in fake.faults.injected
    assert len(fake.optim_steps) == 1  # the step was retried, not applied twice
    assert run.adapter_version is not None
    assert Sample.objects.filter(pk__in=[s.pk for s in samples], trained_at__isnull=False).count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timeout_beyond_the_retry_budget_fails_the_run_and_releases_the_samples(
    backend, remote_site, tokenizer, settings, sent
):
    from workers.tasks.training import train_run

    settings.CLAWHUB_REMOTE_CALL_TIMEOUT = 1.5
    fake = remote_site(backend)
    user = make_user()
    samples = recorded_samples(user, tokenizer, [1, -1])
    run = remote_run(user, backend)
    fake.faults.hang("/api/v1/optim_step", seconds=60)

    assert train_run.apply(args=[run.pk]).get()["outcome"] == "failed"
    run.refresh_from_db()
    # The call budget (2 tries of 1.5 s) was spent twice: the first delivery, then one re-run of the run
    # (CLAWHUB_REMOTE_RUN_RETRIES = 1) resumed from its remote checkpoint.
    assert run.state == TrainingRun.State.FAILED and run.attempts == 2
    assert f"{backend}: step 1 did not succeed after 2 attempts of up to 1.5s each" in run.error
    assert run.remote_ids["backend"] == backend and run.remote_ids["training_run_id"]  # kept for support
    assert ("hang", "/api/v1/optim_step") in fake.faults.injected
    assert not AdapterVersion.objects.exists()
    assert in_pool(samples)
