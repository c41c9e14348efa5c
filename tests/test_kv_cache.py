"""KVCache: f16 storage, length bookkeeping, rollback for speculative decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hiraishin.backends import get_backend
from hiraishin.backends.kv_cache import KVCache, KVCacheError
from hiraishin.errors import BackendError, HiraishinError
from hiraishin.order import ReductionOrder


def rand(rng, n, h=2, d=8):
    return rng.standard_normal((n, h, d)).astype(np.float32)


def test_shapes_and_initial_state():
    c = KVCache(n_layer=3, n_ctx=16, n_head_kv=2, head_dim=8)
    assert c.length == 0
    for layer in range(3):
        assert c.k(layer).shape == c.v(layer).shape == (16, 2, 8)
        assert c.k(layer).dtype == np.float16
    assert c.nbytes == 2 * 3 * 16 * 2 * 8 * 2
    assert "length=0" in repr(c)


def test_write_rounds_to_nearest_even():
    c = KVCache(1, 4, 1, 4)
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0);
    # 1 + 3*2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to 1 + 2^-9
    k = np.array([[[1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 70000.0]]], np.float32)
    c.write(0, 0, k, k)
    assert c.k(0)[0, 0].tolist() == [1.0, 1 + 2**-9, -1.0, float("inf")]


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, (3, 2, 8), elements=st.floats(-1e4, 1e4, width=32)))
def test_write_stores_exactly_the_f16_rounding(x):
    c = KVCache(2, 8, 2, 8)
    c.write(1, 0, x, -x)
    assert np.array_equal(c.k(1)[:3].view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert np.array_equal(c.v(1)[:3].view(np.uint16), (-x).astype(np.float16).view(np.uint16))
    assert not c.k(0).any()


def test_commit_rollback_reset():
    rng = np.random.default_rng(0)
    c = KVCache(2, 32, 2, 8)
    for layer in range(2):
        c.write(layer, 0, rand(rng, 10), rand(rng, 10))
    assert c.length == 0  # write alone does not extend the valid range
    c.commit(10)
    assert c.length == 10
    c.rollback(7)
    assert c.length == 7
    c.write(0, 7, rand(rng, 3), rand(rng, 3))  # overwrite the rejected cells
    c.commit(10)
    c.reset()
    assert c.length == 0


@pytest.mark.parametrize("call,match", [
    (lambda c, x: c.write(2, 0, x, x), "layer must be in 0..1"),
    (lambda c, x: c.k(-1), "layer"),
    (lambda c, x: c.write(0, 1, x, x), "past the valid length"),
    (lambda c, x: c.write(0, 0, x[:, :1], x[:, :1]), r"shape \(T, 2, 8\)"),
    (lambda c, x: c.write(0, 0, x.astype(np.float64), x), "float32"),
    (lambda c, x: c.write(0, 0, x, x[:2]), "differ in shape"),
    (lambda c, x: c.write(0, -1, x, x), "non-negative"),
    (lambda c, x: c.rollback(1), r"pos must be in 0..0"),
    (lambda c, x: c.commit(17), r"end_pos must be in 0..16"),
])
def test_bad_calls_name_the_problem(call, match):
    c = KVCache(2, 16, 2, 8)
    x = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(KVCacheError, match=match):
        call(c, x)
    assert issubclass(KVCacheError, HiraishinError)


def test_write_past_n_ctx_is_refused():
    c = KVCache(1, 16, 2, 8)
    c.write(0, 0, np.zeros((14, 2, 8), np.float32), np.zeros((14, 2, 8), np.float32))
    c.commit(14)
    with pytest.raises(KVCacheError, match="do not fit in n_ctx = 16"):
        c.write(0, 14, np.zeros((3, 2, 8), np.float32), np.zeros((3, 2, 8), np.float32))
    with pytest.raises(KVCacheError, match="use rollback"):
        c.commit(5)


def test_bad_construction():
    with pytest.raises(KVCacheError, match="n_ctx"):
        KVCache(1, 0, 2, 8)
    with pytest.raises(BackendError, match="unknown backend"):
        KVCache(1, 4, 2, 8, backend="tpu")


def test_rollback_then_rewrite_equals_a_fresh_cache_for_attention():
    """Rejected draft cells are never seen: stale data past `length` does not reach attention."""
    rng = np.random.default_rng(1)
    n_kv, D = 2, 128
    keys, vals = rand(rng, 300, n_kv, D), rand(rng, 300, n_kv, D)
    draft_k, draft_v = rand(rng, 8, n_kv, D), rand(rng, 8, n_kv, D)

    spec = KVCache(1, 320, n_kv, D)
    spec.write(0, 0, keys[:290], vals[:290])
    spec.commit(290)
    spec.write(0, 290, draft_k, draft_v)  # 8 draft tokens ...
    spec.commit(298)
    spec.rollback(293)  # ... 3 accepted
    fresh = KVCache(1, 320, n_kv, D)
    both_k = np.concatenate([keys[:290], draft_k[:3]])
    both_v = np.concatenate([vals[:290], draft_v[:3]])
    fresh.write(0, 0, both_k, both_v)
    fresh.commit(293)

    q = rand(rng, 2, 4, D)
    q_pos = np.array([291, 292], np.int32)
    for order in (ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT):
        cpu = get_backend("cpu")
        a = cpu.attention(q, spec.k(0), spec.v(0), q_pos, spec.length, order)
        b = cpu.attention(q, fresh.k(0), fresh.v(0), q_pos, fresh.length, order)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
