"""Split-KV vector flash attention over an f16 KV cache: plans, kernels, emulator, runner.

One query (or two) of one head per CUDA block; the KV cache is walked in
128-cell chunks spread over ``P`` parallel blocks (block ``y`` takes chunks
``y, y+P, y+2P, ...``), each block keeping its own running max and sum; a
combine kernel then merges the ``P`` partial results in block order. The
geometry is llama.cpp's ``flash_attn_ext_vec`` (reference section 6.3), the
arithmetic is IEEE (``fattn_vec.cu``).

Where the float order comes from (what a plan sets):

* ``P``: how many partial softmaxes are merged, and which chunks share a block;
* the attended range ``kv_attended`` (the filled length padded to 256 cells,
  as llama.cpp pads ``n_kv``): the number of chunks, hence ``P``;
* which kernel: the vector kernel, or for multi-query launches under the
  variant policy the tile kernel (``fattn_tile``), which orders everything
  differently.

Public API:

* :class:`AttentionPlan`, :func:`plan_attention` (what
  ``ReductionOrder.attention_plan`` returns), :func:`parallel_blocks_for`
  (llama.cpp's efficiency loop);
* :func:`attention` (plan + run), :func:`flash_attn` (run a given plan),
  :func:`partials` / :func:`combine` (the two stages, for tests and notebooks);
* :func:`measure_occupancy`, :func:`current_profile`, :func:`kernel_report`
  (GPU facts the variant plan depends on).

Devices: a plan is made for a device profile. ``device=None`` means
``order.device`` or the default profile (``hiraishin.devices``) on BOTH
backends, so the CPU emulator and the GPU run the same plan unless asked
otherwise; ``device="current"`` plans for the CUDA device with the occupancy
the driver reports for our compiled kernels (what stock llama.cpp does).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numba import njit

from ..devices import DeviceProfile, get_profile
from ..errors import BackendError, PlanError
from ..fp import expf, fmaf, warp_sum32
from ..order import KV_PAD
from . import _cuda, fattn_tile

__all__ = [
    "AttentionPlan",
    "plan_attention",
    "parallel_blocks_for",
    "attention",
    "flash_attn",
    "launch_attention",
    "partials",
    "combine",
    "attention_scale",
    "measure_occupancy",
    "current_profile",
    "kernel_report",
    "KERNEL_Q1",
    "KERNEL_QN",
    "KERNEL_TILE",
    "CHUNK_CELLS",
    "HEAD_DIMS",
]

SOURCE = "fattn_vec.cu"
KERNEL_Q1 = "fattn_vec_q1"  # one query per block (llama.cpp ncols = 1)
KERNEL_QN = "fattn_vec_qn"  # two queries per block (llama.cpp ncols = 2)
KERNEL_TILE = fattn_tile.KERNEL_NAME
KERNEL_COMBINE = "fattn_combine"
QN_QUERIES = 2  # queries per block of fattn_vec_qn
NTHREADS = 128  # 4 warps (llama.cpp fattn-vec.cuh: nthreads = 128)
# The vector kernel walks the cache 128 cells per step, one cell per thread (fattn-vec.cuh, nbatch_fa = D
# for D = 128; we keep 128 for D = 64 too): the chunk unit of the parallel-block split.
CHUNK_CELLS = 128
HEAD_DIMS = (64, 128)
# FATTN_KQ_MAX_OFFSET = 3.0f*0.6931f (ggml/src/ggml-cuda/fattn-common.cuh, PR #18614)
KQ_MAX_OFFSET = np.float32(3.0) * np.float32(0.6931)
# llama.cpp efficiency loop (fattn-common.cuh launch_fattn): stop once a split reaches this efficiency
EFFICIENCY_GOOD_ENOUGH = 95
# ggml_cuda_get_best_fattn_kernel (fattn.cu), f16 K/V on tensor-core GPUs: the vector kernel for one
# query needs cc >= 890 (Ada) and is skipped when gqa_ratio > 4 with >= 8192 cells; without the GQA
# optimisation (gqa_ratio < 2) one query always takes it.
VEC_MIN_CC = 890
GQA_LONG_RATIO = 4
GQA_LONG_KV = 8192
GQA_OPT_MIN_RATIO = 2

_NEG_HALF_FLT_MAX = np.float32(-np.finfo(np.float32).max / 2)  # initial running max (-FLT_MAX/2)
_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)

Kernel = Literal["vec", "tile"]


def attention_scale(head_dim: int) -> np.float32:
    """``1/sqrt(head_dim)`` in float32 as llama.cpp computes it on the host (128 -> 0x3DB504F3)."""
    return np.float32(1.0) / np.sqrt(np.float32(head_dim))


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

    def __post_init__(self):
        def bad(msg):
            raise PlanError(f"AttentionPlan: {msg}")

        if self.kernel not in ("vec", "tile"):
            bad(f"kernel must be 'vec' or 'tile', got {self.kernel!r}")
        if self.parallel_blocks < 1:
            bad(f"parallel_blocks must be >= 1, got {self.parallel_blocks}")
        if self.head_dim not in HEAD_DIMS:
            bad(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.kernel == "vec":
            if self.queries_per_block not in (1, QN_QUERIES):
                bad(f"the vec kernel takes 1 or {QN_QUERIES} queries per block, got {self.queries_per_block}")
            if self.chunk_cells < CHUNK_CELLS or self.chunk_cells % CHUNK_CELLS:
                bad(f"vec chunk_cells must be a positive multiple of {CHUNK_CELLS}, got {self.chunk_cells}")
            if self.kv_attended < 1 or self.kv_attended % self.chunk_cells:
                bad(f"kv_attended ({self.kv_attended}) must be a positive multiple of chunk_cells "
                    f"({self.chunk_cells})")
            if self.split_cells is not None and self.split_cells != self.chunk_cells:
                bad(f"vec split_cells must equal chunk_cells ({self.chunk_cells}) or be None, "
                    f"got {self.split_cells}")
        else:
            if self.queries_per_block != fattn_tile.TILE_QUERIES:
                bad(f"the tile kernel takes {fattn_tile.TILE_QUERIES} queries per block, "
                    f"got {self.queries_per_block}")
            if self.chunk_cells != fattn_tile.TILE_CELLS:
                bad(f"tile chunk_cells must be {fattn_tile.TILE_CELLS}, got {self.chunk_cells}")
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
        return KERNEL_Q1 if self.queries_per_block == 1 else KERNEL_QN

    @property
    def n_chunks(self) -> int:
        return self.kv_attended // self.chunk_cells

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
        lines = [
            f"{self.kernel_name} ({self.policy}{', ' + self.device if self.device else ''}): "
            f"{self.queries_per_block} quer{'y' if self.queries_per_block == 1 else 'ies'}/block, "
            f"P={self.parallel_blocks} over {self.kv_attended} attended cells{kv}{heads}, "
            f"D={self.head_dim}",
        ]
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


def _resolve_device(device) -> DeviceProfile:
    if isinstance(device, str) and device == "current":
        return current_profile()
    return get_profile(device)


def _variant_uses_vec(n_queries: int, gqa_ratio: int, kv_attended: int, cc: int) -> bool:
    """ggml_cuda_get_best_fattn_kernel for f16 K/V (reference section 6.1)."""
    if n_queries != 1:
        return False
    if gqa_ratio < GQA_OPT_MIN_RATIO:
        return True
    return cc >= VEC_MIN_CC and not (gqa_ratio > GQA_LONG_RATIO and kv_attended >= GQA_LONG_KV)


def plan_attention(order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int,
                   head_dim: int = 128, device=None) -> AttentionPlan:
    """The attention plan ``order`` picks for one launch (see ``ReductionOrder.attention_plan``).

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

    ``device`` is a profile name, a :class:`DeviceProfile`, ``None`` (the
    default profile) or ``"current"`` (the CUDA device, occupancy measured).
    """
    for name, value in (("n_queries", n_queries), ("kv_len", kv_len), ("n_head", n_head),
                        ("n_head_kv", n_head_kv)):
        if int(value) != value or value < 1:
            raise PlanError(f"plan_attention: {name} must be a positive integer, got {value!r}")
    if n_head % n_head_kv:
        raise PlanError(f"plan_attention: n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if head_dim not in HEAD_DIMS:
        raise PlanError(f"plan_attention: head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    profile = _resolve_device(device)
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
            return AttentionPlan("vec", 1, pb, CHUNK_CELLS, kv_attended, None, **common)
        tile_cells = fattn_tile.TILE_CELLS
        ntiles_kv = kv_attended // tile_cells
        ntiles_dst = -(-n_queries // fattn_tile.TILE_QUERIES) * n_head
        pb = parallel_blocks_for(ntiles_kv, ntiles_dst, profile.blocks_per_sm(KERNEL_TILE),
                                 profile.sm_count)
        split = -(-ntiles_kv // pb) * tile_cells
        return AttentionPlan("tile", fattn_tile.TILE_QUERIES, -(-kv_attended // split), tile_cells,
                             kv_attended, split, **common)

    if policy == "fixed_split":
        split = order.split_cells
        if split is None:
            raise PlanError(f"order {order.name!r}: the fixed_split policy needs split_cells")
        kv_attended = _round_up(kv_len, split)
        qpb = 1 if n_queries == 1 else QN_QUERIES
        return AttentionPlan("vec", qpb, kv_attended // split, split, kv_attended, split, **common)

    if policy == "custom":
        if order.parallel_blocks is None:
            raise PlanError(f"order {order.name!r}: the custom attention policy needs parallel_blocks")
        kv_attended = _round_up(kv_len, KV_PAD)
        return AttentionPlan("vec", 1, order.parallel_blocks, CHUNK_CELLS, kv_attended, None, **common)

    raise PlanError(f"order {order.name!r}: unknown attention policy {policy!r}")


# ---------------------------------------------------------------------------------------- emulator


@njit(cache=True, inline="always")
def _butterfly8(x):
    """xor 4, 2, 1 over the 8 threads of a group (every lane ends with this value)."""
    a0 = x[0] + x[4]
    a1 = x[1] + x[5]
    a2 = x[2] + x[6]
    a3 = x[3] + x[7]
    return (a0 + a2) + (a1 + a3)


@njit(cache=True)
def _vec_block(q, k, v, kvh, pos, kv_len, y, n_blocks, chunk_cells, kv_attended, o):
    """One (query, head, block y) of fattn_vec: fills ``o`` (D,), returns (block max, block sum)."""
    D = q.shape[0]
    n_slices = D // 64
    M = np.full(4, _NEG_HALF_FLT_MAX, np.float32)  # per warp
    ssum = np.zeros(NTHREADS, np.float32)  # per thread (its own cell of each step)
    O = np.zeros((16, D), np.float32)  # per (warp, group): row 4w + g
    s = np.empty(NTHREADS, np.float32)
    p = np.empty(NTHREADS, np.float32)
    part = np.empty(8, np.float32)
    n_chunks = kv_attended // chunk_cells
    c = y
    while c < n_chunks:
        for k0 in range(c * chunk_cells, (c + 1) * chunk_cells, NTHREADS):
            for i in range(NTHREADS):
                n = k0 + i
                if n < kv_len and n <= pos:
                    for r in range(8):
                        acc = _ZERO
                        for b in range(n_slices):
                            for e in range(8):
                                d = 64 * b + 8 * r + e
                                acc = fmaf(k[n, kvh, d], q[d], acc)
                        part[r] = acc
                    s[i] = _butterfly8(part)
                else:
                    s[i] = _NEG_INF
            for w in range(4):
                m_new = M[w]
                for lane in range(32):
                    x = s[32 * w + lane] + KQ_MAX_OFFSET
                    if x > m_new:
                        m_new = x
                a = expf(M[w] - m_new)
                M[w] = m_new
                for lane in range(32):
                    i = 32 * w + lane
                    p[i] = expf(s[i] - m_new)
                    ssum[i] = fmaf(ssum[i], a, p[i])
                for g in range(4):
                    row = 4 * w + g
                    for d in range(D):
                        O[row, d] = O[row, d] * a
                for g in range(4):
                    row = 4 * w + g
                    for t in range(8):
                        kk = 32 * w + g + 4 * t
                        n = k0 + kk
                        pk = p[kk]
                        if n < kv_len:
                            for d in range(D):
                                O[row, d] = fmaf(v[n, kvh, d], pk, O[row, d])
                        else:  # the kernel uses zeros for cells past the filled cache
                            for d in range(D):
                                O[row, d] = fmaf(_ZERO, pk, O[row, d])
        c += n_blocks
    # in-block combine
    Mb = _NEG_HALF_FLT_MAX
    for w in range(4):
        if M[w] > Mb:
            Mb = M[w]
    lane_sums = np.empty(32, np.float32)
    warp_sums = np.zeros(32, np.float32)
    for w in range(4):
        a = expf(M[w] - Mb)
        for g in range(4):
            row = 4 * w + g
            for d in range(D):
                O[row, d] = O[row, d] * a
        for lane in range(32):
            lane_sums[lane] = ssum[32 * w + lane] * a
        warp_sums[w] = warp_sum32(lane_sums)
    S = warp_sum32(warp_sums)
    for d in range(D):
        acc = _ZERO
        for row in range(16):
            acc = acc + O[row, d]
        o[d] = acc
    return Mb, S


@njit(cache=True)
def _vec_partials(q, k, v, q_pos, kv_len, n_blocks, chunk_cells, kv_attended, scale, parts, meta):
    T, H, D = q.shape
    ratio = H // k.shape[1]
    qs = np.empty(D, np.float32)
    for t in range(T):
        for h in range(H):
            for d in range(D):
                qs[d] = q[t, h, d] * scale
            for y in range(n_blocks):
                Mb, S = _vec_block(qs, k, v, h // ratio, q_pos[t], kv_len, y, n_blocks, chunk_cells,
                                   kv_attended, parts[t, h, y])
                meta[t, h, y, 0] = Mb
                meta[t, h, y, 1] = S


@njit(cache=True)
def _combine_rows(parts, meta, out):
    """fattn_combine for every (token, head): merge the P partials in block order."""
    T, H, P, D = parts.shape
    for t in range(T):
        for h in range(H):
            kqmax = meta[t, h, 0, 0]
            for l in range(1, P):
                if meta[t, h, l, 0] > kqmax:
                    kqmax = meta[t, h, l, 0]
            for d in range(D):
                num = _ZERO
                den = _ZERO
                for l in range(P):
                    sc = expf(meta[t, h, l, 0] - kqmax)
                    num = fmaf(sc, parts[t, h, l, d], num)
                    den = fmaf(sc, meta[t, h, l, 1], den)
                out[t, h, d] = num / den


@njit(cache=True)
def _finish(parts, meta, out):
    """What the launch writes: P == 1 -> o / S (in the kernel); P > 1 -> fattn_combine."""
    T, H, P, D = parts.shape
    if P > 1:
        _combine_rows(parts, meta, out)
        return
    for t in range(T):
        for h in range(H):
            S = meta[t, h, 0, 1]
            for d in range(D):
                out[t, h, d] = parts[t, h, 0, d] / S


def _emulate_partials(q, k_cache, v_cache, q_pos, plan: AttentionPlan):
    kv_len = plan.kv_len if plan.kv_len is not None else plan.kv_attended
    # f16 -> f32 is exact; only the cells the kernels may read
    k32 = np.ascontiguousarray(k_cache[:kv_len], dtype=np.float32)
    v32 = np.ascontiguousarray(v_cache[:kv_len], dtype=np.float32)
    qpos = q_pos.astype(np.int64)
    scale = attention_scale(plan.head_dim)
    T, H, D = q.shape
    P = plan.parallel_blocks
    if plan.kernel == "tile":
        return fattn_tile.emulate_tile_partials(q, k32, v32, qpos, kv_len, P, plan.split_cells,
                                                plan.kv_attended, scale)
    parts = np.empty((T, H, P, D), np.float32)
    meta = np.empty((T, H, P, 2), np.float32)
    _vec_partials(q, k32, v32, qpos, kv_len, P, plan.chunk_cells, plan.kv_attended, scale, parts, meta)
    return parts, meta


# --------------------------------------------------------------------------------------- validation


def _is_cupy(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy"


def _check_inputs(q, k_cache, v_cache, q_pos, kv_len, backend):
    """Validate shapes/dtypes; return int32 positions (host numpy, or the caller's CuPy array)."""
    if backend not in ("cpu", "cuda"):
        raise BackendError(f"unknown backend {backend!r}; use 'cpu' or 'cuda'")
    for name, arr in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not hasattr(arr, "shape") or len(arr.shape) != 3:
            raise PlanError(f"{name} must be a 3-D array, got shape {getattr(arr, 'shape', None)}")
        if backend == "cpu" and _is_cupy(arr):
            raise BackendError(f"{name} is a CuPy array but backend is 'cpu'")
        if backend == "cuda" and name != "q" and not _is_cupy(arr):
            raise BackendError(f"{name} must be a CuPy array for backend 'cuda' (got {type(arr).__name__})")
    if q.dtype != np.float32:
        raise PlanError(f"q must be float32 (T, n_head, D), got {q.dtype}")
    for name, arr in (("k_cache", k_cache), ("v_cache", v_cache)):
        if arr.dtype != np.float16:
            raise PlanError(f"{name} must be float16 (n_ctx, n_head_kv, D), got {arr.dtype}")
        if not arr.flags.c_contiguous:
            raise PlanError(f"{name} must be C-contiguous")
    if k_cache.shape != v_cache.shape:
        raise PlanError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    T, H, D = q.shape
    n_ctx, Hkv, Dk = k_cache.shape
    if D != Dk:
        raise PlanError(f"q head dim {D} (q shape {tuple(q.shape)}) != cache head dim {Dk} "
                        f"(cache shape {tuple(k_cache.shape)})")
    if D not in HEAD_DIMS:
        raise PlanError(f"head dim must be one of {HEAD_DIMS}, got {D} (q shape {tuple(q.shape)})")
    if T < 1 or Hkv < 1 or H % Hkv:
        raise PlanError(f"q shape {tuple(q.shape)} vs cache shape {tuple(k_cache.shape)}: need T >= 1 and "
                        f"n_head a multiple of n_head_kv")
    if not 1 <= kv_len <= n_ctx:
        raise PlanError(f"kv_len must be in 1..n_ctx ({n_ctx}), got {kv_len}")
    if backend == "cuda" and _is_cupy(q_pos):
        # positions already on the device: shape and type only (their values are only compared
        # with cell indices in the kernels, never used as addresses; reading them back would sync)
        if tuple(q_pos.shape) != (T,) or q_pos.dtype.kind not in "iu":
            raise PlanError(f"q_pos must be an integer array of shape ({T},), got {q_pos.dtype} "
                            f"{tuple(q_pos.shape)}")
        return q_pos if q_pos.dtype == np.int32 and q_pos.flags.c_contiguous else q_pos.astype(np.int32)
    pos = np.asarray(q_pos.get() if _is_cupy(q_pos) else q_pos)
    if pos.shape != (T,) or not np.issubdtype(pos.dtype, np.integer):
        raise PlanError(f"q_pos must be an integer array of shape ({T},), got {pos.dtype} {pos.shape}")
    if T and (pos.min() < 0 or pos.max() >= kv_len):
        raise PlanError(f"q_pos must lie in 0..kv_len-1 = 0..{kv_len - 1} (a query sees its own cell), "
                        f"got min {pos.min()} max {pos.max()}")
    return pos.astype(np.int32)


def _check_plan(plan: AttentionPlan, q, k_cache, kv_len):
    T, H, D = q.shape
    Hkv = k_cache.shape[1]
    for field, want in (("n_queries", T), ("n_head", H), ("n_head_kv", Hkv), ("kv_len", kv_len)):
        have = getattr(plan, field)
        if have is not None and have != want:
            raise PlanError(f"plan.{field} = {have} but the inputs have {want} "
                            f"(q {tuple(q.shape)}, cache {tuple(k_cache.shape)})")
    if plan.head_dim != D:
        raise PlanError(f"plan.head_dim = {plan.head_dim} but q has head dim {D}")


def _plan_kv_len(plan: AttentionPlan, k_cache) -> int:
    kv_len = plan.kv_len if plan.kv_len is not None else plan.kv_attended
    if kv_len > k_cache.shape[0]:
        raise PlanError(f"kv_len must be in 1..n_ctx ({k_cache.shape[0]}) of the cache, got {kv_len} "
                        f"(from the plan)")
    return kv_len


# ------------------------------------------------------------------------------------------- CUDA


@functools.cache
def _kernel(name: str, head_dim: int):
    return _cuda.get_kernel(SOURCE, name, defines={"HX_D": head_dim})


@functools.cache
def _scale(head_dim: int) -> np.float32:
    return attention_scale(head_dim)


def _cuda_launch(q, k_cache, v_cache, pos, plan: AttentionPlan, kv_len: int, dst=None, parts=None, meta=None):
    """Run the plan's attention kernel; returns (dst, parts, meta) with parts/meta None when P == 1.

    ``dst`` (T, H, D), ``parts`` (T, H, P, D), ``meta`` (T, H, P, 2): float32 C-contiguous
    buffers to write into, or None to allocate them.
    """
    from ._cuda import require_cupy

    cp = require_cupy()
    q = cp.ascontiguousarray(cp.asarray(q, dtype=cp.float32))
    qpos = cp.asarray(pos, dtype=cp.int32)
    return _launch_partials(cp, q, k_cache, v_cache, qpos, plan, kv_len, dst, parts, meta)


def _launch_partials(cp, q, k_cache, v_cache, qpos, plan: AttentionPlan, kv_len: int, dst, parts, meta):
    T, H, D = q.shape
    P = plan.parallel_blocks
    if dst is None:
        dst = cp.empty((T, H, D), cp.float32)
    if P > 1:
        if parts is None:
            parts = cp.empty((T, H, P, D), cp.float32)
        if meta is None:
            meta = cp.empty((T, H, P, 2), cp.float32)
    else:
        parts = meta = dst  # not written by the kernel when P == 1
    scale = _scale(D)
    if plan.kernel == "tile":
        fattn_tile.launch_tile(q, k_cache, v_cache, qpos, kv_len, P, plan.split_cells, plan.kv_attended,
                               scale, dst, parts, meta)
    else:
        ncols = plan.queries_per_block
        grid = (-(-T // ncols), P, H)
        _kernel(plan.kernel_name, D)(
            grid, (32, 4, 1),
            (q, k_cache, v_cache, qpos, dst, parts, meta, np.int32(T), np.int32(H),
             np.int32(k_cache.shape[1]), np.int32(kv_len), np.int32(plan.kv_attended),
             np.int32(plan.chunk_cells), np.float32(scale)))
    return (dst, None, None) if P == 1 else (dst, parts, meta)


def _cuda_combine(parts, meta, dst=None):
    T, H, P, D = parts.shape
    if dst is None:
        dst = _cuda.require_cupy().empty((T, H, D), np.float32)
    _kernel(KERNEL_COMBINE, D)((T, H, 1), (D, 1, 1), (parts, meta, dst, np.int32(P)), shared_mem=8 * P)
    return dst


def launch_attention(q, k_cache, v_cache, q_pos, plan: AttentionPlan, out=None, parts=None, meta=None):
    """Run ``plan`` on CuPy arrays, unchecked (with the combine when ``P > 1``) -> ``out`` (T, H, D).

    For callers that validated once (the CUDA backend): ``q`` float32 C-contiguous (T, H, D);
    caches float16 C-contiguous (n_ctx, n_head_kv, D) holding at least the plan's filled cells;
    ``q_pos`` int32 C-contiguous (T,) on the device, each in ``0..kv_len-1``; ``plan`` made for
    exactly these shapes (as :func:`plan_attention` makes it). ``out`` (T, H, D) and, when
    ``P > 1``, the scratch ``parts`` (T, H, P, D) and ``meta`` (T, H, P, 2): float32 C-contiguous
    buffers, or None to allocate them. Same launches, hence same bits, as :func:`flash_attn`.
    """
    kv_len = plan.kv_len if plan.kv_len is not None else plan.kv_attended
    dst, parts, meta = _launch_partials(_cuda.require_cupy(), q, k_cache, v_cache, q_pos, plan, kv_len, out, parts,
                                        meta)
    return dst if parts is None else _cuda_combine(parts, meta, dst)


# ------------------------------------------------------------------------------------------ runner


def partials(q, k_cache, v_cache, q_pos, plan: AttentionPlan, backend: str):
    """First stage only: unnormalised partials ``(T, H, P, D)`` and ``(max, sum)`` meta ``(T, H, P, 2)``.

    Needs ``P > 1`` (with one block the kernels normalise in place and write
    no partials).
    """
    if plan.parallel_blocks == 1:
        raise PlanError("plan has parallel_blocks == 1: the kernel normalises in place and writes no "
                        "partials; use flash_attn")
    kv_len = _plan_kv_len(plan, k_cache)
    pos = _check_inputs(q, k_cache, v_cache, q_pos, kv_len, backend)
    _check_plan(plan, q, k_cache, kv_len)
    if backend == "cpu":
        return _emulate_partials(q, k_cache, v_cache, pos, plan)
    _, parts, meta = _cuda_launch(q, k_cache, v_cache, pos, plan, kv_len)
    return parts, meta


def combine(parts, meta, backend: str):
    """Second stage: merge ``P`` partials in block order (``fattn_combine``) -> ``(T, H, D)`` float32."""
    if len(parts.shape) != 4 or tuple(meta.shape) != tuple(parts.shape[:3]) + (2,):
        raise PlanError(f"combine needs parts (T, H, P, D) and meta (T, H, P, 2), got "
                        f"{tuple(parts.shape)} and {tuple(meta.shape)}")
    if parts.shape[3] not in HEAD_DIMS:
        raise PlanError(f"combine: head dim must be one of {HEAD_DIMS}, got {parts.shape[3]}")
    if backend == "cpu":
        out = np.empty((parts.shape[0], parts.shape[1], parts.shape[3]), np.float32)
        _combine_rows(np.ascontiguousarray(parts, np.float32), np.ascontiguousarray(meta, np.float32), out)
        return out
    if backend == "cuda":
        from ._cuda import require_cupy

        cp = require_cupy()
        return _cuda_combine(cp.ascontiguousarray(parts, cp.float32), cp.ascontiguousarray(meta, cp.float32))
    raise BackendError(f"unknown backend {backend!r}; use 'cpu' or 'cuda'")


def flash_attn(q, k_cache, v_cache, q_pos, plan: AttentionPlan, backend: str):
    """Run one attention launch with an explicit plan -> float32 ``(T, n_head, D)``.

    ``q`` float32 ``(T, n_head, D)``; ``k_cache``/``v_cache`` float16
    ``(n_ctx, n_head_kv, D)``; ``q_pos`` ``(T,)`` absolute positions (query
    ``t`` sees cells ``<= q_pos[t]`` among the ``plan.kv_len`` filled ones).
    ``backend`` ``"cpu"`` (Numba emulator, numpy arrays) or ``"cuda"`` (CuPy).
    """
    kv_len = _plan_kv_len(plan, k_cache)
    pos = _check_inputs(q, k_cache, v_cache, q_pos, kv_len, backend)
    _check_plan(plan, q, k_cache, kv_len)
    if backend == "cpu":
        parts, meta = _emulate_partials(q, k_cache, v_cache, pos, plan)
        out = np.empty(q.shape, np.float32)
        _finish(parts, meta, out)
        return out
    dst, parts, meta = _cuda_launch(q, k_cache, v_cache, pos, plan, kv_len)
    if parts is None:
        return dst
    return _cuda_combine(parts, meta, dst)


def attention(q, k_cache, v_cache, q_pos, kv_len: int, order, backend: str, device=None):
    """Causal attention of ``T`` queries over the first ``kv_len`` cache cells, planned by ``order``.

    Shapes as :func:`flash_attn`; returns float32 ``(T, n_head, D)``.
    ``device``: profile for the plan (``None``: ``order.device`` or the
    default profile; ``"current"``: the CUDA device with measured occupancy).
    """
    if not hasattr(q, "shape") or len(q.shape) != 3 or not hasattr(k_cache, "shape") or len(k_cache.shape) != 3:
        raise PlanError(f"q must be (T, n_head, D) and k_cache (n_ctx, n_head_kv, D); got "
                        f"{getattr(q, 'shape', None)} and {getattr(k_cache, 'shape', None)}")
    T, H, D = q.shape
    plan = order.attention_plan(T, int(kv_len), H, k_cache.shape[1], D, device)
    return flash_attn(q, k_cache, v_cache, q_pos, plan, backend)


# ----------------------------------------------------------------------------------- device facts


def _kernels(head_dim: int):
    from ._cuda import get_kernel

    defines = {"HX_D": head_dim}
    return {
        KERNEL_Q1: get_kernel(SOURCE, KERNEL_Q1, defines=defines),
        KERNEL_QN: get_kernel(SOURCE, KERNEL_QN, defines=defines),
        KERNEL_TILE: get_kernel(fattn_tile.SOURCE, KERNEL_TILE, defines=defines),
        KERNEL_COMBINE: get_kernel(SOURCE, KERNEL_COMBINE, defines=defines),
    }


def measure_occupancy(head_dim: int = 128) -> dict[str, int]:
    """Blocks per SM of our compiled attention kernels, asked from the driver (CuPy).

    ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` with 128 threads and no
    dynamic shared memory, as llama.cpp asks for its vec kernel. Keys are the
    :class:`DeviceProfile` occupancy names.
    """
    from ._cuda import require_cupy

    cp = require_cupy()
    kernels = _kernels(head_dim)
    return {
        name: int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernels[name].kernel.ptr,
                                                                           NTHREADS, 0))
        for name in (KERNEL_Q1, KERNEL_QN, KERNEL_TILE)
    }


@functools.lru_cache(maxsize=None)
def current_profile(head_dim: int = 128) -> DeviceProfile:
    """The CUDA device's profile with our kernels' measured occupancy (cached)."""
    from ..devices import current_device

    return current_device(measure_occupancy(head_dim))


def kernel_report(head_dim: int = 128) -> dict:
    """Registers, spills, shared memory and occupancy of every attention kernel (for results JSON)."""
    from ._cuda import kernel_attributes

    occupancy = measure_occupancy(head_dim)
    return {
        name: dict(kernel_attributes(kernel), blocks_per_sm=occupancy.get(name))
        for name, kernel in _kernels(head_dim).items()
    }
