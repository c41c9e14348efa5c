"""Emulator of ``mmvq_swiglu.cu``: the gate and up mat-vecs' emulator, then the fused SwiGLU + q8_1 emulator
(the kernel performs their float operations in their order; see the package docstring)."""

from __future__ import annotations

import numpy as np

from ..fused.emulate import emulate_swiglu_q8_1
from ..mmvq.emulate import emulate as _mmvq

__all__ = ["emulate"]


def emulate(w_gate: np.ndarray, w_up: np.ndarray, qtype: str, xq: np.ndarray, plan, layout: str | None = None):
    """``(g, u, yq, m)``: the mat-vecs of ``qtype`` weights ``w_gate`` and ``w_up`` on the q8_1 activations
    ``xq`` (llama.cpp's blocks, as ``mmvq.emulate``) under the mmvq ``plan`` (float32 (T, n) each), and
    ``m = silu(g) * u`` (float32 (T, n)) with its q8_1 bytes ``yq`` in ``layout``."""
    g = _mmvq(w_gate, qtype, xq, plan)
    u = _mmvq(w_up, qtype, xq, plan)
    yq, m = emulate_swiglu_q8_1(g, u, layout)
    return g, u, yq, m
