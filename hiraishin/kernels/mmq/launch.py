"""Launcher of ``mmq.cu``: compile defines from the plan, prepared launches writing into ``out``.

Block facts come from :mod:`hiraishin.quant`, geometry from :mod:`hiraishin.plans.subblock`. The
kernel reads its activations in :func:`activation_layout` (the MMA layouts of
``hiraishin/kernels/quantize/layout.py``, which the quantize and fused norm kernels write directly;
or llama.cpp's q8_1 blocks under ``HIRAISHIN_MMQ_XLAYOUT=0``); :func:`launch` takes llama.cpp's
layout and converts.
"""

from __future__ import annotations

import os

import numpy as np

from ...plans.subblock import SUBBLOCK_DP4A_NB, SUBBLOCK_NTILE_COLS, SUBBLOCK_TILE_ROWS, SubBlockPlan
from ...quant import BLOCK_BYTES, GGML_TYPE_ID, QK_K
from ...switches import env_flag
from ..compile import blocks_for_register_cap, get_kernel, relax_register_cap
from ..compile import precompile as compile_many
from ..mmvq.launch import MULTI_MAX_WEIGHTS, multi_weight_args
from ..quantize.layout import MMA8_LAYOUTS, MMA_LAYOUTS, as_layout
from .wtile import TILE_QTYPES

__all__ = [
    "ENV_MMQ_XLAYOUT",
    "ENV_MMQ_MMA8_MIN_COLS",
    "MMA8_MIN_COLS",
    "activation_layout",
    "xlayout_setting",
    "mma8_qtypes",
    "ENV_MMQ_MMA8_Q6K",
    "MMQ_XLAYOUT",
    "ENV_MMQ_LIVE",
    "ENV_MMQ_MULTI",
    "ENV_MMQ_PIPELINE_W",
    "ENV_MMQ_PREFETCH_NEXT",
    "ENV_MMQ_STAGE_W",
    "MMQ_LIVE_COLS",
    "MMQ_MULTI",
    "MMQMultiLaunch",
    "multi_enabled",
    "MMQ_DEFAULT_MAX_REGS",
    "MMQ_MAX_REGS",
    "MMQ_PREFETCH_X",
    "SOURCE",
    "DP4A_SOURCE",
    "DP4A_MAX_REGS",
    "DP4A_XSTAGE",
    "DP4A_WSTAGE",
    "ENV_DP4A_XSTAGE",
    "ENV_DP4A_WSTAGE",
    "dp4a_wstage",
    "dp4a_defines",
    "MMQLaunch",
    "kernel_defines",
    "kernel_source",
    "launch",
    "launch_grid",
    "stage_fits",
    "live_cols",
    "mmq_kernel",
    "precompile",
    "prepared_launch",
]

SOURCE = ("mmq/mma_rows.cu", "mmq/mmq.cu")  # the shared mma.sync helpers and row loads, then the kernel
# One column on dp4a (plans/subblock.py ENV_SUBBLOCK_DP4A): mma_rows.cu for its Q4_K scale helpers, then the kernel.
DP4A_SOURCE = ("mmq/mma_rows.cu", "mmq/onecol_dp4a.cu")
DP4A_NAMES = {"hx_mmq": "hx_mmq_dp4a", "hx_mmq_multi": "hx_mmq_dp4a_multi"}
# Its register cap by (128-value halves per lane = K / 4096, columns): nvcc for sm_90 (ptxas -v) fits one half and
# one column in 62-64 registers with no stack frame (8 CUDA blocks of 4 warps per SM), three halves (K = 12288) in
# 128 (4 blocks; at 96 it spills); the device's NVRTC gave the same once nothing was indexed by a runtime value
# (session 28). One half and 2 / 3 / 4 columns (HX_DCOLS): 96 / 96 / 128, the least with no stack frame for session
# 28's source (4 columns spilled at 96). The source since session 29 (the columns share each phase) has none at 80 / 96
# / 96 (Q4_K 3 columns at 80, Q6_K not); its launches of 2-4 columns timed slower than MMA at these caps (session 30,
# plans/subblock.py SUBBLOCK_DP4A_COLS), so they are off and the caps stay. A cap that leaves local memory is relaxed
# as for the MMA kernels.
DP4A_MAX_REGS = {(1, 1): 64, (1, 2): 96, (1, 3): 96, (1, 4): 128,
                 (0, 1): 64}  # (short rows, plans/subblock.py SUBBLOCK_DP4A_SHORT: one half a lane, as K = 4096)
