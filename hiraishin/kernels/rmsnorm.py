"""RMSNorm fused with the weight multiply: ``y = (scale * x) * w``.

``scale = 1 / sqrt(sum(x**2) / n + eps)`` in IEEE float32 (division and square root correctly
rounded; llama.cpp's ``rsqrtf`` is an approximation the CPU cannot reproduce).

Order of the sum of squares (one fixed tree per row length, never per batch): a block of
:func:`block_threads` ``(n)`` threads; thread ``t`` accumulates ``fma(x[i], x[i], s)`` for
``i = t, t + nthreads, ...``; each warp folds its 32 partials with the xor butterfly
(16, 8, 4, 2, 1); lane ``i`` of a warp then takes warp ``i``'s partial (0 past the last warp)
and butterflies again. The CUDA kernel is ``rmsnorm.cu``; :func:`rms_norm_cpu` is its emulator.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..errors import BackendError
from ..fp import fmaf

__all__ = ["rms_norm", "rms_norm_cpu", "rms_norm_cuda", "launch_rms_norm", "block_threads", "SMALL_ROW_THREADS",
           "LARGE_ROW_THREADS", "LARGE_ROW_MIN"]

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


def _check(x, w):
    if x.ndim != 2 or w.ndim != 1 or x.shape[1] != w.shape[0]:
        raise BackendError(f"rms_norm: x must be (rows, n) and w (n,), got x {x.shape}, w {w.shape}")
    if x.dtype != np.float32 or w.dtype != np.float32:
        raise BackendError(f"rms_norm: needs float32 x and w, got {x.dtype}, {w.dtype}")


def rms_norm_cpu(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Emulator: the kernel's float ops in the kernel's order, on (rows, n) float32 numpy arrays."""
    x = np.ascontiguousarray(x)
    _check(x, w)
    out = np.empty_like(x)
    _rms_norm_rows(x, np.ascontiguousarray(w), np.float32(eps), block_threads(x.shape[1]), out)
    return out


@functools.cache
def _kernel():
    from . import _cuda

    return _cuda.get_kernel("rmsnorm.cu", "hx_rms_norm_f32")


def launch_rms_norm(x, w, eps: float, out):
    """Launch ``hx_rms_norm_f32`` into ``out``, unchecked: one block per row of ``x``.

    For callers that validated once (the CUDA backend): ``x`` and ``out`` float32 C-contiguous
    CuPy arrays of one shape (rows, n), not overlapping; ``w`` float32 C-contiguous (n,).
    Returns ``out``.
    """
    rows, n = x.shape
    if rows:
        _kernel()((rows,), (block_threads(n),), (x, w, out, np.int32(n), np.float32(eps)))
    return out


def rms_norm_cuda(x, w, eps: float):
    """Launch ``hx_rms_norm_f32`` on (rows, n) float32 CuPy arrays: one block per row."""
    from . import _cuda

    cp = _cuda.require_cupy()
    x = cp.ascontiguousarray(cp.asarray(x))
    w = cp.ascontiguousarray(cp.asarray(w))
    _check(x, w)
    return launch_rms_norm(x, w, eps, cp.empty_like(x))


def rms_norm(x, w, eps: float, backend: str = "cpu"):
    """``(scale * x) * w`` per row of ``x`` (rows, n); ``backend`` is ``"cpu"`` or ``"cuda"``."""
    if backend == "cpu":
        return rms_norm_cpu(x, w, eps)
    if backend == "cuda":
        return rms_norm_cuda(x, w, eps)
    raise BackendError(f"rms_norm: unknown backend {backend!r}")
