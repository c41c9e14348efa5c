"""Numba emulator of ``mmq_stock.cu``: llama.cpp MMQ's float sequence, bit for bit (see the
package docstring and :mod:`hiraishin.plans.mmq_stock`).

The integer dot products of a q8_1 block with a weight sub-block are exact in any order, so they
are computed here in plain k order (each weight row and the activations decoded to integers once);
every float operation is the kernel's, in its order.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, f32_to_f16_bits, fmaf
from ...plans.mmq_stock import MMQ_TILE_ROWS
from ...quant import BLOCK_BYTES, BLOCK_ELEMS
from ..blocks import (Q4_K_BYTES, Q6_K_BYTES, QK_K, q4_k_dot32, q4_k_row_scales, q4_k_row_values,
                      q6_k_dot32, q6_k_row_values, q8_1_ints)

__all__ = ["emulate", "piece_tables"]

_Q8_BYTES = BLOCK_BYTES["Q8_1"]
_Q8_ELEMS = BLOCK_ELEMS["Q8_1"]


@njit(cache=True, inline="always")
def _piece_q4_k(qv, xi, xd, xs, j, kb0, kb1, ws, wm):
    """One piece of a Q4_K row (values ``qv``) times column j: sum from 0 over super-blocks kb0..kb1-1."""
    acc = np.float32(0.0)
    for i in range(kb0, kb1):
        for sb in range(8):
            b = i * 8 + sb
            c = q4_k_dot32(qv, xi, j, b)
            acc = fmaf(ws[b] * xd[j, b], np.float32(c), acc)
            acc = fmaf(wm[b], xs[j, b], acc)
    return acc


@njit(cache=True, inline="always")
def _piece_q6_k(qv, sc, dw, xi, xd, j, kb0, kb1):
    acc = np.float32(0.0)
    for i in range(kb0, kb1):
        for n in range(2):
            tmp = np.float32(0.0)
            for bb in range(4):
                b = i * 8 + 4 * n + bb
                c = q6_k_dot32(qv, sc, xi, j, b)
                tmp = fmaf(np.float32(c), xd[j, b], tmp)
            acc = fmaf(tmp, dw[i], acc)
    return acc


@njit(cache=True, inline="always")
def _round_h(v):
    return F16_TO_F32[f32_to_f16_bits(v)]


@njit(cache=True, parallel=True, error_model="numpy")
def _mmq_stock(is_q4, w, xi, xd, xs, row0, tile_cols, ntx, first, count, bounds, out):
    nrows = w.shape[0]
    ncols = xi.shape[0]
    nb = w.shape[1] // (Q4_K_BYTES if is_q4 else Q6_K_BYTES)
    maxp = 1
    for t in range(count.shape[0]):
        maxp = max(maxp, count[t])
    for r in prange(nrows):
        ws = np.empty(nb * 8, dtype=np.float32)
        wm = np.empty(nb * 8, dtype=np.float32)
        qv = np.empty(nb * QK_K, dtype=np.int32)  # the row's values, decoded once (not per column)
        sc6 = np.empty(nb * 16, dtype=np.int32)
        dw = np.empty(nb, dtype=np.float32)
        part = np.empty(maxp, dtype=np.float32)
        if is_q4:  # load_tiles_q4_K: half2(d, -dmin) * half2(sc, m), one fp16 rounding each
            q4_k_row_values(w, r, qv)
            q4_k_row_scales(w, r, ws, wm, F16_TO_F32)
            for b in range(nb * 8):
                ws[b] = _round_h(ws[b])
                wm[b] = -_round_h(wm[b])
        else:
            q6_k_row_values(w, r, qv, sc6, dw, F16_TO_F32)
        it = (row0 + r) // MMQ_TILE_ROWS
        for j in range(ncols):
            t = it * ntx + j // tile_cols
            m = count[t]
            for p in range(m):
                kb0 = bounds[first[t] + p, 0]
                kb1 = bounds[first[t] + p, 1]
                if is_q4:
                    part[p] = _piece_q4_k(qv, xi, xd, xs, j, kb0, kb1, ws, wm)
                else:
                    part[p] = _piece_q6_k(qv, sc6, dw, xi, xd, j, kb0, kb1)
            if m == 1:
                out[j, r] = part[0]
            else:  # mul_mat_q_stream_k_fixup: sum = 0, += P_{m-2} .. P_0; out = P_{m-1} + sum
                s = np.float32(0.0)
                for p in range(m - 2, -1, -1):
                    s = s + part[p]
                out[j, r] = part[m - 1] + s


def piece_tables(plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, count, bounds): the pieces of every tile of ``plan`` as flat int64 arrays."""
    pieces = plan.pieces()
    count = np.array([len(p) for p in pieces], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    bounds = np.array([b for p in pieces for b in p], dtype=np.int64).reshape(-1, 2)
    return first, count, bounds


def emulate(w: np.ndarray, qtype: str, xq: np.ndarray, plan, row0: int = 0) -> np.ndarray:
    """Outputs (ncols, rows) float32 of the stock MMQ order, the kernel's bits.

    ``w``: uint8 Q4_K/Q6_K rows ``row0 .. row0 + len(w) - 1`` of the plan's (``plan.n``, ``plan.k``)
    weight (the whole weight by default; a slice emulates only those rows, with the pieces of
    the full launch). ``xq``: uint8 (ncols, K/32*36) q8_1 bytes (llama.cpp's layout), or float32
    activations, quantized here the same way.
    """
    xq = np.asarray(xq)
    if xq.dtype == np.float32:
        from ..quantize import emulate as quantize

        xq = quantize(np.atleast_2d(xq))
    xq = np.ascontiguousarray(np.atleast_2d(xq), dtype=np.uint8)
    w = np.ascontiguousarray(w, dtype=np.uint8)
    if qtype not in ("Q4_K", "Q6_K") or qtype != plan.qtype:
        raise ValueError(f"plan is for {plan.qtype}; the stock MMQ order covers Q4_K and Q6_K, got {qtype!r}")
    k = xq.shape[1] // _Q8_BYTES * _Q8_ELEMS
    if k != plan.k:
        raise ValueError(f"activations have K={k}, the plan K={plan.k}")
    if xq.shape[0] != plan.ncols:
        raise ValueError(f"activations have {xq.shape[0]} columns, the plan {plan.ncols}")
    if w.shape[1] != k // 256 * BLOCK_BYTES[qtype]:
        raise ValueError(f"weight rows of {w.shape[1]} bytes are not {qtype} rows of K={k}")
    if row0 < 0 or row0 + w.shape[0] > plan.n:
        raise ValueError(f"rows {row0}..{row0 + w.shape[0]} are not rows of the plan's {plan.n}")
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    if out.size == 0:
        return out
    first, count, bounds = piece_tables(plan)
    _, ntx = plan.tiles
    xi, xd, xs = q8_1_ints(xq, F16_TO_F32)
    _mmq_stock(qtype == "Q4_K", w, xi, xd, xs, row0, plan.tile_cols, ntx, first, count, bounds, out)
    return out
