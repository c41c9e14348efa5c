"""Prepared launches of ``swiglu_down.cu``: SwiGLU of the gate and up outputs, its q8_1, and the down
projection's mat-vec in one launch.

A :class:`SwigluDownLaunch` is built once per geometry and called with the arrays, unchecked (the backend
promises C-contiguous CuPy arrays of the documented shapes). It replaces ``hx_swiglu_q8_1``
(``kernels.fused``) followed by the down weight's one-launch ``mmvq`` with the same bits; which passes use it
is the backend's choice (``hiraishin.backends.cuda``, :func:`swiglu_down_tokens`).
"""

from __future__ import annotations

import numpy as np

from ...plans.matvec import MAX_SHARED_BYTES, matvec_traits
from ...quant import BLOCK_BYTES
from ..compile import env_counts, get_kernel
from ..mmvq.launch import capped_compile, kernel_defines, register_cap_blocks, strided_grid
from ..quantize.launch import quantize_defines
from ..quantize.layout import LAYOUT_BYTES, layout_for

__all__ = ["SOURCE", "ENV_SWIGLU_DOWN", "SWIGLU_DOWN_TOKENS", "SWIGLU_DOWN_GROUPS", "SWIGLU_DOWN_PER_SM",
           "settings_from_env", "swiglu_down_tokens", "swiglu_down_fits",
           "swiglu_down_defines", "swiglu_down_compile", "SwigluDownLaunch"]

# quantize_q8_1.cu's hx_q8_1_store (for the down weight's layout), mmvq.cu's rows, their strided form, the kernel.
SOURCE = ("quantize/quantize_q8_1.cu", "mmvq/mmvq.cu", "mmvq/strided.cuh", "swiglu_down/swiglu_down.cu")

# Passes of at most this many tokens make SwiGLU inside the down launch; 0: never (the default): measured
# SLOWER on an H100 (bench/results/2026-12-05-h100-session25/a-tests-abmany: HIRAISHIN_SWIGLU_DOWN=1:4:S,
# one-token graph replays, logits digests equal): the 0.6B 0.639 -> 0.744-0.754 ms, the 8B 2.74 -> 3.21 (S = 1
# or 4, BATCH_VARIANT and BATCH_INVARIANT alike). The SwiGLU launch removed is one of a layer's ~8 dependent
# launches; every resident block reading both 3,072- or 12,288-value rows and quantizing them before its
# first dot costs more (as the norm inside the mat-vecs: norm_mmvq/launch.py).
SWIGLU_DOWN_TOKENS = 0
# Mat-vec row blocks (of 32 * nwarps threads each) per CUDA block: the threads that share one product row (fewer
# where the kernel would spill: swiglu_down_compile).
SWIGLU_DOWN_GROUPS = 4
# At most this many CUDA blocks per SM (and never more than fit at once): each makes the product once and
# strides over the rows of several blocks (mmvq/strided.cuh). 0: one CUDA block per SWIGLU_DOWN_GROUPS row blocks.
SWIGLU_DOWN_PER_SM = 1
# HIRAISHIN_SWIGLU_DOWN="N[:G[:S]]" sets the three above at import (tokens, row groups, blocks per SM).
ENV_SWIGLU_DOWN = "HIRAISHIN_SWIGLU_DOWN"
_SETTINGS = ("SWIGLU_DOWN_TOKENS", "SWIGLU_DOWN_GROUPS", "SWIGLU_DOWN_PER_SM")


def settings_from_env(text: str | None = None) -> dict:
    """``{setting name: value}`` of the leading settings ``text`` (default: ``HIRAISHIN_SWIGLU_DOWN``) gives as
    ``N:G:S``; ``{}`` when unset."""
    return env_counts(ENV_SWIGLU_DOWN, _SETTINGS,
                      "N[:G[:S]] (tokens, N = 0: off; row groups a CUDA block; blocks per SM)", text)


_ENV = settings_from_env()  # read at import, as the other switches; a test may set the constants here
SWIGLU_DOWN_TOKENS = _ENV.get("SWIGLU_DOWN_TOKENS", SWIGLU_DOWN_TOKENS)
SWIGLU_DOWN_GROUPS = max(1, _ENV.get("SWIGLU_DOWN_GROUPS", SWIGLU_DOWN_GROUPS))
SWIGLU_DOWN_PER_SM = _ENV.get("SWIGLU_DOWN_PER_SM", SWIGLU_DOWN_PER_SM)
# The product rows live in static shared memory, whose limit per CUDA block is 48 KiB (plans.matvec.MAX_SHARED_BYTES);
# Qwen3-8B's 12,288-value rows take ~13.5 KiB a token in the Q4_K/Q6_K layouts.


def swiglu_down_tokens() -> int:
    """The most tokens a pass may have to fuse its SwiGLU into the down launch (:data:`SWIGLU_DOWN_TOKENS`)."""
    return SWIGLU_DOWN_TOKENS


