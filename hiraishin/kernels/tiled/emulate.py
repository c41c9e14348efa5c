"""Numba emulator of ``mmq_tiled.cu`` (one thread per output, K in order; see the package docstring)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, fmaf, u16le
from ...plans.matvec import MatVecPlan
from ...quant import BLOCK_BYTES, GGML_TYPE_ID
from ..blocks import Q4_K_BYTES as _Q4_K
from ..blocks import Q4_K_ID as _Q4_K_ID
from ..blocks import Q6_K_BYTES as _Q6_K
from ..blocks import Q6_K_ID as _Q6_K_ID
from ..blocks import Q8_0_BYTES as _Q8_0
from ..blocks import Q8_1_BYTES as _Q8_1
from ..blocks import Q8_1_PER_SUPER as _Q8_1_PER_SUPER

__all__ = ["emulate"]



# The weight block's values and scales are decoded once per (row, block) and every column walks
# them: each output still adds its blocks in k order with the same operations.


@njit(cache=True, inline="always")
def _decode_block(type_id, w, ws, r, kb, vals, scm):
    """Values of weight block ``kb`` of row ``r`` into ``vals`` (ints; Q6_K minus 32) and its scales
    into ``scm`` (Q4_K: 8 scales then 8 mins; Q6_K: 16 scales)."""
    if type_id == _Q4_K_ID:
        wo = kb * _Q4_K
        for sb in range(8):  # get_scale_min_k4
            if sb < 4:
                scm[sb] = np.int64(w[r, wo + 4 + sb]) & 63
                scm[8 + sb] = np.int64(w[r, wo + 8 + sb]) & 63
            else:
                scm[sb] = (np.int64(w[r, wo + 8 + sb]) & 0x0F) | ((np.int64(w[r, wo + sb]) >> 6) << 4)
                scm[8 + sb] = (np.int64(w[r, wo + 8 + sb]) >> 4) | ((np.int64(w[r, wo + 4 + sb]) >> 6) << 4)
            shift = 4 * (sb % 2)
            qo = wo + 16 + 32 * (sb // 2)
            for l in range(32):
                vals[32 * sb + l] = (np.int64(w[r, qo + l]) >> shift) & 15
    elif type_id == _Q6_K_ID:
        wo = kb * _Q6_K
        for t in range(16):
            h = t // 8
            sg = (t % 8) // 2
            l0 = 16 * (t % 2)
            scm[t] = np.int64(ws[r, wo + 192 + t])
            for l in range(l0, l0 + 16):
                lo = (np.int64(w[r, wo + 64 * h + 32 * (sg & 1) + l]) >> (4 * (sg >> 1))) & 15
                hi = (np.int64(w[r, wo + 128 + 32 * h + l]) >> (2 * sg)) & 3
                vals[16 * t + l - l0] = (lo | (hi << 4)) - 32
    else:
        wo = kb * _Q8_0
        for l in range(32):
            vals[l] = np.int64(ws[r, wo + 2 + l])


@njit(cache=True, inline="always")
def _column_block(type_id, acc, vals, scm, dw, dmin, kb, y, ys, j, h2f):
    """One decoded weight block times column j, into acc (per type, the kernel's operations)."""
    if type_id == _Q4_K_ID:
        sd = np.float32(0.0)
        sm = np.float32(0.0)
        for sb in range(8):
            yo = (kb * _Q8_1_PER_SUPER + sb) * _Q8_1
            dot = 0
            ysum = 0
            for l in range(32):
                q8 = np.int64(ys[j, yo + 4 + l])
                dot += vals[32 * sb + l] * q8
                ysum += q8
            d8 = h2f[u16le(y, j, yo)]
            sd = fmaf(d8, np.float32(dot * scm[sb]), sd)
            sm = fmaf(d8, np.float32(ysum * scm[8 + sb]), sm)
        return acc + fmaf(dw, sd, -(dmin * sm))
    if type_id == _Q6_K_ID:
        s = np.float32(0.0)
        for t in range(16):
            yo = (kb * _Q8_1_PER_SUPER + t // 2) * _Q8_1
            l0 = 16 * (t % 2)
            dot = 0
            for l in range(16):
                dot += vals[16 * t + l] * np.int64(ys[j, yo + 4 + l0 + l])
            d8 = h2f[u16le(y, j, yo)]
            s = fmaf(d8, np.float32(dot * scm[t]), s)
        return fmaf(dw, s, acc)
    yo = kb * _Q8_1
    dot = 0
    for l in range(32):
        dot += vals[l] * np.int64(ys[j, yo + 4 + l])
    d = dw * h2f[u16le(y, j, yo)]
    return fmaf(d, np.float32(dot), acc)


@njit(cache=True, parallel=True, error_model="numpy")
def _tiled_emulate(type_id, block_bytes, w, ws, y, ys, h2f, out):
    nb = w.shape[1] // block_bytes
    ncols = y.shape[0]
    for r in prange(w.shape[0]):
        vals = np.empty(256, dtype=np.int64)
        scm = np.empty(16, dtype=np.int64)
        acc = np.zeros(ncols, dtype=np.float32)
        for kb in range(nb):  # one thread per output, blocks in order
            _decode_block(type_id, w, ws, r, kb, vals, scm)
            if type_id == _Q4_K_ID:
                dw = h2f[u16le(w, r, kb * _Q4_K)]
                dmin = h2f[u16le(w, r, kb * _Q4_K + 2)]
            elif type_id == _Q6_K_ID:
                dw = h2f[u16le(w, r, kb * _Q6_K + 208)]
                dmin = np.float32(0.0)
            else:
                dw = h2f[u16le(w, r, kb * _Q8_0)]
                dmin = np.float32(0.0)
            for j in range(ncols):
                acc[j] = _column_block(type_id, acc[j], vals, scm, dw, dmin, kb, y, ys, j, h2f)
        for j in range(ncols):
            out[j, r] = acc[j]


def emulate(w: np.ndarray, qtype: str, xq: np.ndarray, plan: MatVecPlan | None = None) -> np.ndarray:
    """The tiled kernel's outputs on the CPU: float32 (ncols, N), same bits as the kernel.

    ``w`` uint8 (N, row_bytes), ``xq`` q8_1 bytes (ncols, K/32*36) in llama.cpp's layout. The
    kernel has one fixed tile, so ``plan`` (a ``kernel="tiled"`` plan) changes nothing. Inputs are
    not checked (the CPU backend checks them).
    """
    w = np.ascontiguousarray(w)
    xq = np.ascontiguousarray(xq)
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    _tiled_emulate(GGML_TYPE_ID[qtype], BLOCK_BYTES[qtype], w, w.view(np.int8), xq, xq.view(np.int8), F16_TO_F32,
                   out)
    return out
