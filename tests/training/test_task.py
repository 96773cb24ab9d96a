"""The train task in this process with the LOCAL backend on the tiny model: a run produces an adapter version
whose weights load in peft, its samples are trained once, and a finished run is not run again."""

import json
from pathlib import Path

import pytest

from clawhub.adapters.models import AdapterVersion
from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from clawhub.training import services
from clawhub.training.models import TrainingRun, TrainingSettings
from tests.factories import make_user
from tests.training.conftest import approved_samples

TINY = Path(__file__).resolve().parents[2] / "models" / "tiny-qwen2"
FAST = {"micro_batch_size": 1, "grad_accum": 2, "max_seq_len": 256, "lr": 1e-3, "lora_r": 4, "lora_alpha": 8}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def train_dirs(settings, tmp_path):
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    settings.CLAWHUB_ADAPTER_DIR = str(tmp_path / "adapters")
    settings.CLAWHUB_TRAIN_BASE_MODEL = str(TINY)
    return tmp_path


def test_train_task_produces_a_candidate_that_loads_in_peft(db, sent, train_dirs):
    from workers.tasks.training import train_run

    user = make_user()
    samples = approved_samples(user, 4, reward=1) + approved_samples(user, 2, reward=-1)
    TrainingSettings.objects.create(tenant=user.tenant, method="rl", overrides=FAST)
    run = services.run_start(tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk))

    outcome = train_run.apply(args=[run.pk]).get()
    assert outcome["outcome"] == "succeeded", outcome
    run.refresh_from_db()
    assert run.state == TrainingRun.State.SUCCEEDED and run.attempts == 1 and run.error == ""
    assert run.step == 3 and [m["step"] for m in run.metrics] == [1, 2, 3]  # 6 samples, 2 per step
    assert run.tokens > 0 and run.loss is not None and run.mean_reward is not None
    version = run.adapter_version
    assert version.state == AdapterVersion.State.CANDIDATE and version.version == 1 and version.parent is None
    assert Path(version.artifact_path) == train_dirs / "adapters" / f"t{user.tenant.pk}" / "v1"
    assert json.loads((Path(version.artifact_path) / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(TINY)
    # Every claimed sample is trained exactly once and out of the pool.
    assert set(Sample.objects.filter(trained_at__isnull=False).values_list("pk", flat=True)) == {
        s.pk for s in samples
    }
    assert sent.named("clawhub.train.promote") == [("clawhub.train.promote", [version.pk], {}, {})]

    # The exported adapter loads in peft on the base model and changes its output.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = base(ids).logits
        model = PeftModel.from_pretrained(base, version.artifact_path)
        after = model(ids).logits
    assert not torch.allclose(before, after)

    # Idempotent: a finished run is not run again, and no second version appears; since the promotion never
    # started (the worker may have died before sending it), the redelivery sends it again.
    assert train_run.apply(args=[run.pk]).get()["outcome"] == "promote_resent"
    assert len(sent.named("clawhub.train.promote")) == 2
    assert AdapterVersion.objects.count() == 1
    AdapterVersion.objects.filter(pk=version.pk).update(state=AdapterVersion.State.ACTIVE)
    assert train_run.apply(args=[run.pk]).get()["outcome"] == "not_open"


def test_next_run_continues_the_active_version(db, sent, train_dirs):
    from workers.tasks.training import train_run

    user = make_user()
    TrainingSettings.objects.create(tenant=user.tenant, method="rl", overrides=FAST)
    access = tenant_access(actor=user, tenant_id=user.tenant.pk)
    approved_samples(user, 2)
    first = services.run_start(tenant=user.tenant, access=access)
    train_run.apply(args=[first.pk]).get()
    first.refresh_from_db()
    AdapterVersion.objects.filter(pk=first.adapter_version_id).update(state=AdapterVersion.State.ACTIVE)
    approved_samples(user, 2, reward=-1)
    second = services.run_start(tenant=user.tenant, access=access)
    assert second.parent_version_id is None  # resolved when it starts training, not at claim time
    assert train_run.apply(args=[second.pk]).get()["outcome"] == "succeeded"
    second.refresh_from_db()
    assert second.parent_version_id == first.adapter_version_id and second.parent_resolved_at is not None
    # Each trained sample says where pi_old came from and how far behind the trained version its server was:
    # the first run's turns were served by the base and trained from it (lag 0); the second run's too, but
    # it trains v1 (lag 1). These turns carry no log-probs, so pi_old was recomputed.
    first.refresh_from_db()
    assert {n["version_lag"] for n in first.sample_notes.values()} == {0}
    assert len(second.sample_notes) == 2 and {n["version_lag"] for n in second.sample_notes.values()} == {1}
    assert all(n["pi_old"].startswith("recomputed: ") for n in second.sample_notes.values())
    # The run restored the parent's AdamW state (the first run took one optimizer step).
    assert second.adapter_version.metrics["optimizer_resumed_at"] == 1
    assert (
        second.adapter_version.version == 2 and second.adapter_version.parent_id == first.adapter_version_id
    )


def test_a_run_whose_trainer_fails_gives_its_samples_back(db, sent, train_dirs, settings):
    from workers.tasks.training import train_run

    settings.CLAWHUB_TRAIN_BASE_MODEL = str(train_dirs / "no-such-model")
    user = make_user()
    approved_samples(user, 2)
    run = services.run_start(tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk))
    assert train_run.apply(args=[run.pk]).get()["outcome"] == "failed"
    run.refresh_from_db()
    assert run.state == TrainingRun.State.FAILED and "no-such-model" in run.error
    assert Sample.objects.filter(training_run_id__isnull=True, trained_at__isnull=True).count() == 2
    assert not AdapterVersion.objects.exists()


def test_tool_calls_are_written_back_as_the_model_wrote_them():
    from workers.tasks.training import response_text

    message = {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "ls", "arguments": '{"path": "/tmp"}'}}]}
    expected = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call>'
    assert response_text(message) == expected
    assert response_text({"content": "Plain answer."}) == "Plain answer."