DP4A_DEFAULT_MAX_REGS = 128
# HX_XSTAGE: the dp4a kernel's CUDA block copies its columns of activations into shared memory (coalesced) before its
# lanes read them (onecol_dp4a.cu; read straight from global memory, a warp's 16-byte load touches 32 cache lines).
# A copy: no bit changes. H100, session 30 (bench/results/2026-12-06-h100-session30), SUBBLOCK replays, same digests:
# the 8B's one-token pass 2.597 -> 2.530 ms (4 rows a block), 2.469 at 8 rows (plans/subblock.py). Default 1;
# HIRAISHIN_DP4A_XSTAGE=0 reads global memory as before.
ENV_DP4A_XSTAGE = "HIRAISHIN_DP4A_XSTAGE"
DP4A_XSTAGE = int(env_flag(ENV_DP4A_XSTAGE, True, "the dp4a kernel's shared copy of its activations"))
# HX_WSTAGE: the dp4a kernel's CUDA block copies its weight rows into shared memory with cp.async before the PDL wait
# (coalesced 16-byte chunks; a lane's own 16-byte weight loads touch a line each), and its lanes read them there. For
# rows of 16 super-blocks whose copy fits the 48 KB a block declares statically beside the activations' (8 rows:
# 18 KB Q4_K, 27 KB Q6_K); of a weight in tiles (kernels/mmq/wtile.py), the block's pieces of its tile records. A copy:
# no bit changes. H100, session 31 (bench/results/2026-12-06-h100-session31), the 8B's SUBBLOCK one-token pass, same
# digests: ggml's rows 2.503 -> 2.474 ms, tiles 2.656 -> 2.479 (a lane's reads of tiles touch a line each, 32 a warp
# load). Default on; HIRAISHIN_DP4A_WSTAGE=0 reads global memory.
ENV_DP4A_WSTAGE = "HIRAISHIN_DP4A_WSTAGE"
DP4A_WSTAGE = env_flag(ENV_DP4A_WSTAGE, True, "the dp4a kernel's shared copy of its weight rows")
STATIC_SMEM_BYTES = 48 * 1024  # the most shared memory a CUDA block may declare statically


def _wtile(plan: SubBlockPlan, wtile: bool) -> int:
    """HX_WTILE: 1 where the launch's weight is in :mod:`.wtile`'s tile records."""
    if wtile and plan.qtype not in TILE_QTYPES:
        raise ValueError(f"only {', '.join(TILE_QTYPES)} weights come as tiles, the plan is for {plan.qtype}")
    return int(bool(wtile))


