"""Numba emulator of ``mmq_tiled.cu`` (one thread per output, K in order; see the package docstring)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, fmaf, u16le
from ...plans.matvec import MatVecPlan
from ...quant import BLOCK_BYTES, GGML_TYPE_ID

__all__ = ["emulate"]

_Q8_1 = BLOCK_BYTES["Q8_1"]
_Q4_K = BLOCK_BYTES["Q4_K"]
_Q6_K = BLOCK_BYTES["Q6_K"]
_Q8_0 = BLOCK_BYTES["Q8_0"]
_Q4_K_ID = GGML_TYPE_ID["Q4_K"]
_Q6_K_ID = GGML_TYPE_ID["Q6_K"]
_Q8_1_PER_SUPER = 8  # q8_1 blocks of 32 values per 256-value super-block


@njit(cache=True, inline="always")
def _block_q4_k(acc, w, r, kb, y, ys, j, h2f, sc, mn):
    """One Q4_K super-block of row r times column j, added to acc (sc, mn: scratch of 8)."""
    wo = kb * _Q4_K
    for sb in range(8):  # get_scale_min_k4
        if sb < 4:
            sc[sb] = w[r, wo + 4 + sb] & 63
            mn[sb] = w[r, wo + 8 + sb] & 63
        else:
            sc[sb] = (w[r, wo + 8 + sb] & 0x0F) | ((w[r, wo + sb] >> 6) << 4)
            mn[sb] = (w[r, wo + 8 + sb] >> 4) | ((w[r, wo + 4 + sb] >> 6) << 4)
    sd = np.float32(0.0)
    sm = np.float32(0.0)
    for sb in range(8):
        yo = (kb * _Q8_1_PER_SUPER + sb) * _Q8_1
        shift = 4 * (sb % 2)
        qo = wo + 16 + 32 * (sb // 2)
        dot = 0
        ysum = 0
        for l in range(32):
            q8 = np.int64(ys[j, yo + 4 + l])
            dot += ((np.int64(w[r, qo + l]) >> shift) & 15) * q8
            ysum += q8
        d8 = h2f[u16le(y, j, yo)]
        sd = fmaf(d8, np.float32(dot * sc[sb]), sd)
        sm = fmaf(d8, np.float32(ysum * mn[sb]), sm)
    d = h2f[u16le(w, r, wo)]
    dmin = h2f[u16le(w, r, wo + 2)]
    return acc + fmaf(d, sd, -(dmin * sm))


@njit(cache=True, inline="always")
def _block_q6_k(acc, w, ws, r, kb, y, ys, j, h2f):
    """One Q6_K super-block of row r times column j, multiplied into acc with one fma."""
    wo = kb * _Q6_K
    s = np.float32(0.0)
    for t in range(16):
        h = t // 8
        sg = (t % 8) // 2
        l0 = 16 * (t % 2)
        yo = (kb * _Q8_1_PER_SUPER + t // 2) * _Q8_1
        dot = 0
        for l in range(l0, l0 + 16):
            lo = (np.int64(w[r, wo + 64 * h + 32 * (sg & 1) + l]) >> (4 * (sg >> 1))) & 15
            hi = (np.int64(w[r, wo + 128 + 32 * h + l]) >> (2 * sg)) & 3
            dot += ((lo | (hi << 4)) - 32) * np.int64(ys[j, yo + 4 + l])
        d8 = h2f[u16le(y, j, yo)]
        s = fmaf(d8, np.float32(dot * np.int64(ws[r, wo + 192 + t])), s)
    return fmaf(h2f[u16le(w, r, wo + 208)], s, acc)


@njit(cache=True, inline="always")
def _block_q8_0(acc, w, ws, r, b, y, ys, j, h2f):
    """One Q8_0 block of row r times column j, added to acc with one fma."""
    wo = b * _Q8_0
    yo = b * _Q8_1
    dot = 0
    for l in range(32):
        dot += np.int64(ws[r, wo + 2 + l]) * np.int64(ys[j, yo + 4 + l])
    d = h2f[u16le(w, r, wo)] * h2f[u16le(y, j, yo)]
    return fmaf(d, np.float32(dot), acc)


@njit(cache=True, parallel=True, error_model="numpy")
def _tiled_emulate(type_id, block_bytes, w, ws, y, ys, h2f, out):
    nb = w.shape[1] // block_bytes
    for r in prange(w.shape[0]):
        sc = np.empty(8, dtype=np.int64)
        mn = np.empty(8, dtype=np.int64)
        for j in range(y.shape[0]):
            acc = np.float32(0.0)
            for kb in range(nb):  # one thread per output, blocks in order
                if type_id == _Q4_K_ID:
                    acc = _block_q4_k(acc, w, r, kb, y, ys, j, h2f, sc, mn)
                elif type_id == _Q6_K_ID:
                    acc = _block_q6_k(acc, w, ws, r, kb, y, ys, j, h2f)
                else:
                    acc = _block_q8_0(acc, w, ws, r, kb, y, ys, j, h2f)
            out[j, r] = acc


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
