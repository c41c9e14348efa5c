"""Prepared launches of ``norm_mmvq.cu``: a norm (with the residual add) and the mat-vecs reading it,
in one launch per group of weights.

A :class:`NormMatVecLaunch` is built once per geometry, like ``mmvq``'s
:class:`~hiraishin.kernels.mmvq.launch.MultiMatVecLaunch`, and called with the arrays; calls are
unchecked (the backend promises C-contiguous CuPy arrays of the documented shapes). Which calls fuse
is the backend's choice (``hiraishin.backends.cuda``) from the limits below; the bits are the same
either way, only the number of launches in a pass changes.
"""

from __future__ import annotations

import numpy as np

from ..compile import env_counts
from ..fused.launch import NULL
from ...plans.matvec import MAX_SHARED_BYTES, matvec_traits
from ...quant import BLOCK_BYTES
from ..mmvq.launch import (ARGMAX_SLOTS, MIXED_SOURCES, MULTI_MAX_WEIGHTS, argmax_scratch, argmax_token_args,
                           kernel_defines, mixed_defines, mmvq_kernel, multi_weight_args, register_cap_blocks,
                           strided_grid)
from ..quantize.layout import LAYOUT_BYTES, layout_for
from ..quantize.launch import quantize_defines
from ..rmsnorm.emulate import block_threads

__all__ = ["SOURCE", "MIXED_SOURCE", "NORM_MMVQ_GROUPS", "NORM_MMVQ_MAX_TOKENS", "NORM_MMVQ_MAX_BLOCKS",
           "NORM_MMVQ_PER_SM", "ENV_NORM_MMVQ", "limits_from_env", "norm_mmvq_geometry", "norm_mmvq_fits",
           "norm_mmvq_blocks",
           "norm_mmvq_defines", "norm_mixed_blocks", "norm_mixed_defines", "NormMatVecLaunch", "NormMixedMatVecLaunch",
           "NormArgmaxLaunch"]

# norm_mmvq.cu calls the norm kernels' device code (rmsnorm.cu's tree and scale, fused.cu's played tree
# and per-value store, quantize_q8_1.cu's q8_1 store) and mmvq.cu's rows (strided.cuh): one copy of each.
SOURCE = ("rmsnorm/rmsnorm.cu", "quantize/quantize_q8_1.cu", "fused/fused.cu", "mmvq/mmvq.cu", "mmvq/strided.cuh",
          "norm_mmvq/norm_mmvq.cu")
# hx_norm_mmvq_mixed (norm_mixed.cu): the same norm code, then each type's mmvq.cu rows in a namespace of its own
# (mmvq_mixed's sources, without its kernel).
MIXED_SOURCE = ("rmsnorm/rmsnorm.cu", "quantize/quantize_q8_1.cu", "fused/fused.cu") + MIXED_SOURCES[:-1] + (
    "norm_mmvq/norm_mixed.cu",)