def dp4a_wstage(plan: SubBlockPlan, wtile: bool = False) -> int:
    """HX_WSTAGE of a dp4a ``plan``: :data:`DP4A_WSTAGE` where its rows are 16 super-blocks and the copies fit (a
    weight in tiles, ``wtile``: the block's pieces of its tile records, Q4_K for 4, 8 or 16 rows a block, Q6_K for 8
    or 16)."""
    nb = plan.k // QK_K
    rows = plan.nwarps * nb * BLOCK_BYTES[plan.qtype] + 16
    if wtile:  # onecol_dp4a.cu HX_TS_R: a record's 16-byte units, padded
        if plan.qtype == "Q4_K" and plan.nwarps in (4, 8, 16):
            units = 4 * 2 * plan.nwarps + 2 + plan.nwarps
        elif plan.qtype == "Q6_K" and plan.nwarps in (8, 16):
            units = 13 * plan.nwarps + 2 + plan.nwarps // 8
        else:
            return 0
        rows = nb * 16 * ((units + 5) // 8 * 8 + 2)
    xs = plan.ncols * nb * (8 * BLOCK_BYTES["Q8_1"] + 32) if DP4A_XSTAGE else 0
    return int(DP4A_WSTAGE and nb == SUBBLOCK_DP4A_NB and rows + xs <= STATIC_SMEM_BYTES)

# Register cap per thread, as HX_MIN_BLOCKS = resident CUDA blocks per SM, and HX_PREFETCH_X (one
# n-tile: a super-block's activations loaded before its weights): launch facts, no bit changes.
# Keyed (kernel, qtype, warps per CUDA block); H200 sweeps (bench/results/2026-12-01-h200-mmq/):
# one column at 16 warps fits 62-64 registers (2 blocks/SM; 80 or none: 70-89 registers and
# 1 block, attn_q 9.9 vs 8.0 us, output head 349 vs 225); at 4 warps Q4_K 80 + prefetch (ffn_up
# 14.9 vs 15.8 us at 64), Q6_K 64 (output head 192 vs 213 at 80). Two n-tiles: Q4_K 80 (125
# uncapped; attn_q 16 columns 13.8 vs 14.4 us), Q6_K 96 (80 spills: relaxed to 154 registers,
# output head 16 columns 627 vs 465 us at 8 warps, 433 at 4 warps and 96).
# A cap that spills is relaxed (one resident block fewer at a time) when the kernel is compiled.
MMQ_MAX_REGS = {("onecol", "Q4_K", 16): 64, ("onecol", "Q6_K", 16): 64,
                ("onecol", "Q4_K", 4): 80, ("onecol", "Q6_K", 4): 64,
                ("mma", "Q4_K", 8): 80, ("mma", "Q6_K", 8): 96, ("mma", "Q6_K", 4): 96}
MMQ_DEFAULT_MAX_REGS = {"onecol": 64, "mma": 96}
MMQ_PREFETCH_X = {("onecol", "Q4_K", 4): 1}
# HX_PREFETCH_W: each CUDA block asks L2 for its 16 weight rows before waiting on the previous kernel
# (mmq.cu; mmvq.cu's blocks always do), for rows of at most MMQ_PREFETCH_W_MAX_K values. H200, SUBBLOCK
# graph replays, same bits (bench/results/2026-12-02-h200-session6/c-mmq-prefetch-llama-spec): the
# 0.6B shape (K = 1024, 2048, 3072) 1.038 -> 0.946 ms one token, 1.118 -> 1.026 three; the 8B shape
# (K = 4096, 12288) one token 3.299 -> 3.511 (slower), three 4.135 -> 4.152. HIRAISHIN_MMQ_PREFETCH_W=0
# turns it off everywhere, =1 on everywhere (the A/B: bench/final_session.sh STEPS=ab
# AB_VAR=HIRAISHIN_MMQ_PREFETCH_W AB_VALUES="0 1" AB_ORDERS=subblock). A cache hint: no bit changes.
MMQ_PREFETCH_W_MAX_K = 3072
ENV_MMQ_PREFETCH_W = "HIRAISHIN_MMQ_PREFETCH_W"
# HX_PREFETCH_NEXT: each warp asks L2 for the super-block it reads next while it multiplies the
# current one (a cache hint; mmq.cu). Off unless HIRAISHIN_MMQ_PREFETCH_NEXT=1: slower on the H200
# (SUBBLOCK replays, same digests, bench/results/2026-12-02-h200-session8/c-gateup-prefetch-next: the
# 8B 2.985 -> 3.333 ms one token, 3.646 -> 3.798 three; the 0.6B 0.825 -> 0.830, 0.892 -> 0.898).
ENV_MMQ_PREFETCH_NEXT = "HIRAISHIN_MMQ_PREFETCH_NEXT"


def _switch(var: str) -> int:
    """1 if the opt-in switch ``var`` is on (read when a kernel's defines are made), else 0."""
    return int(env_flag(var, False))


def _env_choice(var: str, values: tuple, default: str) -> str:
    """The value of the environment variable ``var`` (``default`` when unset or empty), one of ``values``."""
    value = os.environ.get(var, "").strip() or default
    if value not in values:
        raise ValueError(f"${var}={value!r}: expected one of {', '.join(values)}")
    return value


# HX_PIPELINE_W (Q4_K): each warp issues the loads of its next super-block before the MMAs of the
# current one (registers, not a cache hint; the same loads and float operations, mmq.cu). Off unless
# HIRAISHIN_MMQ_PIPELINE_W=1: slower on the H200 (SUBBLOCK replays, same digests, bench/results/
# 2026-12-03-h200-session9/a-pipeline-w-ncu: the 8B 2.986 -> 3.364 ms one token, 3.580 -> 3.916 three;
# the registers it holds cost occupancy). Since session 30 its first fetch goes before the PDL wait, as the dp4a
# kernel's weight loads do, which that A/B did not have: not yet timed (the A/B: final_session.sh STEPS=ab
# AB_VAR=HIRAISHIN_MMQ_PIPELINE_W AB_VALUES="0 1" AB_ORDERS=subblock AB_WIDTHS=2,3,4).
ENV_MMQ_PIPELINE_W = "HIRAISHIN_MMQ_PIPELINE_W"


# HX_STAGE_W (Q4_K): each warp stages the tile's next super-block in shared memory with cp.async while it
# multiplies the current one (mmq.cu; the same bytes in the same registers, no bit changes). The stages are
# dynamic shared memory (stage_bytes), so every Q4_K launch can have them, the 8-warp two-n-tile ones too (52 KB
# with their partial sums: more than the 48 KB a block may declare statically). Off unless
# HIRAISHIN_MMQ_STAGE_W is "1" (every Q4_K launch) or "wide" (only the launches of two n-tiles per warp, 9..16
# columns: latency-bound, each warp walking its segments one round trip after another). H200, SUBBLOCK replays,
# same digests: "1" where the static memory fitted (bench/results/2026-12-03-h200-session10/b-lazy-scales-stage-w)
# made the 0.6B faster (0.833 -> 0.817 ms one token) and the 8B slower at one token (2.750 -> 2.814); "wide"
# (bench/results/2026-12-03-h200-session11/c-price-of-exactness-stage-wide) the 8B 4.325 -> 4.297 / 4.588 ->
# 4.549 / 5.072 -> 4.997 ms at 9 / 12 / 16 tokens, the 0.6B 1.022 -> 1.001 / 1.088 -> 1.052 / 1.157 -> 1.122,
# widths 1 and 3 unchanged. Not with the MMA8 layouts (the default from session 12, 4-10% on the same passes):
# the two together spill at the 128-register cap (ptxas), relaxed to one block per SM; stage with XLAYOUT=1.
ENV_MMQ_STAGE_W = "HIRAISHIN_MMQ_STAGE_W"
MMQ_STAGE_W_VALUES = ("0", "1", "wide")
SMEM_OPTIN_BYTES = 227 * 1024  # sm_90: the most a CUDA block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def stage_fits(plan: SubBlockPlan, pcols: int) -> bool:
    """Whether ``plan``'s kernel can have HX_STAGE_W: Q4_K rows, and two stages of 16 rows per warp beside the
    per-segment partial sums of ``pcols`` columns within :data:`SMEM_OPTIN_BYTES`."""
    stages = plan.nwarps * 2 * SUBBLOCK_TILE_ROWS * BLOCK_BYTES[plan.qtype]
    return plan.qtype == "Q4_K" and stages + plan.nseg * SUBBLOCK_TILE_ROWS * pcols * 4 <= SMEM_OPTIN_BYTES


def stage_bytes(defines: dict) -> int:
    """Dynamic shared memory a launch of the kernel compiled with ``defines`` needs (mmq.cu HX_STAGE_BYTES)."""
    if not defines.get("HX_STAGE_W"):
        return 0
    return defines["HX_NWARPS"] * 2 * SUBBLOCK_TILE_ROWS * defines["HX_BLOCK_BYTES"]


# HX_XLAYOUT: the activations in the MMA layouts (a lane's B fragments of two q8_1 blocks in one 16-byte
# load, the fp16 scales of four blocks in another; Q4_K rows read 8 bytes per k slot pair), instead of
# llama.cpp's 36-byte blocks read 4 bytes at a time. Nsight Compute on the H200 (bench/results/
# 2026-12-03-h200-session9): with llama.cpp's layout the several-column gate/up launch of the 8B keeps
# L1 89.96% busy at 39% of DRAM bandwidth. Where the integers come from only: no bit changes.
# HIRAISHIN_MMQ_XLAYOUT=0 reads llama.cpp's layout (the A/B); =2 the MMA layouts with each group of 8 columns
# interleaved (MMA8_*: a lane load that reads 8 columns reads 512 contiguous bytes, not 8 lines; Nsight Compute
# on the 9-16-column launches, bench/results/2026-12-03-h200-session11: L1/TEX 71-81% busy, the busiest unit),
# the default, for launches of at least MMA8_MIN_COLS columns. H200, SUBBLOCK replays, same digests
# (bench/results/2026-12-03-h200-session12): =1 -> =2 the 8B 4.354 -> 4.175 ms at 9 tokens, 4.612 -> 4.246 at
# 12, 5.104 -> 4.614 at 16, but 2.751 -> 2.789 at 1 and 3.115 -> 3.164 at 3 (where few of a group's 8 columns
# are real, the lanes of a load clamp to the same column and interleaving saves no lines; why it then costs
# more was not measured). Read once, at import (the backend asks per prepared mat-vec); a test may set MMQ_XLAYOUT /
# MMA8_MIN_COLS itself.
ENV_MMQ_XLAYOUT = "HIRAISHIN_MMQ_XLAYOUT"
MMQ_XLAYOUT_VALUES = ("0", "1", "2")
DEFAULT_MMQ_XLAYOUT = 2
MMQ_XLAYOUT = int(_env_choice(ENV_MMQ_XLAYOUT, MMQ_XLAYOUT_VALUES, str(DEFAULT_MMQ_XLAYOUT)))
# Under HIRAISHIN_MMQ_XLAYOUT=2, launches of fewer columns keep the MMA layouts. 6: the smallest width from
# which on every width was >= 1% faster with MMA8 (same session, bench/pick_ab.py --threshold, the 8B, bound 9
# -> 2: 3.353 -> 3.305 ms at 6 tokens, 3.441 -> 3.354 at 7, 3.482 -> 3.384 at 8; 5: 3.287 -> 3.259, 0.85%; 2:
# 2.955 -> 3.009, slower). HIRAISHIN_MMQ_MMA8_MIN_COLS=c moves the bound (for that A/B).
ENV_MMQ_MMA8_MIN_COLS = "HIRAISHIN_MMQ_MMA8_MIN_COLS"
DEFAULT_MMA8_MIN_COLS = 6
MMA8_MIN_COLS = int(_env_choice(ENV_MMQ_MMA8_MIN_COLS, tuple(str(c) for c in range(1, 17)), str(DEFAULT_MMA8_MIN_COLS)))


# The weight types whose kernels read the MMA8 layouts under HIRAISHIN_MMQ_XLAYOUT=2: Q4_K and Q6_K
# (HIRAISHIN_MMQ_MMA8_Q6K=0: Q4_K only). Q6_K had been left out because ptxas (sm_90, bench/regs_mmq.py) put its
# 9-16-column launches at 164 registers with them (128 with the MMA layouts), one CUDA block per SM instead of
# two. Since each n-tile's activations are addressed from its group's base (mma_rows.cu hx_mma_pointers: no
# per-column pointers), the Qwen3-8B Q6_K launches fit the library's register caps with no spills (ffn_down 16
# columns 128 registers at 2 blocks of 8 warps, the output head 128 at 4 blocks of 4 warps). H200, SUBBLOCK graph
# replays, same logits digests (bench/results/2026-12-04-h200-session14/a-attn-q8-q6k-tests), 0 -> 1: the 8B
# 3.280 -> 3.243 / 4.153 -> 4.125 / 4.227 -> 4.176 / 4.537 -> 4.445 ms at 6 / 9 / 12 / 16 tokens, the 0.6B within
# 0.7% (bench/pick_ab.py, 8B widths 9, 12, 16: 1.3% less in total). Read once, at import (a test may set
# MMA8_Q6K itself).
ENV_MMQ_MMA8_Q6K = "HIRAISHIN_MMQ_MMA8_Q6K"
MMA8_Q6K = _env_choice(ENV_MMQ_MMA8_Q6K, ("0", "1"), "1") == "1"


def mma8_qtypes() -> tuple:
    """The weight types whose kernels read the MMA8 layouts under HIRAISHIN_MMQ_XLAYOUT=2."""
    return ("Q4_K", "Q6_K") if MMA8_Q6K else ("Q4_K",)


def xlayout_setting() -> tuple:
    """The layout setting of the sub-block kernels, part of a prepared launch's cache key: (:data:`MMQ_XLAYOUT`:
    0 llama.cpp's q8_1 blocks, 1 the MMA layouts, 2 their columns-interleaved forms; :data:`MMA8_MIN_COLS`, the
    fewest columns of a launch reading the latter; the weight types that read them, :func:`mma8_qtypes`)."""
    return MMQ_XLAYOUT, MMA8_MIN_COLS, mma8_qtypes()


def plan_xlayout(plan: SubBlockPlan) -> int:
    """HX_XLAYOUT of ``plan``'s kernel: :data:`MMQ_XLAYOUT`, but under 2 the MMA layouts (1) for a weight type
    not in :func:`mma8_qtypes` or a launch of fewer than :data:`MMA8_MIN_COLS` columns; the dp4a kernel reads
    the MMA layouts only."""
    if plan.kernel == "dp4a":
        return 1
    x, min_cols, qtypes = xlayout_setting()
    return 1 if x == 2 and (plan.qtype not in qtypes or plan.ncols < min_cols) else x


def activation_layout(plan: SubBlockPlan) -> str | None:
    """The q8_1 layout ``plan``'s kernel reads its activations in (``quantize.layout``; None: llama.cpp's)."""
    return {0: None, 1: MMA_LAYOUTS[plan.qtype], 2: MMA8_LAYOUTS[plan.qtype]}[plan_xlayout(plan)]


def _prefetch_w(k: int) -> int:
    forced = os.environ.get(ENV_MMQ_PREFETCH_W, "").strip()
    if forced in ("0", "1"):
        return int(forced)
    return 1 if k <= MMQ_PREFETCH_W_MAX_K else 0


# HX_LIVE: a several-column launch of at most 2 (or 4) columns shares the float work of its live
# columns among all 32 lanes of each warp (mmq.cu: the MMA's integer C moved by __shfl_sync; every
# output keeps its float operations and their order, so no bit changes). Off unless
# HIRAISHIN_MMQ_LIVE=1: on the H200 it did not pay (SUBBLOCK graph replays, same logits digests,
# bench/results/2026-12-02-h200-session8/a-live-ablate-pdl: the 8B 3.464 -> 3.444 ms at 2 tokens,
# 3.722 -> 3.864 at 3, 3.906 -> 3.995 at 4; the 0.6B within 0.01 ms): the float work of the dead
# columns was not what bounds these launches, and the shuffles sit in each MMA's dependency chain.
MMQ_LIVE_COLS = (2, 4)
ENV_MMQ_LIVE = "HIRAISHIN_MMQ_LIVE"


def live_cols(plan: SubBlockPlan, prefetch_x: int = 0) -> int:
    """HX_LIVE of ``plan`` under ``HIRAISHIN_MMQ_LIVE=1``: the least of :data:`MMQ_LIVE_COLS` that
    holds its columns, for the several-column kernel with one n-tile and no HX_PREFETCH_X; 0 otherwise."""
    if not _switch(ENV_MMQ_LIVE) or plan.kernel != "mma" or prefetch_x or plan.cols_per_block != SUBBLOCK_NTILE_COLS:
        return 0
    return next((c for c in MMQ_LIVE_COLS if plan.ncols <= c), 0)


def dp4a_defines(plan: SubBlockPlan, max_regs: int | None | str = "default", wtile: bool = False) -> dict:
    """``#define``\\ s of ``onecol_dp4a.cu`` for a ``plan`` of kernel "dp4a" (``max_regs``: override the cap;
    ``wtile``: the weight comes in :mod:`.wtile`'s tile records)."""
    nb = plan.k // QK_K
    if max_regs == "default":
        max_regs = DP4A_MAX_REGS.get((nb // 16, plan.ncols), DP4A_DEFAULT_MAX_REGS)
    return {
        "HX_QTYPE": GGML_TYPE_ID[plan.qtype],
        "HX_BLOCK_BYTES": BLOCK_BYTES[plan.qtype],
        "HX_Q8_BYTES": BLOCK_BYTES["Q8_1"],
        "HX_NB": nb,
        "HX_NSEG": plan.nseg,
        "HX_NWARPS": plan.nwarps,
        "HX_MIN_BLOCKS": blocks_for_register_cap(max_regs, 32 * plan.nwarps),
        "HX_NT": 1,  # (mma_rows.cu's declarations)
        "HX_XLAYOUT": 1,
        "HX_DCOLS": plan.ncols,
        "HX_XSTAGE": DP4A_XSTAGE,
        "HX_WSTAGE": dp4a_wstage(plan, wtile),
        "HX_WTILE": _wtile(plan, wtile),
    }


def kernel_source(plan: SubBlockPlan) -> tuple:
    """The sources of ``plan``'s kernel: :data:`SOURCE`, or :data:`DP4A_SOURCE` for the dp4a kernel."""
    return DP4A_SOURCE if plan.kernel == "dp4a" else SOURCE


def kernel_defines(plan: SubBlockPlan, max_regs: int | None | str = "default",
                   prefetch: int | str = "default", wtile: bool = False) -> dict:
    """``#define``\\ s of the kernel for ``plan`` (``max_regs``, ``prefetch``: override the tuning; ``wtile``: the
    weight comes in :mod:`.wtile`'s tile records, which the options that address ggml's rows do not read)."""
    if plan.kernel == "dp4a":
        return dp4a_defines(plan, max_regs, wtile)
    nt = plan.cols_per_block // SUBBLOCK_NTILE_COLS // plan.warp_split  # n-tiles per warp
    key = (plan.kernel, plan.qtype, plan.nwarps)
    if max_regs == "default":
        table = MMQ_MAX_REGS.get(key, MMQ_DEFAULT_MAX_REGS[plan.kernel])
        max_regs = plan.max_regs if plan.max_regs is not None else table
    if prefetch == "default":
        prefetch = plan.prefetch_x if plan.prefetch_x is not None else MMQ_PREFETCH_X.get(key, 0)
    mt = plan.tile_rows // SUBBLOCK_TILE_ROWS  # row tiles per warp (mmq.cu HX_MT: 2 takes none of the options below)
    regs, pre = max_regs, int(prefetch) if mt == 1 else 0
    threads = 32 * plan.nwarps
    min_blocks = blocks_for_register_cap(regs, threads)
    live = live_cols(plan, pre if nt == 1 else 0) if mt == 1 else 0
    pcols = 1 if plan.kernel == "onecol" else live or plan.cols_per_block
    switch = _env_choice(ENV_MMQ_STAGE_W, MMQ_STAGE_W_VALUES, "0")
    wtile = _wtile(plan, wtile)
    stage = (switch == "1" or (switch == "wide" and nt == 2)) and stage_fits(plan, pcols) and mt == 1 and not wtile
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
        "HX_PREFETCH_X": pre if nt == 1 else 0,
        "HX_PREFETCH_W": _prefetch_w(plan.k),
        "HX_LIVE": live,
        "HX_PREFETCH_NEXT": 0 if stage or mt > 1 or wtile else _switch(ENV_MMQ_PREFETCH_NEXT),
        "HX_PIPELINE_W": _switch(ENV_MMQ_PIPELINE_W) if plan.qtype == "Q4_K" and not stage and mt == 1 else 0,
        "HX_STAGE_W": int(stage),
        "HX_XLAYOUT": plan_xlayout(plan),
        "HX_CGROUPS": plan.interleave,
        "HX_WSPLIT": plan.warp_split,
        "HX_MT": mt,
        "HX_WTILE": wtile,
    }


def mmq_kernel(plan: SubBlockPlan, max_regs: int | None | str = "default", prefetch: int | str = "default",
               name: str = "hx_mmq", wtile: bool = False):
    """The compiled ``hx_mmq`` (or ``hx_mmq_multi``; for a "dp4a" plan ``onecol_dp4a.cu``'s kernel of the same
    arguments) kernel of ``plan`` and the dynamic shared memory its launches give it (:func:`stage_bytes`);
    compiled without the register cap if the cap spills (:func:`relax_register_cap`)."""
    source = kernel_source(plan)
    if plan.kernel == "dp4a":
        name = DP4A_NAMES[name]

    def compile_spills(defines):
        kernel = get_kernel(source, name, defines)
        return kernel, int(kernel.local_size_bytes)

    kernel, defines = relax_register_cap(kernel_defines(plan, max_regs, prefetch, wtile), compile_spills)
    shared = stage_bytes(defines)
    if shared and kernel.raw.max_dynamic_shared_size_bytes < shared:
        # the opt-in (once per kernel): static and dynamic shared memory together may pass 48 KB only with it
        kernel.raw.max_dynamic_shared_size_bytes = shared
    return kernel, shared


def launch_grid(ntiles: int, plan: SubBlockPlan) -> tuple[int, int, int]:
    """The grid of ``ntiles`` row tiles under ``plan``: blockIdx.x = tile * interleave + column group
    within the interleave (mmq.cu HX_CGROUPS), blockIdx.y = the rest of the column groups."""
    per_y = plan.cols_per_block * plan.interleave
    return (ntiles * plan.interleave, -(-plan.ncols // per_y), 1)


class MMQLaunch:
    """The prepared launch of ``plan`` for an (``n``, K) weight; call with (w, xq, out).

    ``w`` uint8 (n, row_bytes); ``xq`` uint8 (ncols, K/32*36) q8_1 bytes in ``self.layout``
    (:func:`activation_layout`); ``out`` float32 (ncols, n) C-contiguous (``out_stride`` floats between
    columns). Unchecked.
    """

    __slots__ = ("block", "grid", "kernel", "scalars", "layout", "shared")

    def __init__(self, n: int, plan: SubBlockPlan, out_stride: int | None = None,
                 max_regs: int | None | str = "default", prefetch: int | str = "default", wtile: bool = False):
        self.kernel, self.shared = mmq_kernel(plan, max_regs, prefetch, wtile=wtile)
        self.layout = activation_layout(plan)
        self.grid = launch_grid(-(-n // plan.tile_rows), plan)
        self.block = (32 * plan.nwarps, 1, 1)
        self.scalars = (np.int32(n), np.int32(plan.ncols), np.int64(n if out_stride is None else out_stride))

    def __call__(self, w, xq, out):
        self.kernel(self.grid, self.block, (w, xq, out) + self.scalars, shared_mem=self.shared)
        return out


# Q/K/V (and gate/up) of one plan in one hx_mmq_multi launch: on unless HIRAISHIN_MMQ_MULTI=0. The bits
# are the separate launches' either way (tests/test_mmq.py, tests/test_mmq_gpu.py). H200, SUBBLOCK graph
# replays, same logits digests (bench/results/2026-12-02-h200-session7, STEPS=ab AB_VAR=HIRAISHIN_MMQ_MULTI):
# the 0.6B shape 0.949 -> 0.826 ms one token, 1.028 -> 0.893 three; the 8B 3.312 -> 2.995, 4.144 -> 3.727.
# Read once (the backend asks per prepared mat-vec); a test or benchmark may set MMQ_MULTI itself.
ENV_MMQ_MULTI = "HIRAISHIN_MMQ_MULTI"
MMQ_MULTI = env_flag(ENV_MMQ_MULTI, True, "the sub-block multi-weight launch")


def multi_enabled() -> bool:
    """Whether the backend groups sub-block mat-vecs that share their input into one launch (MMQ_MULTI)."""
    return MMQ_MULTI


class MMQMultiLaunch:
    """One ``hx_mmq_multi`` launch of up to three (``n_i``, K) weights of one ``plan`` reading the same
    activations (in ``self.layout``); call with (ws, xq, outs), ``outs[i]`` float32 (ncols, n_i). Every
    tile is summed as by :class:`MMQLaunch`: the bits of separate launches, fewer launches. Unchecked."""

    __slots__ = ("block", "grid", "kernel", "ns", "ntiles", "ncols", "layout", "shared")

    def __init__(self, ns: tuple, plan: SubBlockPlan, wtile: bool = False):
        if not 1 <= len(ns) <= MULTI_MAX_WEIGHTS:
            raise ValueError(f"hx_mmq_multi takes 1..{MULTI_MAX_WEIGHTS} weights, got {len(ns)}")
        self.kernel, self.shared = mmq_kernel(plan, name="hx_mmq_multi", wtile=wtile)
        self.layout = activation_layout(plan)
        self.ns = tuple(np.int32(n) for n in ns)
        self.ntiles = tuple(np.int32(-(-n // plan.tile_rows)) for n in ns)  # CUDA blocks' row ranges per weight
        self.grid = launch_grid(int(sum(self.ntiles)), plan)
        self.block = (32 * plan.nwarps, 1, 1)
        self.ncols = np.int32(plan.ncols)

    def __call__(self, ws, xq, outs):
        self.kernel(self.grid, self.block, (xq, self.ncols, *multi_weight_args(ws, outs, self.ns, self.ntiles)),
                    shared_mem=self.shared)
        return outs


_launches: dict = {}


def prepared_launch(n: int, plan: SubBlockPlan, wtile: bool = False) -> MMQLaunch:
    """The cached :class:`MMQLaunch` for ``n`` rows and ``plan`` (``wtile``: of a weight in tile records)."""
    key = (n, plan, xlayout_setting(), bool(wtile))  # the layout the launch reads follows the environment
    hit = _launches.get(key)
    if hit is None:
        hit = _launches[key] = MMQLaunch(n, plan, wtile=wtile)
    return hit


def precompile(plans, max_workers: int | None = None, wtile=False) -> int:
    """Compile the kernels of ``plans`` side by side (``wtile``: for weights in tiles; a bool, or a function of the
    plan); returns how many modules were compiled."""
    tiles = wtile if callable(wtile) else (lambda p: wtile)
    return compile_many(((kernel_source(p), kernel_defines(p, wtile=tiles(p))) for p in plans), max_workers)


def launch(w, qtype: str, xq, plan: SubBlockPlan, out):
    """Run ``plan`` on cupy arrays, unchecked, writing ``out`` (float32 (ncols, N)); returns ``out``.

    ``w`` uint8 (N, row_bytes) C-contiguous ``qtype`` rows; ``xq`` uint8 (ncols, K/32*36), the q8_1
    bytes of ``quantize.launch(x, xq)`` (llama.cpp's layout; converted here to the kernel's, which a
    forward pass writes directly).
    """
    if qtype != plan.qtype:
        raise ValueError(f"plan is for {plan.qtype}, weight is {qtype}")
    run = prepared_launch(w.shape[0], plan)
    return run(w, as_layout(xq, run.layout), out)
