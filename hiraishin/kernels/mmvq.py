"""dp4a mat-vec (Q4_K, Q6_K, Q8_0 weights x q8_1 activations): plan, kernel, emulator.

The geometry is llama.cpp's ``mul_mat_vec_q`` (reference sections 4.1-4.4,
``ggml/src/ggml-cuda/mmvq.cu`` and ``vecdotq.cuh``); the arithmetic is IEEE with
every rounding-relevant op explicit, so the Numba emulator here reproduces the
kernel's bits. For one output (row r, column j)::

    tpb = threads per weight block (Q4_K 16, Q6_K 32, Q8_0 4)
    bpi = 32 * nwarps / tpb                       # weight blocks per iteration
    thread tid: acc = 0; for kbx = tid // tpb, += bpi: acc = step(acc, block kbx, ints of tid % tpb)
    s[L] = acc[L] + acc[32 + L] + ... + acc[32*(nwarps-1) + L]   (warp order, lane by lane)
    s = xor butterfly over the 32 lanes (16, 8, 4, 2, 1); out = s[lane 0]

Only ``nwarps`` changes a result: rows per CUDA block and columns per launch
decide which outputs share a CUDA block, not how any one output is summed.
That is why llama.cpp's table (4 warps for 1-4 columns, 2 for 5-8) makes a
token's logits depend on how many tokens share the batch, and why giving
every column the one-column geometry fixes it.

Plans (:class:`MatVecPlan`) come from :func:`plan_matvec`, which
``ReductionOrder.matvec_plan`` calls:

* ``variant`` (stock llama.cpp): nwarps from the device's table keyed by the
  column count, 1 row per CUDA block for one column else 2; past
  ``MMVQ_MAX_BATCH_SIZE`` = 8 columns the tiled kernel (``mmq_tiled``).
* ``invariant``: every column gets the one-column nwarps; any batch stays on
  the mat-vec kernel, in launches of at most ``order.max_cols_per_launch``
  (one Q4_K column runs 2 rows per CUDA block: measured faster, same bits).
* ``custom``: ``order.nwarps`` / ``order.rows_per_block`` as given.

Valid mat-vec geometry (else :class:`PlanError`): 1 <= nwarps <= 16 (at most 512
threads; llama.cpp uses 1..8), 1 <= rows_per_block <= 8, 1 <= cols_per_launch
<= 16, rows_per_block * cols_per_launch <= 32 (accumulators per thread stay in
registers), and the shared-memory hand-over ``(nwarps-1) * cols * rows * 128``
bytes <= 48 KiB. Any nwarps divides the work: every type has a power-of-two
number of threads per block that divides 32, so blocks per iteration is an
integer; threads whose first block is past the row's end simply add nothing
(llama.cpp's ``small_k`` case).

Runners: :func:`mul_mat_vec` (q8_1 bytes in llama.cpp's layout) and :func:`mul_mat` (float32 in,
quantized here). On the GPU the kernel reads Q4_K/Q6_K activations in its own per-thread layout
(:mod:`.q8_1_layout`): ``mul_mat`` quantizes straight into it, ``mul_mat_vec`` converts.
:class:`MatVecLaunch` / :func:`prepared_launch` / :func:`prepared_plan` / :func:`launch_plan` are
the unchecked launches the CUDA backend and the benchmarks use; compile-time tuning (unroll,
register caps) is in the constants above :func:`kernel_defines`. ``backend="cpu"`` runs the
Numba emulator on numpy arrays, ``backend="cuda"`` the CUDA kernels on cupy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ..devices import DeviceProfile, get_profile
from ..errors import BackendError, PlanError, QuantError
from ..fp import fmaf
from . import mmq_tiled
from .mmq_tiled import _u16
from .q8_1_layout import layout_for, to_layout
from .quantize_q8_1 import F16_TO_F32, Q8_1_BLOCK_BYTES, quantize_q8_1

__all__ = [
    "MMVQ_MAX_BATCH_SIZE",
    "NWARPS_GENERIC",
    "NWARPS_TURING",
    "NWARPS_GCN",
    "TYPE_TRAITS",
    "TypeTraits",
    "MatVecPlan",
    "plan_matvec",
    "mul_mat_vec",
    "mul_mat",
    "MatVecLaunch",
    "mmvq_kernel",
    "launch_plan",
    "PlanLaunches",
    "prepared_plan",
    "prepared_launch",
    "kernel_defines",
    "plan_kernel_defines",
    "preset_kernel_defines",
    "precompile",
    "emulate_mmvq",
    "random_weights",
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


@dataclass(frozen=True)
class TypeTraits:
    """Block facts of a weight type (ggml-common.h, vecdotq.cuh; reference section 2)."""

    qk: int  # values per block
    block_bytes: int
    vdr: int  # VDR_MMVQ: ints of quant data per thread per call
    qi: int  # ints of quant data per block, as the dot product sees them
    type_id: int  # ggml type id (also HX_QTYPE in the CUDA source)
    block_word: str  # "super-block" or "block", for descriptions

    @property
    def threads_per_block(self) -> int:
        """qi / vdr: how many threads share one weight block."""
        return self.qi // self.vdr


TYPE_TRAITS = {
    "Q4_K": TypeTraits(qk=256, block_bytes=144, vdr=2, qi=32, type_id=12, block_word="super-block"),
    "Q6_K": TypeTraits(qk=256, block_bytes=210, vdr=1, qi=32, type_id=14, block_word="super-block"),
    "Q8_0": TypeTraits(qk=32, block_bytes=34, vdr=2, qi=8, type_id=8, block_word="block"),
}
_KQUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def _traits(qtype: str) -> TypeTraits:
    try:
        return TYPE_TRAITS[qtype]
    except KeyError:
        raise PlanError(f"mat-vec supports weight types {sorted(TYPE_TRAITS)}, got {qtype!r}") from None


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
        t = _traits(self.qtype)
        if self.ncols < 1:
            raise PlanError(f"a mat-vec plan needs ncols >= 1, got {self.ncols}")
        if not 1 <= self.cols_per_launch <= self.ncols:
            raise PlanError(f"cols_per_launch must be in 1..ncols={self.ncols}, got {self.cols_per_launch}")
        if self.kernel == "tiled":
            if (self.nwarps, self.rows_per_block, self.cols_per_launch) != (
                    mmq_tiled.TILE_THREADS // 32, mmq_tiled.TILE_ROWS, self.ncols):
                raise PlanError(
                    f"the tiled kernel has a fixed tile ({mmq_tiled.TILE_THREADS // 32} warps, "
                    f"{mmq_tiled.TILE_ROWS} rows, all columns in one launch); got nwarps={self.nwarps}, "
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
    def traits(self) -> TypeTraits:
        return TYPE_TRAITS[self.qtype]

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
                f"Tiles of {mmq_tiled.TILE_ROWS} rows × {mmq_tiled.TILE_COLS} columns, "
                f"{mmq_tiled.TILE_THREADS} threads."
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
    # (Its small_k case, rows = nwarps for short rows, changes no per-row arithmetic.)
    return 1 if cols_per_launch == 1 else 2


# Rows per CUDA block for ONE column under the invariant policy, where it differs from
# llama.cpp's 1 (rows per block change no output bits). Measured on an H200
# (bench/NOTES_mmvq.md, sweep 2026-11-29): Q4_K 4096->12288 17.3 -> 15.2-15.8 us,
# 4096->4096 8.8 -> 8.0-8.5 us; Q6_K is fastest with 1 row.
INVARIANT_ONE_COL_ROWS = {"Q4_K": 2}


def _balanced(ncols: int, max_cols: int) -> int:
    """Columns per launch when ncols are split into the fewest launches of at most max_cols."""
    n_launches = math.ceil(ncols / max_cols)
    return math.ceil(ncols / n_launches)


def plan_matvec(order, ncols: int, qtype: str, device=None) -> MatVecPlan:
    """The plan ``order`` (a ReductionOrder) gives to ``ncols`` columns of a ``qtype`` weight.

    ``device`` is None (the default profile), a profile name or a
    :class:`~hiraishin.devices.DeviceProfile`; it picks the nwarps table.
    """
    if not isinstance(ncols, (int, np.integer)) or ncols < 1:
        raise PlanError(f"plan_matvec needs ncols >= 1, got {ncols!r}")
    ncols = int(ncols)
    _traits(qtype)
    profile = get_profile(device)
    policy = order.matvec
    if policy == "variant":
        if ncols > MMVQ_MAX_BATCH_SIZE:
            return MatVecPlan(kernel="tiled", qtype=qtype, nwarps=mmq_tiled.TILE_THREADS // 32,
                              rows_per_block=mmq_tiled.TILE_ROWS, cols_per_launch=ncols, ncols=ncols)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=_nwarps_from_table(profile, qtype, ncols),
                          rows_per_block=_default_rows_per_block(ncols), cols_per_launch=ncols, ncols=ncols)
    if policy == "invariant":
        cols = _balanced(ncols, order.max_cols_per_launch)
        rows = _default_rows_per_block(cols)
        if cols == 1:
            rows = INVARIANT_ONE_COL_ROWS.get(qtype, rows)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=_nwarps_from_table(profile, qtype, 1),
                          rows_per_block=rows, cols_per_launch=cols, ncols=ncols)
    if policy == "custom":
        nwarps = order.nwarps if order.nwarps is not None else _nwarps_from_table(profile, qtype, 1)
        max_cols = order.max_cols_per_launch
        if order.rows_per_block is not None:
            rows = order.rows_per_block
            if not 1 <= rows <= MAX_ROWS_PER_BLOCK:
                raise PlanError(f"{order.name}: rows_per_block must be in 1..{MAX_ROWS_PER_BLOCK}, got {rows}")
            max_cols = min(max_cols, MAX_ACCUMULATORS // rows)
            cols = _balanced(ncols, max_cols)
        else:
            cols = _balanced(ncols, max_cols)
            rows = _default_rows_per_block(cols)
        return MatVecPlan(kernel="mmvq", qtype=qtype, nwarps=nwarps, rows_per_block=rows,
                          cols_per_launch=cols, ncols=ncols)
    raise PlanError(f"{order.name}: unknown mat-vec policy {policy!r}; expected variant, invariant or custom")


# --------------------------------------------------------------------------- emulator


@njit(cache=True, inline="always")
def _step_q4_k(acc, w, r, wo, y, ys, j, yo, iqs, h2f):
    """vec_dot_q4_K_q8_1 for one thread (ints iqs, iqs+1) of super-block at w[r, wo]."""
    c = iqs // 8
    pos = 4 * ((iqs // 2) % 4)
    qo = wo + 16 + 32 * c + pos
    sumf_d = np.float32(0.0)
    sumf_m = np.float32(0.0)
    for i in range(2):
        sb = 2 * c + i  # get_scale_min_k4
        if sb < 4:
            sc = np.int64(w[r, wo + 4 + sb]) & 63
            mn = np.int64(w[r, wo + 8 + sb]) & 63
        else:
            sc = (np.int64(w[r, wo + 8 + sb]) & 0x0F) | ((np.int64(w[r, wo + sb]) >> 6) << 4)
            mn = (np.int64(w[r, wo + 8 + sb]) >> 4) | ((np.int64(w[r, wo + 4 + sb]) >> 6) << 4)
        bo = yo + sb * 36
        shift = 4 * i
        dot1 = 0
        dot2 = 0
        for k in range(4):
            u0 = np.int64(ys[j, bo + 4 + pos + k])
            u1 = np.int64(ys[j, bo + 4 + pos + 16 + k])
            dot1 += ((np.int64(w[r, qo + k]) >> shift) & 15) * u0
            dot1 += ((np.int64(w[r, qo + 16 + k]) >> shift) & 15) * u1
            dot2 += u0 + u1
        d8 = h2f[_u16(y, j, bo)]
        sumf_d = fmaf(d8, np.float32(dot1 * sc), sumf_d)
        sumf_m = fmaf(d8, np.float32(dot2 * mn), sumf_m)
    d = h2f[_u16(w, r, wo)]
    dmin = h2f[_u16(w, r, wo + 2)]
    return acc + fmaf(d, sumf_d, -(dmin * sumf_m))


@njit(cache=True, inline="always")
def _step_q6_k(acc, w, ws, r, wo, y, ys, j, yo, iqs, h2f):
    """vec_dot_q6_K_q8_1 for one thread (int iqs) of super-block at w[r, wo]."""
    h = iqs // 16
    rr = iqs % 16
    bq8_offset = 4 * h + rr // 8
    scale_offset = 8 * h + rr // 4
    vh_shift = 2 * (rr // 8)
    lo_o = wo + 4 * iqs
    hi_o = wo + 128 + 4 * (8 * h + rr % 8)
    sumf = np.float32(0.0)
    for i in range(2):
        sc = np.int64(ws[r, wo + 192 + scale_offset + 4 * i])
        bo = yo + (bq8_offset + 2 * i) * 36
        uo = bo + 4 + 4 * (iqs % 8)
        dot = 0
        for k in range(4):
            lo = (np.int64(w[r, lo_o + k]) >> (4 * i)) & 15
            hi = (np.int64(w[r, hi_o + k]) >> (vh_shift + 4 * i)) & 3
            dot += ((lo | (hi << 4)) - 32) * np.int64(ys[j, uo + k])
        d8 = h2f[_u16(y, j, bo)]
        sumf = fmaf(d8, np.float32(dot * sc), sumf)
    return fmaf(h2f[_u16(w, r, wo + 208)], sumf, acc)


@njit(cache=True, inline="always")
def _step_q8_0(acc, w, ws, r, wo, y, ys, j, yo, iqs, h2f):
    """vec_dot_q8_0_q8_1 for one thread (ints iqs, iqs+1) of the block at w[r, wo]."""
    dot = 0
    for k in range(8):
        dot += np.int64(ws[r, wo + 2 + 4 * iqs + k]) * np.int64(ys[j, yo + 4 + 4 * iqs + k])
    d = h2f[_u16(w, r, wo)] * h2f[_u16(y, j, yo)]
    return fmaf(d, np.float32(dot), acc)


@njit(cache=True, inline="always")
def _reduce(acc, s, nwarps):
    """Warp hand-over in warp order, then lane 0 of the xor butterfly."""
    for lane in range(32):
        s[lane] = acc[lane]
    for wp in range(1, nwarps):
        for lane in range(32):
            s[lane] = s[lane] + acc[32 * wp + lane]
    # Lane L adds lane L^off; after each step lanes L and L+off hold the same value,
    # so lane 0's result is this in-place halving.
    off = 16
    while off > 0:
        for lane in range(off):
            s[lane] = s[lane] + s[lane + off]
        off //= 2
    return s[0]


@njit(cache=True, inline="always")
def _step(type_id, acc, w, ws, r, kbx, y, ys, j, tid, h2f):
    """Thread ``tid``'s vec-dot of weight block ``kbx`` of row ``r`` with column ``j`` (per type)."""
    if type_id == 12:  # Q4_K: 16 threads per super-block, ints 2*(tid%16), +1; 8 q8_1 blocks
        return _step_q4_k(acc, w, r, kbx * 144, y, ys, j, kbx * 8 * 36, 2 * (tid % 16), h2f)
    if type_id == 14:  # Q6_K: 32 threads per super-block, int tid%32
        return _step_q6_k(acc, w, ws, r, kbx * 210, y, ys, j, kbx * 8 * 36, tid % 32, h2f)
    return _step_q8_0(acc, w, ws, r, kbx * 34, y, ys, j, kbx * 36, 2 * (tid % 4), h2f)  # 4 threads per block


