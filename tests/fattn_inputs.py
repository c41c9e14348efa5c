"""Inputs shared by the attention tests (CPU and GPU)."""

from __future__ import annotations

import numpy as np


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def make_inputs(seed, n_ctx, n_head, n_head_kv, head_dim=128, n_q=None):
    """Random f16 cache of n_ctx cells and one float32 query per position (n_q rows)."""
    rng = np.random.default_rng(seed)
    n_q = n_ctx if n_q is None else n_q
    q = rng.standard_normal((n_q, n_head, head_dim)).astype(np.float32)
    # keys with a spread of scores (some large logits), values of order 1
    k = (1.5 * rng.standard_normal((n_ctx, n_head_kv, head_dim))).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float16)
    return q, k, v


def rope_inputs(H, Hkv, D, pos, n_ctx, seed, T=1):
    """T tokens' raw q (T, H, D), k and v (T, Hkv, D), q and k norm weights, and a K and a V cache of n_ctx
    cells whose cells ``pos .. pos + T - 1`` are NaN (fattn_vec_q1_rope must store them before it reads them)."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((T, H, D)) * 3).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, D)) * 3).astype(np.float32)
    v = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    wq = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    wk = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    caches = [(1.5 * rng.standard_normal((n_ctx, Hkv, D))).astype(np.float16) for _ in range(2)]
    for c in caches:
        c.view(np.uint16)[pos:pos + T] = 0x7E00
    return q, k, v, wq, wk, caches[0], caches[1]
