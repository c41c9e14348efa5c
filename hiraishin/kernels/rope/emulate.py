"""Numba emulator of ``rope.cu``, and the float64-built angle tables both sides read."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...errors import BackendError

__all__ = ["emulate", "rope_tables"]


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


def emulate(x: np.ndarray, pos: np.ndarray, cos_t: np.ndarray, sin_t: np.ndarray) -> np.ndarray:
    """NEOX RoPE of float32 ``x`` (T, n_head, D) at int positions ``pos`` (T,); unchecked."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _rope_rows(x, np.ascontiguousarray(pos, dtype=np.int32), cos_t, sin_t, out)
    return out
