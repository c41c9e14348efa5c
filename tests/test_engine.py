"""The fused pass (no recording) performs the recorded pass's float operations: the same bits (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin import Qwen3, ReductionOrder

ORDERS = [ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
def test_fused_pass_equals_recorded_pass(micro_model_path, order):
    model = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False)
    tokens = list(range(3, 15))
    fused = model.forward(tokens, 0, order)
    model.reset()
    record = {}
    recorded = model.forward(tokens, 0, order, record=record)
    np.testing.assert_array_equal(fused.view(np.uint32), recorded.view(np.uint32))
    np.testing.assert_array_equal(record["output"].view(np.uint32), recorded.view(np.uint32))
    # and the cache the fused pass left holds the recorded pass's keys (the fused KV store)
    k_fused = model.cache.k(0)[:len(tokens)].copy()
    model.reset()
    model.forward(tokens, 0, order)
    np.testing.assert_array_equal(model.cache.k(0)[:len(tokens)], k_fused)


def test_long_decoding_keeps_host_memory_flat(micro_model_path):
    """Past warm-up, decoding allocates nothing that stays (plan caches are bounded)."""
    import tracemalloc

    from hiraishin import plans
    from hiraishin.plans import ATTENTION_PLAN_CACHE_SIZE

    # Start from empty plan caches: one half-filled by earlier tests (tests/test_fattn.py) grew its dict's
    # table (a 72 KiB block) inside the measured window instead of during the warm-up.
    plans._attention_cached.cache_clear()
    plans._matvec_cached.cache_clear()
    model = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=ATTENTION_PLAN_CACHE_SIZE + 600)
    order = ReductionOrder.BATCH_INVARIANT
    token = 1
    tracemalloc.start()  # before the warm-up: blocks freed later are then seen as freed
    for pos in range(ATTENTION_PLAN_CACHE_SIZE + 100):  # fills the attention plan cache
        token = int(np.argmax(model.forward([token], pos, order)[0]))
    before = tracemalloc.take_snapshot()
    for pos in range(ATTENTION_PLAN_CACHE_SIZE + 100, ATTENTION_PLAN_CACHE_SIZE + 500):
        token = int(np.argmax(model.forward([token], pos, order)[0]))
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes held after 400 more tokens"
