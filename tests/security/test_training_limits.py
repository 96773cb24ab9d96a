"""Finding 3: one tenant's training overrides and runs cannot hold the shared GPU workers.

``{"epochs": 100000, "lora_r": 4096, "batch_size": 4096}`` is refused with the allowed range; a tenant over
its GPU-seconds or runs-per-hour budget gets a 429 while another tenant's run still starts; the kick serves
the least-used tenants first.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.core.exceptions import RateLimited, ValidationFailed
from clawhub.tenants.access import tenant_access
from clawhub.training import services
from clawhub.training.budget import gpu_seconds_used
from clawhub.training.models import TrainingRun, TrainingSettings
from tests.factories import make_user
from tests.keys.conftest import login
from tests.training.conftest import approved_samples

pytestmark = pytest.mark.django_db

ATTACK = {"epochs": 100000, "lora_r": 4096, "batch_size": 4096}


def access_of(user):
    return tenant_access(actor=user, tenant_id=user.tenant.pk)


def past_run(tenant, *, hours_ago: float, lasted_s: float) -> TrainingRun:
    started = timezone.now() - timedelta(hours=hours_ago)
    return TrainingRun.objects.create(
        tenant=tenant, backend="local", method="rl", base_model="tiny", state=TrainingRun.State.SUCCEEDED,
        created_at=started, started_at=started, finished_at=started + timedelta(seconds=lasted_s))


def test_oversized_overrides_are_refused_with_the_allowed_range(api_client, settings):
    settings.CLAWHUB_TRAIN_MAX_BATCH_SIZE = 256
    user = make_user()
    login(api_client, user)
    url = f"/api/training/tenants/{user.tenant.pk}/settings/"
    response = api_client.patch(url, {"overrides": {"epochs": 100000, "lora_r": 4096}}, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "epochs=100000: allowed range is 1–10" in message
    assert "lora_r=4096: allowed range is 1–128" in message
    batch = api_client.patch(url, {"batch_size": 4096}, format="json")
    assert batch.status_code == 400 and "1–256" in batch.json()["error"]["message"]
    assert not TrainingSettings.objects.filter(tenant=user.tenant, batch_size=4096).exists()
    # Within range is fine, and the operator can widen a bound.
    assert api_client.patch(url, {"overrides": {"epochs": 3, "lora_r": 64}}, format="json").status_code == 200
    settings.CLAWHUB_TRAIN_UPPER_BOUNDS = {"lora_r": 4096}
    assert api_client.patch(url, {"overrides": {"lora_r": 4096}}, format="json").status_code == 200


@pytest.mark.parametrize("overrides", [
    {"device": "cpu"}, {"device": "cuda:99"}, {"dtype": "float64"}, {"target_modules": ["lm_head"]},
    {"target_modules": [f"m{i}" for i in range(20000)]}, {"target_modules": "q_proj"}, {"seed": 1e30},
    {"seed": -1}, {"epochs": 2.5}, {"epochs": True}, {"lora_r": "8"},
    {"micro_batch_tokens": 10**9}, {"gradient_checkpointing": 1}, {"betas": [0.9]}, {"old_policy": "x"},
])
def test_overrides_take_only_what_a_tenant_may_set_each_bounded(api_client, overrides):
    user = make_user()
    login(api_client, user)
    url = f"/api/training/tenants/{user.tenant.pk}/settings/"
    response = api_client.patch(url, {"overrides": overrides}, format="json")
    assert response.status_code == 400, response.content
    assert "overrides" in str(response.json()["error"])
    assert not TrainingSettings.objects.filter(tenant=user.tenant).exclude(overrides={}).exists()


def test_operator_settings_stored_before_the_rule_are_ignored(db, settings):
    from clawhub.training.selectors import effective_config

    settings.CLAWHUB_TRAIN_DEFAULTS = {"device": "auto", "dtype": "auto"}
    user = make_user()
    ts = TrainingSettings.objects.create(tenant=user.tenant, overrides={
        "device": "cuda:99", "dtype": "float64", "target_modules": ["lm_head"], "lr": 1e-4})
    config = effective_config(ts)
    assert (config["device"], config["dtype"], config["lr"]) == ("auto", "auto", 1e-4)
    assert "target_modules" not in config


def test_overrides_stored_before_the_bounds_do_not_start_a_run(db, sent):
    user = make_user()
    approved_samples(user, 4)
    TrainingSettings.objects.create(tenant=user.tenant, overrides={"epochs": 100000})
    with pytest.raises(ValidationFailed, match="allowed range"):
        services.run_start(tenant=user.tenant, access=access_of(user))
    assert not TrainingRun.objects.exists() and sent.calls == []


def test_a_tenant_over_its_gpu_budget_is_refused_while_another_still_starts(api_client, settings, sent):
    settings.CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY = 3600
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 2
    hog, other = make_user(), make_user()
    approved_samples(hog, 2)
    approved_samples(other, 2)
    past_run(hog.tenant, hours_ago=3, lasted_s=2000)
    past_run(hog.tenant, hours_ago=2, lasted_s=1700)
    past_run(hog.tenant, hours_ago=30, lasted_s=3600)  # ended before the 24 h window
    assert gpu_seconds_used(tenant_id=hog.tenant.pk) == pytest.approx(3700, abs=1)

    login(api_client, hog)
    refused = api_client.post(f"/api/training/tenants/{hog.tenant.pk}/runs/start/")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "training_budget"
    assert "GPU-hours" in refused.json()["error"]["message"]
    assert 0 < int(refused["Retry-After"]) <= 24 * 3600
    login(api_client, other)
    assert api_client.post(f"/api/training/tenants/{other.tenant.pk}/runs/start/").status_code == 201
    queued = TrainingRun.objects.filter(state=TrainingRun.State.QUEUED)
    assert [r.tenant_id for r in queued] == [other.tenant.pk]
    # Staff may still start one by hand for the tenant.
    staff = make_user(is_staff=True)
    run = services.run_start(tenant=hog.tenant, access=tenant_access(actor=staff, tenant_id=hog.tenant.pk))
    assert run.state == TrainingRun.State.QUEUED


def test_runs_per_hour_are_capped(db, settings, sent):
    settings.CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR = 2
    user = make_user()
    approved_samples(user, 2)
    past_run(user.tenant, hours_ago=0.5, lasted_s=10)
    past_run(user.tenant, hours_ago=0.2, lasted_s=10)
    with pytest.raises(RateLimited) as err:
        services.run_start(tenant=user.tenant, access=access_of(user))
    assert err.value.data["budget"] == "runs_per_hour" and 0 < err.value.retry_after <= 1800


def test_the_kick_serves_the_least_used_tenants_first_and_skips_those_over_budget(db, settings, sent):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 2
    settings.CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY = 3600
    hog, busy, idle = make_user(), make_user(), make_user()
    for user in (hog, busy, idle):
        approved_samples(user, 2)
    past_run(hog.tenant, hours_ago=1, lasted_s=4000)
    past_run(busy.tenant, hours_ago=1, lasted_s=600)
    started = services.runs_kick()
    assert [TrainingRun.objects.get(pk=i).tenant_id for i in started] == [idle.tenant.pk, busy.tenant.pk]
