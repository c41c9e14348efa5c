"""Launcher of ``rmsnorm.cu``: one CUDA block of ``block_threads(n)`` threads per row."""

from __future__ import annotations

import functools

import numpy as np

from ..compile import get_kernel
from .emulate import block_threads

__all__ = ["launch"]


@functools.cache
def _kernel():
    return get_kernel("rmsnorm/rmsnorm.cu", "hx_rms_norm_f32")


def launch(x, w, eps: float, out):
    """``hx_rms_norm_f32`` into ``out``, unchecked; returns ``out``.

    ``x`` and ``out`` float32 C-contiguous CuPy arrays of one shape (rows, n), not overlapping;
    ``w`` float32 C-contiguous (n,).
    """
    rows, n = x.shape
    if rows:
        _kernel()((rows,), (block_threads(n),), (x, w, out, np.int32(n), np.float32(eps)))
    return out
