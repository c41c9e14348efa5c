"""block_q4_K: 256 values in 8 sub-blocks of 32, 4-bit quants with 6-bit scales and mins.

``quantize_q4_k`` mirrors ``quantize_row_q4_K_ref`` + ``make_qkx2_quants``
(``ggml/src/ggml-quants.c``) float op by float op, vectorized over sub-blocks: every sum
is accumulated element by element in C order (never ``np.sum``, which reorders).
"""

from __future__ import annotations

import numpy as np

from .formats import BLOCK_Q4_K, K_SCALE_SIZE, QK_K, quantize_superblocks_in_chunks
from .rounding import fp16_bits, nearest_int

SUB = 32  # values per sub-block
N_SUB = QK_K // SUB  # 8 sub-blocks per super-block
NMAX = 15  # 4-bit levels 0..15
SCALE_MAX = 63  # 6-bit scale/min codes

# quantize_row_q4_K_ref calls make_qkx2_quants(32, 15, x, w, L, &min, Laux, -1.f, 0.1f, 20, false).
RMIN = np.float32(-1.0)
RDELTA = np.float32(0.1)
NSTEP = 20
# Candidate numerators ``rmin + rdelta*is + nmax`` for is = 0..nstep, evaluated left to right in float32.
_CANDIDATES = ((RMIN + RDELTA * np.arange(NSTEP + 1, dtype=np.float32)) + np.float32(NMAX)).astype(np.float32)

# Super-blocks per vectorized chunk: bounds the (32, sub-blocks) work arrays (1 MiB each at 1024).
CHUNK_BLOCKS = 1024

_F0 = np.float32(0.0)


def _column_sum(a: np.ndarray) -> np.ndarray:
    """Sum a (n, S) array over axis 0 one element at a time (the C loop order)."""
    acc = a[0].copy()
    for i in range(1, a.shape[0]):
        acc += a[i]
    return acc


