"""Plans of the sub-block order: a mat-vec / mat-mat whose float operations are defined per
q8_1 block of 32 values, so that 1 and 16 columns do the same float work (``hiraishin/kernels/mmq``).

For one output (row r, column j) of an (N, K) Q4_K or Q6_K weight against q8_1 activations::

    NB   = K / 256                               # super-blocks per row
    NSEG = min(NB, SUBBLOCK_MAX_SEGMENTS)        # from K alone
    segment s = super-blocks [s*NB // NSEG, (s+1)*NB // NSEG)
    seg[s] = 0; for each q8_1 block b of segment s, in k order: seg[s] = step(seg[s], b)
    out = seg[0]; for s in 1 .. NSEG-1: out = out + seg[s]           (__fadd_rn, in s order)

``step`` (C = the exact integer dot product of the block, however computed):

* Q4_K, sub-block b of super-block i (scale sc, min m, 6-bit; d, dmin fp16)::

      acc = fmaf((d*sc) * dx_b, float(C_b), acc)    # d*sc exact in float; one rounded mul
      acc = fmaf(-(dmin*m), sx_b, acc)              # dmin*m exact in float

  with ``dx_b``, ``sx_b`` the q8_1 block's fp16 ``d`` and ``s`` (llama.cpp's layout).
* Q6_K, q8_1 block b = 16-value sub-blocks 2b, 2b+1 of super-block i::

      C_b = sc[2b] * sum_{l<16} (q_l - 32) qx_l + sc[2b+1] * sum_{16<=l<32} (q_l - 32) qx_l  (int, |C_b| < 2^24)
      acc = fmaf(d * dx_b, float(C_b), acc)

Nothing here depends on the number of columns: the kernel choice, columns per CUDA block and
warps per CUDA block are launch facts that change no bit.

This module is pure Python (no kernels, no backends).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import PlanError
from ..switches import env_flag, env_int, whole_number

__all__ = [
    "ENV_MMQ_TUNING",
    "ENV_SUBBLOCK_DP4A",
    "ENV_SUBBLOCK_DP4A_COLS",
    "ENV_SUBBLOCK_DP4A_COLS_MIN_ROWS",
    "ENV_SUBBLOCK_DP4A_NWARPS",
    "SUBBLOCK_DP4A",
    "SUBBLOCK_DP4A_COLS",
    "SUBBLOCK_DP4A_COLS_MIN_ROWS",
    "SUBBLOCK_DP4A_DEFAULT",
    "SUBBLOCK_DP4A_LEVELS",
    "SUBBLOCK_DP4A_MAX_COLS",
    "SUBBLOCK_DP4A_NB",
    "SUBBLOCK_DP4A_NWARPS",
    "SUBBLOCK_FEW_COLS_TUNING",
    "SUBBLOCK_FEW_ROWS",
    "SUBBLOCK_MAX_COLS_PER_BLOCK",
    "SUBBLOCK_MAX_SEGMENTS",
    "SUBBLOCK_NTILE_COLS",
    "SUBBLOCK_NWARPS",
    "SUBBLOCK_QK",
    "SUBBLOCK_QTYPES",
    "SUBBLOCK_TILE_ROWS",
    "SUBBLOCK_WIDE_COLS_TUNING",
    "SubBlockPlan",
    "subblock_plan",
    "subblock_segments",
    "tuning_key",
]

SUBBLOCK_QTYPES = ("Q4_K", "Q6_K")
SUBBLOCK_QK = 256  # values per super-block (QK_K)
# At most 16 K-segments per row: with K = 4096 (16 super-blocks) every segment is one super-block,
# so the smallest Qwen3-8B projection (4096 -> 1024, 64 tiles of 16 rows) still runs 1024 warps
# (~8 per SM on 132 SMs) with one DRAM round trip each; K = 12288 gets 3 super-blocks per segment.
SUBBLOCK_MAX_SEGMENTS = 16
SUBBLOCK_TILE_ROWS = 16  # rows per warp tile: the M of mma.m16n8k32 / m16n8k16
SUBBLOCK_NTILE_COLS = 8  # columns per MMA n-tile: the N of m16n8k*
SUBBLOCK_MAX_COLS_PER_BLOCK = 16  # two n-tiles per CUDA block; wider widths use more CUDA blocks
# Warps per CUDA block: a launch fact (no bit changes; tests/test_mmq_gpu.py). H200 sweeps
# (bench/bench_mmq.py --sweep; bench/results/2026-12-01-h200-mmq/): one column, 16 warps (one
# segment each) for rows <= SUBBLOCK_FEW_ROWS (attn_q 8.0 vs 8.3/10.4 us at 8/4 warps; attn_k 5.2
# vs 6.1/8.0; ffn_down 22.4 vs 25.1/37.9), 4 for more rows (ffn_up 14.9 vs 15.6/16.3; output head
# 192 vs 196/225). Several columns: 8 (Q4_K; attn_q 16 columns 13.8 us, ffn_up 35.2), Q6_K 8 for
# rows <= SUBBLOCK_FEW_ROWS (ffn_down 16 columns 38.9) and 4 beyond (output head 433 vs 465).
SUBBLOCK_FEW_ROWS = 4096
SUBBLOCK_NWARPS = {  # (kernel, qtype, rows <= SUBBLOCK_FEW_ROWS) -> warps per CUDA block
    ("onecol", "Q4_K", True): 16, ("onecol", "Q4_K", False): 4,
    ("onecol", "Q6_K", True): 16, ("onecol", "Q6_K", False): 4,
    ("mma", "Q4_K", True): 8, ("mma", "Q4_K", False): 8,
    ("mma", "Q6_K", True): 8, ("mma", "Q6_K", False): 4,
}

# Warps per CUDA block of "mma" launches of at most SUBBLOCK_NTILE_COLS columns (one n-tile: the
# verify passes of a speculative cycle), overriding SUBBLOCK_NWARPS when set: a launch fact for A/B
# runs (HIRAISHIN_SUBBLOCK_MMA_NWARPS=16: one K-segment per warp, as the one-column kernel; 0 or unset:
# the table). Read once; tests/test_mmq_gpu.py checks every warp count against the emulator.
ENV_MMA_NWARPS = "HIRAISHIN_SUBBLOCK_MMA_NWARPS"
SUBBLOCK_MMA_FEW_COLS_NWARPS = os.environ.get(ENV_MMA_NWARPS, "").strip()


# Launch facts of the launches of at most SUBBLOCK_NTILE_COLS columns (the verify passes of a
# speculative cycle) per weight shape, over SUBBLOCK_NWARPS and the register / prefetch tables of
# hiraishin.kernels.mmq.launch: "<qtype>/<few|many>/<k>" ("few": rows <= SUBBLOCK_FEW_ROWS) ->
# warps per CUDA block, register cap, activation prefetch. No bit changes (tests/test_mmq_gpu.py).
# H200 sweep at 2 and 4 columns (bench/tune_mmq.py; bench/results/2026-12-02-h200-session8/b-tune-bench):
# Q4_K K=4096 rows <= 4096 (Q, K, V, O) 8.7/9.3 -> 8.2/8.9 us (attn_k 6.1/6.2 -> 5.1/5.4); the Q6_K
# output head 240/261 -> 210/233; Q4_K ffn_down 16.9/18.5 -> 15.8/17.8; whole SUBBLOCK passes of the
# 8B, same logits digests: 3.465 -> 3.385 ms at 2 tokens, 3.718 -> 3.654 at 3, 4.108 -> 4.021 at 5.
# Gate/up (Q4_K, 12288 rows) at 4 warps and 80 registers, 17.3/19.1 -> 16.8/18.5 us (below the sweep's
# 3% bar), timed in whole passes on its own (c-gateup-prefetch-next): 3.401 -> 3.372 ms at 2 tokens,
# 3.646 -> 3.606 at 3, 4.027 -> 4.004 at 5, same digests: kept.
SUBBLOCK_FEW_COLS_TUNING = {
    "Q4_K/few/4096": {"nwarps": 16, "max_regs": 64, "prefetch_x": 0},
    "Q4_K/many/4096": {"nwarps": 4, "max_regs": 80, "prefetch_x": 0},
    "Q6_K/many/4096": {"nwarps": 8, "max_regs": 64, "prefetch_x": 0},
    "Q4_K/few/12288": {"nwarps": 16, "max_regs": 64, "prefetch_x": 1},
    # attn_v in the Q6_K layers (e-ablate-matvecs-tune-v): 8.8/8.9 -> 6.8/6.9 us; whole passes 3.370 ->
    # 3.331 ms at 2 tokens, 3.615 -> 3.574 at 3, 3.980 -> 3.947 at 5, same digests
    "Q6_K/few/4096": {"nwarps": 16, "max_regs": 128, "prefetch_x": 1},
}
# Launch facts of the launches of 9..16 columns (a verify pass of k + 1 > 8 tokens) per weight shape, keyed
# "<qtype>/<few|many>/<k>/wide": as above, plus "cols_per_block": 16 (one CUDA block per row tile, two
# n-tiles; 9 columns do the float work of 16) or 8 (two CUDA blocks per row tile, one n-tile each, next
# to each other along blockIdx.x so that both read the tile while it is in L2: SubBlockPlan.interleave),
# and "warp_split": 2 (16 columns per CUDA block, each warp one n-tile of them: two warps per K-segment
# read the same weight rows, the second from L1, instead of one warp holding both n-tiles in registers).
# Empty: every wide launch is the two-n-tile block of SUBBLOCK_NWARPS and launch.py's register table. H200
# (bench/results/2026-12-03-h200-session10/a-tune-wide): the sweep at 9 and 16 columns kept two one-tile
# blocks for the 4096-row Q4_K and Q6_K shapes (attn Q/K/V/O, isolated launches faster), but whole SUBBLOCK
# passes of the 8B with them, same digests, were slower: 4.335 -> 4.657 ms at 9 tokens, 4.574 -> 4.867 at
# 12, 5.055 -> 5.346 at 16 (the 0.6B unchanged). So none is kept. The warp split (bench/tuning/split-wide.json
# for every wide launch) was 30% slower in whole passes (bench/results/2026-12-03-h200-session11/
# a-warp-split-matvec: 4.327 -> 5.611 ms at 9 tokens): kept as a tested launch fact for the sweeps. The output head
# alone as two one-tile blocks (bench/tuning/head-interleave.json) was 3% slower at 9 and 16 tokens (session 16).
SUBBLOCK_WIDE_COLS_TUNING: dict = {}
# Rows per CUDA block of the several-column launches: 16 (one row tile per warp) or 32 (two, mmq.cu HX_MT:
# each super-block's activations, loaded once per warp, serve both; L1 was the busiest unit of the 9-16-column
# launches). Launches of at least HIRAISHIN_MMQ_MTILES columns take 32 rows (0 or unset: none). A launch fact:
# no bit changes (tests/test_mmq.py, tests/test_mmq_gpu.py). Measured slower, so off: ptxas needs 222 registers
# for a two-n-tile warp (one 8-warp CUDA block per SM instead of two), and the H200's SUBBLOCK passes of the 8B,
# same digests (bench/results/2026-12-04-h200-session16/b-two-row-tiles), went 3.894 -> 4.520 ms at 9 tokens and
# 4.085 -> 4.744 at 16 (=9), 3.006 -> 3.475 at 3 (=2): fewer activation loads did not make up for the occupancy.
# One column on dp4a, one warp per weight row (kernels/mmq/onecol_dp4a.cu), in place of the MMA kernel's one-column
# form (16 rows a warp): the same float operations in the same order, each K-segment's chain run by two lanes in
# turn. For rows of a multiple of SUBBLOCK_DP4A_NB super-blocks (the Qwen3-8B's K = 4096 and 12288: 16 segments of
# whole super-blocks, two lanes each). The MMA form fills few CUDA blocks on short projections (the 8B's attn_k, 1,024
# rows: 64 CUDA blocks on 132 SMs; H200, bench/results/2026-12-03-h200-session12: 1.27x BATCH_VARIANT's one-column
# mat-vec, ffn_down 1.08x, the output head 1.05x); the dp4a form runs a warp per row like llama.cpp's mat-vec.
# A launch fact, no bit changes (tests/test_mmq_dp4a.py). HIRAISHIN_SUBBLOCK_DP4A (read once, at import): 0 off;
# 1 (default) rows of exactly SUBBLOCK_DP4A_NB super-blocks (K = 4096: one super-block a lane, 64 registers); 2
# every row of a multiple of it (also K = 12288: three a lane, 128 registers). H100, session 28, same digests
# (bench/results/2026-12-06-h100-session28): the 8B's SUBBLOCK one-token pass 2.747 -> 2.685 ms at 2, passes of
# 3 tokens unchanged; isolated one-column launches x BATCH_VARIANT's mat-vec, MMA -> dp4a: attn_q 1.05 -> 1.12,
# attn_k 1.28 -> 1.12, ffn_up 1.04 -> 1.02, ffn_down (K = 12288) 1.02 -> 1.16, output head 1.18 -> 1.00 (in a
# pass the dp4a form also loads its weights before the PDL wait). Level 1 (ffn_down back on MMA) against 2, H100,
# session 29 (bench/results/2026-12-06-h100-session29), same digests: the 8B's one-token pass 2.708 -> 2.602 ms, the
# 0.6B's 0.750 -> 0.744. Default 1.
ENV_SUBBLOCK_DP4A = "HIRAISHIN_SUBBLOCK_DP4A"
SUBBLOCK_DP4A_LEVELS = (0, 1, 2)
SUBBLOCK_DP4A_DEFAULT = 1


def _dp4a_from_env() -> int:
    return env_int(ENV_SUBBLOCK_DP4A, SUBBLOCK_DP4A_LEVELS, SUBBLOCK_DP4A_DEFAULT, "the dp4a one-column level")


SUBBLOCK_DP4A = _dp4a_from_env()
# Launches of up to HIRAISHIN_SUBBLOCK_DP4A_COLS columns (default 1: one column only; at most SUBBLOCK_DP4A_MAX_COLS)
# on the dp4a kernel too, for the shapes HIRAISHIN_SUBBLOCK_DP4A puts there: a lane's weights loaded once serve every
# column, each column summed as the one column is (the same bits at every width); rows of 16 super-blocks only
# (K = 4096: one half a lane; at K = 12288 ptxas needs 226-255 registers for 2-4 columns). For the verify passes of 2-4
# tokens, where the MMA form costs more than its one column (H100, session 28, isolated launches x BATCH_VARIANT's
# one column at 3 columns: the output head 1.25, attn_k 1.25, gate/up 1.14; dp4a one column: 1.00 / 1.12 / 1.02).
# Slower, so off: H100, session 29, SUBBLOCK replays, same digests, HIRAISHIN_SUBBLOCK_DP4A_COLS 1 -> 2 -> 3 -> 4, the
# 8B 2.995 -> 3.164 ms at 2 tokens, 3.104 -> 3.695 at 3 (from 3 columns), 3.156 -> 4.247 at 4 (4): the columns
# ran one after another in a lane, each waiting for its own activations and chain. Rebuilt with the columns sharing
# each phase (onecol_dp4a.cu hx_dp4a_cols), session 30: the same (2.897 -> 3.074 at 2, 3.027 -> 3.624 at 3, 3.099 ->
# 4.237 at 4); with launch.py's shared copy of the activations and 8 rows a CUDA block: 2.895 -> 2.950 at 2, 3.027 ->
# 3.409 at 3. Off.
ENV_SUBBLOCK_DP4A_COLS = "HIRAISHIN_SUBBLOCK_DP4A_COLS"
SUBBLOCK_DP4A_MAX_COLS = 4  # each column's x (32 ints a lane) and operands come and go; more would crowd registers


def _dp4a_cols_from_env() -> int:
    return env_int(ENV_SUBBLOCK_DP4A_COLS, range(1, SUBBLOCK_DP4A_MAX_COLS + 1), 1, "the dp4a kernel's most columns")


SUBBLOCK_DP4A_COLS = _dp4a_cols_from_env()
# ... and only for weights of at least this many rows (0: every weight). The output head (151,936 rows) streams 510 MB
# at any width, so its 2-4 columns' extra instructions (~150 a row and column, session 30's PTX) fit under the stream,
# where a layer's short launches run out of issue slots; HIRAISHIN_SUBBLOCK_DP4A_COLS_MIN_ROWS=65536 asks for the head
# alone, for the A/B. A launch fact: no bit changes.
ENV_SUBBLOCK_DP4A_COLS_MIN_ROWS = "HIRAISHIN_SUBBLOCK_DP4A_COLS_MIN_ROWS"
SUBBLOCK_DP4A_COLS_MIN_ROWS = env_int(ENV_SUBBLOCK_DP4A_COLS_MIN_ROWS, range(0, 1 << 24), 0,
                                      "the fewest rows of a weight whose 2-4 columns go to dp4a")
SUBBLOCK_DP4A_NB = 16  # super-blocks per row must be a multiple of this (16 segments x 2 lanes = 32 lanes)
# ... or, under HIRAISHIN_SUBBLOCK_DP4A_SHORT=1, rows of 1, 2, 4 or 8 super-blocks (the 0.6B draft's K = 1024 and 2048;
# SUBBLOCK_DP4A_NB / nb rows a warp, each on 2 nb lanes: one segment of one super-block per lane pair, as the order asks
# of rows that short). For the draft under SUBBLOCK, whose one-column MMA form puts 16 rows in a warp and fills few CUDA
# blocks on the 0.6B's projections (its one-token pass 0.70 ms against BATCH_INVARIANT's 0.61, H100, session 31). A
# launch fact, no bit changes (tests/test_mmq_dp4a_short.py); CPU-tested, not yet timed: off.
ENV_SUBBLOCK_DP4A_SHORT = "HIRAISHIN_SUBBLOCK_DP4A_SHORT"
SUBBLOCK_DP4A_SHORT = env_flag(ENV_SUBBLOCK_DP4A_SHORT, False, "the dp4a kernel for short rows")
# Rows (warps) per CUDA block: 8. With launch.py's HX_XSTAGE a block's copy of the activations serves them all, so more
# rows a block copy less (H100, session 30, the shared copy on, SUBBLOCK replays, same digests: the 8B's one-token
# pass 2.517 -> 2.480 ms from 4 rows, llama.cpp's one-column mat-vec's 4 warps, to 8; 2.469 -> 2.488 from 8 to 16).
# HIRAISHIN_SUBBLOCK_DP4A_NWARPS for an A/B; a launch fact only.
ENV_SUBBLOCK_DP4A_NWARPS = "HIRAISHIN_SUBBLOCK_DP4A_NWARPS"
SUBBLOCK_DP4A_NWARPS = env_int(ENV_SUBBLOCK_DP4A_NWARPS, (2, 4, 8, 16), 8, "the dp4a kernel's rows per CUDA block")
ENV_MMQ_MTILES = "HIRAISHIN_MMQ_MTILES"
SUBBLOCK_MTILES_MIN_COLS = env_int(ENV_MMQ_MTILES, range(0, SUBBLOCK_MAX_COLS_PER_BLOCK + 1), 0,
                                   "the fewest columns of a launch with two row tiles a warp (0: none)")
WIDE_SUFFIX = "/wide"
# A tuning file replacing both tables, for A/B runs of a launch sweep (bench/tune_mmq.py writes one):
# JSON of the same form; "none": no entries (SUBBLOCK_NWARPS and launch.py's tables alone). Read once.
ENV_MMQ_TUNING = "HIRAISHIN_MMQ_TUNING"
_TUNING_FIELDS = {"nwarps", "max_regs", "prefetch_x"}


def _read_tuning(path: str) -> dict:
    """The tuning table ``path`` names ("": :data:`SUBBLOCK_FEW_COLS_TUNING` and
    :data:`SUBBLOCK_WIDE_COLS_TUNING`; "none": empty)."""
    if not path:
        return {**SUBBLOCK_FEW_COLS_TUNING, **SUBBLOCK_WIDE_COLS_TUNING}
    if path == "none":
        return {}
    import json

    try:
        table = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as e:
        raise PlanError(f"${ENV_MMQ_TUNING}={path!r}: cannot read a JSON tuning table ({e})") from e
    if not isinstance(table, dict):
        raise PlanError(f"${ENV_MMQ_TUNING}={path!r}: expected a JSON object, got {type(table).__name__}")
    for key, entry in table.items():
        wide = isinstance(key, str) and key.endswith(WIDE_SUFFIX)
        fields = _TUNING_FIELDS | ({"cols_per_block", "warp_split"} if wide else set())
        ok = (isinstance(entry, dict) and set(entry) <= fields
              and all(isinstance(v, int) and not isinstance(v, bool) for v in entry.values())
              and 1 <= entry.get("nwarps", 1) <= 16 and entry.get("prefetch_x", 0) in (0, 1)
              and entry.get("cols_per_block", SUBBLOCK_MAX_COLS_PER_BLOCK) in (SUBBLOCK_NTILE_COLS,
                                                                              SUBBLOCK_MAX_COLS_PER_BLOCK)
              # two warps per K-segment: 16 columns per CUDA block, an even number of warps
              and (entry.get("warp_split", 1) == 1
                   or (entry.get("warp_split") == 2 and entry.get("cols_per_block", 16) == 16
                       and entry.get("nwarps", 2) % 2 == 0)))
        if not ok or key.count("/") != 2 + wide:
            raise PlanError(f"${ENV_MMQ_TUNING}={path!r}: bad entry {key!r}: {entry!r} (want "
                            '"<qtype>/<few|many>/<k>": {"nwarps": 1..16, "max_regs": int, "prefetch_x": 0|1}, or '
                            '"<qtype>/<few|many>/<k>/wide": the same, "cols_per_block": 8|16 and "warp_split": 1|2 '
                            '(2: 16 columns, an even number of warps))')
    return table


SUBBLOCK_MMA_TUNING = _read_tuning(os.environ.get(ENV_MMQ_TUNING, "").strip())


def tuning_key(qtype: str, n: int | None, k: int, ncols: int = SUBBLOCK_NTILE_COLS) -> str:
    """The key of a (``n``, ``k``) ``qtype`` weight in a tuning file, for launches of ``ncols`` columns
    (2..8, or 9..16: a "/wide" key)."""
    few = n is None or n <= SUBBLOCK_FEW_ROWS
    return f"{qtype}/{'few' if few else 'many'}/{k}" + (WIDE_SUFFIX if ncols > SUBBLOCK_NTILE_COLS else "")


def _mma_few_cols_nwarps() -> int | None:
    text = SUBBLOCK_MMA_FEW_COLS_NWARPS
    if text in ("", "0"):
        return None
    n = whole_number(text)
    if n is None or not 1 <= n <= 16:
        raise PlanError(f"${ENV_MMA_NWARPS} must be a warp count in 1..16 (or 0: the table), got {text!r}")
    return n


def subblock_segments(k: int) -> int:
    """NSEG of rows of ``k`` values (the only geometry that changes bits)."""
    return min(k // SUBBLOCK_QK, SUBBLOCK_MAX_SEGMENTS)


@dataclass(frozen=True)
class SubBlockPlan:
    """One launch of the sub-block order for ``ncols`` columns of a (N, ``k``) ``qtype`` weight.

    ``nseg`` is the order (from ``k`` only); ``kernel`` ("onecol": the MMA kernel specialised to
    one column, float work only for the column that exists; "dp4a": one column (up to
    :data:`SUBBLOCK_DP4A_COLS`) on dp4a, a warp per row, :data:`ENV_SUBBLOCK_DP4A`; "mma": up to 16 columns per CUDA block), ``cols_per_block`` and ``nwarps``
    are launch facts that change no bit, as are ``max_regs`` and ``prefetch_x`` (None:
    ``hiraishin.kernels.mmq.launch``'s tables decide; set by the tuning tables, :data:`SUBBLOCK_FEW_COLS_TUNING`, :data:`SUBBLOCK_WIDE_COLS_TUNING` or
    :data:`ENV_MMQ_TUNING`), ``interleave``: the column groups of ``cols_per_block`` whose CUDA
    blocks of one row tile sit next to each other along ``blockIdx.x`` (1: column groups along
    ``blockIdx.y``), so that the second reads the tile's weights from L2, and ``warp_split``: the
    column groups a CUDA block's warps split into (2: each warp one n-tile of 16 columns); ``tile_rows``:
    rows per CUDA block, 16 or 32 (two row tiles per warp: :data:`ENV_MMQ_MTILES`; "dp4a": one row per warp).
    """

    qtype: str
    ncols: int
    k: int
    nseg: int
    kernel: str
    tile_rows: int
    cols_per_block: int
    nwarps: int
    max_regs: int | None = None
    prefetch_x: int | None = None
    interleave: int = 1
    warp_split: int = 1

    @property
    def nblocks(self) -> int:
        """Super-blocks per row."""
        return self.k // SUBBLOCK_QK

    def segment_bounds(self) -> list[tuple[int, int]]:
        """[first, end) super-block of each segment."""
        nb, ns = self.nblocks, self.nseg
        return [(s * nb // ns, (s + 1) * nb // ns) for s in range(ns)]

    def describe(self) -> str:
        sizes = sorted({b - a for a, b in self.segment_bounds()})
        step = ("acc = fmaf((d*sc)*dx, float(C), acc); acc = fmaf(-(dmin*m), sx, acc)"
                if self.qtype == "Q4_K" else
                "C = sc[2b]*C_lo + sc[2b+1]*C_hi (int); acc = fmaf(d*dx, float(C), acc)")
        return (f"sub-block order, {self.qtype}, K={self.k}: each row in {self.nseg} K-segments of "
                f"{'/'.join(map(str, sizes))} super-block(s); per q8_1 block of 32 values in k order: "
                f"{step}; segments added in order 0..{self.nseg - 1}. Same float operations at every "
                f"width. Launch ({self.ncols} column(s)): {self.kernel} kernel, {self.tile_rows} rows x "
                f"{self.cols_per_block} columns per CUDA block, {self.nwarps} warps"
                + (f", {self.interleave} column groups per row tile side by side" if self.interleave > 1 else "")
                + (f", its warps split over {self.warp_split} column groups" if self.warp_split > 1 else "") + ".")


def subblock_plan(ncols: int, qtype: str, k: int, device=None, n: int | None = None) -> SubBlockPlan:
    """The :class:`SubBlockPlan` for ``ncols`` >= 1 columns of ``qtype`` rows of ``k`` values.

    ``n`` (the weight's rows, optional) picks the warps per CUDA block, a launch fact; the order
    (``nseg``) depends on ``k`` only. ``device`` is accepted for symmetry with the other plan
    functions; nothing here depends on it.
    Raises :class:`PlanError` on a type the order does not cover, ``k`` not a positive multiple
    of 256, ``ncols`` < 1 or ``n`` < 1.
    """
    if qtype not in SUBBLOCK_QTYPES:
        raise PlanError(f"sub-block order covers {list(SUBBLOCK_QTYPES)}, got {qtype!r}")
    if not isinstance(k, int) or k <= 0 or k % SUBBLOCK_QK:
        raise PlanError(f"sub-block order: K={k!r} must be a positive multiple of {SUBBLOCK_QK}")
    if not isinstance(ncols, int) or ncols < 1:
        raise PlanError(f"sub-block order: ncols={ncols!r} must be >= 1")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise PlanError(f"sub-block order: n={n!r} rows must be >= 1")
    nseg = subblock_segments(k)
    cols = SUBBLOCK_NTILE_COLS if ncols <= SUBBLOCK_NTILE_COLS else SUBBLOCK_MAX_COLS_PER_BLOCK
    kernel = "onecol" if ncols == 1 else "mma"
    nb = k // SUBBLOCK_QK
    dp4a_rows = nb % SUBBLOCK_DP4A_NB == 0 and (SUBBLOCK_DP4A == 2 or (SUBBLOCK_DP4A == 1 and nb == SUBBLOCK_DP4A_NB))
    # several columns for rows of one half a lane only (ptxas: three halves and two columns take 226+ registers)
    tall = SUBBLOCK_DP4A_COLS_MIN_ROWS == 0 or (n is not None and n >= SUBBLOCK_DP4A_COLS_MIN_ROWS)
    if dp4a_rows and (ncols == 1 or (ncols <= SUBBLOCK_DP4A_COLS and nb == SUBBLOCK_DP4A_NB and tall)):
        return SubBlockPlan(qtype=qtype, ncols=ncols, k=k, nseg=nseg, kernel="dp4a", tile_rows=SUBBLOCK_DP4A_NWARPS,
                            cols_per_block=ncols, nwarps=SUBBLOCK_DP4A_NWARPS)
    if SUBBLOCK_DP4A_SHORT and ncols == 1 and nb < SUBBLOCK_DP4A_NB and SUBBLOCK_DP4A_NB % nb == 0:
        # short rows: SUBBLOCK_DP4A_NB // nb rows a warp (onecol_dp4a.cu HX_RPW), tile_rows the CUDA block's rows
        return SubBlockPlan(qtype=qtype, ncols=1, k=k, nseg=nseg, kernel="dp4a",
                            tile_rows=SUBBLOCK_DP4A_NWARPS * (SUBBLOCK_DP4A_NB // nb), cols_per_block=1,
                            nwarps=SUBBLOCK_DP4A_NWARPS)
    nwarps = SUBBLOCK_NWARPS[(kernel, qtype, n is None or n <= SUBBLOCK_FEW_ROWS)]
    tuned, interleave = {}, 1
    if kernel == "mma" and ncols <= SUBBLOCK_MAX_COLS_PER_BLOCK:  # verify widths: the tuning tables
        tuned = SUBBLOCK_MMA_TUNING.get(tuning_key(qtype, n, k, ncols), {})
        # the A/B switch of 2..8 columns wins over the table (its warps with the table's cap would be a third setting)
        forced = _mma_few_cols_nwarps() if ncols <= SUBBLOCK_NTILE_COLS else None
        if forced:
            nwarps, tuned = forced, {}
        else:
            nwarps = tuned.get("nwarps", nwarps)
        cols = tuned.get("cols_per_block", cols)  # ("/wide" entries only)
        interleave = -(-ncols // cols)
    split = tuned.get("warp_split", 1)  # ("/wide" entries only): warps per K-segment
    two_tiles = kernel == "mma" and split == 1 and 0 < SUBBLOCK_MTILES_MIN_COLS <= ncols
    return SubBlockPlan(qtype=qtype, ncols=ncols, k=k, nseg=nseg, kernel=kernel,
                        tile_rows=SUBBLOCK_TILE_ROWS * (2 if two_tiles else 1), cols_per_block=cols, nwarps=min(nseg * split, nwarps),
                        max_regs=tuned.get("max_regs"), prefetch_x=tuned.get("prefetch_x"), interleave=interleave,
                        warp_split=split)
