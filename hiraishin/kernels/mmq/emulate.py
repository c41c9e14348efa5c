"""Numba emulator of ``mmq.cu``: the sub-block order, bit for bit (see the package docstring).

The integers (dot products of a q8_1 block with a weight sub-block) are computed here in plain
k order: they are exact, so any order gives the kernel's (tensor-core) values. Every float
operation is the kernel's, in the kernel's order: ``fmaf`` where it writes ``__fmaf_rn``.
For speed on the CPU the activations are decoded to integers once per call and each weight row
once (not once per row and column); that changes which integers are formed when, not a value.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, fmaf
from ...quant import BLOCK_BYTES, BLOCK_ELEMS
from ..blocks import (Q4_K_BYTES, Q6_K_BYTES, QK_K, q4_k_dot32, q4_k_row_scales, q4_k_row_values,
                      q6_k_dot32, q6_k_row_values, q8_1_ints)

__all__ = ["emulate", "segment_starts"]

_Q8_BYTES = BLOCK_BYTES["Q8_1"]
_Q8_ELEMS = BLOCK_ELEMS["Q8_1"]


@njit(cache=True, parallel=True, error_model="numpy")
def _mmq_q4_k(w, xi, xd, xs, starts, out, f16):
    nrows = w.shape[0]
    ncols = xi.shape[0]
    nseg = starts.shape[0] - 1
    nsb = w.shape[1] // Q4_K_BYTES
    for r in prange(nrows):
        # the row once: its 4-bit values in k order and each sub-block's d*sc, dmin*m (float32 products)
        qv = np.empty(nsb * QK_K, dtype=np.int32)
        q4_k_row_values(w, r, qv)
        ws = np.empty(nsb * 8, dtype=np.float32)
        wm = np.empty(nsb * 8, dtype=np.float32)
        q4_k_row_scales(w, r, ws, wm, f16)
        part = np.empty(nseg, dtype=np.float32)
        for j in range(ncols):
            for s in range(nseg):
                acc = np.float32(0.0)
                for i in range(starts[s], starts[s + 1]):
                    for sb in range(8):
                        b = i * 8 + sb
                        c = q4_k_dot32(qv, xi, j, b)
                        acc = fmaf(ws[b] * xd[j, b], np.float32(c), acc)
                        acc = fmaf(-wm[b], xs[j, b], acc)
                part[s] = acc
            v = part[0]
            for s in range(1, nseg):
                v = v + part[s]
            out[j, r] = v


@njit(cache=True, parallel=True, error_model="numpy")
def _mmq_q6_k(w, xi, xd, starts, out, f16):
    nrows = w.shape[0]
    ncols = xi.shape[0]
    nseg = starts.shape[0] - 1
    nsb = w.shape[1] // Q6_K_BYTES
    for r in prange(nrows):
        # the row once: its values minus 32 in k order, its 16-value scales and the super-blocks' d
        qv = np.empty(nsb * QK_K, dtype=np.int32)
        sc = np.empty(nsb * 16, dtype=np.int32)
        dw = np.empty(nsb, dtype=np.float32)
        q6_k_row_values(w, r, qv, sc, dw, f16)
        part = np.empty(nseg, dtype=np.float32)
        for j in range(ncols):
            for s in range(nseg):
                acc = np.float32(0.0)
                for i in range(starts[s], starts[s + 1]):
                    for jj in range(8):
                        b = i * 8 + jj
                        c = q6_k_dot32(qv, sc, xi, j, b)  # sc_0 * dot_0 + sc_1 * dot_1 (the MMAs)
                        acc = fmaf(dw[i] * xd[j, b], np.float32(c), acc)
                part[s] = acc
            v = part[0]
            for s in range(1, nseg):
                v = v + part[s]
            out[j, r] = v


def segment_starts(k: int, nseg: int) -> np.ndarray:
    """First super-block of each of ``nseg`` segments of a row of ``k`` values, and the end."""
    nb = k // 256
    return np.array([s * nb // nseg for s in range(nseg + 1)], dtype=np.int64)


def emulate(w: np.ndarray, qtype: str, xq: np.ndarray, plan) -> np.ndarray:
    """Outputs (ncols, N) float32 of the sub-block order, the kernels' bits.

    ``w``: uint8 (N, row_bytes) Q4_K/Q6_K rows. ``xq``: uint8 (ncols, K/32*36) q8_1 bytes in
    llama.cpp's layout (``hiraishin.kernels.quantize.emulate(x)``), or float32 (ncols, K)
    activations, quantized here the same way. ``plan``: a :class:`~hiraishin.plans.subblock.SubBlockPlan`
    (only ``plan.nseg`` and ``plan.k`` matter; the width does not).
    """
    xq = np.asarray(xq)
    if xq.dtype == np.float32:
        from ..quantize import emulate as quantize

        xq = quantize(np.atleast_2d(xq))
    xq = np.ascontiguousarray(np.atleast_2d(xq), dtype=np.uint8)
    w = np.ascontiguousarray(w, dtype=np.uint8)
    k = xq.shape[1] // _Q8_BYTES * _Q8_ELEMS
    if k != plan.k:
        raise ValueError(f"activations have K={k}, the plan K={plan.k}")
    if w.shape[1] != k // 256 * BLOCK_BYTES[qtype]:
        raise ValueError(f"weight rows of {w.shape[1]} bytes are not {qtype} rows of K={k}")
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    if out.size == 0:
        return out
    starts = segment_starts(k, plan.nseg)
    if qtype not in ("Q4_K", "Q6_K"):
        raise ValueError(f"sub-block order covers Q4_K and Q6_K, not {qtype!r}")
    xi, xd, xs = q8_1_ints(xq, F16_TO_F32)
    if qtype == "Q4_K":
        _mmq_q4_k(w, xi, xd, xs, starts, out, F16_TO_F32)
    else:
        _mmq_q6_k(w, xi, xd, starts, out, F16_TO_F32)
    return out
