"""Numba emulator of ``rmsnorm.cu`` (the reduction tree is in the package docstring)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...fp import fmaf

__all__ = ["emulate", "block_threads", "SMALL_ROW_THREADS", "LARGE_ROW_THREADS", "LARGE_ROW_MIN"]

# llama.cpp norm.cu (rms_norm_f32 launch): 256 threads per row if ncols < 1024, else 1024.
SMALL_ROW_THREADS = 256
LARGE_ROW_THREADS = 1024
LARGE_ROW_MIN = 1024
WARP = 32


def block_threads(n: int) -> int:
    """Threads per row for a row of ``n`` floats (depends on ``n`` only, never on the batch)."""
    return LARGE_ROW_THREADS if n >= LARGE_ROW_MIN else SMALL_ROW_THREADS


@njit(cache=True, inline="always")
def _butterfly(lanes):
    # xor butterfly over 32 lanes, as hx_warp_sum: lane i <- v[i] + v[i ^ off]
    tmp = np.empty(WARP, np.float32)
    off = 16
    while off > 0:
        for i in range(WARP):
            tmp[i] = lanes[i] + lanes[i ^ off]
        for i in range(WARP):
            lanes[i] = tmp[i]
        off >>= 1
    return lanes[0]


@njit(cache=True)
def _rms_norm_rows(x, w, eps, nthreads, out):
    rows, n = x.shape
    nwarps = nthreads // WARP
    partial = np.empty(nthreads, np.float32)
    lanes = np.empty(WARP, np.float32)
    n_f = np.float32(n)
    one = np.float32(1.0)
    for r in range(rows):
        for t in range(nthreads):
            s = np.float32(0.0)
            for i in range(t, n, nthreads):
                s = fmaf(x[r, i], x[r, i], s)
            partial[t] = s
        warp_sums = np.zeros(WARP, np.float32)
        for wi in range(nwarps):
            for lane in range(WARP):
                lanes[lane] = partial[wi * WARP + lane]
            warp_sums[wi] = _butterfly(lanes)
        total = _butterfly(warp_sums)
        mean = total / n_f
        scale = one / np.sqrt(mean + eps)
        for i in range(n):
            out[r, i] = (scale * x[r, i]) * w[i]


def emulate(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``(scale * x) * w`` per row of float32 ``x`` (rows, n), ``w`` (n,): the kernel's ops in its order.

    Inputs are not checked (the CPU backend checks them).
    """
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _rms_norm_rows(x, np.ascontiguousarray(w), np.float32(eps), block_threads(x.shape[1]), out)
    return out
