"""Numba emulator of ``fattn_vec.cu`` (and, through :mod:`.emulate_tile`, ``fattn_tile.cu``).

The same float operations in the same order as the kernels: per (query, head, parallel block) an
online softmax over the block's chunks (``_vec_block``), then the combine in block order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...fp import expf, fmaf, warp_sum32
from ...plans.attention import NTHREADS, AttentionPlan
from .emulate_tile import emulate_tile_partials

__all__ = ["emulate", "emulate_partials", "emulate_combine", "attention_scale", "KQ_MAX_OFFSET"]

# FATTN_KQ_MAX_OFFSET = 3.0f*0.6931f (ggml/src/ggml-cuda/fattn-common.cuh, PR #18614)
KQ_MAX_OFFSET = np.float32(3.0) * np.float32(0.6931)
_NEG_HALF_FLT_MAX = np.float32(-np.finfo(np.float32).max / 2)  # initial running max (-FLT_MAX/2)
_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)


def attention_scale(head_dim: int) -> np.float32:
    """``1/sqrt(head_dim)`` in float32 as llama.cpp computes it on the host (128 -> 0x3DB504F3)."""
    return np.float32(1.0) / np.sqrt(np.float32(head_dim))


@njit(cache=True, inline="always")
def _butterfly8(x):
    """xor 4, 2, 1 over the 8 threads of a group (every lane ends with this value)."""
    a0 = x[0] + x[4]
    a1 = x[1] + x[5]
    a2 = x[2] + x[6]
    a3 = x[3] + x[7]
    return (a0 + a2) + (a1 + a3)


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _vec_block(q, k, v, kvh, pos, kv_len, y, n_blocks, chunk_cells, kv_attended, o):
    """One (query, head, block y) of fattn_vec: fills ``o`` (D,), returns (block max, block sum)."""
    D = q.shape[0]
    n_slices = D // 64
    M = np.full(4, _NEG_HALF_FLT_MAX, np.float32)  # per warp
    ssum = np.zeros(NTHREADS, np.float32)  # per thread (its own cell of each step)
    O = np.zeros((16, D), np.float32)  # per (warp, group): row 4w + g
    s = np.empty(NTHREADS, np.float32)
    p = np.empty(NTHREADS, np.float32)
    part = np.empty(8, np.float32)
    n_chunks = kv_attended // chunk_cells
    c = y
    while c < n_chunks and c * chunk_cells < kv_len:  # steps past the filled cells change nothing: skipped
        for k0 in range(c * chunk_cells, (c + 1) * chunk_cells, NTHREADS):
            if k0 >= kv_len:
                break
            for i in range(NTHREADS):
                n = k0 + i
                if n < kv_len and n <= pos:
                    for r in range(8):
                        acc = _ZERO
                        for b in range(n_slices):
                            for e in range(8):
                                d = 64 * b + 8 * r + e
                                acc = fmaf(k[n, kvh, d], q[d], acc)
                        part[r] = acc
                    s[i] = _butterfly8(part)
                else:
                    s[i] = _NEG_INF
            for w in range(4):
                m_new = M[w]
                for lane in range(32):
                    x = s[32 * w + lane] + KQ_MAX_OFFSET
                    if x > m_new:
                        m_new = x
                a = expf(M[w] - m_new)
                M[w] = m_new
                for lane in range(32):
                    i = 32 * w + lane
                    p[i] = expf(s[i] - m_new)
                    ssum[i] = fmaf(ssum[i], a, p[i])
                for g in range(4):
                    row = 4 * w + g
                    for d in range(D):
                        O[row, d] = O[row, d] * a
                for g in range(4):
                    row = 4 * w + g
                    for t in range(8):
                        kk = 32 * w + g + 4 * t
                        n = k0 + kk
                        pk = p[kk]
                        if n < kv_len:
                            for d in range(D):
                                O[row, d] = fmaf(v[n, kvh, d], pk, O[row, d])
                        else:  # the kernel uses zeros for cells past the filled cache
                            for d in range(D):
                                O[row, d] = fmaf(_ZERO, pk, O[row, d])
        c += n_blocks
    # in-block combine
    Mb = _NEG_HALF_FLT_MAX
    for w in range(4):
        if M[w] > Mb:
            Mb = M[w]
    lane_sums = np.empty(32, np.float32)
    warp_sums = np.zeros(32, np.float32)
    for w in range(4):
        a = expf(M[w] - Mb)
        for g in range(4):
            row = 4 * w + g
            for d in range(D):
                O[row, d] = O[row, d] * a
        for lane in range(32):
            lane_sums[lane] = ssum[32 * w + lane] * a
        warp_sums[w] = warp_sum32(lane_sums)
    S = warp_sum32(warp_sums)
    for d in range(D):
        acc = _ZERO
        for row in range(16):
            acc = acc + O[row, d]
        o[d] = acc
    return Mb, S


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _vec_partials(q, k, v, q_pos, kv_len, n_blocks, chunk_cells, kv_attended, scale, parts, meta):
    T, H, D = q.shape
    ratio = H // k.shape[1]
    qs = np.empty(D, np.float32)
    for t in range(T):
        for h in range(H):
            for d in range(D):
                qs[d] = q[t, h, d] * scale
            for y in range(n_blocks):
                Mb, S = _vec_block(qs, k, v, h // ratio, q_pos[t], kv_len, y, n_blocks, chunk_cells,
                                   kv_attended, parts[t, h, y])
                meta[t, h, y, 0] = Mb
                meta[t, h, y, 1] = S


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _combine_rows(parts, meta, out):
    """fattn_combine for every (token, head): merge the P partials in block order."""
    T, H, P, D = parts.shape
    for t in range(T):
        for h in range(H):
            kqmax = meta[t, h, 0, 0]
            for l in range(1, P):
                if meta[t, h, l, 0] > kqmax:
                    kqmax = meta[t, h, l, 0]
            for d in range(D):
                num = _ZERO
                den = _ZERO
                for l in range(P):
                    sc = expf(meta[t, h, l, 0] - kqmax)
                    num = fmaf(sc, parts[t, h, l, d], num)
                    den = fmaf(sc, meta[t, h, l, 1], den)
                out[t, h, d] = num / den


@njit(cache=True, error_model="numpy")  # IEEE division (0/0 = NaN), as the kernels
def _finish(parts, meta, out):
    """What the launch writes: P == 1 -> o / S (in the kernel); P > 1 -> fattn_combine."""
    T, H, P, D = parts.shape
    if P > 1:
        _combine_rows(parts, meta, out)
        return
    for t in range(T):
        for h in range(H):
            S = meta[t, h, 0, 1]
            for d in range(D):
                out[t, h, d] = parts[t, h, 0, d] / S


def emulate_partials(q, k_cache, v_cache, q_pos, plan: AttentionPlan):
    """First stage only: unnormalised partials (T, H, P, D) and (max, sum) meta (T, H, P, 2).

    With ``P == 1`` the kernels normalise in place; these are then the values before that.
    """
    kv_len = plan.kv_len if plan.kv_len is not None else plan.kv_attended
    # f16 -> f32 is exact; only the cells the kernels may read
    k32 = np.ascontiguousarray(k_cache[:kv_len], dtype=np.float32)
    v32 = np.ascontiguousarray(v_cache[:kv_len], dtype=np.float32)
    qpos = q_pos.astype(np.int64)
    scale = attention_scale(plan.head_dim)
    T, H, D = q.shape
    P = plan.parallel_blocks
    if plan.kernel == "tile":
        return emulate_tile_partials(q, k32, v32, qpos, kv_len, P, plan.split_cells,
                                                plan.kv_attended, scale)
    parts = np.empty((T, H, P, D), np.float32)
    meta = np.empty((T, H, P, 2), np.float32)
    _vec_partials(q, k32, v32, qpos, kv_len, P, plan.chunk_cells, plan.kv_attended, scale, parts, meta)
    return parts, meta




def emulate_combine(parts: np.ndarray, meta: np.ndarray) -> np.ndarray:
    """Second stage: merge ``P`` partials in block order (``fattn_combine``) -> (T, H, D) float32."""
    out = np.empty((parts.shape[0], parts.shape[1], parts.shape[3]), np.float32)
    _combine_rows(np.ascontiguousarray(parts, np.float32), np.ascontiguousarray(meta, np.float32), out)
    return out


def emulate(q, k_cache, v_cache, q_pos, plan: AttentionPlan) -> np.ndarray:
    """One attention launch of ``plan`` on numpy arrays (the combine included) -> float32 (T, n_head, D).

    ``q`` float32 (T, n_head, D); caches float16 (n_ctx, n_head_kv, D); ``q_pos`` (T,) absolute
    positions (query ``t`` sees cells ``<= q_pos[t]`` of the ``plan.kv_len`` filled ones).
    Inputs are not checked (the CPU backend checks them).
    """
    parts, meta = emulate_partials(q, k_cache, v_cache, np.asarray(q_pos), plan)
    out = np.empty(q.shape, np.float32)
    _finish(parts, meta, out)
    return out
