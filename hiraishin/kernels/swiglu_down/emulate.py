"""Emulator of ``swiglu_down.cu``: the fused SwiGLU + q8_1 emulator, then the mat-vec's (the kernel performs
their float operations in their order; see the package docstring)."""

from __future__ import annotations

import numpy as np

from ..fused.emulate import emulate_swiglu_q8_1
from ..mmvq.emulate import emulate as _mmvq

__all__ = ["emulate"]


def emulate(g: np.ndarray, u: np.ndarray, w: np.ndarray, qtype: str, plan) -> np.ndarray:
    """``silu(g) * u`` of float32 (T, k) ``g`` and ``u``, quantized to q8_1, times the ``qtype`` weight ``w``
    under the mmvq ``plan``: float32 (T, n)."""
    yq, _ = emulate_swiglu_q8_1(g, u)  # llama.cpp's blocks: the mat-vec emulator reads those
    return _mmvq(w, qtype, yq, plan)