# Measured on the H200 (bench/results/2026-12-02-h200-session6/a-norm-mmvq-tests, sweep_norm.py variants
# "256/mmvq=T:B:G", BATCH_INVARIANT graph replays, logits digests equal in every variant): fusing is
# SLOWER at every setting tried. Qwen3-0.6B one-token pass 0.711 ms with norm launches, 0.825-0.828 with
# the norm in its mat-vecs (4 or 8 groups), 0.988 with 2 groups, 0.913 with the output head fused too;
# three tokens 0.887 -> 1.22-2.05. Qwen3-8B one token 2.553 -> 3.09 (Q, K, V fused, 768 CUDA blocks),
# 5.25 (gate and up too). A norm launch between two mat-vecs costs its latency in the chain (~2.5 us);
# done inside the mat-vec it costs more: every CUDA block waits for its own norm before its first dot
# product, and the big grid has nothing ahead of it to hide its blocks' start behind (under PDL the
# small norm launch is resident early, and the mat-vec's blocks become resident while it runs).
# So the fusion is off (NORM_MMVQ_MAX_TOKENS = 0); the kernel stays as that measured alternative,
# bit-exact and tested, for the A/B to be repeated (bench/sweep_norm.py --variants 256,256/mmvq=4:1024:4).
#
# Mat-vec row blocks (of 32 * nwarps threads each) per CUDA block: the threads that share one norm.
NORM_MMVQ_GROUPS = 4
# Passes of at most this many tokens fuse (each CUDA block norms every token's row; the shared memory
# holds them all). 0: none (see above).
NORM_MMVQ_MAX_TOKENS = 0
# A group of weights fuses only if its launch has at most this many CUDA blocks (one per NORM_MMVQ_GROUPS row
# blocks, before NORM_MMVQ_PER_SM): every block repeats the norm, so a wide matrix (the output head, 151,936
# rows) keeps its norm launch.
NORM_MMVQ_MAX_BLOCKS = 1024
# At most this many CUDA blocks per SM (and never more than the driver says fit at once): a grid of fewer
# blocks than row groups strides over them, so each resident block makes the norm once, not once per wave of
# blocks (session 6 launched one block per NORM_MMVQ_GROUPS row blocks; where the SMs hold fewer, each wave
# waited for its own norm). 0: no cap (that grid). Measured SLOWER too, on an H100 (bench/results/
# 2026-12-05-h100-session25/a-tests-abmany: HIRAISHIN_NORM_MMVQ=1:100000:4:S, one-token graph replays, digests
# equal): the 0.6B 0.639 -> 0.92 ms with S = 1 and 0.82 with S = 4, the 8B 2.739 -> 3.45-3.47 (both orders).
# Fewer resident warps stream the rows than the plain grid's, and each block's first dot still waits behind
# its norm (no weights held across the wait: HX_W_EARLY is off here); the launches removed save less.
NORM_MMVQ_PER_SM = 0
# HIRAISHIN_NORM_MMVQ="T:B:G:S" (any leading part) sets the four limits above at import, so a whole bench can
# run with the norm inside the mat-vecs (bench/sweep_norm.py sets them per variant instead).
ENV_NORM_MMVQ = "HIRAISHIN_NORM_MMVQ"
_LIMITS = ("NORM_MMVQ_MAX_TOKENS", "NORM_MMVQ_MAX_BLOCKS", "NORM_MMVQ_GROUPS", "NORM_MMVQ_PER_SM")


def limits_from_env(text: str | None = None) -> dict:
    """``{limit name: value}`` of the leading limits ``text`` (default: ``HIRAISHIN_NORM_MMVQ``) gives as
    ``T:B:G:S``; ``{}`` when unset."""
    return env_counts(ENV_NORM_MMVQ, _LIMITS, "T[:B[:G[:S]]] (tokens, CUDA blocks, row groups a block, blocks per SM)",
                      text)


_ENV = limits_from_env()
NORM_MMVQ_MAX_TOKENS = _ENV.get("NORM_MMVQ_MAX_TOKENS", NORM_MMVQ_MAX_TOKENS)
NORM_MMVQ_MAX_BLOCKS = _ENV.get("NORM_MMVQ_MAX_BLOCKS", NORM_MMVQ_MAX_BLOCKS)
NORM_MMVQ_GROUPS = _ENV.get("NORM_MMVQ_GROUPS", NORM_MMVQ_GROUPS)
NORM_MMVQ_PER_SM = _ENV.get("NORM_MMVQ_PER_SM", NORM_MMVQ_PER_SM)


def norm_mmvq_geometry(n: int, nwarps: int, groups: int | None = None) -> tuple[int, int, int] | None:
    """(row groups per CUDA block, tree threads each thread plays, values each tree thread holds)
    for rows of ``n`` floats and mat-vec blocks of ``nwarps`` warps: the most groups, up to
    ``groups`` (default :data:`NORM_MMVQ_GROUPS`), whose threads divide rmsnorm's tree of
    ``block_threads(n)``; None when none does or ``n % 32 != 0``."""
    if n % 32:
        return None
    tree = block_threads(n)
    for g in range(NORM_MMVQ_GROUPS if groups is None else groups, 0, -1):
        threads = 32 * nwarps * g
        if threads <= tree and tree % threads == 0:
            return g, tree // threads, -(-n // tree)
    return None


