"""Numba emulator of ``mmvq.cu``: the same float operations, in the same order, as the kernel.

Per output (row r, column j), thread ``tid`` of ``32 * nwarps`` walks the weight blocks the plan
gives it (``MatVecPlan.thread_blocks``), each step one vec-dot of llama.cpp's ``vecdotq.cuh``
(the ``_step_*`` functions below, with ``fmaf`` exactly where the kernel writes ``__fmaf_rn``);
then the warp hand-over in warp order and the 32-lane xor butterfly (``_reduce``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, fmaf, u16le
from ...plans.matvec import MatVecPlan, matvec_traits
from ..blocks import Q4_K_BYTES as _Q4_K
from ..blocks import Q4_K_ID as _Q4_K_ID
from ..blocks import Q6_K_BYTES as _Q6_K
from ..blocks import Q6_K_ID as _Q6_K_ID
from ..blocks import Q8_0_BYTES as _Q8_0
from ..blocks import Q8_1_BYTES as _Q8_1
from ..blocks import Q8_1_PER_SUPER as _Q8_1_PER_SUPER

__all__ = ["emulate"]


# Each thread step is split in two: the weight side (its quant values and scales, decoded once per
# weight block) and the column side (integer dots with one column's q8_1 ints, then the float
# operations). Decoding once and walking the columns inside changes no operation of any output:
# every (row, column, thread) still performs its own sequence in kbx order.


@njit(cache=True, inline="always")
def _decode_q4_k(w, r, wo, iqs, vals, scm):
    """Thread ``iqs``'s 16 nibbles (vals[8*i + k] low ints, vals[8*i + 4 + k] the +16 ints, sub-block
    i = 0, 1) and its two (scale, min) pairs (get_scale_min_k4) of the super-block at w[r, wo]."""
    c = iqs // 8
    pos = 4 * ((iqs // 2) % 4)
    qo = wo + 16 + 32 * c + pos
    for i in range(2):
        sb = 2 * c + i
        if sb < 4:
            scm[2 * i] = np.int64(w[r, wo + 4 + sb]) & 63
            scm[2 * i + 1] = np.int64(w[r, wo + 8 + sb]) & 63
        else:
            scm[2 * i] = (np.int64(w[r, wo + 8 + sb]) & 0x0F) | ((np.int64(w[r, wo + sb]) >> 6) << 4)
            scm[2 * i + 1] = (np.int64(w[r, wo + 8 + sb]) >> 4) | ((np.int64(w[r, wo + 4 + sb]) >> 6) << 4)
        shift = 4 * i
        for k in range(4):
            vals[8 * i + k] = (np.int64(w[r, qo + k]) >> shift) & 15
            vals[8 * i + 4 + k] = (np.int64(w[r, qo + 16 + k]) >> shift) & 15
    return c, pos


@njit(cache=True, inline="always")
def _column_q4_k(acc, vals, scm, c, pos, d, dmin, y, ys, j, yo, h2f):
    """vec_dot_q4_K_q8_1 of the decoded thread values with column j."""
    sumf_d = np.float32(0.0)
    sumf_m = np.float32(0.0)
    for i in range(2):
        bo = yo + (2 * c + i) * _Q8_1
        dot1 = 0
        dot2 = 0
        for k in range(4):
            u0 = np.int64(ys[j, bo + 4 + pos + k])
            u1 = np.int64(ys[j, bo + 4 + pos + 16 + k])
            dot1 += vals[8 * i + k] * u0 + vals[8 * i + 4 + k] * u1
            dot2 += u0 + u1
        d8 = h2f[u16le(y, j, bo)]
        sumf_d = fmaf(d8, np.float32(dot1 * scm[2 * i]), sumf_d)
        sumf_m = fmaf(d8, np.float32(dot2 * scm[2 * i + 1]), sumf_m)
    return acc + fmaf(d, sumf_d, -(dmin * sumf_m))


@njit(cache=True, inline="always")
def _decode_q6_k(w, ws, r, wo, iqs, vals, scm):
    """Thread ``iqs``'s 8 six-bit values minus 32 (vals[4*i + k]) and two scales of w[r, wo]."""
    h = iqs // 16
    rr = iqs % 16
    scale_offset = 8 * h + rr // 4
    vh_shift = 2 * (rr // 8)
    lo_o = wo + 4 * iqs
    hi_o = wo + 128 + 4 * (8 * h + rr % 8)
    for i in range(2):
        scm[i] = np.int64(ws[r, wo + 192 + scale_offset + 4 * i])
        for k in range(4):
            lo = (np.int64(w[r, lo_o + k]) >> (4 * i)) & 15
            hi = (np.int64(w[r, hi_o + k]) >> (vh_shift + 4 * i)) & 3
            vals[4 * i + k] = (lo | (hi << 4)) - 32
    return 4 * h + rr // 8


@njit(cache=True, inline="always")
def _column_q6_k(acc, vals, scm, bq8_offset, iqs, d6, y, ys, j, yo, h2f):
    """vec_dot_q6_K_q8_1 of the decoded thread values with column j."""
    sumf = np.float32(0.0)
    for i in range(2):
        bo = yo + (bq8_offset + 2 * i) * _Q8_1
        uo = bo + 4 + 4 * (iqs % 8)
        dot = 0
        for k in range(4):
            dot += vals[4 * i + k] * np.int64(ys[j, uo + k])
        d8 = h2f[u16le(y, j, bo)]
        sumf = fmaf(d8, np.float32(dot * scm[i]), sumf)
    return fmaf(d6, sumf, acc)


@njit(cache=True, inline="always")
def _column_q8_0(acc, ws, r, wo, dw, y, ys, j, yo, iqs, h2f):
    """vec_dot_q8_0_q8_1 for one thread (ints iqs, iqs+1) of the block at w[r, wo] with column j."""
    dot = 0
    for k in range(8):
        dot += np.int64(ws[r, wo + 2 + 4 * iqs + k]) * np.int64(ys[j, yo + 4 + 4 * iqs + k])
    d = dw * h2f[u16le(y, j, yo)]
    return fmaf(d, np.float32(dot), acc)


@njit(cache=True, inline="always")
def _reduce(acc, s, nwarps):
    """Warp hand-over in warp order, then lane 0 of the xor butterfly."""
    for lane in range(32):
        s[lane] = acc[lane]
    for wp in range(1, nwarps):
        for lane in range(32):
            s[lane] = s[lane] + acc[32 * wp + lane]
    # Lane L adds lane L^off; after each step lanes L and L+off hold the same value,
    # so lane 0's result is this in-place halving.
    off = 16
    while off > 0:
        for lane in range(off):
            s[lane] = s[lane] + s[lane + off]
        off //= 2
    return s[0]


@njit(cache=True, inline="always")
def _thread_block(type_id, acc, tid, w, ws, r, kbx, y, ys, ncols, h2f, vals, scm):
    """Thread ``tid``'s vec-dot of weight block ``kbx`` of row ``r`` with every column, into acc[:, tid]."""
    if type_id == _Q4_K_ID:  # 16 threads per super-block, ints 2*(tid%16), +1; 8 q8_1 blocks
        wo = kbx * _Q4_K
        c, pos = _decode_q4_k(w, r, wo, 2 * (tid % 16), vals, scm)
        d = h2f[u16le(w, r, wo)]
        dmin = h2f[u16le(w, r, wo + 2)]
        yo = kbx * _Q8_1_PER_SUPER * _Q8_1
        for j in range(ncols):
            acc[j, tid] = _column_q4_k(acc[j, tid], vals, scm, c, pos, d, dmin, y, ys, j, yo, h2f)
    elif type_id == _Q6_K_ID:  # 32 threads per super-block, int tid%32
        wo = kbx * _Q6_K
        iqs = tid % 32
        bq8 = _decode_q6_k(w, ws, r, wo, iqs, vals, scm)
        d6 = h2f[u16le(w, r, wo + 208)]
        yo = kbx * _Q8_1_PER_SUPER * _Q8_1
        for j in range(ncols):
            acc[j, tid] = _column_q6_k(acc[j, tid], vals, scm, bq8, iqs, d6, y, ys, j, yo, h2f)
    else:  # Q8_0: 4 threads per block
        wo = kbx * _Q8_0
        dw = h2f[u16le(w, r, wo)]
        for j in range(ncols):
            acc[j, tid] = _column_q8_0(acc[j, tid], ws, r, wo, dw, y, ys, j, kbx * _Q8_1, 2 * (tid % 4), h2f)


# Rows are independent; prange over chunks of rows cannot change any result.
_ROWS_PER_CHUNK = 64


@njit(cache=True, parallel=True, error_model="numpy")
def _mmvq_emulate(type_id, block_bytes, tpb, w, ws, y, ys, nwarps, h2f, out):
    n = w.shape[0]
    ncols = y.shape[0]
    nb = w.shape[1] // block_bytes
    nthreads = 32 * nwarps
    bpi = nthreads // tpb
    nchunks = (n + _ROWS_PER_CHUNK - 1) // _ROWS_PER_CHUNK
    for chunk in prange(nchunks):  # scratch allocated once per chunk of rows
        acc = np.empty((ncols, nthreads), dtype=np.float32)
        s = np.empty(32, dtype=np.float32)
        vals = np.empty(16, dtype=np.int64)
        scm = np.empty(4, dtype=np.int64)
        for r in range(chunk * _ROWS_PER_CHUNK, min(n, (chunk + 1) * _ROWS_PER_CHUNK)):
            acc[:, :] = np.float32(0.0)
            for tid in range(nthreads):
                for kbx in range(tid // tpb, nb, bpi):
                    _thread_block(type_id, acc, tid, w, ws, r, kbx, y, ys, ncols, h2f, vals, scm)
            for j in range(ncols):
                out[j, r] = _reduce(acc[j], s, nwarps)


def emulate(w: np.ndarray, qtype: str, xq: np.ndarray, plan: MatVecPlan) -> np.ndarray:
    """The mat-vec kernel's outputs for ``plan``, on the CPU: float32 (ncols, N).

    ``w`` uint8 (N, row_bytes) blocks of ``qtype``; ``xq`` q8_1 bytes (ncols, K/32*36) in
    llama.cpp's layout. Rows per block and columns per launch change no output, so only
    ``plan.nwarps`` is used. Inputs are not checked (the CPU backend checks them).
    """
    t = matvec_traits(qtype)
    w = np.ascontiguousarray(w)
    xq = np.ascontiguousarray(xq)
    nwarps = plan.nwarps
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    _mmvq_emulate(t.type_id, t.block_bytes, t.threads_per_block, w, w.view(np.int8), xq, xq.view(np.int8),
                  nwarps, F16_TO_F32, out)
    return out
