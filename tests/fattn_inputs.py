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
