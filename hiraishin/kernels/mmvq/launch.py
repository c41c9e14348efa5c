"""Launcher of ``mmvq.cu``: compile-time geometry, measured tuning, prepared launches.

The kernel is compiled per launch geometry and row length (``kernel_defines``); block facts come
from :mod:`hiraishin.quant` and the plan's traits as ``#define``\\ s. A decode step makes
hundreds of mat-vec calls, so everything but the arrays is prepared once (:class:`MatVecLaunch`,
:class:`PlanLaunches`, cached by geometry).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ...order import ReductionOrder
from ...plans import matvec_plan
from ...plans.matvec import MatVecPlan, matvec_traits
from ...quant import BLOCK_BYTES
from ...switches import env_flag
from ..compile import (BLOCKS_PER_SM, THREADS_PER_SM, blocks_for_register_cap, cupy_available, get_kernel,
                       relax_register_cap)
from ..compile import precompile as compile_many
from ..quantize.layout import LAYOUT_BYTES, layout_for

__all__ = [
    "MMVQ_UNROLL_ONE_COL",
    "MMVQ_UNROLL_MULTI_COL",
    "MMVQ_ONE_COL_MAX_REGS",
    "MMVQ_MULTI_COL_MAX_REGS",
    "kernel_defines",
    "mmvq_kernel",
    "capped_compile",
    "MatVecLaunch",
    "ArgmaxMatVecLaunch",
    "argmax_scratch",
    "argmax_token_args",
    "ARGMAX_SLOTS",
    "HEAD_ARGMAX",
    "head_argmax_enabled",
    "ENV_HEAD_ARGMAX",
    "PlanLaunches",
    "MultiMatVecLaunch",
    "MixedMatVecLaunch",
    "MIXED_SOURCES",
    "mixed_defines",
    "mixed_enabled",
    "ENV_MIXED",
    "MIXED",
    "MULTI_MAX_WEIGHTS",
    "multi_weight_args",
    "register_cap_blocks",
    "prepared_launch",
    "prepared_plan",
    "plan_kernel_defines",
    "preset_kernel_defines",
    "precompile",
    "launch",
]

SOURCE = "mmvq/mmvq.cu"

# Compile-time tuning of mmvq.cu. None of it changes a bit of any output (per-thread order,
# hand-over and butterfly are the same); measured on an H200 with bench/sweep_mmvq.py
# (bench/results/2026-11-29-h200-mmvq2/, bench/NOTES_mmvq.md).
#
# HX_UNROLL: kbx iterations per unrolled step, i.e. how many weight blocks' loads a thread has
# in flight together and how many loads share one pointer update. One column: 4 (K = 4096 rows
# are then fully unrolled); wider launches keep code size and registers down with 2.
MMVQ_UNROLL_ONE_COL = 4
MMVQ_UNROLL_MULTI_COL = 2
# HX_MIN_BLOCKS: resident CUDA blocks per SM the compiler must allow, which caps registers per
# thread (65536 / (threads * blocks)). One 128-thread column: Q6_K rows of <= 16 super-blocks
# (output head, K = 4096) fastest at 40 registers (12 blocks: 166 vs 174 us), longer rows
# (ffn_down, K = 12288) at 32 (16 blocks: 17.9 vs 18.4 us); Q4_K (2 rows per block, K = 4096)
# at 40 (ffn_up 12.6 vs 13.0 us). Several columns: at most 128 registers (9 columns in one launch:
# ffn_down 40.9 vs 44.3 us, output head 514 vs 602 us), for up to 18 accumulators per thread
# (16 columns x 2 rows would spill).
# (longest row in super-blocks this applies to, None = any; registers) per weight type; Q4_K
# rows longer than 16 super-blocks are left uncapped (2 rows x 4 unrolled blocks spill at 40).
MMVQ_ONE_COL_MAX_REGS = {"Q4_K": ((16, 40),), "Q6_K": ((16, 40), (None, 32))}
MMVQ_MULTI_COL_MAX_REGS = 128
MMVQ_MULTI_COL_CAPPED_ACCUMULATORS = 18  # columns x rows up to which the cap holds without spills


def register_cap_blocks(qtype: str, ncols: int, rows: int, nwarps: int, nblocks: int,
                        threads: int | None = None) -> int:
    """HX_MIN_BLOCKS for a launch: the register cap above as resident blocks per SM of ``threads``
    threads (default a block of ``nwarps`` warps; norm_mmvq's blocks hold several such groups)."""
    regs = MMVQ_MULTI_COL_MAX_REGS
    if ncols > 1 and ncols * rows > MMVQ_MULTI_COL_CAPPED_ACCUMULATORS:
        return 1
    if ncols == 1:
        rules = MMVQ_ONE_COL_MAX_REGS.get(qtype, ())
        regs = next((r for limit, r in rules if limit is None or nblocks <= limit), None)
        if regs is None:
            return 1
    return blocks_for_register_cap(regs, 32 * nwarps if threads is None else threads)


# HX_PREFETCH_AHEAD: a CUDA block also asks L2 for the weight rows of the block this many indices
# later, one wave of resident blocks (SMs x the most 32*nwarps-thread blocks an SM holds), so a
# matrix of several waves streams from DRAM a wave ahead of its readers (mmvq.cu,
# hx_prefetch_rows). Off (0) unless HIRAISHIN_PREFETCH_AHEAD=1: same bits but slower on the H200 (replays,
# bench/results/2026-12-02-h200-session6/b-bench-tests: the 8B 2.540 -> 2.671 ms one token, 3.459 -> 3.610
# three; the 0.6B 0.708 -> 0.723); 0 also without a CUDA device (compile checks).
ENV_PREFETCH_AHEAD = "HIRAISHIN_PREFETCH_AHEAD"


@functools.lru_cache(maxsize=None)
def prefetch_ahead(nwarps: int) -> int:
    """HX_PREFETCH_AHEAD for blocks of ``nwarps`` warps on the current CUDA device (0: none)."""
    if not env_flag(ENV_PREFETCH_AHEAD, False, "the L2 prefetch a wave ahead") or not cupy_available():
        return 0
    import cupy

    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    return sms * min(THREADS_PER_SM // (32 * nwarps), BLOCKS_PER_SM)


# HX_W_EARLY (mmvq.cu): a thread loads the weight words of its first kbx steps into registers before it
# waits for the previous kernel (programmatic dependent launch) and decodes them after, so only the
# activations are read after the wait. The same bits. HIRAISHIN_MMVQ_EARLY, read at import: "0" off; "N": the first N steps of a thread's
# kbx loop (at most HX_UNROLL) loaded early; "N:K": only for rows of at most K values. One-column launches
# only. Default 1 step, measured on the H200 (graph replays, same logits digests;
# bench/results/2026-12-04-h200-session18/b-weights-before-wait, c-early-pick-bench): one token, 0 -> 1 step,
# the 0.6B 0.700 -> 0.674 ms (BATCH_INVARIANT) and 0.663 -> 0.632 (FIXED_SPLIT), the 8B 2.533 -> 2.486 and
# 2.500 -> 2.448; 2 or 4 steps no better (the 8B 2.53-2.54: more registers held), rows of <= 4096 values
# only the same as all; at 3 columns the 8B's pass 3.439 -> 3.533 (the multi-column kernels' registers).
ENV_EARLY = "HIRAISHIN_MMVQ_EARLY"
EARLY_DEFAULT = "1"


def parse_early(text: str) -> tuple[int, int | None]:
    """(steps loaded before the wait, longest row in values it applies to or None) of a
    HIRAISHIN_MMVQ_EARLY value."""
    steps, _, longest = text.strip().partition(":")
    try:
        out = (int(steps or 0), int(longest) if longest else None)
    except ValueError:
        raise ValueError(f"{ENV_EARLY} must be N or N:K (integers), got {text!r}") from None
    if out[0] < 0 or (out[1] is not None and out[1] < 1):
        raise ValueError(f"{ENV_EARLY} must be N >= 0 steps and K >= 1 values, got {text!r}")
    return out


W_EARLY, W_EARLY_MAX_K = parse_early(os.environ.get(ENV_EARLY, EARLY_DEFAULT))


def early_steps(qtype: str, ncols: int, nblocks: int) -> int:
    """HX_W_EARLY of a launch: weight steps a thread loads before its wait (0: none)."""
    if ncols != 1 or not W_EARLY:
        return 0
    if W_EARLY_MAX_K is not None and nblocks * matvec_traits(qtype).qk > W_EARLY_MAX_K:
        return 0
    return W_EARLY


def kernel_defines(qtype: str, ncols: int, rows_per_block: int, nwarps: int, nblocks: int,
                   unroll: int | None = None, min_blocks: int | None = None, ahead: int | None = None) -> dict:
    """The ``#define``\\ s that compile ``mmvq.cu`` for one launch geometry and row length.

    ``unroll``, ``min_blocks`` and ``ahead`` (HX_UNROLL, HX_MIN_BLOCKS, HX_PREFETCH_AHEAD) default to
    the measured choices above; none of them changes a bit.
    """
    t = matvec_traits(qtype)
    if unroll is None:
        unroll = MMVQ_UNROLL_ONE_COL if ncols == 1 else MMVQ_UNROLL_MULTI_COL
    if min_blocks is None:
        min_blocks = register_cap_blocks(qtype, ncols, rows_per_block, nwarps, nblocks)
    # block facts from hiraishin.quant / the plan's traits, activation bytes per weight block from
    # the layout the kernel reads (its own for Q4_K/Q6_K, llama.cpp's q8_1 blocks for Q8_0)
    layout = layout_for(qtype)
    y_step = LAYOUT_BYTES[layout] if layout else BLOCK_BYTES["Q8_1"]
    out = {"HX_QTYPE": t.type_id, "HX_QK": t.qk, "HX_BLOCK_BYTES": t.block_bytes, "HX_VDR": t.vdr,
           "HX_TPB": t.threads_per_block, "HX_Y_STEP": y_step, "HX_NCOLS": int(ncols),
           "HX_RPB": int(rows_per_block), "HX_NWARPS": int(nwarps), "HX_NBLOCKS": int(nblocks),
           "HX_UNROLL": int(unroll), "HX_MIN_BLOCKS": int(min_blocks),
           "HX_PREFETCH_AHEAD": int(prefetch_ahead(int(nwarps)) if ahead is None else ahead)}
    early = early_steps(qtype, ncols, nblocks)
    if early:
        out["HX_W_EARLY"] = early
    return out


def capped_compile(defines: dict, compile_spills):
    """``compile_spills(defines) -> (compiled, spill bytes)`` under the mat-vecs' register rule; returns
    ``(compiled, defines it was compiled with)``. A register cap (HX_MIN_BLOCKS > 1) that makes the compiler
    spill is dropped: spilling to local memory costs more than the occupancy the cap buys; with weights held
    across the wait (HX_W_EARLY) it is relaxed one resident block at a time instead (they need a few
    registers more, and dropping the cap at once gave some kernels 1.5x the registers). Bits are the same
    either way. ``mmvq_kernel`` on the device and the nvcc compile tests share it."""
    if defines.get("HX_W_EARLY"):
        return relax_register_cap(defines, compile_spills)
    compiled, spills = compile_spills(defines)
    if defines.get("HX_MIN_BLOCKS", 1) > 1 and spills > 0:
        defines = {**defines, "HX_MIN_BLOCKS": 1}
        compiled, _ = compile_spills(defines)
    return compiled, defines


def mmvq_kernel(defines: dict, source=SOURCE, name: str = "mmvq"):
    """The compiled kernel ``name`` of ``source`` (mmvq.cu's ``mmvq`` by default) for ``defines`` and the
    defines it was compiled with (:func:`capped_compile`'s register rule)."""
    def compiled(at):
        k = get_kernel(source, name, at)
        return k, k.local_size_bytes

    return capped_compile(defines, compiled)


def resident_grid(blocks: int, per_sm: int, fit_per_sm: int, sm_count: int) -> int:
    """CUDA blocks to launch for ``blocks`` blocks' rows in a kernel that strides (``mmvq/strided.cuh``): all of
    them when ``per_sm`` is 0, else at most ``min(per_sm, fit_per_sm)`` per SM (``fit_per_sm``: what the driver
    says fits at once, at least 1)."""
    if per_sm <= 0:
        return blocks
    return max(1, min(blocks, min(per_sm, max(1, fit_per_sm)) * sm_count))


def strided_grid(kernel, blocks: int, block: tuple, shared: int, per_sm: int) -> tuple:
    """The grid of a striding ``kernel`` (a compiled launch with ``block`` threads and ``shared`` dynamic bytes)
    whose rows fill ``blocks`` CUDA blocks: :func:`resident_grid` with the driver's occupancy and SM count
    (asked only when ``per_sm`` caps it)."""
    if per_sm <= 0:
        return (blocks, 1, 1)
    import cupy as cp

    threads = block[0] * block[1] * block[2]
    fit = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, shared)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    return (resident_grid(blocks, per_sm, int(fit), int(sms)), 1, 1)


class MatVecLaunch:
    """One compiled mmvq launch: ``ncols`` columns of a (``n``, ``k``) ``qtype`` weight.

    Call it with the weight (C-contiguous cupy uint8 (n, row_bytes)), the q8_1 activations in
    the kernel's layout for ``qtype`` (``quantize.layout.layout_for``; C-contiguous) and ``out``
    (float32, ``ncols`` rows of ``n`` floats, contiguous); nothing is checked (the backends
    check). Everything but the three arrays is prepared here: a decode step makes hundreds of
    these calls.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "defines", "scalars")

    def __init__(self, qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int):
        t = matvec_traits(qtype)
        self.kernel, self.defines = mmvq_kernel(kernel_defines(qtype, ncols, rows_per_block, nwarps, k // t.qk))
        self.grid = ((n + rows_per_block - 1) // rows_per_block, 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * ncols * rows_per_block * 32 * 4
        self.scalars = (np.int32(n), np.int64(n))  # rows, floats between output columns

    def __call__(self, w, xq, out):
        self.kernel(self.grid, self.block, (w, xq, out) + self.scalars, shared_mem=self.shared)
        return out


# mmvq_argmax (mmvq.cu, HX_ARGMAX): the output head of a one-token pass with its greedy token in the same launch
# (hx_argmax_rows' rule and advance). Its CUDA blocks max their keys into this many slots (the Qwen3 head's
# 37,984 blocks of 4 rows: ~600 atomics an address) before the last block reads them. Off: measured SLOWER on
# the H200 (bench/results/2026-12-05-h200-session22, one-token graph replays under BATCH_INVARIANT, logits
# digests equal): the 0.6B 0.631 -> 0.657 ms, the 8B 2.340 -> 2.435 (tens of thousands of blocks each fencing
# and counting cost more than the argmax launch they remove); again on an H100 (2026-12-05-h100-session25/
# c-graph-passes-head-argmax, both orders): 0.640 -> 0.666 and 2.745 -> 2.841. HIRAISHIN_HEAD_ARGMAX=1 repeats
# the A/B.
ARGMAX_SLOTS = 64
ENV_HEAD_ARGMAX = "HIRAISHIN_HEAD_ARGMAX"
HEAD_ARGMAX = env_flag(ENV_HEAD_ARGMAX, False, "the output head's fused argmax")


def head_argmax_enabled() -> bool:
    """Whether a one-token head launch also picks the greedy token (:data:`HEAD_ARGMAX`, read at each call:
    a test sets it on this module, ``sys.modules["hiraishin.kernels.mmvq.launch"]``, since the package's
    ``launch`` is the function of that name)."""
    return HEAD_ARGMAX


def argmax_scratch() -> tuple:
    """Zeroed slot keys and counters of an argmax launch (``mmvq_argmax``, ``hx_norm_mmvq_argmax``): each
    launch's last CUDA block sets them back to zero, so one pair serves every launch on one stream."""
    import cupy

    return cupy.zeros((ARGMAX_SLOTS,), np.uint64), cupy.zeros((ARGMAX_SLOTS + 1,), np.uint32)


def argmax_token_args(token, pos, advance=None, log=None) -> tuple:
    """The last arguments of an argmax launch: the token, the pass's position, the advance and log (null
    pointers when None) and the log's length."""
    null = np.uint64(0)
    return (token, pos, null if advance is None else advance, null if log is None else log,
            np.int32(0 if log is None else log.shape[0]))


class ArgmaxMatVecLaunch:
    """One ``mmvq_argmax`` launch: one column of an (``n``, ``k``) ``qtype`` weight (the output head) and the
    first index of its largest value. Call it with the weight, the activations and ``out`` (as
    :class:`MatVecLaunch`; float32 (1, n)), ``token`` (int32 (1,)), ``pos`` (int32 (1,), the pass's position)
    and the advance (``advance``: int32 (2,), ``log``: int32 (n_log, 2); None: not written), as
    ``hx_argmax_rows``. The launch keeps its own zeroed slot keys and counters (reset by each launch's last
    block): create and call it on one stream.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "n", "slot_keys", "counters")

    def __init__(self, qtype: str, n: int, k: int, rows_per_block: int, nwarps: int):
        t = matvec_traits(qtype)
        defines = {**kernel_defines(qtype, 1, rows_per_block, nwarps, k // t.qk, ahead=0), "HX_ARGMAX": 1,
                   "HX_ARGMAX_SLOTS": ARGMAX_SLOTS}
        self.kernel, _ = mmvq_kernel(defines, SOURCE, "mmvq_argmax")
        self.grid = ((n + rows_per_block - 1) // rows_per_block, 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * rows_per_block * 32 * 4
        self.n = np.int32(n)
        self.slot_keys, self.counters = argmax_scratch()

    def __call__(self, w, xq, out, token, pos, advance=None, log=None):
        self.kernel(self.grid, self.block,
                    (w, xq, out, self.n, self.slot_keys, self.counters) + argmax_token_args(token, pos, advance, log),
                    shared_mem=self.shared)
        return token


# Weights one mmvq_multi launch takes (Q, K and V share an input; so do gate and up).
MULTI_MAX_WEIGHTS = 3


class MultiMatVecLaunch:
    """One ``mmvq_multi`` launch of up to three (``n_i``, ``k``) ``qtype`` weights with one input.

    Call it with the weights, the activations (as :class:`MatVecLaunch`) and one ``out`` per
    weight (float32 (``ncols``, ``n_i``)). Every row is summed exactly as by ``mmvq`` with the same
    geometry (same defines): the same bits as separate launches, fewer launches.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "nblk", "ns")

    def __init__(self, qtype: str, ns: tuple, k: int, ncols: int, rows_per_block: int, nwarps: int):
        if not 1 <= len(ns) <= MULTI_MAX_WEIGHTS:
            raise ValueError(f"mmvq_multi takes 1..{MULTI_MAX_WEIGHTS} weights, got {len(ns)}")
        defines = prepared_launch(qtype, ns[0], k, ncols, rows_per_block, nwarps).defines
        self.kernel, _ = mmvq_kernel(defines, SOURCE, "mmvq_multi")
        self.ns = tuple(np.int32(n) for n in ns)
        self.nblk = tuple(np.int32((n + rows_per_block - 1) // rows_per_block) for n in ns)
        self.grid = (int(sum(self.nblk)), 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * ncols * rows_per_block * 32 * 4

    def __call__(self, ws, xq, outs):
        self.kernel(self.grid, self.block, (xq, *multi_weight_args(ws, outs, self.ns, self.nblk)),
                    shared_mem=self.shared)
        return outs


# mmvq_mixed (mixed.cu): each weight type's rows are mmvq.cu compiled with that type's defines, in a
# namespace of its own, then the kernel.
MIXED_SOURCES = ("mmvq/type_a.cuh", SOURCE, "mmvq/type_end.cuh", "mmvq/type_b.cuh", SOURCE, "mmvq/type_end.cuh",
                 "mmvq/mixed.cu")
# Per-type defines of kernel_defines that mixed.cu takes as HX_A_* / HX_B_*; the rest are common.
_MIXED_PER_TYPE = ("HX_QTYPE", "HX_QK", "HX_BLOCK_BYTES", "HX_VDR", "HX_TPB", "HX_Y_STEP", "HX_RPB", "HX_NBLOCKS",
                   "HX_UNROLL")
# On (1) by default: one dependent launch fewer in the layers with a Q6_K attn_v, the same bits (H200 graph
# replays, BATCH_INVARIANT, 0 -> 1: the 0.6B 0.710 -> 0.698 / 0.850 -> 0.835 / 0.886 -> 0.872 ms at 1 / 2 / 3
# tokens, the 8B 2.547 -> 2.528 / 2.980 -> 2.978 / 3.459 -> 3.443; same logits digests;
# bench/results/2026-12-03-h200-session13/a-ablate-mixed). HIRAISHIN_MMVQ_MIXED=0: a launch per type.
# Read once, at import, as the sub-block kernels' switches are (the backend asks per grouped call; a test may
# set MIXED itself).
ENV_MIXED = "HIRAISHIN_MMVQ_MIXED"
MIXED = env_flag(ENV_MIXED, True, "the mixed-type multi-weight launch")


def mixed_enabled() -> bool:
    """Whether weights of two types that read one input (Q4_K attn_q/attn_k beside a Q6_K attn_v)
    share one ``mmvq_mixed`` launch (:data:`MIXED`: ``HIRAISHIN_MMVQ_MIXED`` at import, default 1)."""
    return MIXED


def mixed_defines(qtype_a: str, rows_a: int, qtype_b: str, rows_b: int, ncols: int, nwarps: int, nblocks_a: int,
                  nblocks_b: int, b_first: int) -> dict:
    """The defines of ``mmvq_mixed``: each type's ``kernel_defines`` (with its own rows per block and
    super-blocks per row) as HX_A_* / HX_B_*, the common column count and warps, the looser of the two
    register caps, and HX_B_FIRST (the first weight slot of type B)."""
    da = kernel_defines(qtype_a, ncols, rows_a, nwarps, nblocks_a, ahead=0)
    db = kernel_defines(qtype_b, ncols, rows_b, nwarps, nblocks_b, ahead=0)
    out = {f"HX_A_{k[3:]}": da[k] for k in _MIXED_PER_TYPE}
    out.update({f"HX_B_{k[3:]}": db[k] for k in _MIXED_PER_TYPE})
    out.update({"HX_NCOLS": int(ncols), "HX_NWARPS": int(nwarps), "HX_PREFETCH_AHEAD": 0,
                "HX_MIN_BLOCKS": min(da["HX_MIN_BLOCKS"], db["HX_MIN_BLOCKS"]), "HX_B_FIRST": int(b_first)})
    if "HX_W_EARLY" in da and "HX_W_EARLY" in db:  # one wait per kernel: both types load early or neither
        out["HX_W_EARLY"] = min(da["HX_W_EARLY"], db["HX_W_EARLY"])
    return out


class MixedMatVecLaunch:
    """One ``mmvq_mixed`` launch: up to three weights of two types with one input, the ones of
    ``qtypes[0]``'s type first.

    ``qtypes``, ``ns`` and ``rows`` (rows per CUDA block) per weight; ``k`` values per row;
    ``ncols`` columns; ``nwarps`` warps (one count for both types). Call it with the weights, the
    activations in each type's layout (``ya``, ``yb``) and one ``out`` per weight. Each row is
    summed exactly as by ``mmvq`` for its type and geometry: the same bits as separate launches.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "nblk", "ns")

    def __init__(self, qtypes: tuple, ns: tuple, rows: tuple, k: int, ncols: int, nwarps: int):
        kinds = list(dict.fromkeys(qtypes))
        if len(kinds) != 2 or not 2 <= len(ns) <= MULTI_MAX_WEIGHTS or len(qtypes) != len(ns) or len(rows) != len(ns):
            raise ValueError(f"mmvq_mixed takes 2..{MULTI_MAX_WEIGHTS} weights of two types, got {qtypes}")
        b_first = qtypes.index(kinds[1])
        if any(q != kinds[1] for q in qtypes[b_first:]):
            raise ValueError(f"mmvq_mixed needs the weights of one type before the other's, got {qtypes}")
        ta, tb = matvec_traits(kinds[0]), matvec_traits(kinds[1])
        defines = mixed_defines(kinds[0], rows[0], kinds[1], rows[b_first], ncols, nwarps, k // ta.qk, k // tb.qk,
                                b_first)
        self.kernel, _ = mmvq_kernel(defines, MIXED_SOURCES, "mmvq_mixed")
        self.ns = tuple(np.int32(n) for n in ns)
        self.nblk = tuple(np.int32((n + r - 1) // r) for n, r in zip(ns, rows))
        self.grid = (int(sum(self.nblk)), 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * ncols * max(rows) * 32 * 4

    def __call__(self, ws, ya, yb, outs):
        self.kernel(self.grid, self.block, (ya, yb, *multi_weight_args(ws, outs, self.ns, self.nblk)),
                    shared_mem=self.shared)
        return outs


def multi_weight_args(ws, outs, ns, nblk) -> list:
    """The weight arguments of ``mmvq_multi`` (and of norm_mmvq.cu's kernel): per weight slot i of
    MULTI_MAX_WEIGHTS, the weight, its output and its row count, and for all but the last slot its
    CUDA-block count. Missing weights repeat the last one with 0 rows (no CUDA block is theirs)."""
    args = []
    for i in range(MULTI_MAX_WEIGHTS):
        j = min(i, len(ws) - 1)
        args += [ws[j], outs[j], ns[j] if i < len(ws) else np.int32(0)]
        if i < MULTI_MAX_WEIGHTS - 1:
            args.append(nblk[j] if i < len(ws) else np.int32(0))
    return args


class PlanLaunches:
    """All launches of an mmvq plan, prepared (:class:`MatVecLaunch` each); called like one."""

    __slots__ = ("launches",)

    def __init__(self, qtype: str, n: int, k: int, plan: MatVecPlan):
        self.launches = [(start, count, prepared_launch(qtype, n, k, count, plan.rows_per_block, plan.nwarps))
                         for start, count in plan.launches()]

    def __call__(self, w, xq, out):
        if len(self.launches) == 1:
            return self.launches[0][2](w, xq, out)
        for start, count, launch in self.launches:
            launch(w, xq[start:start + count], out[start:start + count])
        return out


_launches: dict = {}  # prepared MatVecLaunch and PlanLaunches objects, by geometry


def prepared_launch(qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int) -> MatVecLaunch:
    """The cached :class:`MatVecLaunch` for this geometry (kernel compiled on first use)."""
    key = (qtype, n, k, ncols, rows_per_block, nwarps)
    hit = _launches.get(key)
    if hit is None:
        hit = _launches[key] = MatVecLaunch(qtype, n, k, ncols, rows_per_block, nwarps)
    return hit


def prepared_plan(qtype: str, n: int, k: int, plan: MatVecPlan) -> PlanLaunches:
    """The cached :class:`PlanLaunches` of an mmvq ``plan`` for an (``n``, ``k``) ``qtype`` weight."""
    key = (qtype, n, k, plan)
    hit = _launches.get(key)
    if hit is None:
        hit = _launches[key] = PlanLaunches(qtype, n, k, plan)
    return hit


def plan_kernel_defines(qtype: str, k: int, plan: MatVecPlan) -> list[dict]:
    """The ``kernel_defines`` of each launch of an mmvq ``plan`` for rows of ``k`` values."""
    t = matvec_traits(qtype)
    if plan.kernel != "mmvq":
        return []
    return [kernel_defines(qtype, count, plan.rows_per_block, plan.nwarps, k // t.qk) for _, count in plan.launches()]


def preset_kernel_defines(qtype: str, k: int, widths=range(1, 17)) -> dict:
    """``{description: defines}`` of every mmvq launch BATCH_VARIANT and BATCH_INVARIANT make for
    ``widths`` columns of a ``qtype`` weight with rows of ``k`` values (for precompiling, tests)."""
    out = {}
    for order in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT):
        for width in widths:
            for d in plan_kernel_defines(qtype, k, matvec_plan(order, width, qtype, k=k)):
                out[f"mmvq {qtype} ncols={d['HX_NCOLS']} rows={d['HX_RPB']} nwarps={d['HX_NWARPS']} k={k}"] = d
    return out


def precompile(qtype: str, k: int, plans, max_workers: int | None = None) -> int:
    """Compile the mmvq kernels that ``plans`` launch for rows of ``k`` values, side by side.

    Kernels compile on first use anyway; this does it for many geometries at once (see
    :func:`hiraishin.kernels.compile.precompile`). Returns how many modules were compiled.
    """
    return compile_many(((SOURCE, d) for plan in plans for d in plan_kernel_defines(qtype, k, plan)),
                       max_workers)


def launch(w, qtype: str, y, plan: MatVecPlan, out):
    """Run an mmvq ``plan``'s launches on cupy arrays, unchecked, writing ``out``; returns ``out``.

    ``w`` uint8 (N, row_bytes) C-contiguous; ``y`` the activations already in the kernel's layout
    for ``qtype`` (``quantize.launch(x, y, layout_for(qtype))``); ``out`` float32 (ncols, N).
    """
    t = matvec_traits(qtype)
    return prepared_plan(qtype, w.shape[0], w.shape[1] // t.block_bytes * t.qk, plan)(w, y, out)
