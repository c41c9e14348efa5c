"""Launcher of ``rope.cu``: one CUDA block per (token, head), head_dim/2 threads."""

from __future__ import annotations

import functools

import numpy as np

from ..compile import get_kernel

__all__ = ["launch"]


@functools.cache
def _kernel():
    return get_kernel("rope/rope.cu", "hx_rope_neox_f32")


def launch(x, pos, cos_t, sin_t, out):
    """``hx_rope_neox_f32`` into ``out``, unchecked; returns ``out``.

    ``x`` and ``out`` float32 C-contiguous CuPy arrays (T, n_head, D), not overlapping; ``pos``
    int32 C-contiguous (T,) on the device, each in ``0..n_ctx-1`` (read by the kernel, so a CUDA
    graph replays with new positions); ``cos_t``/``sin_t`` float32 C-contiguous (n_ctx, D/2).
    """
    T, H, D = x.shape
    if T:
        _kernel()((T * H,), (D // 2,), (x, out, pos, cos_t, sin_t, np.int32(H), np.int32(D)))
    return out
