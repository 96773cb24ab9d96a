"""The grouped per-span LoRA layer: peft's maths token by token (outputs and every gradient equal to the
per-span reference in float64, with tenants of two ranks, spans cut across blocks, and tokens of the base
alone), and a kernel count that does not grow with the number of spans or tenants (torch.profiler)."""

import torch

from workers.trainer import lora_bench
from workers.trainer.lora_spans import segment_lora


def _forward_backward(model, x, spans, kernel):
    model.zero_grad(set_to_none=True)
    x.grad = None
    with segment_lora(model, spans, kernel=kernel):
        out = model(x)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def test_grouped_equals_the_per_span_reference_in_float64():
    model = lora_bench.lora_layer(3, d_in=24, d_out=20, rank=4).double()
    # A fourth tenant of another rank: its own group.
    from peft import LoraConfig

    model.add_adapter("t3", LoraConfig(r=2, lora_alpha=8, target_modules=["proj"]))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            torch.nn.init.normal_(p, std=0.1)
    # Spans longer than a block, a one-token span, a gap (row padding) and the base alone.
    spans = [("t0", 0, 40), ("t1", 40, 41), ("t3", 41, 75), ("t2", 80, 200), ("t0", 200, 230),
             (None, 230, None)]
    x = torch.randn(260, 24, dtype=torch.float64, requires_grad=True)
    out, x_grad, grads = _forward_backward(model, x, spans, "grouped")
    ref_out, ref_x_grad, ref_grads = _forward_backward(model, x, spans, "per_span")
    assert torch.allclose(out, ref_out, rtol=0, atol=1e-13)
    assert torch.allclose(x_grad, ref_x_grad, rtol=0, atol=1e-13)
    assert set(grads) == set(ref_grads) and any("t3" in n for n in grads)
    for name, grad in ref_grads.items():
        assert torch.allclose(grads[name], grad, rtol=0, atol=1e-12), name
    # No delta where no adapter runs: the gap and the base-alone tokens get the base's output.
    base = model.get_base_model().proj.base_layer(x).detach()
    assert torch.equal(out[75:80], base[75:80]) and torch.equal(out[230:], base[230:])
    assert not torch.allclose(out[:75], base[:75])


def test_the_grouped_kernel_count_does_not_grow_with_spans_or_tenants():
    counts = {}
    for tenants, per_tenant in [(2, 1), (2, 4), (8, 1), (8, 4)]:
        model = lora_bench.lora_layer(tenants, d_in=16, d_out=16, rank=2)
        spans = lora_bench.round_robin_spans(tenants, per_tenant, 256)
        x = torch.randn(256, 16, requires_grad=True)
        counts[tenants, per_tenant] = {k: lora_bench.kernel_ops(model, x, spans, k)
                                       for k in ("grouped", "per_span")}
    assert len({c["grouped"] for c in counts.values()}) == 1, counts
    # The reference's loop grows with the spans: what the grouped layer removes.
    assert counts[8, 4]["per_span"] > 3 * counts[8, 1]["per_span"] > 3 * counts[2, 1]["per_span"], counts
    assert counts[8, 4]["per_span"] > 5 * counts[8, 4]["grouped"], counts


def test_the_lora_kernel_benchmark_prints_both_implementations_side_by_side():
    lines = []
    rows = lora_bench.bench_lora_kernels(tenants=(2,), spans_per_tenant=(1, 2), tokens=64, d_in=16, d_out=16,
                                         rank=2, repeats=1, log=lines.append)
    assert len(lines) == len(rows) == 2 and [r["spans"] for r in rows] == [2, 4]
    for row in rows:
        assert set(row["ops_per_layer"]) == set(row["ms_per_layer"]) == {"per_span", "grouped", "base_only"}
        assert row["ops_ratio_per_span_over_grouped"] > 0 and row["time_ratio_per_span_over_grouped"] > 0
