"""Attention plans: how split-KV flash attention groups the softmax sums, for a given order.

The vector kernel (llama.cpp's ``flash_attn_ext_vec``, reference section 6.3) takes one query
(or two) of one head per CUDA block and walks the KV cache in 128-cell chunks spread over ``P``
parallel blocks (block ``y`` takes chunks ``y, y+P, y+2P, ...``), each keeping its own running
max and sum; a combine kernel merges the ``P`` partial results in block order. What a plan sets:

* ``P``: how many partial softmaxes are merged, and which chunks share a block;
* the attended range ``kv_attended`` (the filled length padded to 256 cells, as llama.cpp pads
  ``n_kv``): the number of chunks, hence ``P``;
* which kernel: the vector kernel, or for multi-query launches under the variant policy the
  tile kernel, which orders everything differently. The exact policies may run a launch through
  ``fattn_vec_shared``: the vector kernel's order for every query, but the queries of one KV head
  in a block share each K/V load (``AttentionPlan.shared_kv``), where that was measured faster.

:func:`attention_plan` (order, shape, device) -> :class:`AttentionPlan`; :func:`parallel_blocks_for`
is llama.cpp's efficiency loop. A plan is made for a device profile (``hiraishin.devices``):
``None`` means ``order.device`` or the default profile on BOTH backends, so the CPU emulator and
the GPU run the same plan unless asked otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

from ..devices import get_profile
from ..errors import PlanError
from ..order import KV_PAD

__all__ = [
    "AttentionPlan",
    "attention_plan",
    "parallel_blocks_for",
    "KERNEL_Q1",
    "KERNEL_QN",
    "KERNEL_TILE",
    "KERNEL_COMBINE",
    "KERNEL_SHARED",
    "SHARED_QUERIES",
    "shared_queries_for",
    "shared_occupancy_key",
    "SHARED_MIN_KV",
    "SHARED_PICK",
    "CHUNK_CELLS",
    "HEAD_DIMS",
    "QN_QUERIES",
    "NTHREADS",
    "TILE_QUERIES",
    "TILE_CELLS",
    "KV_PAD",
]

KERNEL_Q1 = "fattn_vec_q1"  # one query per block (llama.cpp ncols = 1)
KERNEL_QN = "fattn_vec_qn"  # two queries per block (llama.cpp ncols = 2)
KERNEL_TILE = "fattn_tile"  # the multi-query tile kernel (hiraishin/kernels/attention/fattn_tile.cu)
KERNEL_COMBINE = "fattn_combine"
# the vector kernel's arithmetic per query, with the queries of one KV head sharing each K/V load
KERNEL_SHARED = "fattn_vec_shared"
# Queries of one KV head per fattn_vec_shared block. Each needs 16 x D float partials of its own
# (the order's accumulators) in registers: 8 queries at D = 128 take 224 registers (nvcc sm_90).
SHARED_QUERIES = (2, 4, 8)
# Which launches share K/V loads, measured on the H200 (Qwen3-8B heads, launch + combine, isolated;
# bench/results/2026-12-04-h200-session15, bench_verify_attention --kv 48..4096): fattn_vec_shared
# with 4 queries per block and the queries in registers was within 12% of the fastest build at every
# width of 2..16 from 1024 filled cells on (0.69-1.00x fattn_vec_q1's time at 1024, 2048 and 4096
# cells; e.g. 16 tokens at 4096 cells 106.7 us against 148.6, where the wave estimate this replaces
# picked a build taking 140.6). Below that, sharing loads saves little (few cells, in L2) and the
# shared block's longer body costs more: at 48-256 cells fattn_vec_q1 was within 13% of the best
# build at every width and up to 1.5x faster than 4 queries a block; at 512 cells mixed (0.86-1.35x
# from 2 queries). The estimate's 2 queries a block at 48 cells cost the synthetic 8B's 16-token
# SUBBLOCK pass 0.22 ms (19.1 us a layer).
SHARED_MIN_KV = 1024  # filled cells from which a pass of several queries shares K/V loads
SHARED_PICK = 4  # queries of one KV head per fattn_vec_shared block then
# Not kept: sharing from 13 queries at any length (the isolated launches above had the 4-query build faster
# from 13 queries at 48-512 cells on the 8B's heads). Whole SUBBLOCK / BATCH_INVARIANT passes, same digests
# (bench/results/2026-12-04-h200-session16/c-bench-shared-min-queries): the 8B within 0.3% at 12-16 tokens
# (4.086 -> 4.083 ms at 16), the 0.6B (16 query heads on 8 KV heads) 5-9% slower (1.024 -> 1.117 at 16).
# The multi-query tile kernel (fattn_tile.cu gets these as #defines): queries per block, and cells
# per shared-memory tile (its KV granularity).
TILE_QUERIES = 8
TILE_CELLS = 64
QN_QUERIES = 2  # queries per block of fattn_vec_qn
NTHREADS = 128  # 4 warps (llama.cpp fattn-vec.cuh: nthreads = 128)
# The vector kernel walks the cache 128 cells per step, one cell per thread (fattn-vec.cuh, nbatch_fa = D
# for D = 128; we keep 128 for D = 64 too): the chunk unit of the parallel-block split.
CHUNK_CELLS = 128
HEAD_DIMS = (64, 128)
# llama.cpp efficiency loop (fattn-common.cuh launch_fattn): stop once a split reaches this efficiency
EFFICIENCY_GOOD_ENOUGH = 95
# ggml_cuda_get_best_fattn_kernel (fattn.cu), f16 K/V on tensor-core GPUs: the vector kernel for one
# query needs cc >= 890 (Ada) and is skipped when gqa_ratio > 4 with >= 8192 cells; without the GQA
# optimisation (gqa_ratio < 2) one query always takes it.
VEC_MIN_CC = 890
GQA_LONG_RATIO = 4
GQA_LONG_KV = 8192
GQA_OPT_MIN_RATIO = 2


Kernel = Literal["vec", "tile"]


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


# --------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class AttentionPlan:
    """The reduction geometry of one attention launch.

    ``kernel="vec"``: block ``y`` walks chunks ``y, y+P, y+2P, ...`` of
    ``chunk_cells`` cells over ``[0, kv_attended)``; ``split_cells`` is set
    (equal to ``chunk_cells``) when the split is a fixed cell size.
    ``kernel="tile"``: block ``y`` walks the contiguous cells
    ``[y*split_cells, (y+1)*split_cells)`` in tiles of ``chunk_cells`` (64).
    ``kv_len`` is the number of filled cells (``None``: all of
    ``kv_attended``); cells at or past it are masked and never read.
    ``shared_kv`` (vec only): ``fattn_vec_shared``, a block holds
    ``queries_per_block`` queries of one KV head (token-major over its GQA
    group) that share each K/V load; per query the float operations and
    their order are those of ``fattn_vec_q1`` with the same ``P`` and
    chunks, so the bits are too (the emulator is the same).
    """

    kernel: Kernel
    queries_per_block: int
    parallel_blocks: int
    chunk_cells: int = CHUNK_CELLS
    kv_attended: int = KV_PAD
    split_cells: int | None = None
    kv_len: int | None = None
    n_queries: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    head_dim: int = 128
    policy: str = "custom"
    device: str = ""
    shared_kv: bool = False

    def __post_init__(self):
        def bad(msg):
            raise PlanError(f"AttentionPlan: {msg}")

        if self.kernel not in ("vec", "tile"):
            bad(f"kernel must be 'vec' or 'tile', got {self.kernel!r}")
        if self.parallel_blocks < 1:
            bad(f"parallel_blocks must be >= 1, got {self.parallel_blocks}")
        if self.head_dim not in HEAD_DIMS:
            bad(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.shared_kv:
            if self.kernel != "vec":
                bad(f"shared_kv needs the vec kernel, got {self.kernel!r}")
            if self.queries_per_block not in SHARED_QUERIES:
                bad(f"{KERNEL_SHARED} takes {SHARED_QUERIES} queries per block, got {self.queries_per_block}")
        elif self.kernel == "vec" and self.queries_per_block not in (1, QN_QUERIES):
            bad(f"the vec kernel takes 1 or {QN_QUERIES} queries per block, got {self.queries_per_block}")
        if self.kernel == "vec":
            if self.chunk_cells < CHUNK_CELLS or self.chunk_cells % CHUNK_CELLS:
                bad(f"vec chunk_cells must be a positive multiple of {CHUNK_CELLS}, got {self.chunk_cells}")
            if self.kv_attended < 1 or self.kv_attended % self.chunk_cells:
                bad(f"kv_attended ({self.kv_attended}) must be a positive multiple of chunk_cells "
                    f"({self.chunk_cells})")
            if self.split_cells is not None and self.split_cells != self.chunk_cells:
                bad(f"vec split_cells must equal chunk_cells ({self.chunk_cells}) or be None, "
                    f"got {self.split_cells}")
        else:
            if self.queries_per_block != TILE_QUERIES:
                bad(f"the tile kernel takes {TILE_QUERIES} queries per block, "
                    f"got {self.queries_per_block}")
            if self.chunk_cells != TILE_CELLS:
                bad(f"tile chunk_cells must be {TILE_CELLS}, got {self.chunk_cells}")
            if self.kv_attended < 1 or self.kv_attended % self.chunk_cells:
                bad(f"kv_attended ({self.kv_attended}) must be a positive multiple of {self.chunk_cells}")
            if self.split_cells is None or self.split_cells < 1 or self.split_cells % self.chunk_cells:
                bad(f"tile split_cells must be a positive multiple of {self.chunk_cells}, "
                    f"got {self.split_cells}")
        if self.kv_len is not None and not 1 <= self.kv_len <= self.kv_attended:
            bad(f"kv_len must be in 1..kv_attended ({self.kv_attended}), got {self.kv_len}")
        if self.n_queries is not None and self.n_queries < 1:
            bad(f"n_queries must be >= 1, got {self.n_queries}")
        if self.n_head is not None and self.n_head_kv is not None and (
            self.n_head_kv < 1 or self.n_head % self.n_head_kv
        ):
            bad(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")

    @property
    def kernel_name(self) -> str:
        """The CUDA kernel this plan launches (the key of its occupancy in a device profile)."""
        if self.kernel == "tile":
            return KERNEL_TILE
        if self.shared_kv:
            return KERNEL_SHARED
        return KERNEL_Q1 if self.queries_per_block == 1 else KERNEL_QN

    @property
    def n_chunks(self) -> int:
        return self.kv_attended // self.chunk_cells

    @property
    def filled_blocks(self) -> int:
        """Parallel blocks with at least one filled cell to sum (vec kernel; ``P`` for the tile kernel
        or without ``kv_len``): block ``y`` walks chunks ``y, y+P, ...`` and the kernel skips every
        chunk at or past ``kv_len``, so blocks ``ceil(kv_len / chunk_cells)`` and later sum nothing."""
        if self.kernel != "vec" or self.kv_len is None:
            return self.parallel_blocks
        return min(self.parallel_blocks, -(-self.kv_len // self.chunk_cells))

    def launched(self) -> "AttentionPlan":
        """The plan as launched: without the parallel blocks that sum nothing (:attr:`filled_blocks`).

        The same bits as this plan. A block past the filled cells leaves its running max at
        -FLT_MAX/2, its sum and its output at 0, so in the combine its scale ``exp(max - M)`` is 0 and
        each of its terms adds ``fma(0, 0, x) = x`` to a numerator or denominator that is never -0 (both
        start at +0 and a round-to-nearest sum is -0 only if both addends are). The remaining blocks
        walk the same chunks as before (block ``y`` takes chunk ``y``; ``y + P'`` is past the filled
        cells); with one left, the kernel's own ``o / S`` is the combine's ``fma(1, o, 0) / fma(1, S, 0)``.
        So a short cache (``kv_len <= chunk_cells``: every decode step's first 128 cells under the
        llama.cpp policies, whose ``P`` is 2 or more there) needs no combine launch.
        ``tests/test_fattn.py`` checks the bits against the full plan in the emulator, the GPU tests
        the kernels against the emulator."""
        filled = self.filled_blocks
        if filled == self.parallel_blocks:
            return self
        return _with_blocks(self, filled)

    def chunks_of_block(self, y: int) -> list[tuple[int, int]]:
        """Cell ranges ``[start, end)`` block ``y`` walks, in the order it walks them."""
        if not 0 <= y < self.parallel_blocks:
            raise PlanError(f"block index {y} out of range 0..{self.parallel_blocks - 1}")
        c = self.chunk_cells
        if self.kernel == "vec":
            return [(i * c, (i + 1) * c) for i in range(y, self.n_chunks, self.parallel_blocks)]
        begin = y * self.split_cells
        end = min(begin + self.split_cells, self.kv_attended)
        return [(s, min(s + c, end)) for s in range(begin, end, c)]

    def block_of_cell(self, cell: int) -> int:
        """Which parallel block reads ``cell``."""
        if not 0 <= cell < self.kv_attended:
            raise PlanError(f"cell {cell} out of the attended range 0..{self.kv_attended - 1}")
        if self.kernel == "vec":
            return (cell // self.chunk_cells) % self.parallel_blocks
        return cell // self.split_cells

    def describe(self) -> str:
        """Human-readable summary: kernel, split, and which cells each block reads."""
        kv = "" if self.kv_len is None else f", {self.kv_len} filled"
        heads = ""
        if self.n_head is not None:
            heads = f", {self.n_head} q heads / {self.n_head_kv} kv heads"
        per_block = f"{self.queries_per_block} quer{'y' if self.queries_per_block == 1 else 'ies'}"
        lines = [
            f"{self.kernel_name} ({self.policy}{', ' + self.device if self.device else ''}): "
            f"{per_block}{' of one KV head' if self.shared_kv else ''}/block, "
            f"P={self.parallel_blocks} over {self.kv_attended} attended cells{kv}{heads}, "
            f"D={self.head_dim}",
        ]
        if self.shared_kv:
            lines.append(f"  shared: each K/V element a thread loads serves the block's {per_block} (token-major "
                         f"over the GQA group); per query the order of {KERNEL_Q1} is unchanged (same "
                         f"chunks, P, in-block reductions and combine), hence the same bits")
        if self.kernel == "vec":
            how = "fixed split" if self.split_cells else "interleaved chunks"
            lines.append(f"  {how} of {self.chunk_cells} cells; block y takes chunks y, y+P, ...")
        else:
            lines.append(f"  contiguous split of {self.split_cells} cells per block, "
                         f"{self.chunk_cells}-cell tiles")
        shown = min(self.parallel_blocks, 8)
        for y in range(shown):
            ranges = self.chunks_of_block(y)
            text = ", ".join(f"[{a},{b})" for a, b in ranges[:6]) or "(no cells)"
            if len(ranges) > 6:
                text += f", ... ({len(ranges)} ranges)"
            lines.append(f"  block {y}: {text}")
        if self.parallel_blocks > shown:
            lines.append(f"  ... {self.parallel_blocks - shown} more blocks")
        lines.append("  combine: " + ("none (P = 1, normalised in the kernel)" if self.parallel_blocks == 1
                                      else f"{self.parallel_blocks} partials merged in block order"))
        return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _with_blocks(plan: AttentionPlan, parallel_blocks: int) -> AttentionPlan:
    # cached: a decode loop asks for the launched plan of the same plan every step
    return replace(plan, parallel_blocks=parallel_blocks)


def parallel_blocks_for(ntiles_kv: int, ntiles_dst: int, blocks_per_sm: int, sm_count: int) -> int:
    """llama.cpp's choice of parallel blocks (fattn-common.cuh ``launch_fattn``, reference section 6.6).

    Starting from ``min(blocks_per_sm, ntiles_kv)``, take the number of KV
    splits whose grid fills the GPU's waves most efficiently, stopping once a
    split reaches :data:`EFFICIENCY_GOOD_ENOUGH` percent and more waves would
    follow.
    """
    if min(ntiles_kv, ntiles_dst, blocks_per_sm, sm_count) < 1:
        raise PlanError(
            f"parallel_blocks_for needs positive arguments, got ntiles_kv={ntiles_kv}, "
            f"ntiles_dst={ntiles_dst}, blocks_per_sm={blocks_per_sm}, sm_count={sm_count}"
        )
    pb = min(blocks_per_sm, ntiles_kv)
    blocks_per_wave = sm_count * blocks_per_sm
    best_eff = 0
    best_waves = 0
    for t in range(pb, ntiles_kv + 1):
        total = ntiles_dst * t
        waves = -(-total // blocks_per_wave)
        eff = 100 * total // (waves * blocks_per_wave)
        if best_eff >= EFFICIENCY_GOOD_ENOUGH and waves > best_waves:
            break
        if eff > best_eff:
            best_eff, best_waves, pb = eff, waves, t
    return pb


def shared_occupancy_key(queries: int) -> str:
    """The device-profile occupancy name of fattn_vec_shared's build for ``queries`` per block."""
    return f"{KERNEL_SHARED}/q{queries}"