def swiglu_down_fits(qtype: str, k: int, ncols: int, rows_per_block: int = 1, nwarps: int = 1,
                     groups: int = 1) -> bool:
    """Whether ``ncols`` product rows of ``k`` values, in the layout a ``qtype`` mat-vec reads, and the groups'
    hand-over fit a CUDA block's shared memory (whole weight blocks a row)."""
    t = matvec_traits(qtype)
    if k <= 0 or k % t.qk:
        return False
    layout = layout_for(qtype)
    step = LAYOUT_BYTES[layout] if layout else BLOCK_BYTES["Q8_1"]  # mmvq.cu's HX_Y_STEP
    hand_over = groups * (nwarps - 1) * ncols * rows_per_block * 32 * 4
    return ncols * (k // t.qk) * step + hand_over <= MAX_SHARED_BYTES


def swiglu_down_defines(qtype: str, k: int, ncols: int, rows_per_block: int, nwarps: int,
                        groups: int = SWIGLU_DOWN_GROUPS) -> dict:
    """``#define``\\ s of ``hx_swiglu_down``: mmvq's for the down weight's geometry (the same rows, the same
    bits), the q8_1 layout that mat-vec reads (the product is stored in it), shared activations and the row
    groups per CUDA block."""
    base = kernel_defines(qtype, ncols, rows_per_block, nwarps, k // matvec_traits(qtype).qk)
    base.pop("HX_W_EARLY", None)  # the product reads the previous kernel first: no weight words held over the wait
    min_blocks = 1 if base["HX_MIN_BLOCKS"] == 1 else register_cap_blocks(
        qtype, ncols, rows_per_block, nwarps, base["HX_NBLOCKS"], threads=32 * nwarps * groups)
    return {**base, **quantize_defines(layout_for(qtype)), "HX_MIN_BLOCKS": int(min_blocks), "HX_Y_SHARED": 1,
            "HX_SWIGLU_GROUPS": int(groups)}


def swiglu_down_compile(qtype: str, k: int, ncols: int, rows_per_block: int, nwarps: int, compile_spills,
                        groups: int | None = None):
    """``(compiled, defines)`` of ``hx_swiglu_down`` with the most row groups a CUDA block, up to ``groups``
    (default :data:`SWIGLU_DOWN_GROUPS`), halving them while the kernel spills: the block's threads share the
    SM's registers, and a mat-vec geometry that needs many (Qwen3-8B's 12,288-value rows, four rows a block:
    ~164) spills at 512 threads. ``compile_spills(defines) -> (compiled, spill bytes)`` compiles (on the
    device, or with nvcc in the compile tests); mmvq's register-cap rule applies per try. One group is kept
    whatever it spills."""
    g = SWIGLU_DOWN_GROUPS if groups is None else groups
    while True:
        compiled, defines = capped_compile(swiglu_down_defines(qtype, k, ncols, rows_per_block, nwarps, g),
                                           compile_spills)
        if g == 1 or compile_spills(defines)[1] == 0:
            return compiled, defines
        g //= 2


class SwigluDownLaunch:
    """One ``hx_swiglu_down`` launch: ``silu(g) * u`` of ``ncols`` rows of ``k`` values, quantized to q8_1 in
    the layout a ``qtype`` mat-vec reads, times an (``n``, ``k``) ``qtype`` weight.

    Call it ``(g, u, w, out)``: float32 (``ncols``, ``k``) ``g`` and ``u``, the weight, float32 (``ncols``,
    ``n``) ``out``. Bits: those of ``hx_swiglu_q8_1`` into that layout and then ``mmvq`` under the geometry
    (``rows_per_block``, ``nwarps``), whatever the grid: ``per_sm`` (default :data:`SWIGLU_DOWN_PER_SM`, read
    when built) caps the CUDA blocks per SM, and each block then takes several blocks' rows.
    """

    __slots__ = ("kernel", "defines", "grid", "block", "shared", "blocks", "n")

    def __init__(self, qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int,
                 per_sm: int | None = None, groups: int | None = None):
        if not swiglu_down_fits(qtype, k, ncols, rows_per_block, nwarps, SWIGLU_DOWN_GROUPS if groups is None
                                else groups):
            raise ValueError(f"hx_swiglu_down: {ncols} product rows of {k} values do not fit its shared memory")

        def compiled(defines):
            kernel = get_kernel(SOURCE, "hx_swiglu_down", defines)
            return kernel, kernel.local_size_bytes

        self.kernel, self.defines = swiglu_down_compile(qtype, k, ncols, rows_per_block, nwarps, compiled, groups)
        groups = self.defines["HX_SWIGLU_GROUPS"]
        self.blocks = -(-(-(-n // rows_per_block)) // groups)
        self.block = (32, nwarps, groups)
        self.shared = groups * (nwarps - 1) * ncols * rows_per_block * 32 * 4
        per_sm = SWIGLU_DOWN_PER_SM if per_sm is None else per_sm
        self.grid = strided_grid(self.kernel, self.blocks, self.block, self.shared, per_sm)
        self.n = np.int32(n)

    def __call__(self, g, u, w, out):
        self.kernel(self.grid, self.block, (g, u, w, out, self.n), shared_mem=self.shared)
        return out
