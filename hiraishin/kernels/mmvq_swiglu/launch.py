"""Prepared launches of ``mmvq_swiglu.cu``: the gate and up mat-vecs with SwiGLU and its q8_1 as their epilogue.

A :class:`SwigluMatVecLaunch` is built once per geometry and called with the arrays, unchecked (the backend
promises C-contiguous CuPy arrays of the documented shapes). It replaces ``mmvq_multi`` of the gate and up
weights followed by ``hx_swiglu_q8_1`` (``kernels.fused``) with the same bits; which passes use it is the
backend's choice (``hiraishin.backends.cuda``, :func:`swiglu_epilogue_enabled` and :func:`swiglu_epilogue_fits`).
"""

from __future__ import annotations

import numpy as np

from ...switches import env_flag
from ..fused.launch import NULL
from ..mmvq.launch import mmvq_kernel, prepared_launch
from ..quantize.launch import quantize_defines

__all__ = ["SOURCE", "ENV_SWIGLU_EPILOGUE", "SWIGLU_EPILOGUE", "GROUP_ROWS", "swiglu_epilogue_enabled",
           "swiglu_epilogue_fits", "mmvq_swiglu_defines", "SwigluMatVecLaunch"]

# quantize_q8_1.cu's hx_q8_1_store (compiled for the down projection's layout), mmvq.cu's rows, the kernel.
SOURCE = ("quantize/quantize_q8_1.cu", "mmvq/mmvq.cu", "mmvq_swiglu/mmvq_swiglu.cu")

# Rows of gate (and of up) behind one q8_1 block of the product: the unit of the epilogue.
GROUP_ROWS = 32

# Off: measured SLOWER on the H200 (bench/results/2026-12-05-h200-session22, graph replays under
# BATCH_INVARIANT, logits digests equal; SUBBLOCK's gate/up run the sub-block MMA kernels and never take it):
# the 0.6B 0.631 -> 0.679 ms at one token, 0.818 -> 0.891 at three; the 8B 2.340 -> 2.453, 3.340 -> 3.751.
# Under programmatic dependent launch the SwiGLU launch it removes costs little in the chain, while every
# CUDA block of the big gate/up grid now fences and counts before it retires, and the last group's product
# waits behind the last block. Kept, bit-exact and tested, as that measured alternative
# (HIRAISHIN_SWIGLU_EPILOGUE=1). Read at import, as the other switches; a test may set SWIGLU_EPILOGUE here.
ENV_SWIGLU_EPILOGUE = "HIRAISHIN_SWIGLU_EPILOGUE"
SWIGLU_EPILOGUE = env_flag(ENV_SWIGLU_EPILOGUE, False, "SwiGLU in the gate/up mat-vec's epilogue")


def swiglu_epilogue_enabled() -> bool:
    """Whether the backend may fuse SwiGLU into the gate/up launch (:data:`SWIGLU_EPILOGUE`)."""
    return SWIGLU_EPILOGUE


def swiglu_epilogue_fits(n: int, rows_per_block: int) -> bool:
    """Whether gate/up weights of ``n`` rows, ``rows_per_block`` rows a CUDA block, fit the kernel: whole
    32-row groups, each made of whole CUDA blocks."""
    return n > 0 and n % GROUP_ROWS == 0 and GROUP_ROWS % rows_per_block == 0


def mmvq_swiglu_defines(qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int,
                        layout: str | None) -> dict:
    """``#define``\\ s of ``mmvq_swiglu``: the gate/up ``mmvq`` launch's (the same rows, the same bits) and
    the q8_1 ``layout`` the down projection reads (HX_LAYOUT)."""
    return {**prepared_launch(qtype, n, k, ncols, rows_per_block, nwarps).defines, **quantize_defines(layout)}


class SwigluMatVecLaunch:
    """One ``mmvq_swiglu`` launch: ``ncols`` columns of two (``n``, ``k``) ``qtype`` weights (gate, up) reading
    one input, and ``silu(gate) * up`` quantized to q8_1 in ``layout`` (the down projection's).

    Call it ``(wg, wu, xq, g, u, yq, m=None)``: the weights, their q8_1 activations (as ``mmvq``), float32
    (``ncols``, ``n``) outputs ``g`` and ``u``, the product's q8_1 ``yq`` (``quantize.launch.output_shape``
    of (``ncols``, ``n``) in ``layout``) and optionally its float32 values ``m``. The bits: ``mmvq_multi``
    of the two weights, then ``hx_swiglu_q8_1``. The launch keeps its own zeroed counters (reset by each
    group's last CUDA block): create and call it on one stream.
    """

    __slots__ = ("kernel", "defines", "grid", "block", "shared", "n", "counters")

    def __init__(self, qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int,
                 layout: str | None):
        import cupy

        if not swiglu_epilogue_fits(n, rows_per_block):
            raise ValueError(f"mmvq_swiglu needs rows in whole groups of {GROUP_ROWS} made of whole CUDA blocks; "
                             f"got {n} rows, {rows_per_block} rows a CUDA block")
        defines = mmvq_swiglu_defines(qtype, n, k, ncols, rows_per_block, nwarps, layout)
        self.kernel, self.defines = mmvq_kernel(defines, SOURCE, "mmvq_swiglu")  # mmvq's register rule
        self.grid = (2 * n // rows_per_block, 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * ncols * rows_per_block * 32 * 4
        self.n = np.int32(n)
        self.counters = cupy.zeros((n // GROUP_ROWS,), np.uint32)

    def __call__(self, wg, wu, xq, g, u, yq, m=None):
        self.kernel(self.grid, self.block, (xq, wg, wu, g, u, self.n, self.counters, yq, NULL if m is None else m),
                    shared_mem=self.shared)
        return yq