def shared_queries_for(n_queries: int, kv_len: int) -> int:
    """Queries per ``fattn_vec_shared`` block for a launch of ``n_queries`` over ``kv_len`` filled
    cells, 0 for ``fattn_vec_q1``: :data:`SHARED_PICK` from 2 queries and :data:`SHARED_MIN_KV` cells
    on (the H200 measurement above). Scheduling only: the bits are the one-query kernel's whatever
    this returns."""
    return SHARED_PICK if n_queries >= 2 and kv_len >= SHARED_MIN_KV else 0


def _exact_vec(n_queries: int, kv_len: int) -> dict:
    """The exact policies' kernel fields: fattn_vec_shared or fattn_vec_q1 (:func:`shared_queries_for`)."""
    nq = shared_queries_for(n_queries, kv_len)
    return dict(queries_per_block=nq, shared_kv=True) if nq else dict(queries_per_block=1)


def _variant_uses_vec(n_queries: int, gqa_ratio: int, kv_attended: int, cc: int) -> bool:
    """ggml_cuda_get_best_fattn_kernel for f16 K/V (reference section 6.1)."""
    if n_queries != 1:
        return False
    if gqa_ratio < GQA_OPT_MIN_RATIO:
        return True
    return cc >= VEC_MIN_CC and not (gqa_ratio > GQA_LONG_RATIO and kv_attended >= GQA_LONG_KV)


