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
