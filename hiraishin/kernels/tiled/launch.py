"""Launcher of ``mmq_tiled.cu``: the tile from the plan module, block facts from :mod:`hiraishin.quant`."""

from __future__ import annotations

import numpy as np

from ...plans.matvec import TILE_COLS, TILE_COLS_PER_THREAD, TILE_ROWS, MatVecPlan
from ...quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID, QK_K
from ..compile import get_kernel

__all__ = ["tiled_defines", "launch"]

SOURCE = "tiled/mmq_tiled.cu"


def tiled_defines(qtype: str) -> dict:
    """``#define``\\ s of the tiled kernel for ``qtype`` weights."""
    return {"HX_QTYPE": GGML_TYPE_ID[qtype], "HX_TILE_ROWS": TILE_ROWS, "HX_COLS_PER_THREAD": TILE_COLS_PER_THREAD,
            "HX_COL_GROUPS": TILE_COLS // TILE_COLS_PER_THREAD,
            "HX_STEP_BYTES": QK_K // BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype]}  # weight bytes per 256 values


def launch(w, qtype: str, xq, plan: MatVecPlan, out):
    """Run the tiled kernel on cupy arrays, unchecked: ``out`` (ncols, N) float32 gets w @ x.

    ``w`` (N, row_bytes) uint8, ``xq`` (ncols, K/32*36) uint8 in llama.cpp's q8_1 layout, both
    C-contiguous. Returns ``out``.
    """
    nrows, row_bytes = w.shape
    ncols = xq.shape[0]
    k = row_bytes // BLOCK_BYTES[qtype] * BLOCK_ELEMS[qtype]
    kernel = get_kernel(SOURCE, "mmq_tiled", tiled_defines(qtype))
    grid = ((nrows + TILE_ROWS - 1) // TILE_ROWS, (ncols + TILE_COLS - 1) // TILE_COLS, 1)
    block = (TILE_ROWS, TILE_COLS // TILE_COLS_PER_THREAD, 1)
    kernel(grid, block, (w, xq, out, np.int32(nrows), np.int32(ncols), np.int32(k),
                         np.int64(row_bytes), np.int64(xq.shape[1]), np.int64(out.shape[1])))
    return out
