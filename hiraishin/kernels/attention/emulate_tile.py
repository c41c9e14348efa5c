"""Multi-query flash attention with its own work split (``fattn_tile.cu``).

Stock llama.cpp leaves the vector kernel as soon as a launch holds more than
one query (reference section 6.1: Ada/Hopper take the MMA kernel, older cards
the tile kernel). This kernel is hiraishin's stand-in for that path. It reads
the same f16 cache and masks the same cells as the vector kernel, but groups
the float operations differently:

* a block serves a tile of :data:`TILE_QUERIES` queries of one head;
* block ``y`` walks ONE contiguous range of ``split_cells`` cells (not
  interleaved chunks) in tiles of :data:`TILE_CELLS` cells;
* a query-cell score is one thread's sequential dot product over ``D`` dims;
* one running max per query (no ``FATTN_KQ_MAX_OFFSET``), and exponentials of
  differences below :data:`SOFTMAX_FTZ_THRESHOLD` flushed to zero, as the MMA
  kernel does;
* the output of a (query, dim) is one thread's sequential sum over the cells.

Results for ``P > 1`` go through the vector kernels' combine. The Numba emulator here does the
same operations in the same order; its entry is :func:`emulate_tile_partials` (``emulate.emulate``
calls it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...fp import expf, fmaf, warp_sum32
from ...plans.attention import NTHREADS, TILE_CELLS, TILE_QUERIES

__all__ = ["emulate_tile_partials", "SOFTMAX_FTZ_THRESHOLD", "TILE_QUERIES", "TILE_CELLS", "NTHREADS"]

# llama.cpp SOFTMAX_FTZ_THRESHOLD (ggml/src/ggml-cuda/fattn-common.cuh), used by the MMA kernel
SOFTMAX_FTZ_THRESHOLD = np.float32(-20.0)

_NEG_HALF_FLT_MAX = np.float32(-np.finfo(np.float32).max / 2)
_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)


@njit(cache=True, inline="always")
def _exp_ftz(x):
    if x >= SOFTMAX_FTZ_THRESHOLD:
        return expf(x)
    return _ZERO


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _tile_block(q, k, v, kvh, pos, kv_len, begin, end, o):
    """One (query, head, block y) of fattn_tile: fills ``o`` (D,), returns (max, sum)."""
    D = q.shape[0]
    M = _NEG_HALF_FLT_MAX
    S = _ZERO
    for d in range(D):
        o[d] = _ZERO
    s = np.empty(TILE_CELLS, np.float32)
    p = np.empty(TILE_CELLS, np.float32)
    pair = np.empty(32, np.float32)
    for base in range(begin, end, TILE_CELLS):
        m = _NEG_INF
        for c in range(TILE_CELLS):
            n = base + c
            if n < kv_len and n <= pos:
                acc = _ZERO
                for d in range(D):
                    acc = fmaf(k[n, kvh, d], q[d], acc)
                s[c] = acc
            else:
                s[c] = _NEG_INF
            if s[c] > m:
                m = s[c]
        Mn = M if M >= m else m
        a = _exp_ftz(M - Mn)
        for c in range(TILE_CELLS):
            p[c] = _exp_ftz(s[c] - Mn)
        for lane in range(32):
            pair[lane] = p[lane] + p[lane + 32]
        S = fmaf(S, a, warp_sum32(pair))
        M = Mn
        for d in range(D):
            o[d] = o[d] * a
        for c in range(TILE_CELLS):
            n = base + c
            pc = p[c]
            if n < kv_len:
                for d in range(D):
                    o[d] = fmaf(v[n, kvh, d], pc, o[d])
            else:  # the kernel stages zeros for cells past the filled cache
                for d in range(D):
                    o[d] = fmaf(_ZERO, pc, o[d])
    return M, S


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _tile_partials(q, k, v, q_pos, kv_len, n_blocks, split_cells, kv_attended, scale, parts, meta):
    T, H, D = q.shape
    ratio = H // k.shape[1]
    qs = np.empty(D, np.float32)
    for t in range(T):
        for h in range(H):
            for d in range(D):
                qs[d] = q[t, h, d] * scale
            for y in range(n_blocks):
                begin = y * split_cells
                end = min(begin + split_cells, kv_attended)
                M, S = _tile_block(qs, k, v, h // ratio, q_pos[t], kv_len, begin, end, parts[t, h, y])
                meta[t, h, y, 0] = M
                meta[t, h, y, 1] = S


def emulate_tile_partials(q, k32, v32, q_pos, kv_len, n_blocks, split_cells, kv_attended, scale):
    """Emulate fattn_tile: unnormalised partials ``(T, H, P, D)`` and ``(max, sum)`` meta ``(T, H, P, 2)``.

    ``k32``/``v32`` are the first ``kv_len`` cache cells converted to float32
    (exact), ``q_pos`` int64, ``scale`` a float32. Inputs are validated by the
    caller (``fattn_vec.flash_attn``).
    """
    T, H, D = q.shape
    parts = np.empty((T, H, n_blocks, D), np.float32)
    meta = np.empty((T, H, n_blocks, 2), np.float32)
    _tile_partials(q, k32, v32, q_pos, kv_len, n_blocks, split_cells, kv_attended, np.float32(scale),
                   parts, meta)
    return parts, meta
