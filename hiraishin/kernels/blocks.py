"""Block facts the Numba emulators use as module constants (Numba folds them into compiled code),
and the two byte readers the tensor-core emulators share.

Taken from :mod:`hiraishin.quant`, so no emulator repeats a block size or a type id.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID, QK_K

__all__ = ["Q4_K_BYTES", "Q4_K_ID", "Q6_K_BYTES", "Q6_K_ID", "Q8_0_BYTES", "Q8_0_ELEMS", "Q8_1_BYTES",
           "Q8_1_ELEMS", "Q8_1_PER_SUPER", "QK_K", "half_at", "int8_of"]

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


@njit(cache=True, inline="always")
def q4_k_dot32(w, r, o, sb, xq, j, xo):
    """The exact integer dot of sub-block ``sb`` (32 values) of the Q4_K super-block at ``w[r, o]`` with the
    q8_1 block at ``xq[j, xo]`` (its 32 int8 quants): what one m16n8k32 MMA computes per output."""
    qo = o + 16 + 32 * (sb >> 1)
    shift = 4 * (sb & 1)
    c = np.int32(0)
    for l in range(32):
        c += ((np.int32(w[r, qo + l]) >> shift) & 0xF) * int8_of(xq[j, xo + 4 + l])
    return c


@njit(cache=True, inline="always")
def q6_k_dot32(w, r, o, jj, xq, j, xo):
    """The exact integer ``sc_0 * dot_0 + sc_1 * dot_1`` of the two 16-value sub-blocks of q8_1 block ``jj`` of the
    Q6_K super-block at ``w[r, o]`` with the q8_1 block at ``xq[j, xo]`` (two m16n8k16 MMAs, scaled as ints)."""
    n = jj >> 2
    bb = jj & 3
    c = np.int32(0)
    for h in range(2):
        ch = np.int32(0)
        for l in range(16 * h, 16 * h + 16):
            lo = (np.int32(w[r, o + 64 * n + 32 * (bb & 1) + l]) >> (4 * (bb >> 1))) & 0xF
            hi = (np.int32(w[r, o + 128 + 32 * n + l]) >> (2 * bb)) & 3
            ch += ((lo | (hi << 4)) - 32) * int8_of(xq[j, xo + 4 + l])
        c += int8_of(w[r, o + 192 + 2 * jj + h]) * ch
    return c
