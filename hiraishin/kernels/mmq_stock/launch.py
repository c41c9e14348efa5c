"""Launcher of ``mmq_stock.cu``: defines from the plan, the work-item and fixup tables on the
device, a scratch buffer for the pieces the fixup adds; prepared launches writing into ``out``.

Geometry from :mod:`hiraishin.plans.mmq_stock`, block facts from :mod:`hiraishin.quant`. The
kernel reads llama.cpp's q8_1 layout (``hiraishin.kernels.quantize.launch(x, xq)``, layout None).
"""

from __future__ import annotations

import numpy as np

from ...plans.mmq_stock import MMQ_TILE_ROWS, MMQStockPlan
from ...quant import BLOCK_BYTES, GGML_TYPE_ID, QK_K
from ..compile import blocks_for_register_cap, get_kernel, relax_register_cap
from ..compile import precompile as compile_many

__all__ = ["KEPT_SCRATCH_COLS", "MMQ_STOCK_MAX_REGS", "SOURCE", "MMQStockLaunch", "kernel_defines", "launch",
           "precompile", "prepared_launch"]

# the shared mma.sync helpers and weight-row loads, then the kernel (concatenated, as get_kernel does)
SOURCE = ("mmq/mma_rows.cu", "mmq_stock/mmq_stock.cu")

# Register cap per thread as resident CUDA blocks per SM (HX_MIN_BLOCKS), keyed by (qtype, n-tiles
# per warp): a launch fact, no bit changes. What the kernels need without spilling (H200 run 1,
# bench/results/2026-12-01-h200-mmq-stock/: Q4_K 96 / 166, Q6_K 128 / 239 registers at 2 / 4
# n-tiles); a cap that spills is relaxed when the kernel compiles.
MMQ_STOCK_MAX_REGS = {("Q4_K", 2): 96, ("Q6_K", 2): 128, ("Q4_K", 4): 168, ("Q6_K", 4): 240}
# Launches of at most this many columns (decode steps and verify batches, which CUDA graphs replay:
# passes of up to hiraishin.model.qwen3.BUFFER_MAX_TOKENS = 16 tokens)
# keep their scratch buffer; wider ones (prefills of every prompt length) take it from CuPy's pool
# per call, so that many prompt lengths hold no memory. Prepared launches kept: at most
# _LAUNCHES_MAX (the cache is emptied when full; the backend's mat-vecs keep their own).
KEPT_SCRATCH_COLS = 16
_LAUNCHES_MAX = 256


def kernel_defines(plan: MMQStockPlan, max_regs: int | None | str = "default") -> dict:
    """``#define``\\ s of the kernels for ``plan`` (``max_regs``: override the register cap)."""
    if plan.k is None:
        raise ValueError("the stock MMQ kernel needs a plan with the row length k")
    nt = plan.cols_per_warp // 8
    regs = MMQ_STOCK_MAX_REGS.get((plan.qtype, nt)) if max_regs == "default" else max_regs
    threads = 32 * plan.nwarps
    min_blocks = blocks_for_register_cap(regs, threads)
    return {
        "HX_QTYPE": GGML_TYPE_ID[plan.qtype],
        "HX_BLOCK_BYTES": BLOCK_BYTES[plan.qtype],
        "HX_Q8_BYTES": BLOCK_BYTES["Q8_1"],
        "HX_NB": plan.k // QK_K,
        "HX_NWARPS": plan.nwarps,
        "HX_NT": nt,
        "HX_J": plan.tile_cols,
        "HX_TILE_ROWS": MMQ_TILE_ROWS,
        "HX_MIN_BLOCKS": min_blocks,
        "HX_Q4_SCALE_FP16": 1,  # load_tiles_q4_K: the scale products in fp16
    }


