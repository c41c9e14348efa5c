"""Block facts the Numba emulators use as module constants (Numba folds them into compiled code),
and the byte readers the tensor-core emulators share (each weight row and the activations
decoded to integers once, then exact integer dots in k order).

Taken from :mod:`hiraishin.quant`, so no emulator repeats a block size or a type id.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID, QK_K

__all__ = ["Q4_K_BYTES", "Q4_K_ID", "Q6_K_BYTES", "Q6_K_ID", "Q8_0_BYTES", "Q8_0_ELEMS", "Q8_1_BYTES",
           "Q8_1_ELEMS", "Q8_1_PER_SUPER", "QK_K", "half_at", "int8_of", "q4_k_scale_min", "q8_1_ints",
           "q4_k_row_values", "q4_k_row_scales", "q6_k_row_values", "q4_k_dot32", "q6_k_dot32"]

Q8_1_BYTES = BLOCK_BYTES["Q8_1"]
Q4_K_BYTES = BLOCK_BYTES["Q4_K"]
Q6_K_BYTES = BLOCK_BYTES["Q6_K"]
Q8_0_BYTES = BLOCK_BYTES["Q8_0"]
Q4_K_ID = GGML_TYPE_ID["Q4_K"]
Q6_K_ID = GGML_TYPE_ID["Q6_K"]
Q8_1_PER_SUPER = QK_K // BLOCK_ELEMS["Q8_1"]  # q8_1 blocks of 32 values per 256-value super-block
Q8_0_ELEMS = BLOCK_ELEMS["Q8_0"]  # values per block (QK_K: per K-quant super-block)
Q8_1_ELEMS = BLOCK_ELEMS["Q8_1"]


@njit(cache=True, inline="always")
def half_at(b0, b1, f16):
    """The float32 value of the little-endian fp16 bytes ``b0``, ``b1`` (``f16``: the 65536-entry table)."""
    return f16[np.int64(b0) | (np.int64(b1) << 8)]


@njit(cache=True, inline="always")
def int8_of(b):
    """A uint8 byte read as int8."""
    v = np.int32(b)
    return v - 256 if v >= 128 else v


@njit(cache=True, inline="always")
def q4_k_scale_min(w, r, o, sb):
    """The 6-bit (scale, min) of sub-block ``sb`` of the Q4_K super-block at ``w[r, o]`` (llama.cpp's
    get_scale_min_k4)."""
    q = o + 4
    if sb < 4:
        return np.int32(w[r, q + sb]) & 63, np.int32(w[r, q + sb + 4]) & 63
    sc = (np.int32(w[r, q + sb + 4]) & 0xF) | ((np.int32(w[r, q + sb - 4]) >> 6) << 4)
    m = (np.int32(w[r, q + sb + 4]) >> 4) | ((np.int32(w[r, q + sb]) >> 6) << 4)
    return sc, m


@njit(cache=True)
def q8_1_ints(xq, f16):
    """llama.cpp's q8_1 blocks (ncols, K/32*36 bytes) as int32 quants (ncols, K) in k order and the
    float32 d and s of each block (ncols, K/32): what the tensor-core emulators read, decoded once
    per call instead of once per weight row."""
    ncols = xq.shape[0]
    nb = xq.shape[1] // Q8_1_BYTES
    xi = np.empty((ncols, nb * Q8_1_ELEMS), dtype=np.int32)
    xd = np.empty((ncols, nb), dtype=np.float32)
    xs = np.empty((ncols, nb), dtype=np.float32)
    for j in range(ncols):
        for b in range(nb):
            xo = b * Q8_1_BYTES
            xd[j, b] = half_at(xq[j, xo], xq[j, xo + 1], f16)
            xs[j, b] = half_at(xq[j, xo + 2], xq[j, xo + 3], f16)
            for l in range(Q8_1_ELEMS):
                xi[j, b * Q8_1_ELEMS + l] = int8_of(xq[j, xo + 4 + l])
    return xi, xd, xs


@njit(cache=True, inline="always")
def q4_k_row_values(w, r, qv):
    """The 4-bit values of Q4_K row ``r`` into ``qv`` (int32, K) in k order: value 32*sb + l of a
    super-block is the low (sb even) or high (sb odd) nibble of quant byte 32*(sb//2) + l."""
    for i in range(w.shape[1] // Q4_K_BYTES):
        o = i * Q4_K_BYTES
        for sb in range(8):
            qo = o + 16 + 32 * (sb >> 1)
            shift = 4 * (sb & 1)
            for l in range(32):
                qv[i * QK_K + sb * 32 + l] = (np.int32(w[r, qo + l]) >> shift) & 0xF


@njit(cache=True, inline="always")
def q4_k_row_scales(w, r, ws, wm, f16):
    """The float32 products d * sc and dmin * m of every sub-block of Q4_K row ``r`` into ``ws``, ``wm``
    (K/32 each, in k order): one RN product each, as the kernels form them before any rounding."""
    for i in range(w.shape[1] // Q4_K_BYTES):
        o = i * Q4_K_BYTES
        d = half_at(w[r, o], w[r, o + 1], f16)
        dmin = half_at(w[r, o + 2], w[r, o + 3], f16)
        for sb in range(8):
            sc, m = q4_k_scale_min(w, r, o, sb)
            ws[i * 8 + sb] = d * np.float32(sc)
            wm[i * 8 + sb] = dmin * np.float32(m)


@njit(cache=True, inline="always")
def q6_k_row_values(w, r, qv, sc, dw, f16):
    """The 6-bit values minus 32 of Q6_K row ``r`` into ``qv`` (int32, K) in k order, its int8
    scales (one per 16 values) into ``sc`` (int32, K/16) and each super-block's d into ``dw`` (float32)."""
    for i in range(w.shape[1] // Q6_K_BYTES):
        o = i * Q6_K_BYTES
        dw[i] = half_at(w[r, o + 208], w[r, o + 209], f16)
        for t in range(16):
            sc[i * 16 + t] = int8_of(w[r, o + 192 + t])
        for jj in range(8):
            n = jj >> 2
            bb = jj & 3
            for l in range(32):
                lo = (np.int32(w[r, o + 64 * n + 32 * (bb & 1) + l]) >> (4 * (bb >> 1))) & 0xF
                hi = (np.int32(w[r, o + 128 + 32 * n + l]) >> (2 * bb)) & 3
                qv[i * QK_K + jj * 32 + l] = (lo | (hi << 4)) - 32


@njit(cache=True, inline="always")
def q4_k_dot32(qv, xi, j, b):
    """The exact integer dot of the row's q8_1-block-sized piece ``b`` (32 values, from
    :func:`q4_k_row_values`) with column j's quants there: what one m16n8k32 MMA computes per output."""
    c = np.int32(0)
    base = b * 32
    for l in range(32):
        c += qv[base + l] * xi[j, base + l]
    return c


@njit(cache=True, inline="always")
def q6_k_dot32(qv, sc, xi, j, b):
    """The exact integer ``sc_0 * dot_0 + sc_1 * dot_1`` of the two 16-value halves of piece ``b``
    (values from :func:`q6_k_row_values`) with column j's quants (two m16n8k16 MMAs, scaled as ints)."""
    base = b * 32
    c0 = np.int32(0)
    c1 = np.int32(0)
    for l in range(16):
        c0 += qv[base + l] * xi[j, base + l]
        c1 += qv[base + 16 + l] * xi[j, base + 16 + l]
    return sc[2 * b] * c0 + sc[2 * b + 1] * c1
