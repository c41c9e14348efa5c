"""block_q6_K: 256 values in 16 sub-blocks of 16, 6-bit quants with int8 scales.

``quantize_q6_k`` mirrors ``quantize_row_q6_K_ref`` + ``make_qx_quants(16, 32, x, L, 1, NULL)``
(``ggml/src/ggml-quants.c``) float op by float op, vectorized over sub-blocks; sums run
element by element in C order.
"""

from __future__ import annotations

import numpy as np

from .formats import BLOCK_Q6_K, QK_K, quantize_superblocks_in_chunks
from .rounding import fp16_bits, nearest_int

SUB = 16  # values per sub-block
N_SUB = QK_K // SUB  # 16 sub-blocks per super-block
NMAX = 32  # levels -32..31, stored +32
GROUP_MAX_EPS = np.float32(1e-15)  # GROUP_MAX_EPS, ggml-quants.c
SCALE_RANGE = np.float32(-128.0)  # iscale = -128/max_scale

# make_qx_quants tries iscale = -(nmax + 0.1f*is)/max for is = -9..9, is != 0, in this order.
_STEPS = np.array([s for s in range(-9, 10) if s != 0], dtype=np.float32)
_CANDIDATES = (np.float32(NMAX) + np.float32(0.1) * _STEPS).astype(np.float32)

CHUNK_BLOCKS = 256  # super-blocks per vectorized chunk (work arrays of 4096 x 18 candidates)

_F0 = np.float32(0.0)


def make_qx_quants(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, 32, x, L, rmse_type=1, qw=NULL) for each row of x (S, n) float32.

    Returns (scale (S,) float32, L (S, n) uint8 in 0..63)."""
    S, n = x.shape
    ax = np.abs(x)
    imax = ax.argmax(axis=1)  # first index of the largest |x|, like the strict '>' scan
    rows = np.arange(S)
    amax = ax[rows, imax]
    mx = x[rows, imax]
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, np.float32(1.0), mx)  # zero rows are overwritten at the end

    w = x * x  # rmse_type 1
    wx = w * x
    iscale = np.float32(-NMAX) / mx
    l = np.clip(nearest_int(iscale[:, None] * x), -NMAX, NMAX - 1).astype(np.float32)
    sumlx = np.zeros(S, dtype=np.float32)
    suml2 = np.zeros(S, dtype=np.float32)
    for i in range(n):
        sumlx = sumlx + wx[:, i] * l[:, i]
        suml2 = suml2 + (w[:, i] * l[:, i]) * l[:, i]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != _F0, sumlx / suml2, _F0).astype(np.float32)
    best = scale * sumlx

    nc = _CANDIDATES.size
    iscale_c = (-_CANDIDATES)[None, :] / mx[:, None]  # (S, 18)
    lc = np.empty((n, S, nc), dtype=np.float32)
    sumlx_c = np.zeros((S, nc), dtype=np.float32)
    suml2_c = np.zeros_like(sumlx_c)
    for i in range(n):
        li = lc[i]
        np.clip(nearest_int(iscale_c * x[:, i, None]), -NMAX, NMAX - 1, out=li, casting="unsafe")
        sumlx_c += wx[:, i, None] * li
        suml2_c += (w[:, i, None] * li) * li

    choice = np.full(S, -1, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in range(nc):
            slx, sl2 = sumlx_c[:, c], suml2_c[:, c]
            take = (sl2 > _F0) & (slx * slx > best * sl2)
            new_scale = slx / sl2
            scale = np.where(take, new_scale, scale)
            best = np.where(take, new_scale * slx, best)
            choice = np.where(take, c, choice)
    picked = np.nonzero(choice >= 0)[0]
    if picked.size:
        l[picked] = lc[:, picked, choice[picked]].T

    L = (l + np.float32(NMAX)).astype(np.uint8)
    L[zero] = 0
    scale = np.where(zero, _F0, scale)
    return scale.astype(np.float32), L


def _quantize_superblocks(x: np.ndarray) -> np.ndarray:
    """float32 (B, 256) -> structured block_q6_K (B,)."""
    B = x.shape[0]
    scale, L = make_qx_quants(x.reshape(B * N_SUB, SUB))
    scales = scale.reshape(B, N_SUB)
    L = L.reshape(B, N_SUB, SUB)

    # max_scale = the signed scale with the largest |scale| (first one on ties); the C scan
    # starts at 0 with a strict '>', so NaN scales (overflowing sums) are never picked.
    a = np.abs(scales)
    a = np.where(a > _F0, a, _F0)
    ia = a.argmax(axis=1)
    max_abs = a[np.arange(B), ia]
    max_scale = np.where(max_abs > _F0, scales[np.arange(B), ia], _F0)
    empty = max_abs < GROUP_MAX_EPS
    safe_max = np.where(empty, np.float32(1.0), max_scale)

    iscale = SCALE_RANGE / safe_max
    d_bits = fp16_bits(np.float32(1.0) / iscale)
    # scales are int8 in the block: MIN(127, nearest_int(.)) then an int -> int8 store.
    sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)

    dd = d_bits.view(np.float16).astype(np.float32)[:, None] * sc.astype(np.float32)
    xb = x.reshape(B, N_SUB, SUB)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (np.clip(nearest_int(xb / dd[..., None]), -NMAX, NMAX - 1) + NMAX).astype(np.uint8)
    L = np.where((dd != _F0)[..., None], q, L)  # sub-blocks with d == 0 keep make_qx_quants' L

    # Element e = 128h + 32s + l: ql[64h + 32(s&1) + l] nibble (s>=2 -> high), qh[32h+l] bits 2s.
    L = L.reshape(B, 2, 4, 32)  # (block, h, s, l)
    ql = (L[:, :, 0:2, :] & 0x0F) | ((L[:, :, 2:4, :] & 0x0F) << 4)  # (B, h, s&1, l)
    hi = L >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # (B, h, l)

    out = np.empty(B, dtype=BLOCK_Q6_K)
    out["ql"] = ql.reshape(B, QK_K // 2)
    out["qh"] = qh.reshape(B, QK_K // 4)
    out["scales"] = sc
    out["d"] = d_bits.view(np.float16)
    out[empty] = np.zeros((), dtype=BLOCK_Q6_K)  # all-zero block (memset in the C)
    return out


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) with n % 256 == 0 -> uint8 (..., n/256*210), as quantize_row_q6_K_ref."""
    return quantize_superblocks_in_chunks(x, BLOCK_Q6_K, _quantize_superblocks, CHUNK_BLOCKS)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """Structured q6_K blocks (..., nb) -> float32 (..., nb*256): ``x = (f(d)*scale)*q``."""
    shp = blocks.shape
    ql = blocks["ql"].reshape(*shp, 2, 1, 2, 32)  # (h, nibble, s&1, l)
    low = (ql >> np.array([0, 4], dtype=np.uint8)[:, None, None]) & np.uint8(0x0F)
    low = low.reshape(*shp, 2, 4, 32)  # s = 2*nibble + (s&1)
    qh = blocks["qh"].reshape(*shp, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & np.uint8(0x03)
    q = (low | (high << 4)).astype(np.int8) - np.int8(NMAX)
    q = q.reshape(*shp, N_SUB, SUB).astype(np.float32)
    d = blocks["d"].astype(np.float32)[..., None] * blocks["scales"].astype(np.float32)  # (..., nb, 16)
    y = d[..., None] * q
    return y.reshape(*shp[:-1], shp[-1] * QK_K)