# Rows are independent; prange over chunks of rows cannot change any result.
_ROWS_PER_CHUNK = 64


@njit(cache=True, parallel=True, error_model="numpy")
def _mmvq_emulate(type_id, block_bytes, tpb, w, ws, y, ys, nwarps, h2f, out):
    n = w.shape[0]
    nb = w.shape[1] // block_bytes
    nthreads = 32 * nwarps
    bpi = nthreads // tpb
    nchunks = (n + _ROWS_PER_CHUNK - 1) // _ROWS_PER_CHUNK
    for chunk in prange(nchunks):  # scratch allocated once per chunk of rows
        acc = np.empty(nthreads, dtype=np.float32)
        s = np.empty(32, dtype=np.float32)
        for r in range(chunk * _ROWS_PER_CHUNK, min(n, (chunk + 1) * _ROWS_PER_CHUNK)):
            for j in range(y.shape[0]):
                for tid in range(nthreads):
                    a = np.float32(0.0)
                    for kbx in range(tid // tpb, nb, bpi):
                        a = _step(type_id, a, w, ws, r, kbx, y, ys, j, tid, h2f)
                    acc[tid] = a
                out[j, r] = _reduce(acc, s, nwarps)


def emulate_mmvq(w: np.ndarray, qtype: str, xq: np.ndarray, nwarps: int) -> np.ndarray:
    """CPU emulation of the mat-vec kernel with ``nwarps`` warps: float32 (ncols, N).

    Rows per block and columns per launch do not change any output, so only
    ``nwarps`` is needed. Inputs must be validated and C-contiguous.
    """
    t = TYPE_TRAITS[qtype]
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    _mmvq_emulate(t.type_id, t.block_bytes, t.threads_per_block, w, w.view(np.int8), xq, xq.view(np.int8),
                  nwarps, F16_TO_F32, out)
    return out


# --------------------------------------------------------------------------- runners


def _check_weight(w, qtype: str) -> tuple[int, int]:
    """(N, K) of a weight, or a QuantError naming its shape and type."""
    t = TYPE_TRAITS.get(qtype)
    if t is None:
        raise QuantError(f"mat-vec weights must be one of {sorted(TYPE_TRAITS)}, got qtype {qtype!r}")
    if w.ndim != 2 or w.dtype != np.uint8:
        raise QuantError(
            f"{qtype} weight must be a uint8 array (N rows, row_bytes); got {w.dtype} {tuple(w.shape)}"
        )
    n, row_bytes = w.shape
    if row_bytes == 0 or row_bytes % t.block_bytes:
        raise QuantError(
            f"{qtype} weight of shape {tuple(w.shape)}: row_bytes={row_bytes} is not a positive multiple "
            f"of the {t.block_bytes}-byte block"
        )
    return n, row_bytes // t.block_bytes * t.qk


def _check_xq(xq, qtype: str, k: int, w_shape) -> int:
    expect = k // 32 * Q8_1_BLOCK_BYTES
    if xq.ndim != 2 or xq.dtype != np.uint8 or xq.shape[1] != expect:
        raise QuantError(
            f"q8_1 activations for a {qtype} weight of shape {tuple(w_shape)} (K={k}) must be uint8 "
            f"(ncols, {expect}); got {xq.dtype} {tuple(xq.shape)}"
        )
    return xq.shape[0]


def mul_mat_vec(w, qtype: str, xq, plan: MatVecPlan, backend: str = "cpu"):
    """``w`` (N, row_bytes) times q8_1 activations ``xq`` (ncols, K/32*36) -> float32 (ncols, N).

    Runs ``plan`` (from :func:`plan_matvec`): the mat-vec kernel in
    ``len(plan.launches())`` launches, or the tiled kernel. ``backend="cpu"``:
    numpy in and out (Numba emulator); ``backend="cuda"``: cupy in and out.
    """
    if backend not in ("cpu", "cuda"):
        raise BackendError(f"unknown backend {backend!r}; expected 'cpu' or 'cuda'")
    if not isinstance(plan, MatVecPlan):
        raise PlanError(f"mul_mat_vec needs a MatVecPlan, got {type(plan).__name__}")
    if plan.qtype != qtype:
        raise PlanError(f"plan is for {plan.qtype} but the weight is {qtype}")
    n, k = _check_weight(w, qtype)
    ncols = _check_xq(xq, qtype, k, w.shape)
    if ncols != plan.ncols:
        raise PlanError(f"plan is for {plan.ncols} columns but xq has {ncols} (shape {tuple(xq.shape)})")
    if backend == "cpu":
        if not isinstance(w, np.ndarray) or not isinstance(xq, np.ndarray):
            raise BackendError(
                f"backend 'cpu' needs numpy arrays; got w {type(w).__name__}, xq {type(xq).__name__}"
            )
        w = np.ascontiguousarray(w)
        xq = np.ascontiguousarray(xq)
        if plan.kernel == "tiled":
            return mmq_tiled.emulate_tiled(w, qtype, xq, F16_TO_F32)
        return emulate_mmvq(w, qtype, xq, plan.nwarps)
    return _mul_mat_vec_cuda(w, qtype, xq, plan, n, k)


def _check_cuda_weight(w, qtype):
    from ._cuda import require_cupy

    cp = require_cupy()
    if not isinstance(w, cp.ndarray):
        raise BackendError(f"backend 'cuda' needs a cupy weight; got {type(w).__name__}")
    if not w.flags.c_contiguous:
        raise BackendError(f"{qtype} weight {tuple(w.shape)} must be C-contiguous on the GPU (no silent copies)")
    align = 4 if qtype == "Q4_K" else 2  # the kernels load ints (Q4_K) or 16-bit halves
    if w.data.ptr % align:
        raise BackendError(f"{qtype} weight must be {align}-byte aligned")
    return cp


def _mul_mat_vec_cuda(w, qtype, xq, plan, n, k):
    cp = _check_cuda_weight(w, qtype)
    if not isinstance(xq, cp.ndarray):
        raise BackendError(f"backend 'cuda' needs cupy q8_1 data; got {type(xq).__name__}")
    xq = cp.ascontiguousarray(xq)
    out = cp.empty((plan.ncols, n), dtype=cp.float32)
    if plan.kernel == "tiled":
        mmq_tiled.launch_tiled(w, qtype, xq, out, k)
        return out
    # The mat-vec kernel reads Q4_K/Q6_K activations in their own layout (q8_1_layout).
    y = to_layout(xq, qtype) if layout_for(qtype) else xq
    return launch_plan(w, qtype, y, plan, out)


def launch_plan(w, qtype: str, y, plan: MatVecPlan, out):
    """Run an mmvq plan's launches, unchecked: ``y`` holds the activations already in the kernel's
    layout for ``qtype`` (``quantize_q8_1(x, "cuda", layout_for(qtype))``), ``out`` is float32
    (ncols, n). For benchmarks and callers whose arrays are right by construction."""
    t = _traits(qtype)
    return prepared_plan(qtype, w.shape[0], w.shape[1] // t.block_bytes * t.qk, plan)(w, y, out)


# --------------------------------------------------------------------------- kernel launch

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
# Per-SM limits of the GPUs we compile for (sm_80 .. sm_90): registers, threads, resident blocks.
_REGISTERS_PER_SM = 65536
_THREADS_PER_SM = 2048
_BLOCKS_PER_SM = 32


def _min_blocks(qtype: str, ncols: int, rows: int, nwarps: int, nblocks: int) -> int:
    """HX_MIN_BLOCKS for a launch: the register cap above as resident blocks per SM."""
    regs = MMVQ_MULTI_COL_MAX_REGS
    if ncols > 1 and ncols * rows > MMVQ_MULTI_COL_CAPPED_ACCUMULATORS:
        return 1
    if ncols == 1:
        rules = MMVQ_ONE_COL_MAX_REGS.get(qtype, ())
        regs = next((r for limit, r in rules if limit is None or nblocks <= limit), None)
        if regs is None:
            return 1
    threads = 32 * nwarps
    return max(1, min(_REGISTERS_PER_SM // (threads * regs), _THREADS_PER_SM // threads, _BLOCKS_PER_SM))


def kernel_defines(qtype: str, ncols: int, rows_per_block: int, nwarps: int, nblocks: int,
                   unroll: int | None = None, min_blocks: int | None = None) -> dict:
    """The ``#define``\\ s that compile ``mmvq.cu`` for one launch geometry and row length.

    ``unroll`` and ``min_blocks`` (HX_UNROLL, HX_MIN_BLOCKS) default to the measured choices above.
    """
    t = _traits(qtype)
    if unroll is None:
        unroll = MMVQ_UNROLL_ONE_COL if ncols == 1 else MMVQ_UNROLL_MULTI_COL
    if min_blocks is None:
        min_blocks = _min_blocks(qtype, ncols, rows_per_block, nwarps, nblocks)
    return {"HX_QTYPE": t.type_id, "HX_NCOLS": int(ncols), "HX_RPB": int(rows_per_block),
            "HX_NWARPS": int(nwarps), "HX_NBLOCKS": int(nblocks), "HX_UNROLL": int(unroll),
            "HX_MIN_BLOCKS": int(min_blocks)}


def mmvq_kernel(defines: dict):
    """The compiled mmvq kernel for ``defines`` and the defines it was compiled with.

    A register cap (HX_MIN_BLOCKS > 1) that makes the compiler spill is dropped: spilling to
    local memory costs more than the occupancy the cap buys. (Bits are the same either way.)
    """
    from ._cuda import get_kernel

    kernel = get_kernel("mmvq.cu", "mmvq", defines)
    if defines.get("HX_MIN_BLOCKS", 1) > 1 and kernel.local_size_bytes > 0:
        defines = {**defines, "HX_MIN_BLOCKS": 1}
        kernel = get_kernel("mmvq.cu", "mmvq", defines)
    return kernel, defines


class MatVecLaunch:
    """One compiled mmvq launch: ``ncols`` columns of a (``n``, ``k``) ``qtype`` weight.

    Call it with the weight (C-contiguous cupy uint8 (n, row_bytes)), the q8_1 activations in
    the kernel's layout for ``qtype`` (``q8_1_layout.layout_for``; C-contiguous) and ``out``
    (float32, ``ncols`` rows of ``n`` floats, contiguous); nothing is checked (the checked path
    is :func:`mul_mat_vec`). Everything but the three arrays is prepared here: a decode step
    makes hundreds of these calls.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "defines", "scalars")

    def __init__(self, qtype: str, n: int, k: int, ncols: int, rows_per_block: int, nwarps: int):
        t = _traits(qtype)
        self.kernel, self.defines = mmvq_kernel(kernel_defines(qtype, ncols, rows_per_block, nwarps, k // t.qk))
        self.grid = ((n + rows_per_block - 1) // rows_per_block, 1, 1)
        self.block = (32, nwarps, 1)
        self.shared = (nwarps - 1) * ncols * rows_per_block * 32 * 4
        self.scalars = (np.int32(n), np.int64(n))  # rows, floats between output columns

    def __call__(self, w, xq, out):
        self.kernel(self.grid, self.block, (w, xq, out) + self.scalars, shared_mem=self.shared)
        return out


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
    t = _traits(qtype)
    if plan.kernel != "mmvq":
        return []
    return [kernel_defines(qtype, count, plan.rows_per_block, plan.nwarps, k // t.qk) for _, count in plan.launches()]


def preset_kernel_defines(qtype: str, k: int, widths=range(1, 17)) -> dict:
    """``{description: defines}`` of every mmvq launch BATCH_VARIANT and BATCH_INVARIANT make for
    ``widths`` columns of a ``qtype`` weight with rows of ``k`` values (for precompiling, tests)."""
    from ..order import ReductionOrder

    out = {}
    for order in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT):
        for width in widths:
            for d in plan_kernel_defines(qtype, k, order.matvec_plan(width, qtype)):
                out[f"mmvq {qtype} ncols={d['HX_NCOLS']} rows={d['HX_RPB']} nwarps={d['HX_NWARPS']} k={k}"] = d
    return out


def precompile(qtype: str, k: int, plans, max_workers: int | None = None) -> int:
    """Compile the mmvq kernels that ``plans`` launch for rows of ``k`` values, side by side.

    Kernels compile on first use anyway; this does it for many geometries at once (see
    :func:`hiraishin.kernels._cuda.precompile`). Returns how many modules were compiled.
    """
    from ._cuda import precompile as _precompile

    return _precompile((("mmvq.cu", d) for plan in plans for d in plan_kernel_defines(qtype, k, plan)),
                       max_workers)


def mul_mat(w, qtype: str, x, order, backend: str = "cpu", device=None):
    """``w`` (N, row_bytes) times float32 activations ``x`` (ncols, K) -> float32 (ncols, N).

    Quantizes ``x`` to q8_1 (kernel or emulator), asks
    ``order.matvec_plan(ncols, qtype, device)`` for the geometry and runs it.
    """
    n, k = _check_weight(w, qtype)
    if x.ndim != 2 or x.dtype != np.float32 or x.shape[1] != k:
        raise QuantError(
            f"activations for a {qtype} weight of shape {tuple(w.shape)} (K={k}) must be float32 "
            f"(ncols, {k}); got {x.dtype} {tuple(x.shape)}"
        )
    if x.shape[0] == 0:
        if backend == "cuda":
            from ._cuda import require_cupy

            return require_cupy().empty((0, n), dtype=np.float32)
        return np.empty((0, n), dtype=np.float32)
    plan = order.matvec_plan(x.shape[0], qtype, device)
    if backend == "cuda" and plan.kernel == "mmvq":
        # quantized straight into the layout the kernel reads (no conversion pass)
        cp = _check_cuda_weight(w, qtype)
        y = quantize_q8_1(x, "cuda", layout_for(qtype))
        return launch_plan(w, qtype, y, plan, cp.empty((x.shape[0], n), dtype=cp.float32))
    xq = quantize_q8_1(x, backend)
    return mul_mat_vec(w, qtype, xq, plan, backend)


# --------------------------------------------------------------------------- test data


def random_weights(qtype: str, n_rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random VALID weight blocks (N, row_bytes) for tests and benchmarks.

    Quant bytes and 6-bit/8-bit scales are uniform random; the fp16 scale
    fields are finite and of a realistic size (|w| up to about 2), so no
    quantizer is needed and any (N, K) is cheap to make.
    """
    t = _traits(qtype)
    if k % t.qk or k <= 0 or n_rows < 0:
        raise QuantError(f"random_weights: K={k} must be a positive multiple of {t.qk} for {qtype}")
    rng = np.random.default_rng(seed)
    nb = k // t.qk
    blocks = rng.integers(0, 256, size=(n_rows, nb, t.block_bytes), dtype=np.uint8)

    def f16(lo, hi, shape, signed=False):
        v = rng.uniform(lo, hi, size=shape)
        if signed:
            v *= rng.choice([-1.0, 1.0], size=shape)
        return v.astype(np.float16).view(np.uint8).reshape(*shape, 2)

    if qtype == "Q4_K":
        blocks[:, :, 0:2] = f16(2e-4, 2e-3, (n_rows, nb))  # d
        blocks[:, :, 2:4] = f16(2e-4, 2e-3, (n_rows, nb))  # dmin
    elif qtype == "Q6_K":
        blocks[:, :, 208:210] = f16(1e-4, 5e-4, (n_rows, nb), signed=True)
    else:  # Q8_0
        blocks[:, :, 0:2] = f16(2e-4, 2e-3, (n_rows, nb), signed=True)
    return blocks.reshape(n_rows, nb * t.block_bytes)