def test_version_lag_counts_versions_along_the_trained_lineage(db):
    from clawhub.adapters.selectors import version_lag, version_lineage

    user = make_user()
    v1 = AdapterVersion.objects.create(tenant=user.tenant, version=1, artifact_path="/a/v1")
    v2 = AdapterVersion.objects.create(tenant=user.tenant, version=2, parent=v1, artifact_path="/a/v2")
    v3 = AdapterVersion.objects.create(tenant=user.tenant, version=3, parent=v2, artifact_path="/a/v3")
    rolled_back_from = AdapterVersion.objects.create(
        tenant=user.tenant, version=4, parent=v3, artifact_path="/a/v4"
    )
    lineage = version_lineage(version=v3)
    assert lineage == [v3.pk, v2.pk, v1.pk]
    assert [version_lag(served_id=v.pk, lineage=lineage) for v in (v3, v2, v1)] == [0, 1, 2]
    assert version_lag(served_id=None, lineage=lineage) == 3  # the base model, behind every version
    assert version_lag(served_id=rolled_back_from.pk, lineage=lineage) is None
    assert version_lag(served_id=None, lineage=version_lineage(version=None)) == 0


def test_a_train_sample_carries_how_its_reply_was_sampled_and_its_lag(db):
    from workers.tasks.training import train_sample

    user = make_user()
    sample = approved_samples(user, 1)[0]
    turn = sample.turn
    version = AdapterVersion.objects.create(tenant=user.tenant, version=1, artifact_path="/a/v1")
    turn.adapter_version, turn.token_ids, turn.logprobs = version, [5, 6], [-0.5, -0.25]
    turn.sampling = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "logprobs_mode": "processed_logprobs",
                     "defaulted": []}
    turn.save()
    got = train_sample(sample, lineage=[version.pk])
    assert (got.temperature, got.top_p, got.top_k, got.logprobs_mode) == (0.6, 0.95, 20, "processed_logprobs")
    assert got.version_lag == 0 and got.response_logprobs == [-0.5, -0.25]

    # A turn recorded before its sampling was: temperature 1 and an unknown mode (pi_old recomputed later).
    turn.sampling = {}
    turn.save()
    old = train_sample(sample, lineage=[])
    assert (old.temperature, old.logprobs_mode, old.version_lag) == (1.0, "", None)
    assert old.recorded_logprobs_problem() == "unknown log-probs mode"


def test_recorded_logprobs_of_penalised_sampling_are_not_pi_old(db):
    from workers.tasks.training import train_sample

    user = make_user()
    sample = approved_samples(user, 1)[0]
    turn = sample.turn
    turn.request = {**turn.request, "presence_penalty": 0.5, "logit_bias": {"7": 5}}
    turn.token_ids, turn.logprobs = [5, 6], [-0.5, -0.25]
    turn.save()
    got = train_sample(sample)
    assert got.response_logprobs is None
    assert "sampled with presence_penalty, logit_bias" in got.source


def test_a_pass_takes_queued_runs_only_within_its_token_bound(db, sent, settings):
    """CLAWHUB_TRAIN_PASS_TOKENS: the task's own batch goes in, then other tenants' queued runs oldest first
    while the pass's prompt + reply tokens stay within the bound; a run that does not fit stays queued for
    a next pass, and a smaller, younger one that fits is still taken."""
    from clawhub.conversations.models import Turn
    from workers.tasks.training import _pass_companions

    settings.CLAWHUB_TRAIN_PASS_TENANTS = 8
    settings.CLAWHUB_TRAIN_PASS_TOKENS = 1000
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    runs = {}
    for name, tokens in [("own", 400), ("big", 500), ("too_big", 300), ("small", 100)]:
        user = make_user()
        samples = approved_samples(user, 2)
        Turn.objects.filter(sample__in=samples).update(prompt_tokens=tokens // 2 - 10, completion_tokens=10)
        runs[name] = services.run_start(tenant=user.tenant, access=tenant_access(actor=user,
                                                                                 tenant_id=user.tenant.pk))
    # As the train task leaves its own run before it looks for companions.
    TrainingRun.objects.filter(pk=runs["own"].pk).update(state=TrainingRun.State.RUNNING, attempts=1)
    companions = _pass_companions(runs["own"], task_id="pass-1")
    assert sorted(r.pk for r in companions) == sorted([runs["big"].pk, runs["small"].pk])  # 400+500+100
    left = TrainingRun.objects.get(pk=runs["too_big"].pk)
    assert left.state == TrainingRun.State.QUEUED and not (left.remote_ids or {}).get("pass_task")
    # Its own task trains it next (in a pass of its own here: every other run is taken).
    assert _pass_companions(left, task_id="pass-2") == []
    # A redelivered task finds the runs it took, and the bound still keeps the other one out.
    again = _pass_companions(runs["own"], task_id="pass-1")
    assert sorted(r.pk for r in again) == sorted(r.pk for r in companions)
    assert TrainingRun.objects.get(pk=left.pk).state == TrainingRun.State.QUEUED
