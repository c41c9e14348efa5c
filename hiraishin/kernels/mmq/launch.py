"""Launcher of ``mmq.cu``: compile defines from the plan, prepared launches writing into ``out``.

Block facts come from :mod:`hiraishin.quant`, geometry from :mod:`hiraishin.plans.subblock`. The
kernel reads activations in llama.cpp's q8_1 layout, i.e. what
``hiraishin.kernels.quantize.launch(x, xq)`` (layout None) writes: no re-layout kernel.
"""

from __future__ import annotations

import numpy as np

from ...plans.subblock import SUBBLOCK_NTILE_COLS, SUBBLOCK_TILE_ROWS, SubBlockPlan
from ...quant import BLOCK_BYTES, GGML_TYPE_ID, QK_K
from ..compile import get_kernel
from ..compile import precompile as compile_many

__all__ = ["SOURCE", "MMQ_MAX_REGS", "kernel_defines", "mmq_kernel", "MMQLaunch", "prepared_launch",
           "precompile", "launch"]

SOURCE = "mmq/mmq.cu"

# Register cap per thread (as HX_MIN_BLOCKS = resident CUDA blocks per SM); a launch fact that
# changes no bit. sm_90 ptxas (nvcc 12, --fmad=false): the one-column kernel needs 62-70 registers
# uncapped and fits 64 without spills (Q4_K K=4096, Q6_K K=4096/12288), i.e. two 512-thread
# blocks per SM instead of one; 40 spills. Two n-tiles need 125-128 uncapped; 80 fits Q4_K and
# spills for Q6_K. A cap that spills is dropped when the kernel is compiled (mmq_kernel).
MMQ_MAX_REGS = {"onecol": 64, "mma": 80}
_REGISTERS_PER_SM = 65536
_MAX_BLOCKS_PER_SM = 32


def kernel_defines(plan: SubBlockPlan, max_regs: int | None | str = "default") -> dict:
    """``#define``\\ s of the kernel for ``plan`` (``max_regs``: override the register cap; None: none)."""
    nt = plan.cols_per_block // SUBBLOCK_NTILE_COLS
    regs = MMQ_MAX_REGS.get(plan.kernel) if max_regs == "default" else max_regs
    threads = 32 * plan.nwarps
    min_blocks = 1 if regs is None else max(1, min(_MAX_BLOCKS_PER_SM, _REGISTERS_PER_SM // (threads * regs)))
    return {
        "HX_QTYPE": GGML_TYPE_ID[plan.qtype],
        "HX_BLOCK_BYTES": BLOCK_BYTES[plan.qtype],
        "HX_Q8_BYTES": BLOCK_BYTES["Q8_1"],
        "HX_NB": plan.k // QK_K,
        "HX_NSEG": plan.nseg,
        "HX_NWARPS": plan.nwarps,
        "HX_NT": nt,
        "HX_ONECOL": 1 if plan.kernel == "onecol" else 0,
        "HX_MIN_BLOCKS": min_blocks,
    }


def mmq_kernel(plan: SubBlockPlan, max_regs: int | None | str = "default"):
    """The compiled ``hx_mmq`` kernel of ``plan``; compiled without the register cap if the cap spills."""
    defines = kernel_defines(plan, max_regs)
    kernel = get_kernel(SOURCE, "hx_mmq", defines)
    if defines["HX_MIN_BLOCKS"] > 1 and int(kernel.local_size_bytes) > 0:
        kernel = get_kernel(SOURCE, "hx_mmq", dict(defines, HX_MIN_BLOCKS=1))
    return kernel


class MMQLaunch:
    """The prepared launch of ``plan`` for an (``n``, K) weight; call with (w, xq, out).

    ``w`` uint8 (n, row_bytes); ``xq`` uint8 (ncols, K/32*36) q8_1 (llama.cpp layout); ``out``
    float32 (ncols, n) C-contiguous (``out_stride`` floats between columns). Unchecked.
    """

    __slots__ = ("kernel", "grid", "block", "scalars")

    def __init__(self, n: int, plan: SubBlockPlan, out_stride: int | None = None,
                 max_regs: int | None | str = "default"):
        self.kernel = mmq_kernel(plan, max_regs)
        self.grid = ((n + SUBBLOCK_TILE_ROWS - 1) // SUBBLOCK_TILE_ROWS,
                     (plan.ncols + plan.cols_per_block - 1) // plan.cols_per_block, 1)
        self.block = (32 * plan.nwarps, 1, 1)
        self.scalars = (np.int32(n), np.int32(plan.ncols), np.int64(n if out_stride is None else out_stride))

    def __call__(self, w, xq, out):
        self.kernel(self.grid, self.block, (w, xq, out) + self.scalars)
        return out


_launches: dict = {}


def prepared_launch(n: int, plan: SubBlockPlan) -> MMQLaunch:
    """The cached :class:`MMQLaunch` for ``n`` rows and ``plan``."""
    key = (n, plan)
    hit = _launches.get(key)
    if hit is None:
        hit = _launches[key] = MMQLaunch(n, plan)
    return hit


def precompile(plans, max_workers: int | None = None) -> int:
    """Compile the kernels of ``plans`` side by side; returns how many modules were compiled."""
    return compile_many(((SOURCE, kernel_defines(p)) for p in plans), max_workers)


def launch(w, qtype: str, xq, plan: SubBlockPlan, out):
    """Run ``plan`` on cupy arrays, unchecked, writing ``out`` (float32 (ncols, N)); returns ``out``.

    ``w`` uint8 (N, row_bytes) C-contiguous ``qtype`` rows; ``xq`` uint8 (ncols, K/32*36), the q8_1
    bytes of ``quantize.launch(x, xq)`` (llama.cpp's layout).
    """
    if qtype != plan.qtype:
        raise ValueError(f"plan is for {plan.qtype}, weight is {qtype}")
    return prepared_launch(w.shape[0], plan)(w, xq, out)