def _kernels(plan: MMQStockPlan, max_regs="default"):
    def compile_spills(defines):  # a cap that spills: one resident block fewer (more registers), down to no cap
        main = get_kernel(SOURCE, "hx_mmq_stock", defines)
        return main, int(main.local_size_bytes)

    main, defines = relax_register_cap(kernel_defines(plan, max_regs), compile_spills)
    return main, get_kernel(SOURCE, "hx_mmq_stock_fixup", defines)


class MMQStockLaunch:
    """The prepared launches (main kernel, then the fixup where a tile has several pieces) of
    ``plan`` (its ``n`` rows, its ``k``); call with (w, xq, out). ``out`` float32 (ncols, n),
    ``out_stride`` floats between columns. Unchecked.
    """

    __slots__ = ("block", "cp", "fixup", "fixup_grid", "fixups", "grid", "items", "kernel", "scalars", "scratch",
                 "scratch_floats")

    def __init__(self, plan: MMQStockPlan, out_stride: int | None = None, max_regs="default"):
        import cupy as cp

        if not plan.shaped:
            raise ValueError("the stock MMQ kernel needs a plan with the weight's shape (k, n)")
        self.kernel, self.fixup = _kernels(plan, max_regs)
        items, fixups = plan.tables()
        nslots = int((items[:, 4] >= 0).sum())
        subrows = MMQ_TILE_ROWS // plan.rows_per_block
        self.grid = (len(items) * subrows, -(-plan.tile_cols // plan.cols_per_warp), 1)
        self.block = (32 * plan.nwarps, 1, 1)
        self.fixup_grid = (len(fixups), plan.tile_cols, 1)
        self.items = cp.asarray(items)
        self.fixups = cp.asarray(fixups) if len(fixups) else None
        self.cp = cp
        self.scratch_floats = max(1, nslots * plan.tile_cols * MMQ_TILE_ROWS)
        self.scratch = cp.empty(self.scratch_floats, dtype=cp.float32) if plan.ncols <= KEPT_SCRATCH_COLS else None
        self.scalars = (np.int32(plan.n), np.int32(plan.ncols),
                        np.int64(plan.n if out_stride is None else out_stride))

    def __call__(self, w, xq, out):
        scratch = self.scratch
        if scratch is None:  # stream-ordered pool memory: free for reuse once these kernels have run
            scratch = self.cp.empty(self.scratch_floats, dtype=self.cp.float32)
        self.kernel(self.grid, self.block, (w, xq, out, scratch, self.items) + self.scalars)
        if self.fixups is not None:
            self.fixup(self.fixup_grid, (MMQ_TILE_ROWS, 1, 1), (out, scratch, self.fixups) + self.scalars)
        return out


_launches: dict = {}


def prepared_launch(plan: MMQStockPlan) -> MMQStockLaunch:
    """The cached :class:`MMQStockLaunch` of ``plan``."""
    hit = _launches.get(plan)
    if hit is None:
        if len(_launches) >= _LAUNCHES_MAX:
            _launches.clear()
        hit = _launches[plan] = MMQStockLaunch(plan)
    return hit


def precompile(plans, max_workers: int | None = None) -> int:
    """Compile the kernels of ``plans`` side by side; returns how many modules were compiled."""
    return compile_many(((SOURCE, kernel_defines(p)) for p in plans), max_workers)


def launch(w, qtype: str, xq, plan: MMQStockPlan, out):
    """Run ``plan`` on cupy arrays, unchecked, writing ``out`` (float32 (ncols, N)); returns ``out``.

    ``w`` uint8 (N, row_bytes) C-contiguous ``qtype`` rows, N = ``plan.n``; ``xq`` uint8
    (ncols, K/32*36), the q8_1 bytes of ``quantize.launch(x, xq)`` (llama.cpp's layout).
    """
    if qtype != plan.qtype:
        raise ValueError(f"plan is for {plan.qtype}, weight is {qtype}")
    if w.shape[0] != plan.n:
        raise ValueError(f"plan is for {plan.n} rows, weight has {w.shape[0]}")
    return prepared_launch(plan)(w, xq, out)
