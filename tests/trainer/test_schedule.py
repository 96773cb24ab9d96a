"""The pass scheduler: oldest-ready first, one batch per tenant per pass, tenants over budget skipped, one
base model per pass, bounded by tenants and tokens (the oldest batch always gets in)."""

import pytest

from workers.trainer.schedule import ReadyBatch, choose_pass


def batch(key, tenant, ready_at, tokens=100, group=("tiny", "cpu", "float32")):
    return ReadyBatch(key=key, tenant_id=tenant, ready_at=ready_at, tokens=tokens, group=group)


def keys(chosen):
    return [b.key for b in chosen]


def test_a_busy_tenant_gets_one_batch_per_pass_and_a_quiet_ones_old_batch_goes_first():
    ready = [batch(f"busy-{i}", "busy", 10 + i) for i in range(10)] + [batch("quiet", "quiet", 5)]
    assert keys(choose_pass(ready, within_budget=lambda t: True, max_tenants=8)) == ["quiet", "busy-0"]


def test_over_budget_tenants_wait_and_the_rest_fill_the_pass_oldest_first():
    ready = [batch("a", "A", 3), batch("hog", "H", 1), batch("b", "B", 2), batch("c", "C", 4)]
    asked = []

    def within(tenant):
        asked.append(tenant)
        return tenant != "H"

    assert keys(choose_pass(ready, within_budget=within, max_tenants=2)) == ["b", "a"]
    assert sorted(asked) == ["A", "B", "H"]  # asked once each, and not for C once the pass was full


def test_one_base_model_per_pass_and_a_token_bound_that_the_oldest_always_passes():
    other = ("qwen3-4b", "cuda", "bfloat16")
    ready = [batch("big", "A", 1, tokens=50_000), batch("x", "B", 2, group=other), batch("s", "C", 3, 10),
             batch("m", "D", 4, 5_000)]
    assert keys(choose_pass(ready, within_budget=lambda t: True, max_tenants=8, max_tokens=40_000)) == [
        "big"
    ]
    assert keys(choose_pass(ready, within_budget=lambda t: True, max_tenants=8, max_tokens=60_000)) == [
        "big", "s", "m"
    ]
    with pytest.raises(ValueError, match="max_tenants=0"):
        choose_pass(ready, within_budget=lambda t: True, max_tenants=0)