def make_qkx2_quants(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(n, 15, x, w, L, &the_min, Laux, -1, 0.1, 20, use_mad=false) per column.

    x, w: float32 (n, S), one sub-block per column.  Returns (scale (S,), the_min (S,),
    L uint8 (n, S)).  The C overwrites ``min`` whenever a candidate wins, and later candidates
    use the updated ``min`` in their ``iscale`` and ``x - min``: the 21 candidates therefore
    run in order, each vectorized over all sub-blocks."""
    n, S = x.shape
    mn = x.min(axis=0)
    mx = x.max(axis=0)
    sum_w = _column_sum(w)
    sum_x = _column_sum(w * x)
    mn = np.where(mn > _F0, _F0, mn)
    flat = mx == mn
    # Flat columns give L = 0, scale = 0 in the C; run them on a dummy range, fix up at the end.
    mn = np.where(flat, np.float32(-1.0), mn)
    mx = np.where(flat, _F0, mx)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.float32(NMAX) / (mx - mn)
        scale = np.float32(1.0) / iscale
        L = np.clip(nearest_int(iscale * (x - mn)), 0, NMAX).astype(np.float32)
        diff = (scale * L + mn) - x
        best_error = _column_sum(w * (diff * diff))

        for c in range(NSTEP + 1):
            iscale = _CANDIDATES[c] / (mx - mn)
            laux = np.clip(nearest_int(iscale * (x - mn)), 0, NMAX).astype(np.float32)
            wl = w * laux
            sum_l = _column_sum(wl)
            sum_l2 = _column_sum(wl * laux)
            sum_xl = _column_sum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > _F0
            this_min = np.where(pos, _F0, this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            diff = (this_scale * laux + this_min) - x
            cur_error = _column_sum(w * (diff * diff))
            take = (D > _F0) & (cur_error < best_error)
            best_error = np.where(take, cur_error, best_error)
            scale = np.where(take, this_scale, scale)
            mn = np.where(take, this_min, mn)
            L = np.where(take, laux, L)

    scale = np.where(flat, _F0, scale)
    mn = np.where(flat, x.min(axis=0), mn)  # flat: min == max == the clamped minimum
    mn = np.where(flat & (mn > _F0), _F0, mn)
    L = np.where(flat, _F0, L)
    return scale.astype(np.float32), -mn, L.astype(np.uint8)


def pack_scale_min(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins (B, 8) uint8 -> the 12 packed bytes (B, 12) (get_scale_min_k4 inverse)."""
    out = np.empty((ls.shape[0], K_SCALE_SIZE), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return out


def unpack_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes (..., 12) -> 6-bit scales and mins (..., 8) each (get_scale_min_k4)."""
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, m


def _quantize_superblocks(x: np.ndarray) -> np.ndarray:
    """float32 (B, 256) -> structured block_q4_K (B,)."""
    B = x.shape[0]
    xs = np.ascontiguousarray(x.reshape(B * N_SUB, SUB).T)  # (32, sub-blocks): columns are sub-blocks
    av_x = np.sqrt(_column_sum(xs * xs) / np.float32(SUB))
    w = av_x + np.abs(xs)
    scale, the_min, L = make_qkx2_quants(xs, w)
    scales = scale.reshape(B, N_SUB)
    mins = the_min.reshape(B, N_SUB)
    L = L.T.reshape(B, N_SUB, SUB)

    # max_scale/max_min start at +0 and only grow on a strictly larger value: never -0, and a
    # NaN scale (from overflowing sums on huge inputs) is skipped, hence fmax, not max.
    max_scale = np.fmax.reduce(scales, axis=1)
    max_scale = np.where(max_scale > _F0, max_scale, _F0)
    max_min = np.fmax.reduce(mins, axis=1)
    max_min = np.where(max_min > _F0, max_min, _F0)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > _F0, np.float32(SCALE_MAX) / max_scale, _F0).astype(np.float32)
        inv_min = np.where(max_min > _F0, np.float32(SCALE_MAX) / max_min, _F0).astype(np.float32)
    # The C stores nearest_int(...) into a uint8 (wraps) before MIN(63, .).
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, SCALE_MAX).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, SCALE_MAX).astype(np.uint8)

    out = np.empty(B, dtype=BLOCK_Q4_K)
    d_bits = fp16_bits(max_scale / np.float32(SCALE_MAX))
    dmin_bits = fp16_bits(max_min / np.float32(SCALE_MAX))
    out["d"] = d_bits.view(np.float16)
    out["dmin"] = dmin_bits.view(np.float16)
    out["scales"] = pack_scale_min(ls, lm)

    # Second pass: re-quantize every value against the stored (fp16, 6-bit) scales.
    dd = d_bits.view(np.float16).astype(np.float32)[:, None] * ls.astype(np.float32)
    dm = dmin_bits.view(np.float16).astype(np.float32)[:, None] * lm.astype(np.float32)
    xb = x.reshape(B, N_SUB, SUB)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(nearest_int((xb + dm[..., None]) / dd[..., None]), 0, NMAX).astype(np.uint8)
    L = np.where((dd != _F0)[..., None], q, L)  # sub-blocks with d == 0 keep the first-pass L

    # Chunk c of 32 bytes: low nibble = sub-block 2c, high nibble = sub-block 2c+1.
    L = L.reshape(B, N_SUB // 2, 2, SUB)
    out["qs"] = (L[:, :, 0, :] | (L[:, :, 1, :] << 4)).reshape(B, QK_K // 2)
    return out


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) with n % 256 == 0 -> uint8 (..., n/256*144), as quantize_row_q4_K_ref."""
    return quantize_superblocks_in_chunks(x, BLOCK_Q4_K, _quantize_superblocks, CHUNK_BLOCKS)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """Structured q4_K blocks (..., nb) -> float32 (..., nb*256): ``x = (f(d)*sc)*q - f(dmin)*m``."""
    sc, m = unpack_scale_min(blocks["scales"])
    d1 = blocks["d"].astype(np.float32)[..., None] * sc.astype(np.float32)  # (..., nb, 8)
    m1 = blocks["dmin"].astype(np.float32)[..., None] * m.astype(np.float32)
    qs = blocks["qs"].reshape(*blocks.shape, N_SUB // 2, 1, SUB)
    q = (qs >> np.array([0, 4], dtype=np.uint8)[:, None]) & np.uint8(0x0F)  # (..., nb, 4, 2, 32)
    q = q.reshape(*blocks.shape, N_SUB, SUB).astype(np.float32)
    y = d1[..., None] * q - m1[..., None]
    return y.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK_K)
