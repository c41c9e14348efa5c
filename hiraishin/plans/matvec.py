"""Mat-vec plans: which thread of the dp4a mat-vec sums which weight blocks, for a given order.

The geometry is llama.cpp's ``mul_mat_vec_q`` (reference sections 4.1-4.4,
``ggml/src/ggml-cuda/mmvq.cu`` and ``vecdotq.cuh``). For one output (row r, column j)::

    tpb = threads per weight block (Q4_K 16, Q6_K 32, Q8_0 4)
    bpi = 32 * nwarps / tpb                       # weight blocks per iteration
    thread tid: acc = 0; for kbx = tid // tpb, += bpi: acc = step(acc, block kbx, ints of tid % tpb)
    s[L] = acc[L] + acc[32 + L] + ... + acc[32*(nwarps-1) + L]   (warp order, lane by lane)
    s = xor butterfly over the 32 lanes (16, 8, 4, 2, 1); out = s[lane 0]

Only ``nwarps`` changes a result: rows per CUDA block and columns per launch decide which
outputs share a CUDA block, not how any one output is summed. That is why llama.cpp's table
(4 warps for 1-4 columns, 2 for 5-8) makes a token's logits depend on how many tokens share the
batch, and why giving every column the one-column geometry fixes it.

:func:`matvec_plan` (order, ncols, qtype, device) -> :class:`MatVecPlan`:

* ``variant`` (stock llama.cpp): nwarps from the device's table keyed by the column count, 2 rows
  per CUDA block for several columns (llama.cpp's) and the invariant policy's rows for one (no bit
  changes: llama.cpp's 1 row was slower); past ``MMVQ_MAX_BATCH_SIZE`` = 8 columns llama.cpp's MMQ
  order (:class:`~hiraishin.plans.mmq_stock.MMQStockPlan`, int8 tensor cores) for Q4_K/Q6_K and
  the tiled kernel for Q8_0.
* ``invariant``: every column gets the one-column nwarps; any batch stays on the mat-vec
  kernel, in launches of at most ``order.max_cols_per_launch`` (one Q4_K column runs 2 rows per
  CUDA block, short rows more: measured faster, same bits).
* ``custom``: ``order.nwarps`` / ``order.rows_per_block`` as given.

Valid mat-vec geometry (else :class:`PlanError`): 1 <= nwarps <= 16 (at most 512 threads;
llama.cpp uses 1..8), 1 <= rows_per_block <= 8, 1 <= cols_per_launch <= 16, rows_per_block *
cols_per_launch <= 32 (accumulators per thread stay in registers), and the shared-memory
hand-over ``(nwarps-1) * cols * rows * 128`` bytes <= 48 KiB. Any nwarps divides the work: every
type has a power-of-two number of threads per block that divides 32, so blocks per iteration is
an integer; threads whose first block is past the row's end add nothing (llama.cpp's
``small_k`` case).

The tiled kernel (``kernel="tiled"``, the variant order's Q8_0 path past 8 columns) has one fixed tile:
``TILE_ROWS`` rows x ``TILE_COLS`` columns per CUDA block of ``TILE_THREADS`` threads, one
thread per output walking K in order (``hiraishin/kernels/tiled``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..devices import DeviceProfile, get_profile
from ..errors import PlanError
from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID
from .mmq_stock import MMQ_STOCK_QTYPES, MMQStockPlan, mmq_stock_plan

__all__ = [
    "MMVQ_MAX_BATCH_SIZE",
    "NWARPS_GENERIC",
    "NWARPS_TURING",
    "NWARPS_GCN",
    "MATVEC_TRAITS",
    "MatVecTraits",
    "matvec_traits",
    "MatVecPlan",
    "matvec_plan",
    "TILE_ROWS",
    "TILE_COLS",
    "TILE_COLS_PER_THREAD",
    "TILE_THREADS",
]

# ggml/src/ggml-cuda/mmvq.cuh: batches wider than this never use the mat-vec kernel.
MMVQ_MAX_BATCH_SIZE = 8

# nwarps by column count 1..8 (index ncols-1), ggml/src/ggml-cuda/mmvq.cu calc_nwarps
# (reference section 4.2). GENERIC: Pascal .. Hopper and consumer Blackwell.
NWARPS_GENERIC = (4, 4, 4, 4, 2, 2, 2, 2)
# TURING (cc 7.5): like GENERIC except 2 warps at one column for Q2_K..Q6_K.
NWARPS_TURING = NWARPS_GENERIC
NWARPS_TURING_KQUANT_ONE_COL = 2
# GCN/CDNA.
NWARPS_GCN = (2, 2, 2, 2, 1, 1, 1, 1)
_NWARPS_TABLES = {"GENERIC": NWARPS_GENERIC, "TURING": NWARPS_TURING, "GCN": NWARPS_GCN,
                  # GB10 is GENERIC except an 8-warp case that needs llama.cpp's halve_iters,
                  # which we do not model.
                  "GB10": NWARPS_GENERIC}

# Limits of our kernel (see the module docstring).
MAX_NWARPS = 16
MAX_ROWS_PER_BLOCK = 8
MAX_COLS_PER_LAUNCH = 16
MAX_ACCUMULATORS = 32
MAX_SHARED_BYTES = 48 * 1024

# The tiled kernel's one tile (hiraishin/kernels/tiled/mmq_tiled.cu gets these as #defines):
TILE_ROWS = 32  # rows per CUDA block (threadIdx.x)
TILE_COLS_PER_THREAD = 4
TILE_COLS = 16  # columns per CUDA block: 4 groups (threadIdx.y) of TILE_COLS_PER_THREAD
TILE_THREADS = TILE_ROWS * (TILE_COLS // TILE_COLS_PER_THREAD)  # 128


@dataclass(frozen=True)
class MatVecTraits:
    """How the mat-vec kernel splits one weight block of a type among threads.

    Block sizes and type ids come from :mod:`hiraishin.quant`; ``vdr`` and ``qi`` are the kernel's
    own (``VDR_*_MMVQ`` and ``QI*`` in llama.cpp's vecdotq.cuh / ggml-common.h, reference section 2).
    """

    qtype: str
    vdr: int  # VDR_MMVQ: ints of quant data per thread per call
    qi: int  # ints of quant data per block, as the dot product sees them
    block_word: str  # "super-block" or "block", for descriptions

    @property
    def qk(self) -> int:
        """Values per weight block."""
        return BLOCK_ELEMS[self.qtype]

    @property
    def block_bytes(self) -> int:
        return BLOCK_BYTES[self.qtype]

    @property
    def type_id(self) -> int:
        """ggml type id (HX_QTYPE in the CUDA sources)."""
        return GGML_TYPE_ID[self.qtype]

    @property
    def threads_per_block(self) -> int:
        """qi / vdr: how many threads share one weight block."""
        return self.qi // self.vdr


MATVEC_TRAITS = {
    "Q4_K": MatVecTraits("Q4_K", vdr=2, qi=32, block_word="super-block"),
    "Q6_K": MatVecTraits("Q6_K", vdr=1, qi=32, block_word="super-block"),
    "Q8_0": MatVecTraits("Q8_0", vdr=2, qi=8, block_word="block"),
}
_KQUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def matvec_traits(qtype: str) -> MatVecTraits:
    """The :class:`MatVecTraits` of a weight type; :class:`PlanError` for a type the mat-vec lacks."""
    try:
        return MATVEC_TRAITS[qtype]
    except (KeyError, TypeError):
        raise PlanError(f"mat-vec supports weight types {sorted(MATVEC_TRAITS)}, got {qtype!r}") from None


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class MatVecPlan:
    """Geometry of one mat-vec (or tiled mat-mat) call over ``ncols`` columns.

    ``kernel`` is ``"mmvq"`` (mat-vec) or ``"tiled"`` (wide batches). For the
    tiled kernel ``nwarps``/``rows_per_block`` are its fixed tile (4 warps, 32
    rows) and one launch takes every column.
    """

    kernel: str
    qtype: str
    nwarps: int
    rows_per_block: int
    cols_per_launch: int
    ncols: int

    def __post_init__(self):
        t = matvec_traits(self.qtype)
        if self.ncols < 1:
            raise PlanError(f"a mat-vec plan needs ncols >= 1, got {self.ncols}")
        if not 1 <= self.cols_per_launch <= self.ncols:
            raise PlanError(f"cols_per_launch must be in 1..ncols={self.ncols}, got {self.cols_per_launch}")
        if self.kernel == "tiled":
            if (self.nwarps, self.rows_per_block, self.cols_per_launch) != (
                    TILE_THREADS // 32, TILE_ROWS, self.ncols):
                raise PlanError(
                    f"the tiled kernel has a fixed tile ({TILE_THREADS // 32} warps, "
                    f"{TILE_ROWS} rows, all columns in one launch); got nwarps={self.nwarps}, "
                    f"rows_per_block={self.rows_per_block}, cols_per_launch={self.cols_per_launch}"
                )
            return
        if self.kernel != "mmvq":
            raise PlanError(f"kernel must be 'mmvq' or 'tiled', got {self.kernel!r}")
        if not 1 <= self.nwarps <= MAX_NWARPS:
            raise PlanError(f"{self.qtype} mat-vec: nwarps must be in 1..{MAX_NWARPS}, got {self.nwarps}")
        if not 1 <= self.rows_per_block <= MAX_ROWS_PER_BLOCK:
            raise PlanError(
                f"{self.qtype} mat-vec: rows_per_block must be in 1..{MAX_ROWS_PER_BLOCK}, got {self.rows_per_block}"
            )
        if self.cols_per_launch > MAX_COLS_PER_LAUNCH:
            raise PlanError(
                f"{self.qtype} mat-vec: at most {MAX_COLS_PER_LAUNCH} columns per launch, got {self.cols_per_launch}"
            )
        if self.rows_per_block * self.cols_per_launch > MAX_ACCUMULATORS:
            raise PlanError(
                f"{self.qtype} mat-vec: rows_per_block * cols_per_launch = "
                f"{self.rows_per_block} * {self.cols_per_launch} > {MAX_ACCUMULATORS} accumulators per thread"
            )
        if self.shared_bytes > MAX_SHARED_BYTES:
            raise PlanError(
                f"{self.qtype} mat-vec: the warp hand-over needs {self.shared_bytes} bytes of shared memory "
                f"(nwarps={self.nwarps}, cols={self.cols_per_launch}, rows={self.rows_per_block}), "
                f"more than {MAX_SHARED_BYTES}"
            )
        # Every type's threads-per-block divides 32, so this is exact for any nwarps.
        assert (32 * self.nwarps) % t.threads_per_block == 0

    # -- derived geometry

    @property
    def traits(self) -> MatVecTraits:
        return MATVEC_TRAITS[self.qtype]

    @property
    def threads(self) -> int:
        """Threads per CUDA block."""
        return 32 * self.nwarps

    @property
    def blocks_per_iter(self) -> int:
        """Weight blocks one iteration of the mat-vec's kbx loop covers (blocks_per_iter in mmvq.cu)."""
        return self.threads // self.traits.threads_per_block

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of one mat-vec launch (the warp hand-over)."""
        if self.kernel != "mmvq":
            return 0
        return (self.nwarps - 1) * self.cols_per_launch * self.rows_per_block * 32 * 4

    def launches(self) -> list[tuple[int, int]]:
        """(first column, number of columns) of each launch, in order."""
        out = []
        start = 0
        while start < self.ncols:
            count = min(self.cols_per_launch, self.ncols - start)
            out.append((start, count))
            start += count
        return out

    def thread_blocks(self, n_blocks: int) -> dict[int, list[int]]:
        """Which weight blocks each thread sums, in order: ``{tid: [kbx, ...]}``.

        For the mat-vec kernel, every thread of the CUDA block (tid = 32*warp +
        lane), including threads with nothing to do. For the tiled kernel one
        thread owns one output and walks every block: ``{0: [0, 1, ..., n-1]}``.
        """
        if n_blocks < 0:
            raise PlanError(f"n_blocks must be >= 0, got {n_blocks}")
        if self.kernel == "tiled":
            return {0: list(range(n_blocks))}
        tpb = self.traits.threads_per_block
        return {tid: list(range(tid // tpb, n_blocks, self.blocks_per_iter)) for tid in range(self.threads)}

    def describe(self) -> str:
        """The order of adds in words, for notebooks and reports."""
        t = self.traits
        bw = t.block_word
        if self.kernel == "tiled":
            inner = {
                "Q4_K": "inside each super-block the 8 sub-block products (32 values each) are summed in order, "
                        "scale and min terms separately, then added to the running total",
                "Q6_K": "inside each super-block the 16 sub-block products (16 values each) are summed in order, "
                        "then multiplied into the running total with one fma",
                "Q8_0": "each block's product (32 values) is added to the running total with one fma",
            }[self.qtype]
            return (
                f"{self.qtype}, tiled mat-mat (the wide-batch path), {self.ncols} columns in one launch: "
                f"one thread per output walks {bw}s 0, 1, 2, … in order; {inner}; no sum across threads. "
                f"Tiles of {TILE_ROWS} rows × {TILE_COLS} columns, "
                f"{TILE_THREADS} threads."
            )
        tpb = t.threads_per_block
        bpi = self.blocks_per_iter
        per_thread = t.qk // tpb
        warp_blocks = max(1, 32 // tpb)
        if warp_blocks == 1:
            warp0 = ", ".join(str(bpi * i) for i in range(3))
        else:
            warp0 = ", ".join(f"{bpi * i}–{bpi * i + warp_blocks - 1}" for i in range(3))
        if self.nwarps == 1:
            hand = "one warp, so no shared-memory hand-over"
        elif self.nwarps == 2:
            hand = "warp 0 then adds warp 1, lane by lane"
        else:
            hand = f"warp 0 then adds warps 1..{self.nwarps - 1} in order, lane by lane"
        launches = self.launches()
        if len(launches) == 1:
            cols = f"{self.ncols} column{'s' if self.ncols > 1 else ''} in one launch"
        else:
            cols = f"{self.ncols} columns in {len(launches)} launches of " + "+".join(str(c) for _, c in launches)
        return (
            f"{self.qtype}, {self.nwarps} warp{'s' if self.nwarps > 1 else ''} ({self.threads} threads): "
            f"{tpb} threads per {bw} ({per_thread} values each), {bpi} {bw}s per iteration; "
            f"thread t sums {bw}s t//{tpb}, t//{tpb} + {bpi}, t//{tpb} + {2 * bpi}, … "
            f"(warp 0 covers {warp0}, …); {hand}, then a 32-lane xor butterfly (16, 8, 4, 2, 1). "
            f"{self.rows_per_block} row{'s' if self.rows_per_block > 1 else ''} per CUDA block, {cols}."
        )


def _nwarps_from_table(profile: DeviceProfile, qtype: str, ncols: int) -> int:
    try:
        table = _NWARPS_TABLES[profile.mmvq_table]
    except KeyError:
        raise PlanError(
            f"device profile {profile.name!r} names mat-vec table {profile.mmvq_table!r}; "
            f"known: {sorted(_NWARPS_TABLES)}"
        ) from None
    if profile.mmvq_table == "TURING" and ncols == 1 and qtype in _KQUANTS:
        return NWARPS_TURING_KQUANT_ONE_COL
    return table[ncols - 1]


def _default_rows_per_block(cols_per_launch: int) -> int:
    # llama.cpp calc_rows_per_block (GENERIC/TURING/GCN): 1 row for one column, else 2.
    # (Its small_k case, rows = nwarps for short rows, is _small_k below.) MULTI_COL_ROWS: an A/B's
    # override (HIRAISHIN_ONE_COL_ROWS "multi=N"), capped at the accumulators a thread may hold.
    if cols_per_launch == 1:
        return 1
    if MULTI_COL_ROWS:
        return max(1, min(MULTI_COL_ROWS, MAX_ACCUMULATORS // cols_per_launch))
    return 2


def _blocks_per_step(qtype: str, nwarps: int) -> int:
    """Weight blocks one kbx step of ``nwarps`` warps covers (``vdr * nwarps * 32 / qi``)."""
    return 32 * nwarps // MATVEC_TRAITS[qtype].threads_per_block


def _small_k(qtype: str, nwarps: int, k: int | None) -> bool:
    """llama.cpp's ``small_k`` (mmvq.cu, PR #20635; one column only): more than one warp and fewer
    weight blocks per row than one kbx step covers (``blocks_per_row < nwarps * vdr * 32 / qi``),
    so some threads have nothing to sum. It then puts ``nwarps`` rows in a CUDA block, which
    changes no per-row arithmetic. Example: Qwen3-0.6B's K = 1024 Q4_K rows (4 < 8 super-blocks).
    ``k`` None (row length unknown): False."""
    return k is not None and nwarps > 1 and k // MATVEC_TRAITS[qtype].qk < _blocks_per_step(qtype, nwarps)


# Short rows (one column, every policy): where every thread sums at most ONE weight block of a row
# (blocks per row <= blocks per kbx step, e.g. Qwen3-0.6B's K = 1024 Q6_K output, 4 super-blocks
# for 4 warps), a CUDA block of one row is all set-up and hand-over; this many rows per block
# share them (threads issue that many independent row loads). Rows per block change no bits.
# H200, one decode step of the synthetic 0.6B under Nsight Compute: the output head 184 -> 52 us
# with these and small_k together (bench/results/2026-12-01-h200-session3, kernel times a/ vs b/).
SHORT_ROW_ROWS = 4


def _one_col_rows(qtype: str, nwarps: int, k: int | None, n: int | None = None) -> int:
    """Rows per CUDA block of a one-column launch (every policy but ``custom`` with its own rows)."""
    if WIDE_ROWS and n is not None and n >= WIDE_N:
        return WIDE_ROWS
    if _small_k(qtype, nwarps, k):
        return SMALL_K_ROWS or nwarps
    if k is not None and k // MATVEC_TRAITS[qtype].qk <= _blocks_per_step(qtype, nwarps):
        return SHORT_ROW_ROWS
    if k is not None and k >= LONG_ROW_K:
        return LONG_ROW_ROWS.get(qtype, INVARIANT_ONE_COL_ROWS.get(qtype, 1))
    return INVARIANT_ONE_COL_ROWS.get(qtype, 1)


# Rows per CUDA block for ONE column under every policy, where it differs from llama.cpp's 1 (rows
# per block change no output bits). Measured on an H200
# (bench/NOTES_mmvq.md, sweep 2026-11-29): Q4_K 4096->12288 17.3 -> 15.2-15.8 us,
# 4096->4096 8.8 -> 8.0-8.5 us; Q6_K is fastest with 1 row.
INVARIANT_ONE_COL_ROWS = {"Q4_K": 2}
# Rows of at least LONG_ROW_K values (16+ super-blocks: several kbx steps a thread), since the weights
# are loaded before the PDL wait (session 18): graph replays of the synthetic 8B's one-token pass
# (BATCH_INVARIANT, the same logits digest in every setting) 2.416 ms with {Q4_K: 2, Q6_K: 1},
# 2.379 with Q4_K 4, 2.393 with Q6_K 2, 2.336 with both, 2.802 with Q4_K 8 and Q6_K 2, 2.394 with Q4_K 4
# and Q6_K 4, 2.894 with Q4_K 1 (bench/results/2026-12-04-h200-session19/f-one-col-rows, g-one-col-rows-2). The 0.6B's
# rows (at most 3,072 values) keep the rows above: Q6_K 2 made its pass 0.624 -> 0.630 ms.
LONG_ROW_K = 4096
LONG_ROW_ROWS = {"Q4_K": 4, "Q6_K": 2}
SMALL_K_ROWS = 0  # rows of a small_k launch; 0: llama.cpp's nwarps
# Weights of at least WIDE_N rows (in Qwen3 the output head alone: 151,936 rows) may take rows of their own,
# WIDE_ROWS (0: the rules above). The 0.6B's head is ~8% of its one-token pass (Nsight Compute, session 7:
# 51 us of ~0.63 ms, against ~33 us to stream its 128 MB at the measured copy bandwidth), in 37,984 CUDA
# blocks of 4 short rows; for an A/B ("wide=N" below) before anything is kept.
WIDE_N = 65536
WIDE_ROWS = 0
MULTI_COL_ROWS = 0  # rows of a launch of 2+ columns; 0: llama.cpp's 2

# HIRAISHIN_ONE_COL_ROWS="Q4_K=2,Q6_K=1,short=4,small=4,multi=2,wide=8" overrides the rows above (a type's value
# for one-column rows of every length; multi: launches of 2+ columns; wide: weights of WIDE_N+ rows) for an A/B of whole passes
# (bench/final_session.sh step ab): rows per block change no bit, only speed.
ENV_ONE_COL_ROWS = "HIRAISHIN_ONE_COL_ROWS"


def _rows_from_env(text: str) -> None:
    global SHORT_ROW_ROWS, SMALL_K_ROWS, MULTI_COL_ROWS, WIDE_ROWS
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        try:
            rows = int(value)
        except ValueError:
            rows = 0
        if not 1 <= rows <= MAX_ROWS_PER_BLOCK:
            raise PlanError(f"{ENV_ONE_COL_ROWS}: {item!r} needs rows in 1..{MAX_ROWS_PER_BLOCK}")
        if key == "short":
            SHORT_ROW_ROWS = rows
        elif key == "small":
            SMALL_K_ROWS = rows
        elif key == "multi":
            MULTI_COL_ROWS = rows
        elif key == "wide":
            WIDE_ROWS = rows
        elif key in MATVEC_TRAITS:
            INVARIANT_ONE_COL_ROWS[key] = LONG_ROW_ROWS[key] = rows
        else:
            raise PlanError(f"{ENV_ONE_COL_ROWS}: unknown key {key!r} (a quant type, 'short', 'small', 'multi' or 'wide')")


if os.environ.get(ENV_ONE_COL_ROWS):
    _rows_from_env(os.environ[ENV_ONE_COL_ROWS])


def _balanced(ncols: int, max_cols: int) -> int:
    """Columns per launch when ncols are split into the fewest launches of at most max_cols."""
    n_launches = math.ceil(ncols / max_cols)
    return math.ceil(ncols / n_launches)


def matvec_plan(order, ncols: int, qtype: str, device=None, k: int | None = None,
                n: int | None = None) -> MatVecPlan | MMQStockPlan:
    """The plan ``order`` (a ReductionOrder) gives to ``ncols`` columns of a ``qtype`` weight.

    ``device`` is None (the default profile), a profile name or a
    :class:`~hiraishin.devices.DeviceProfile`; it picks the nwarps table (and the SM count of the
    stock MMQ split). ``k``, ``n``: the weight's row length and rows: the variant order's Q4_K/Q6_K
    plans past 8 columns need them (:mod:`.mmq_stock`); one-column plans of short rows put more rows
    in a CUDA block with them (:func:`_small_k`, :data:`SHORT_ROW_ROWS`; no bit changes).
    """
    if isinstance(ncols, bool) or not isinstance(ncols, int) and not hasattr(ncols, "__index__") or ncols < 1:
        raise PlanError(f"matvec_plan needs ncols >= 1, got {ncols!r}")
    ncols = int(ncols)
    matvec_traits(qtype)
    profile = get_profile(device)
    policy = order.matvec
    if policy == "variant":
        if ncols > MMVQ_MAX_BATCH_SIZE:
            if qtype in MMQ_STOCK_QTYPES:  # llama.cpp's MMQ order (Q8_0 keeps the tiled kernel)
                return mmq_stock_plan(ncols, qtype, k, n, profile)
            return MatVecPlan(kernel="tiled", qtype=qtype, nwarps=TILE_THREADS // 32,
                              rows_per_block=TILE_ROWS, cols_per_launch=ncols, ncols=ncols)
        nwarps = _nwarps_from_table(profile, qtype, ncols)
        # One column: the exact policies' rows per CUDA block (llama.cpp's are 1, or nwarps for
        # small_k). Rows per block change no bit, and the variant's one-column nwarps are theirs, so
        # the one-token pass is the same launch under every order and the price of exactness measures
        # float order alone (H200 bench, synthetic 8B: the variant's decode 3.13 -> 2.59 ms, its 0.6B
        # draft step 0.92 -> 0.82; bench/results/2026-12-04-h200-session15).
        rows = _one_col_rows(qtype, nwarps, k, n) if ncols == 1 else _default_rows_per_block(ncols)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols,
                          ncols=ncols)
    if policy in ("invariant", "subblock"):
        # (the sub-block order covers Q4_K/Q6_K; its other weight types, e.g. Q8_0, walk the
        # invariant one-column geometry: exact at every width as well)
        nwarps = _nwarps_from_table(profile, qtype, 1)
        cols = _balanced(ncols, order.max_cols_per_launch)
        rows = _one_col_rows(qtype, nwarps, k, n) if cols == 1 else _default_rows_per_block(cols)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=cols,
                          ncols=ncols)
    if policy == "custom":
        nwarps = order.nwarps if order.nwarps is not None else _nwarps_from_table(profile, qtype, 1)
        max_cols = order.max_cols_per_launch
        if order.rows_per_block is not None:
            rows = order.rows_per_block
            if not 1 <= rows <= MAX_ROWS_PER_BLOCK:
                raise PlanError(f"{order.name}: rows_per_block must be in 1..{MAX_ROWS_PER_BLOCK}, got {rows}")
            max_cols = min(max_cols, MAX_ACCUMULATORS // rows)
            cols = _balanced(ncols, max_cols)
        else:  # rows per CUDA block change no bit: the invariant policy's choice for its nwarps
            cols = _balanced(ncols, max_cols)
            rows = _one_col_rows(qtype, nwarps, k, n) if cols == 1 else _default_rows_per_block(cols)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=nwarps, rows_per_block=rows,
                          cols_per_launch=cols, ncols=ncols)
    raise PlanError(f"{order.name}: unknown mat-vec policy {policy!r}; expected variant, invariant, subblock "
                   "or custom")
