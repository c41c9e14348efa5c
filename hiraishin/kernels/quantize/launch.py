"""Launcher of ``quantize_q8_1.cu`` (see the package docstring for what it computes)."""

from __future__ import annotations

import numpy as np

from ...quant import BLOCK_BYTES, BLOCK_ELEMS
from ..compile import get_kernel
from .layout import LAYOUT_BYTES, LAYOUT_IDS, SUPER_BLOCK, layout_rows

__all__ = ["QUANTIZE_WARPS_PER_BLOCK", "QuantizeLaunch", "quantize_defines", "quantize_kernel", "output_shape",
           "launch"]

# llama.cpp launches CUDA_QUANTIZE_BLOCK_SIZE = 256 threads (quantize.cuh), i.e. 8 warps,
# one q8_1 block per warp. The block size does not change any result.
QUANTIZE_WARPS_PER_BLOCK = 8
SOURCE = "quantize/quantize_q8_1.cu"


def quantize_defines(layout: str | None = None) -> dict:
    """``#define``\\ s of the kernel: HX_LAYOUT is 0 (llama.cpp's blocks) or the layout's id
    (``layout.LAYOUT_IDS``); HX_LAYOUT_BYTES the bytes of one record of it."""
    return {"HX_LAYOUT": 0 if layout is None else LAYOUT_IDS[layout],
            "HX_LAYOUT_BYTES": 0 if layout is None else LAYOUT_BYTES[layout]}


def quantize_kernel(layout: str | None = None):
    """The compiled quantize kernel writing ``layout`` (None: llama.cpp's blocks)."""
    return get_kernel(SOURCE, "quantize_q8_1", quantize_defines(layout))


def output_shape(T: int, K: int, layout: str | None = None) -> tuple[int, int]:
    """Shape of the uint8 q8_1 bytes of (T, K) activations in ``layout`` (an interleaving layout's rows are
    whole groups of columns: ``layout.layout_rows``)."""
    if layout is None:
        return T, K // BLOCK_ELEMS["Q8_1"] * BLOCK_BYTES["Q8_1"]
    return layout_rows(T, layout), K // SUPER_BLOCK * LAYOUT_BYTES[layout]


class QuantizeLaunch:
    """The prepared launch quantizing float32 (T, K) activations into ``layout``; call with (x, out)."""

    __slots__ = ("kernel", "grid", "block", "scalars", "shape")

    def __init__(self, T: int, K: int, layout: str | None):
        nb = K // BLOCK_ELEMS["Q8_1"]
        self.kernel = quantize_kernel(layout)
        self.grid = ((nb + QUANTIZE_WARPS_PER_BLOCK - 1) // QUANTIZE_WARPS_PER_BLOCK, T, 1)
        self.block = (32 * QUANTIZE_WARPS_PER_BLOCK, 1, 1)
        self.scalars = (np.int32(K), np.int64(K))
        self.shape = output_shape(T, K, layout)

    def __call__(self, x, out):
        self.kernel(self.grid, self.block, (x, out) + self.scalars)
        return out


_launches: dict = {}


def launch(x, out, layout: str | None = None):
    """Quantize float32 cupy ``x`` (T, K) into ``out`` (uint8, :func:`output_shape`), unchecked.

    Inputs must be C-contiguous; K a multiple of 32 (of 256 for a layout). Returns ``out``.
    """
    T, K = x.shape
    if T == 0:
        return out
    q = _launches.get((T, K, layout))
    if q is None:
        q = _launches[(T, K, layout)] = QuantizeLaunch(T, K, layout)
    return q(x, out)
