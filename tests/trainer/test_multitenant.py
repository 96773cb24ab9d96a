"""A multi-tenant pass over tenants A, B and C (different objectives, step plans and LoRA ranks; C continues
a parent version with its optimizer state) leaves every adapter and its AdamW moments equal to training each
tenant alone (float64 on the tiny model); one tenant's failing callback drops only that tenant."""

import pytest
import torch

from tests.trainer.conftest import sampled_batch
from tests.trainer.test_local import started
from workers.trainer import checkpoint as ckpt
from workers.trainer import resident
from workers.trainer.backend import TrainConfig
from workers.trainer.multitenant import MultiTenantPass, TenantJob

CONFIGS = {
    "A": {"method": "rl", "lora_r": 4, "lora_alpha": 8},
    "B": {"method": "combine", "mini_batches": 2, "lora_r": 8, "lora_alpha": 16, "seed": 1},
    "C": {"method": "rl", "epochs": 2},
}


@pytest.fixture(autouse=True)
def fresh_resident():
    resident.reset()
    yield
    resident.reset()


def state_of(backend) -> tuple[dict, dict]:
    """(adapter weights, AdamW state) by adapter-independent parameter name."""
    named = ckpt._trainable(backend.model, backend.adapter)
    weights = {n: p.detach().clone() for n, p in named}
    moments = {n: backend.optimizer.state[p] for n, p in named}
    return weights, moments


def test_a_pass_over_three_tenants_equals_training_each_alone(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batches = {
        key: sampled_batch(probe, prompts[i * 6 : i * 6 + 6], seed=40 + i, first_id=100 * i)
        for i, key in enumerate("ABC")
    }
    common = {"dtype": "float64", "lr": 1e-3, "micro_batch_tokens": 600, "pack_row_tokens": 250}
    # C continues a parent version (adapter + optimizer state), as most runs do.
    parent_run = started(tiny_model_dir, tmp_path / "parent", **common, **CONFIGS["C"])
    parent_run.train(sampled_batch(probe, prompts[18:24], seed=50, first_id=900))
    parent = parent_run.export_adapter(str(tmp_path / "adapters" / "c-v1"))
    parents = {"A": None, "B": None, "C": parent}

    alone = {}
    for key, config in CONFIGS.items():
        backend = started(tiny_model_dir, tmp_path / f"alone-{key}", parent=parents[key], **common, **config)
        result = backend.train(batches[key])
        alone[key] = (result, *state_of(backend))

    jobs = [
        TenantJob(key, TrainConfig(device="cpu", **common, **config), str(tmp_path / f"pass-{key}"),
                  batches[key], parents[key])
        for key, config in CONFIGS.items()
    ]
    with MultiTenantPass(str(tiny_model_dir), jobs) as mt:
        outcomes = mt.train()
        together = {o.key: (o.result, *state_of(o.backend)) for o in outcomes}
        assert all(o.error is None for o in outcomes)
        # The joint steps really were shared: step 1 of all three in one pass, and B's two mini-batches and
        # C's two epochs kept the pass going after A was done.
        assert [len(o.steps) for o in outcomes] == [1, 2, 2]
        exported = outcomes[2].backend.export_adapter(str(tmp_path / "adapters" / "c-v2"))
        assert (tmp_path / "adapters" / "c-v2" / "adapter_model.safetensors").exists()

    for key in CONFIGS:
        result_alone, weights_alone, moments_alone = alone[key]
        result, weights, moments = together[key]
        assert result.steps == result_alone.steps
        assert result.trained_sample_ids == result_alone.trained_sample_ids
        for m_alone, m in zip(result_alone.metrics, result.metrics, strict=True):
            assert abs(m_alone.loss - m.loss) < 1e-10 and abs(m_alone.grad_norm - m.grad_norm) < 1e-10, key
        assert set(weights) == set(weights_alone) and weights, key
        for name, w in weights_alone.items():
            assert torch.allclose(weights[name], w, atol=1e-12), (key, name)
            assert int(moments[name]["step"]) == int(moments_alone[name]["step"]), (key, name)
            assert torch.allclose(moments[name]["exp_avg"], moments_alone[name]["exp_avg"], atol=1e-14)
            assert torch.allclose(moments[name]["exp_avg_sq"], moments_alone[name]["exp_avg_sq"], atol=1e-18)
    assert alone["C"][0].optimizer_resumed_at == together["C"][0].optimizer_resumed_at == 2
    # The pass's export loads as a continuation like any other version's.
    follow = started(tiny_model_dir, tmp_path / "follow", parent=exported, **common, **CONFIGS["C"])
    assert follow.optimizer_resumed_at == 4
    assert resident.stats()["loads"] == 1


def test_a_failing_tenant_is_dropped_and_the_others_finish(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    common = {"device": "cpu", "lr": 1e-3, "method": "rl", "mini_batches": 2}

    def cancel(_metrics):
        raise RuntimeError("cancelled")

    jobs = [
        TenantJob(key, TrainConfig(**common), str(tmp_path / key),
                  sampled_batch(probe, prompts[i * 4 : i * 4 + 4], seed=60 + i, first_id=10 * i),
                  on_step=cancel if key == "B" else None)
        for i, key in enumerate("ABC")
    ]
    with MultiTenantPass(str(tiny_model_dir), jobs) as mt:
        outcomes = mt.train()
    assert [o.error for o in outcomes] == [None, "RuntimeError: cancelled", None]
    assert outcomes[0].result.steps == outcomes[2].result.steps == 2 and outcomes[1].steps == [1]
    base = resident._current.model
    assert not resident._adapter_layers(base)  # every adapter of the pass detached
