"""Emulator of ``norm_mmvq.cu``: the fused norm's emulator, then the mat-vec's (the kernel performs
their float operations in their order; see the package docstring)."""

from __future__ import annotations

import numpy as np

from ..fused.emulate import emulate_add_rms_norm_q8_1, emulate_rms_norm_q8_1
from ..mmvq.emulate import emulate as _mmvq

__all__ = ["emulate"]


def emulate(x: np.ndarray, r: np.ndarray | None, norm_w: np.ndarray, eps: float, weights, plan):
    """``(outs, s)``: RMSNorm of ``x`` (+ ``r``; float32 (T, k)) with ``norm_w``, quantized to q8_1, times
    each ``(w, qtype)`` of ``weights`` under the mmvq ``plan`` (float32 (T, n_i) each); ``s`` is
    ``x + r`` (None without ``r``)."""
    if r is None:
        s = None
        xq, _ = emulate_rms_norm_q8_1(x, norm_w, eps)
    else:
        s, xq, _ = emulate_add_rms_norm_q8_1(x, r, norm_w, eps)
    return [_mmvq(w, qtype, xq, plan) for w, qtype in weights], s