def attention_plan(order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int,
                   head_dim: int = 128, device=None) -> AttentionPlan:
    """The attention plan ``order`` (a :class:`~hiraishin.order.ReductionOrder`) picks for one launch.

    * ``variant`` (stock llama.cpp): attended range = ``kv_len`` padded to
      256; one query on cc >= 890 -> vector kernel, ``P`` from its occupancy;
      several queries -> tile kernel, split from the tile kernel's occupancy
      and the number of query tiles.
    * ``invariant`` (the fork's patch 0004 fixed): vector kernel, one query per
      block, ``P`` from the one-query kernel's occupancy and the tile count of
      ONE query, range padded to 256 (the caller stops verify batches at
      multiples of 256 cells, ``order.verify_limit``).
    * ``fixed_split``: one block per ``order.split_cells`` cells at fixed
      positions, for any query count.
    * ``custom``: vector kernel with ``order.parallel_blocks`` blocks.

    Under the ``invariant`` and ``custom`` policies a launch runs ``fattn_vec_shared``
    (:func:`shared_queries_for` queries of one KV head per block share each K/V load) where that was
    measured faster than ``fattn_vec_q1``: the same ``P``, chunks and per-query order as one query
    alone, so the same bits.

    ``device`` is a profile name, a :class:`DeviceProfile` (the CUDA backend passes the current
    GPU's, with its measured occupancy) or ``None`` (``order.device``, else the default profile).
    """
    for name, value in (("n_queries", n_queries), ("kv_len", kv_len), ("n_head", n_head),
                        ("n_head_kv", n_head_kv)):
        if int(value) != value or value < 1:
            raise PlanError(f"attention_plan: {name} must be a positive integer, got {value!r}")
    if n_head % n_head_kv:
        raise PlanError(f"attention_plan: n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if head_dim not in HEAD_DIMS:
        raise PlanError(f"attention_plan: head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    profile = get_profile(device)
    common = dict(kv_len=kv_len, n_queries=n_queries, n_head=n_head, n_head_kv=n_head_kv,
                  head_dim=head_dim, policy=order.attention, device=profile.name)
    policy = order.attention

    if policy in ("variant", "invariant"):
        kv_attended = _round_up(kv_len, KV_PAD)
        vec = policy == "invariant" or _variant_uses_vec(
            n_queries, n_head // n_head_kv, kv_attended, profile.compute_capability)
        if vec:
            # ntiles_dst of ONE query: for the invariant policy whatever the launch holds (patch 0004's
            # fix); for the variant policy the vector kernel only ever gets one query.
            pb = parallel_blocks_for(kv_attended // CHUNK_CELLS, n_head,
                                     profile.blocks_per_sm(KERNEL_Q1), profile.sm_count)
            if policy == "invariant":
                # several queries share the K/V loads; P and every query's order stay the one-query plan's
                return AttentionPlan("vec", parallel_blocks=pb, chunk_cells=CHUNK_CELLS, kv_attended=kv_attended,
                                     **_exact_vec(n_queries, kv_len), **common)
            return AttentionPlan("vec", 1, pb, CHUNK_CELLS, kv_attended, None, **common)
        tile_cells = TILE_CELLS
        ntiles_kv = kv_attended // tile_cells
        ntiles_dst = -(-n_queries // TILE_QUERIES) * n_head
        pb = parallel_blocks_for(ntiles_kv, ntiles_dst, profile.blocks_per_sm(KERNEL_TILE),
                                 profile.sm_count)
        split = -(-ntiles_kv // pb) * tile_cells
        return AttentionPlan("tile", TILE_QUERIES, -(-kv_attended // split), tile_cells,
                             kv_attended, split, **common)

    if policy == "fixed_split":
        split = order.split_cells
        if split is None:
            raise PlanError(f"order {order.name!r}: the fixed_split policy needs split_cells")
        kv_attended = _round_up(kv_len, split)
        # fattn_vec_shared is not taken here: with 256-cell splits a block walks 2 steps, and on the
        # H200 fattn_vec_qn (two tokens of one head per block) was faster at 35 of 45 multi-query
        # widths x KV lengths (bench/results/2026-12-01-h200-verify-attention)
        qpb = 1 if n_queries == 1 else QN_QUERIES
        return AttentionPlan("vec", qpb, kv_attended // split, split, kv_attended, split, **common)

    if policy == "custom":
        if order.parallel_blocks is None:
            raise PlanError(f"order {order.name!r}: the custom attention policy needs parallel_blocks")
        kv_attended = _round_up(kv_len, KV_PAD)
        return AttentionPlan("vec", parallel_blocks=order.parallel_blocks, chunk_cells=CHUNK_CELLS,
                             kv_attended=kv_attended,
                             **_exact_vec(n_queries, kv_len),
                             **common)

    raise PlanError(f"order {order.name!r}: unknown attention policy {policy!r}")
