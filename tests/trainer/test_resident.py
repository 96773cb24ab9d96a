"""The resident base: runs of several tenants in one process load the base once, attach and detach their
adapters without changing it, train exactly as a run with a private copy would, and a failed run leaves
nothing behind (its adapter freed, the next run fine); another base model reloads once."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.trainer.conftest import sampled_batch
from tests.trainer.test_local import adapter_weights, started
from workers.trainer import resident
from workers.trainer.backend import TrainConfig
from workers.trainer.forward import load_pretrained
from workers.trainer.local import LocalBackend

IDS = torch.tensor([[1, 5, 9, 200, 31, 7]])


@pytest.fixture(autouse=True)
def fresh_resident():
    resident.reset()
    yield
    resident.reset()


def resident_run(tiny_model_dir, workdir, parent=None, loader=load_pretrained, **config) -> LocalBackend:
    backend = LocalBackend(model_loader=loader, resident=True)
    backend.start(
        str(tiny_model_dir), parent, TrainConfig(device="cpu", **{"lr": 1e-3, "method": "rl", **config}),
        str(workdir),
    )
    return backend


def base_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


class Boom(Exception):
    pass


def test_tenants_share_one_load_and_train_as_with_a_private_copy(tiny_model_dir, tmp_path, prompts):
    original = base_logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    probe = started(tiny_model_dir, tmp_path / "probe")
    batches = [
        sampled_batch(probe, prompts[i * 6 : i * 6 + 6], seed=20 + i, first_id=100 * i) for i in range(2)
    ]

    a = resident_run(tiny_model_dir, tmp_path / "a")
    base = resident._current.model
    hooks = len(base.get_input_embeddings()._forward_hooks)
    a.train(batches[0])
    a.export_adapter(str(tmp_path / "adapters" / "a"))
    a.close()
    assert not resident._adapter_layers(base) and torch.equal(base_logits(base), original)

    # A failing run (the on_step callback raises after the first checkpoint, as a cancelled run does).
    failing = resident_run(tiny_model_dir, tmp_path / "failing", micro_batch_size=1, grad_accum=1)

    def fail(_metrics):
        raise Boom()

    with pytest.raises(Boom):
        failing.train(batches[1], on_step=fail)
    failing.close()
    del failing

    # Tenant B after the failure: same base object, still one load, the failed run's LoRA freed.
    b = resident_run(tiny_model_dir, tmp_path / "b", parent=str(tmp_path / "adapters" / "a"))
    assert b.runtime["resident"]["loads"] == 1 and b.runtime["resident"]["runs_on_this_load"] == 3
    assert b.runtime["resident"]["previous_adapter_freed"] is True
    assert b.optimizer_resumed_at == 1  # the parent's optimizer state came along
    assert b.model.get_base_model() is base
    b.train(batches[1])
    trained_resident = adapter_weights(b)
    b.close()
    assert torch.equal(base_logits(base), original)
    assert len(base.get_input_embeddings()._forward_hooks) == hooks  # no hook left per attach

    # The same run with a private copy of the base: identical adapter.
    parent = str(tmp_path / "adapters" / "a")
    private = started(tiny_model_dir, tmp_path / "private", parent=parent, method="rl")
    private.train(batches[1])
    for name, w in adapter_weights(private).items():
        assert torch.equal(w, trained_resident[name]), name


def test_another_base_model_reloads_once(tiny_model_dir, tmp_path):
    other = tmp_path / "other-base"
    shutil.copytree(tiny_model_dir, other)
    for base_dir, workdir in ((tiny_model_dir, "1"), (tiny_model_dir, "2"), (other, "3"), (other, "4")):
        backend = resident_run(base_dir, tmp_path / workdir)
        backend.close()
    stats = resident.stats()
    assert stats["loads"] == 2 and stats["evictions"] == 1 and stats["runs_on_this_load"] == 2


def test_a_run_failing_before_its_adapter_exists_leaves_the_base_usable(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError):
        resident_run(tiny_model_dir, tmp_path / "bad", target_modules=("no_such_module",))
    base = resident._current.model
    assert not resident._adapter_layers(base)
    resident.release(resident._current, None)  # what close() does for a backend whose start() raised
    ok = resident_run(tiny_model_dir, tmp_path / "ok")
    assert resident.stats()["loads"] == 1 and ok.model.get_base_model() is base
    ok.close()


def test_a_saved_adapter_is_keyed_as_peft_saves_it(tiny_model_dir, tmp_path):
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    from workers.trainer import checkpoint as ckpt

    backend = resident_run(tiny_model_dir, tmp_path / "run")
    ckpt.save_adapter(backend.model, tmp_path / "ours")
    ours = load_file(tmp_path / "ours" / "adapter_model.safetensors")
    theirs = get_peft_model_state_dict(backend.model, adapter_name="default")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    backend.close()