def norm_mmvq_fits(qtypes, k: int, ncols: int, rows_max: int, nwarps: int, groups: int) -> bool:
    """Whether a norm_mmvq launch (of weights of ``qtypes``, one type or two) fits a CUDA block's shared memory:
    ``ncols`` normed rows of ``k`` values in each type's mat-vec layout, the groups' hand-over of up to
    ``rows_max`` rows, and the warp partials and group keys."""
    cols = 0
    for q in dict.fromkeys(qtypes):
        t, layout = matvec_traits(q), layout_for(q)
        cols += ncols * (k // t.qk) * (LAYOUT_BYTES[layout] if layout else BLOCK_BYTES["Q8_1"])
    return cols + groups * (nwarps - 1) * ncols * rows_max * 32 * 4 + 256 <= MAX_SHARED_BYTES


def norm_mmvq_blocks(ns, rows_per_block: int, geometry: tuple[int, int, int]) -> int:
    """CUDA blocks of an ``hx_norm_mmvq`` launch of weights of ``ns`` rows (its grid)."""
    return -(-sum(-(-int(n) // rows_per_block) for n in ns) // geometry[0])


def norm_mmvq_defines(qtype: str, k: int, ncols: int, rows_per_block: int, nwarps: int, layout: str | None,
                      geometry: tuple[int, int, int], min_blocks: int | None = None) -> dict:
    """``#define``\\ s of ``hx_norm_mmvq``: mmvq's for the geometry (the same rows, the same bits), the
    q8_1 ``layout`` it reads, shared activations, and the norm's groups and played tree. ``min_blocks``
    (HX_MIN_BLOCKS) defaults to mmvq's register cap for this block's threads."""
    base = kernel_defines(qtype, ncols, rows_per_block, nwarps, k // matvec_traits(qtype).qk)
    base.pop("HX_W_EARLY", None)  # hx_norm_mmvq waits first (its norm reads the previous kernel), no early loads
    groups, play, vals = geometry
    if min_blocks is None:
        min_blocks = 1 if base["HX_MIN_BLOCKS"] == 1 else register_cap_blocks(
            qtype, ncols, rows_per_block, nwarps, base["HX_NBLOCKS"], threads=32 * nwarps * groups)
    return {**base, **quantize_defines(layout), "HX_MIN_BLOCKS": int(min_blocks), "HX_Y_SHARED": 1,
            "HX_NORM_GROUPS": int(groups), "HX_NORM_PLAY": int(play), "HX_NORM_VALS": int(vals)}


def norm_mixed_blocks(ns, rows, b_first: int, geometry: tuple[int, int, int]) -> int:
    """CUDA blocks of an ``hx_norm_mmvq_mixed`` launch of weights of ``ns`` rows, ``rows`` rows a CUDA block each,
    type B from weight ``b_first`` on (each type's row blocks fill CUDA blocks of their own)."""
    nblk = [-(-int(n) // int(r)) for n, r in zip(ns, rows)]
    return -(-sum(nblk[:b_first]) // geometry[0]) + -(-sum(nblk[b_first:]) // geometry[0])


def norm_mixed_defines(qtypes: tuple, rows: tuple, k: int, ncols: int, nwarps: int, b_first: int,
                       geometry: tuple[int, int, int]) -> dict:
    """``#define``\\ s of ``hx_norm_mmvq_mixed``: ``mmvq_mixed``'s for types ``qtypes`` (A, B) with ``rows`` rows
    per CUDA block each (the same rows, the same bits), both types' q8_1 layouts (the norm writes A's as its
    first, B's as its second), shared activations, the norm's groups and played tree, and the tighter
    register cap of the two types for this block's threads."""
    (qa, qb), (ra, rb) = qtypes, rows
    ta, tb = matvec_traits(qa), matvec_traits(qb)
    base = mixed_defines(qa, ra, qb, rb, ncols, nwarps, k // ta.qk, k // tb.qk, b_first)
    base.pop("HX_W_EARLY", None)  # the norm reads the previous kernel first: no weight words held over the wait
    groups, play, vals = geometry
    caps = [register_cap_blocks(q, ncols, r, nwarps, k // matvec_traits(q).qk, threads=32 * nwarps * groups)
            for q, r in ((qa, ra), (qb, rb))]
    second = quantize_defines(layout_for(qb))
    return {**base, **quantize_defines(layout_for(qa)), "HX_LAYOUT2": second["HX_LAYOUT"],
            "HX_LAYOUT2_BYTES": second["HX_LAYOUT_BYTES"], "HX_MIN_BLOCKS": int(min(caps)), "HX_Y_SHARED": 1,
            "HX_NORM_GROUPS": int(groups),
            "HX_NORM_PLAY": int(play), "HX_NORM_VALS": int(vals)}


class NormMatVecLaunch:
    """One ``hx_norm_mmvq`` launch: RMSNorm of ``x`` (+ ``r``) and the mat-vecs of up to three
    (``n_i``, ``k``) ``qtype`` weights reading it, for ``ncols`` tokens.

    Call it ``(x, r, nw, s, ws, outs)``: ``x`` float32 (ncols, k), ``r`` the residual (same shape)
    or None, ``nw`` the norm weight (k,), ``s`` float32 (ncols, k) receiving ``x + r`` or None,
    ``ws`` the weights, ``outs`` float32 (ncols, n_i) each. Bits: those of
    ``hx_add_rms_norm_q8_1`` (or ``hx_rms_norm_q8_1``) into ``layout`` and then ``mmvq_multi``, whatever
    the grid: ``per_sm`` (default :data:`NORM_MMVQ_PER_SM`, read when built) caps the CUDA blocks per SM
    (``mmvq.launch.strided_grid``), and each block then takes several blocks' rows.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "nblk", "ns", "scalars", "blocks")

    def __init__(self, qtype: str, ns: tuple, k: int, ncols: int, rows_per_block: int, nwarps: int,
                 layout: str | None, eps: float, per_sm: int | None = None):
        if not 1 <= len(ns) <= MULTI_MAX_WEIGHTS:
            raise ValueError(f"hx_norm_mmvq takes 1..{MULTI_MAX_WEIGHTS} weights, got {len(ns)}")
        geometry = norm_mmvq_geometry(k, nwarps)
        if geometry is None:
            raise ValueError(f"no hx_norm_mmvq geometry for rows of {k} values and {nwarps} warps")
        if not norm_mmvq_fits((qtype,), k, ncols, rows_per_block, nwarps, geometry[0]):
            raise ValueError(f"hx_norm_mmvq: {ncols} normed rows of {k} values and the hand-over do not fit "
                             f"a CUDA block's shared memory")
        defines = norm_mmvq_defines(qtype, k, ncols, rows_per_block, nwarps, layout, geometry)
        self.kernel, _ = mmvq_kernel(defines, SOURCE, "hx_norm_mmvq")  # mmvq's register rule
        groups = geometry[0]
        self.ns = tuple(np.int32(n) for n in ns)
        self.nblk = tuple(np.int32(-(-n // rows_per_block)) for n in ns)
        self.blocks = norm_mmvq_blocks(ns, rows_per_block, geometry)
        self.block = (32, nwarps, groups)
        self.shared = groups * (nwarps - 1) * ncols * rows_per_block * 32 * 4
        per_sm = NORM_MMVQ_PER_SM if per_sm is None else per_sm
        self.grid = strided_grid(self.kernel, self.blocks, self.block, self.shared, per_sm)
        self.scalars = (np.int32(k), np.float32(eps))

    def __call__(self, x, r, nw, s, ws, outs):
        args = (x, NULL if r is None else r, nw, NULL if s is None else s, *self.scalars,
                *multi_weight_args(ws, outs, self.ns, self.nblk))
        self.kernel(self.grid, self.block, args, shared_mem=self.shared)
        return outs


class NormMixedMatVecLaunch:
    """One ``hx_norm_mmvq_mixed`` launch: RMSNorm of ``x`` (+ ``r``) and the mat-vecs of 2..3 (``n_i``, ``k``)
    weights of two types reading it (the ones of ``qtypes[0]``'s type first), for ``ncols`` tokens; ``rows``:
    each weight's rows per CUDA block (its one-launch mmvq plan's).

    Called as :class:`NormMatVecLaunch`. Bits: those of ``hx_add_rms_norm_q8_1`` (or ``hx_rms_norm_q8_1``) into
    both types' layouts and then ``mmvq_mixed``, whatever the grid (``per_sm`` as there).
    """

    __slots__ = ("kernel", "grid", "block", "shared", "nblk", "ns", "scalars", "blocks")

    def __init__(self, qtypes: tuple, ns: tuple, rows: tuple, k: int, ncols: int, nwarps: int, eps: float,
                 per_sm: int | None = None):
        kinds = list(dict.fromkeys(qtypes))
        if len(kinds) != 2 or not 2 <= len(ns) <= MULTI_MAX_WEIGHTS or not len(qtypes) == len(ns) == len(rows):
            raise ValueError(f"hx_norm_mmvq_mixed takes 2..{MULTI_MAX_WEIGHTS} weights of two types, got {qtypes}")
        b_first = qtypes.index(kinds[1])
        if any(q != kinds[1] for q in qtypes[b_first:]) or len(set(rows[:b_first])) > 1 or len(set(rows[b_first:])) > 1:
            raise ValueError(f"hx_norm_mmvq_mixed needs one type's weights (and rows per block) before the other's, "
                             f"got {qtypes} with rows {rows}")
        geometry = norm_mmvq_geometry(k, nwarps)
        if geometry is None:
            raise ValueError(f"no hx_norm_mmvq geometry for rows of {k} values and {nwarps} warps")
        if not norm_mmvq_fits(kinds, k, ncols, max(rows), nwarps, geometry[0]):
            raise ValueError(f"hx_norm_mmvq_mixed: {ncols} normed rows of {k} values in two layouts and the hand-over "
                             f"do not fit a CUDA block's shared memory")
        defines = norm_mixed_defines(tuple(kinds), (rows[0], rows[b_first]), k, ncols, nwarps, b_first, geometry)
        self.kernel, _ = mmvq_kernel(defines, MIXED_SOURCE, "hx_norm_mmvq_mixed")  # mmvq's register rule
        groups = geometry[0]
        self.ns = tuple(np.int32(n) for n in ns)
        self.nblk = tuple(np.int32(-(-n // r)) for n, r in zip(ns, rows))
        self.blocks = norm_mixed_blocks(ns, rows, b_first, geometry)
        self.block = (32, nwarps, groups)
        self.shared = groups * (nwarps - 1) * ncols * max(rows) * 32 * 4
        per_sm = NORM_MMVQ_PER_SM if per_sm is None else per_sm
        self.grid = strided_grid(self.kernel, self.blocks, self.block, self.shared, per_sm)
        self.scalars = (np.int32(k), np.float32(eps))

    __call__ = NormMatVecLaunch.__call__


class NormArgmaxLaunch:
    """One ``hx_norm_mmvq_argmax`` launch: a one-token pass's end: RMSNorm of ``x`` (+ ``r``), the mat-vec of the
    (``n``, ``k``) ``qtype`` output head and the first index of its largest value, striding as
    :class:`NormMatVecLaunch` (``per_sm``).

    Call it ``(x, r, nw, s, w, out, token, pos, advance=None, log=None)``: the norm's arguments as there, the
    head ``w``, ``out`` float32 (1, n), then as ``mmvq.launch.ArgmaxMatVecLaunch``. Bits: the norm launch, mmvq
    and ``hx_argmax_rows``. Keeps its own zeroed slot keys and counters: create and call it on one stream.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "blocks", "n", "scalars", "slot_keys", "counters")

    def __init__(self, qtype: str, n: int, k: int, rows_per_block: int, nwarps: int, layout: str | None, eps: float,
                 per_sm: int | None = None):
        geometry = norm_mmvq_geometry(k, nwarps)
        if geometry is None:
            raise ValueError(f"no hx_norm_mmvq geometry for rows of {k} values and {nwarps} warps")
        defines = {**norm_mmvq_defines(qtype, k, 1, rows_per_block, nwarps, layout, geometry), "HX_ARGMAX": 1,
                   "HX_ARGMAX_SLOTS": ARGMAX_SLOTS, "HX_PREFETCH_AHEAD": 0}
        self.kernel, _ = mmvq_kernel(defines, SOURCE, "hx_norm_mmvq_argmax")  # mmvq's register rule
        groups = geometry[0]
        self.blocks = norm_mmvq_blocks((n,), rows_per_block, geometry)
        self.block = (32, nwarps, groups)
        self.shared = groups * (nwarps - 1) * rows_per_block * 32 * 4
        per_sm = NORM_MMVQ_PER_SM if per_sm is None else per_sm
        self.grid = strided_grid(self.kernel, self.blocks, self.block, self.shared, per_sm)
        self.n = np.int32(n)
        self.scalars = (np.int32(k), np.float32(eps))
        self.slot_keys, self.counters = argmax_scratch()

    def __call__(self, x, r, nw, s, w, out, token, pos, advance=None, log=None):
        self.kernel(self.grid, self.block,
                    (x, NULL if r is None else r, nw, NULL if s is None else s, *self.scalars, w, out, self.n,
                     self.slot_keys, self.counters) + argmax_token_args(token, pos, advance, log),
                    shared_mem=self.shared)
        return token
