"""Rotary position embedding, NEOX layout (Qwen3), from float64-built cos/sin tables.

Dimension ``d`` is rotated together with ``d + head_dim/2`` (llama.cpp rope.cu, ``rope_neox``):
``y[d] = x[d]*cos - x[d+h]*sin``, ``y[d+h] = x[d]*sin + x[d+h]*cos`` with
``theta = pos * base**(-2d/head_dim)``. The angle tables are computed once on the host in
float64 and rounded to float32 (:func:`rope_tables`); both backends read the same table, so
there is no transcendental function on the device whose bits could differ. (llama.cpp computes
the angle with fast-math ``powf``/``cosf``/``sinf`` on the device; we trade that for exactness.)
No reduction: nothing to plan. Kernel ``rope.cu``; emulator :func:`rope_neox_cpu`.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..errors import BackendError

__all__ = ["rope_tables", "rope_neox", "rope_neox_cpu", "rope_neox_cuda", "launch_rope_neox"]


def rope_tables(n_ctx: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """``cos``, ``sin`` float32 tables of shape (n_ctx, head_dim/2), computed in float64."""
    if head_dim % 2:
        raise BackendError(f"rope_tables: head_dim must be even, got {head_dim}")
    half = head_dim // 2
    inv_freq = np.power(np.float64(base), -2.0 * np.arange(half, dtype=np.float64) / head_dim)
    theta = np.arange(n_ctx, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@njit(cache=True)
def _rope_rows(x, pos, cos_t, sin_t, out):
    T, H, D = x.shape
    half = D // 2
    for t in range(T):
        p = pos[t]
        for h in range(H):
            for d in range(half):
                c = cos_t[p, d]
                s = sin_t[p, d]
                x0 = x[t, h, d]
                x1 = x[t, h, d + half]
                out[t, h, d] = x0 * c - x1 * s
                out[t, h, d + half] = x0 * s + x1 * c


def _check(x, pos, cos_t, sin_t):
    if x.ndim != 3 or x.shape[2] % 2 or x.dtype != np.float32:
        raise BackendError(f"rope: x must be float32 (T, n_head, head_dim even), got {x.dtype} {x.shape}")
    if pos.shape != (x.shape[0],):
        raise BackendError(f"rope: pos must have shape ({x.shape[0]},), got {pos.shape}")
    if cos_t.shape != sin_t.shape or cos_t.shape[1] != x.shape[2] // 2:
        raise BackendError(f"rope: tables {cos_t.shape}/{sin_t.shape} do not fit head_dim {x.shape[2]}")


def _check_positions(pos, n_ctx: int):
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n_ctx):
        raise BackendError(f"rope: positions {int(pos.min())}..{int(pos.max())} outside the table (n_ctx {n_ctx})")


def rope_neox_cpu(x, pos, cos_t, sin_t) -> np.ndarray:
    """Emulator on numpy arrays: x float32 (T, n_head, D), pos int (T,) absolute positions."""
    x = np.ascontiguousarray(x)
    pos = np.ascontiguousarray(pos, dtype=np.int32)
    _check(x, pos, cos_t, sin_t)
    _check_positions(pos, cos_t.shape[0])
    out = np.empty_like(x)
    _rope_rows(x, pos, cos_t, sin_t, out)
    return out


@functools.cache
def _kernel():
    from . import _cuda

    return _cuda.get_kernel("rope.cu", "hx_rope_neox_f32")


def launch_rope_neox(x, pos, cos_t, sin_t, out):
    """Launch ``hx_rope_neox_f32`` into ``out``, unchecked: one block per (token, head).

    For callers that validated once (the CUDA backend): ``x`` and ``out`` float32 C-contiguous
    CuPy arrays (T, n_head, D), not overlapping; ``pos`` int32 C-contiguous (T,) on the device,
    each in ``0..n_ctx-1``; ``cos_t``/``sin_t`` float32 C-contiguous (n_ctx, D/2). Returns ``out``.
    """
    T, H, D = x.shape
    if T:
        _kernel()((T * H,), (D // 2,), (x, out, pos, cos_t, sin_t, np.int32(H), np.int32(D)))
    return out


def rope_neox_cuda(x, pos, cos_t, sin_t):
    """Launch ``hx_rope_neox_f32``: one block per (token, head), head_dim/2 threads."""
    from . import _cuda

    cp = _cuda.require_cupy()
    if isinstance(pos, np.ndarray):
        _check_positions(pos, cos_t.shape[0])  # host positions: range-check before the upload
    x = cp.ascontiguousarray(cp.asarray(x))
    pos = cp.ascontiguousarray(cp.asarray(pos, dtype=cp.int32))
    _check(x, pos, cos_t, sin_t)
    cos_t = cp.ascontiguousarray(cp.asarray(cos_t, dtype=cp.float32))
    sin_t = cp.ascontiguousarray(cp.asarray(sin_t, dtype=cp.float32))
    return launch_rope_neox(x, pos, cos_t, sin_t, cp.empty_like(x))


def rope_neox(x, pos, cos_t, sin_t, backend: str = "cpu"):
    """Rotate ``x`` (T, n_head, D) at absolute positions ``pos`` (T,)."""
    if backend == "cpu":
        return rope_neox_cpu(x, pos, cos_t, sin_t)
    if backend == "cuda":
        return rope_neox_cuda(x, pos, cos_t, sin_t)
    raise BackendError(f"rope: unknown backend {backend!r}")
