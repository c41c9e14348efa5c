"""Plans of the stock MMQ order: ``BATCH_VARIANT``'s mat-mat past ``MMVQ_MAX_BATCH_SIZE`` = 8
columns for Q4_K/Q6_K weights, the float sequence of llama.cpp's ``mul_mat_q`` (``hiraishin/kernels/mmq_stock``).

Upstream (ggml ``src/ggml-cuda/mmq.cuh``, ``mmq-load-tiles.cuh``, ``mmq-vec-dot.cuh``,
``mmq-config-ampere.cuh``; Volta..Hopper, int8 ``mma.sync``): output tiles of ``I`` = 128 rows x
``J`` columns, ``J`` the smallest configured width that gives the fewest column tiles; the
(tile, super-block) work of the whole product is cut into ``grid`` equal contiguous ranges
("stream-k"), ``grid`` = the tile count when tiling alone fills the SMs to >= 90 %, else the SM
count. So each tile's K range falls into *pieces* [kb0, kb1) of super-blocks, one per CUDA block
that touches it. For one output (row r, column j) of a piece::

    sum = 0
    for super-block i in kb0 .. kb1-1, in k order:
      Q4_K (load_tiles_q4_K: dm = half2(d*sc_b, -dmin*m_b), FP16 products, per sub-block b):
        for b in 0..7:  sum = fmaf(f(dm_b.x) * dx_b, float(C_b), sum)      # C_b exact int dot
                        sum = fmaf(f(dm_b.y), sx_b, sum)                    # q8_1 (d, s) of block b
      Q6_K (vec_dot_q6_K_q8_1_mma, two 128-value halves per super-block):
        for h in 0, 1:  tmp = 0
                        for b in 4h .. 4h+3:  tmp = fmaf(float(sc[2b]*C_lo + sc[2b+1]*C_hi), dx_b, tmp)
                        sum = fmaf(tmp, f(d), sum)

A tile's last piece P_m is written to the output; earlier pieces go to the fixup buffer and
``mul_mat_q_stream_k_fixup`` adds them, newest first: ``out = P_m + ((((0 + P_{m-1}) + P_{m-2})
+ ...) + P_0)``. (``sum += a*b*c`` and ``sum += a*b`` are the fused multiply-adds nvcc contracts
them to; the products are rounded first.)

What the order depends on: K, the row count N (tiles of 128 rows), the width (column tiles of
``J``) and the GPU's SM count (``device.sm_count``; 132 on an H200). Within 9..128 columns there
is one column tile, so the pieces depend on N, K and the SMs, not on the width; 129+ columns
(prefill) add column tiles and change them.

Read from ggml-org/ggml at d99724f (2026-08-21). The tiles are ``mmq-config-ampere.cuh``'s
(Volta..Hopper, NVIDIA): a profile of another GPU gets them with its own SM count; its own MMQ
configuration and mat-vec/MMQ crossover (Ada, Blackwell: llama.cpp PR #26079) are not modelled.

This module is pure Python (no kernels, no backends).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..devices import get_profile
from ..errors import PlanError

__all__ = [
    "MMQ_STOCK_QTYPES",
    "MMQ_TILE_ROWS",
    "MMQ_J",
    "MMQ_J_FALLBACK",
    "MMQ_J_MAX",
    "MMQ_TILE_EFFICIENCY",
    "MMQ_STOCK_NWARPS",
    "MMQStockPlan",
    "mmq_stock_plan",
    "mmq_tile_cols",
    "stream_k_grid",
    "stream_k_pieces",
]

MMQ_STOCK_QTYPES = ("Q4_K", "Q6_K")
# mmq-config-ampere.cuh, Q4_K and Q6_K (Volta..Hopper): I = 128 rows per tile, 256 threads, one
# 256-value super-block per K iteration (MMQ_ITER_K; blocks_per_iter = 1), stream-k on.
MMQ_TILE_ROWS = 128
MMQ_QK = 256
# Configured J (columns per tile): rows a multiple of 128 (fallback = false), else (fallback = true).
MMQ_J = (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)
MMQ_J_FALLBACK = (8, 16, 32, 64, 128)
MMQ_J_MAX = 128
# launch_mul_mat_q: one CUDA block per tile when the tiles fill the SMs to at least this percent.
MMQ_TILE_EFFICIENCY = 90

# Our kernel's launch facts (no bit changes; tests/test_mmq_stock*.py): warps per CUDA block
# (16 rows each) and columns per warp, keyed by J >= 64. H200 sweep
# (bench/results/2026-12-01-h200-mmq-stock/, run 1): 2 warps beat 4 and 8 at every shape (16
# columns: attn_q 19.7 vs 21.9 / 26.4 us, ffn_down 56.2 vs 62.4 / 75.5; 512: 270 vs 270 / 275,
# output head 11.1 vs 11.4 / 11.7 ms); 512 columns: 32 columns per warp beat 16 (attn_q 270 vs 337 us).
MMQ_STOCK_NWARPS = 2
MMQ_STOCK_COLS_PER_WARP = {False: 16, True: 32}  # key: J >= 64


def mmq_tile_cols(ncols: int, nrows: int) -> int:
    """``J`` of ``mul_mat_q_switch_J``: the first configured width with the fewest column tiles."""
    best, best_tiles = 0, None
    for j in (MMQ_J if nrows % MMQ_TILE_ROWS == 0 else MMQ_J_FALLBACK):
        tiles = -(-ncols // j)
        if best_tiles is None or tiles < best_tiles:
            best, best_tiles = j, tiles
        if best_tiles == 1:
            break
    return best


def stream_k_grid(ntiles: int, sm_count: int) -> int:
    """CUDA blocks of upstream's stream-k launch: the tiles, if they fill the SMs well, else the SMs."""
    waves = -(-ntiles // sm_count)
    efficiency = 100 * ntiles // (sm_count * waves)
    return ntiles if efficiency >= MMQ_TILE_EFFICIENCY else sm_count


@functools.lru_cache(maxsize=256)
def stream_k_pieces(ntiles: int, nb: int, grid: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per tile (in upstream's kbc order), its pieces [kb0, kb1) of super-blocks in k order.

    CUDA block ``b`` owns kbc range [b*T // grid, (b+1)*T // grid) of T = ntiles * nb (with one
    super-block per iteration the ranges need no rounding); each range is cut at tile boundaries.
    """
    total = ntiles * nb
    pieces = [[] for _ in range(ntiles)]
    for b in range(grid):
        lo, hi = b * total // grid, (b + 1) * total // grid
        while lo < hi:
            t = lo // nb
            end = min(hi, (t + 1) * nb)
            pieces[t].append((lo - t * nb, end - t * nb))
            lo = end
    return tuple(tuple(p) for p in pieces)


@dataclass(frozen=True)
class MMQStockPlan:
    """The stock MMQ order for ``ncols`` (> 8) columns of an (``n``, ``k``) ``qtype`` weight.

    ``n`` and ``k`` may be None (a plan asked for without a weight: it describes the order but
    cannot run). ``sm_count`` is the device's (it sets the stream-k split); ``tile_cols`` is
    upstream's ``J``. ``nwarps`` (16 rows each) and ``cols_per_warp`` are our kernel's launch
    facts, which change no bit.
    """

    qtype: str
    ncols: int
    k: int | None
    n: int | None
    sm_count: int
    tile_cols: int
    nwarps: int = MMQ_STOCK_NWARPS
    cols_per_warp: int = 16
    kernel: str = "mmq_stock"

    @property
    def rows_per_block(self) -> int:
        """Rows one CUDA block of our kernel computes."""
        return 16 * self.nwarps

    @property
    def cols_per_launch(self) -> int:
        return self.ncols

    def launches(self) -> list[tuple[int, int]]:
        """(first column, columns) of each launch: one launch (plus the fixup) for every column."""
        return [(0, self.ncols)]

    @property
    def shaped(self) -> bool:
        return self.k is not None and self.n is not None

    def _need_shape(self):
        if not self.shaped:
            raise PlanError("the stock MMQ plan needs the weight's shape (k, n) to split K; "
                            "ask plans.matvec_plan(order, ncols, qtype, k=..., n=...)")

    @property
    def nblocks(self) -> int:
        """Super-blocks per row."""
        self._need_shape()
        return self.k // MMQ_QK

    @property
    def tiles(self) -> tuple[int, int]:
        """(row tiles, column tiles) of upstream's launch."""
        self._need_shape()
        return -(-self.n // MMQ_TILE_ROWS), -(-self.ncols // self.tile_cols)

    @property
    def grid(self) -> int:
        """CUDA blocks of upstream's stream-k launch."""
        nty, ntx = self.tiles
        return stream_k_grid(nty * ntx, self.sm_count)

    def pieces(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Pieces [kb0, kb1) of each tile (index it * column tiles + jt), in k order."""
        nty, ntx = self.tiles
        return stream_k_pieces(nty * ntx, self.nblocks, self.grid)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """The work items and fixups our kernel runs, as int32 arrays.

        ``items`` (n_items, 5): it, jt, kb0, kb1, scratch slot (-1: the tile's last piece, written
        to the output). ``fixups`` (n_fixups, 4): it, jt, first slot, pieces in scratch (the
        tile's pieces before the last, in k order, in consecutive slots).
        """
        _, ntx = self.tiles
        items, fixups, slot = [], [], 0
        for t, ps in enumerate(self.pieces()):
            it, jt = divmod(t, ntx)
            if len(ps) > 1:
                fixups.append((it, jt, slot, len(ps) - 1))
            for p, (a, b) in enumerate(ps):
                last = p == len(ps) - 1
                items.append((it, jt, a, b, -1 if last else slot))
                slot += 0 if last else 1
        return (np.array(items, dtype=np.int32).reshape(-1, 5),
                np.array(fixups, dtype=np.int32).reshape(-1, 4))

    def describe(self) -> str:
        step = ("per 32-value sub-block b: sum = fmaf(half(d*sc_b)*dx_b, float(C_b), sum); "
                "sum = fmaf(half(-dmin*m_b), sx_b, sum) (FP16 scale products, as load_tiles_q4_K packs them)"
                if self.qtype == "Q4_K" else
                "per 128-value half: tmp = 0; per q8_1 block b: tmp = fmaf(float(sc_lo*C_lo + sc_hi*C_hi), dx_b, tmp); "
                "then sum = fmaf(tmp, d, sum)")
        head = (f"{self.qtype}, stock MMQ order (llama.cpp mul_mat_q, the wide-batch path past 8 columns), "
                f"{self.ncols} columns in one launch: tiles of {MMQ_TILE_ROWS} rows x {self.tile_cols} columns; "
                f"each output sums super-blocks in k order, {step}")
        if not self.shaped:
            split = (f"; the K split (stream-k over {self.sm_count} SMs) depends on the weight's shape, "
                     "not given here")
        else:
            sizes = sorted({len(p) for p in self.pieces()})
            split = (f"; stream-k over {self.grid} CUDA blocks ({self.sm_count} SMs): each tile's "
                     f"{self.nblocks} super-blocks fall into {'/'.join(map(str, sizes))} piece(s), the last "
                     "written to the output, the others added newest first by the fixup "
                     "(out = P_m + (((0 + P_m-1) + ...) + P_0))")
        return (head + split + ". Differs from upstream in its input only: the activations are the mat-vec's "
                "q8_1 blocks (d = amax/127 in fp16, q = round(x/d)), not quantize_mmq_q8_1's "
                "(d = 1/(127/amax), Q6_K's d kept in fp32), and every operation is IEEE (no fast-math). "
                f"Launch: {self.nwarps} warps x 16 rows, {self.cols_per_warp} columns per warp.")


def mmq_stock_plan(ncols: int, qtype: str, k: int | None = None, n: int | None = None,
                   device=None) -> MMQStockPlan:
    """The :class:`MMQStockPlan` of ``ncols`` columns of a (``n``, ``k``) ``qtype`` weight on ``device``.

    Raises :class:`PlanError` for a type other than Q4_K/Q6_K, ``k`` not a positive multiple of
    256, or ``ncols`` / ``n`` < 1.
    """
    if qtype not in MMQ_STOCK_QTYPES:
        raise PlanError(f"the stock MMQ order covers {list(MMQ_STOCK_QTYPES)}, got {qtype!r}")
    if not isinstance(ncols, int) or ncols < 1:
        raise PlanError(f"stock MMQ: ncols={ncols!r} must be >= 1")
    if k is not None and (not isinstance(k, int) or k <= 0 or k % MMQ_QK):
        raise PlanError(f"stock MMQ: K={k!r} must be a positive multiple of {MMQ_QK}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise PlanError(f"stock MMQ: n={n!r} rows must be >= 1")
    profile = get_profile(device)
    j = mmq_tile_cols(ncols, MMQ_TILE_ROWS if n is None else n)
    return MMQStockPlan(qtype=qtype, ncols=ncols, k=k, n=n, sm_count=profile.sm_count, tile_cols=j,
                        cols_per_warp=MMQ_STOCK_COLS_PER_WARP[j >= 64])
