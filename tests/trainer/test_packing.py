"""Real-size readiness on the tiny model: chunked log-probs equal the full-vocabulary computation, packed
token-budget micro-batches give the loss and gradients of padded ones (float64), activation checkpointing
changes nothing but memory, and the defaults are the real-size ones."""

import torch

from tests.trainer.conftest import sampled_batch
from tests.trainer.test_local import adapter_weights, started
from workers.trainer.backend import TrainConfig
from workers.trainer.batching import collate, collate_packed, encode_batch, token_budget_groups
from workers.trainer.forward import resolve_gradient_checkpointing, response_stats
from workers.trainer.losses import chunked_token_logprobs, token_logprobs


def test_chunked_logprobs_equal_the_full_computation_values_and_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False).double()
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    full = token_logprobs(head(hidden), targets)
    (full * torch.linspace(-1, 1, 37, dtype=torch.float64)).sum().backward()
    expected_grad, hidden.grad = hidden.grad.clone(), None
    logp, entropy, top = chunked_token_logprobs(hidden, targets, head, chunk=8, topk=3)
    (logp * torch.linspace(-1, 1, 37, dtype=torch.float64)).sum().backward()
    assert logp.dtype == torch.float64 and torch.allclose(logp, full, atol=1e-12)
    assert torch.allclose(hidden.grad, expected_grad, atol=1e-12)
    probs = torch.softmax(head(hidden).double(), -1)
    assert torch.allclose(entropy, -(probs * probs.log()).sum(-1), atol=1e-12)
    assert torch.equal(top, torch.topk(head(hidden), 3, dim=-1).indices)
    with torch.no_grad():  # no gradient: the same numbers without the per-chunk checkpoint
        again, _, _ = chunked_token_logprobs(hidden, targets, head, chunk=5)
    assert torch.allclose(again, logp)


def test_token_budget_groups_keep_order_and_put_a_long_item_alone():
    assert token_budget_groups([3, 3, 3, 10, 1, 1], 6) == [[0, 1], [2], [3], [4, 5]]
    assert token_budget_groups([], 6) == []


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def test_a_packed_row_gives_the_loss_and_gradients_of_padded_rows(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path / "run", dtype="float64", lr=1e-3)
    # The LoRA B matrices start at 0; move them so the adapter's gradients depend on the context.
    with torch.no_grad():
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    batch = sampled_batch(backend, prompts[:6], seed=3)
    encoded, _ = encode_batch(backend.tokenizer, batch, max_seq_len=4096)
    sequences = [(e.prompt_ids, e.response_ids) for e in encoded]
    lengths = {len(p) + len(r) for p, r in sequences}
    assert len(lengths) > 1  # different lengths: the padded rows really are padded
    weights = torch.linspace(0.5, 1.5, 6, dtype=torch.float64)[:, None]
    results = []
    for batch_ in (collate(sequences, pad_id=0), collate(sequences, pad_id=0, padding_side="left"),
                   collate_packed(sequences, pad_id=0)):
        backend.model.zero_grad(set_to_none=True)
        stats = response_stats(backend.model, batch_, chunk=7)
        loss = (stats.logp * batch_.mask * weights).sum()
        loss.backward()
        results.append((stats.logp * batch_.mask, float(loss.detach()), _lora_grads(backend.model)))
    packed = collate_packed(sequences, pad_id=0)
    assert packed.input_ids.shape == (1, sum(len(p) + len(r) for p, r in sequences))
    assert packed.attention_mask is None and (packed.position_ids[0] == 0).sum() == 6
    reference_logp, reference_loss, reference_grads = results[0]
    for logp, loss, grads in results[1:]:
        assert torch.allclose(logp, reference_logp, atol=1e-10)
        assert abs(loss - reference_loss) < 1e-9
        assert set(grads) == set(reference_grads) and len(grads) > 0
        for name, grad in grads.items():
            assert torch.allclose(grad, reference_grads[name], atol=1e-10), name


def test_a_step_on_packed_micro_batches_equals_a_step_on_padded_ones(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batch = sampled_batch(probe, prompts[:8], seed=4)
    common = {"dtype": "float64", "method": "combine", "lr": 1e-3}
    padded = started(tiny_model_dir, tmp_path / "padded", micro_batch_tokens=0, micro_batch_size=3, **common)
    # A budget of ~2 samples per row: several packed micro-batches, accumulated.
    packed = started(tiny_model_dir, tmp_path / "packed", micro_batch_tokens=200, **common)
    r1, r2 = padded.train(batch), packed.train(batch)
    assert abs(r1.metrics[0].loss - r2.metrics[0].loss) < 1e-9
    assert abs(r1.metrics[0].grad_norm - r2.metrics[0].grad_norm) < 1e-9
    assert r2.metrics[0].entropy > 0
    w1, w2 = adapter_weights(padded), adapter_weights(packed)
    assert any((w != 0).any() for n, w in w1.items() if "lora_B" in n)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-12), name


def test_activation_checkpointing_changes_nothing_but_memory(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batch = sampled_batch(probe, prompts[:4], seed=5)
    plain = started(tiny_model_dir, tmp_path / "plain", dtype="float64", gradient_checkpointing=False)
    checkpointed = started(tiny_model_dir, tmp_path / "ckpt", dtype="float64", gradient_checkpointing=True)
    assert checkpointed.model.get_base_model().is_activation_checkpointing
    r1, r2 = plain.train(batch), checkpointed.train(batch)
    assert abs(r1.metrics[0].loss - r2.metrics[0].loss) < 1e-10
    w1, w2 = adapter_weights(plain), adapter_weights(checkpointed)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-12), name


def test_real_size_defaults():
    cfg = TrainConfig()
    assert cfg.max_seq_len == 32768 and cfg.micro_batch_tokens == 8192
    assert cfg.gradient_checkpointing is None
    assert resolve_gradient_checkpointing(None, torch.device("cuda")) is True
    assert resolve_gradient_checkpointing(None, torch.device("cpu")) is False
    assert resolve_gradient_checkpointing(False, torch.device("cuda")) is False


def test_packed_rows_of_a_bounded_length_give_the_same_log_probs(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path / "run", dtype="float64")
    batch = sampled_batch(backend, prompts[:6], seed=6)
    encoded, _ = encode_batch(backend.tokenizer, batch, max_seq_len=4096)
    sequences = [(e.prompt_ids, e.response_ids) for e in encoded]
    longest = max(len(p) + len(r) for p, r in sequences)
    one_row = collate_packed(sequences, pad_id=0)
    rows = collate_packed(sequences, pad_id=0, row_tokens=longest + 5)
    assert rows.input_ids.shape[0] > 1 and rows.input_ids.shape[1] < one_row.input_ids.shape[1]
    with torch.no_grad():
        a = response_stats(backend.model, one_row).logp
        b = response_stats(backend.model, rows).logp
    assert torch.allclose(a * one_row.mask, b * rows.mask, atol=1e-10)
    # Each sample's span covers exactly its own tokens, in the flattened (rows x length) order.
    flat = rows.input_ids.flatten().tolist()
    for (start, end), (prompt, response) in zip(rows.sample_spans(), sequences, strict=True):
        assert flat[start:end] == prompt + response
    padded = collate(sequences, pad_id=0, padding_side="left")
    flat = padded.input_ids.flatten().tolist()
    for (start, end), (prompt, response) in zip(padded.sample_spans(), sequences, strict=True):
        assert flat[start:end] == prompt + response
