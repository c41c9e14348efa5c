"""Numba emulator of ``mmvq.cu``: the same float operations, in the same order, as the kernel.

Per output (row r, column j), thread ``tid`` of ``32 * nwarps`` walks the weight blocks the plan
gives it (``MatVecPlan.thread_blocks``), each step one vec-dot of llama.cpp's ``vecdotq.cuh``
(the ``_step_*`` functions below, with ``fmaf`` exactly where the kernel writes ``__fmaf_rn``);
then the warp hand-over in warp order and the 32-lane xor butterfly (``_reduce``).

How the CPU gets fast without changing a bit (``tests/test_mmvq_emulator.py`` checks every output
against a plain one-output-at-a-time emulator):

* Rows are independent, so ``_ROWS`` of them run side by side as the lanes of SIMD vectors: every
  scratch array is flat with the row as its fastest index, each step does the same float operations
  on every lane, and LLVM turns the ``for l in range(_ROWS)`` loops into vector instructions. Each
  output still performs its own operations in its own order.
* A tile's rows are first copied as uint32 words, row-minor (``_gather_tile``), so that decoding a
  byte of every row is one vector shift; each weight block is decoded once per call and every column
  walks it; the columns' q8_1 ints and scales are converted once per call (``_columns``).
* Integer work (the dp4a sums) is done in float32: every product and partial sum of one thread's
  step is an integer of magnitude below 2**24 (``_EXACT``), so float32 holds each one exactly and
  every operation on them is exact: the same values as the kernel's int32 arithmetic, converted to
  float where the kernel converts them.
* Calls of more than about a million multiply-adds split their row tiles among threads (``_PARALLEL_MIN``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ...fp import F16_TO_F32, fmaf, u16le
from ...plans.matvec import MatVecPlan, matvec_traits
from ..blocks import Q4_K_BYTES as _Q4_K
from ..blocks import Q4_K_ID as _Q4_K_ID
from ..blocks import Q6_K_BYTES as _Q6_K
from ..blocks import Q6_K_ID as _Q6_K_ID
from ..blocks import Q8_0_BYTES as _Q8_0
from ..blocks import Q8_0_ELEMS as _Q8_0_QK
from ..blocks import Q8_1_BYTES as _Q8_1
from ..blocks import Q8_1_ELEMS as _Q8_1_QK
from ..blocks import Q8_1_PER_SUPER as _Q8_1_PER_SUPER
from ..blocks import QK_K as _QK

__all__ = ["emulate"]

# Rows per tile, the SIMD lanes (4 AVX2 registers of float32). LLVM vectorizes a lane loop with
# runtime alias checks, worth it from about 16 lanes; on the 0.6B shapes 32 measured best (16: decode
# 3x slower; 64: tile copies 2x slower), and a decoded super-block of 32 rows is 32 KiB.
_ROWS = 32
# Largest |integer| one thread step forms: Q4_K 8 products of (q <= 15) x (|q8| <= 128) times a
# scale <= 63; Q6_K 4 products of |q - 32| <= 32 and |q8| <= 128 times |int8 scale| <= 128; Q8_0
# 8 products of two int8s. Below 2**24, so float32 holds it and every partial sum exactly.
_EXACT = max(8 * 15 * 128 * 63, 4 * 32 * 128 * 128, 8 * 128 * 128)
assert _EXACT < 2**24
# Calls with fewer multiply-adds than this run on one thread. Measured on 2 idle cores: a 1024 x 1024
# mat-vec 0.48 ms on one thread, 0.33 ms on two; 3072 x 1024 1.42 -> 0.73 ms; the 64-position replay
# 64 -> 40 s. A parallel region also waits until every thread has been scheduled: up to ~8 ms when
# other processes hold the cores, so the smallest calls (the tiny test shapes) stay serial.
_PARALLEL_MIN = 1 << 20
_ZERO = np.float32(0.0)


@njit(cache=True, inline="always")
def _ix(i):
    """An index as unsigned: Numba guards signed indices against negative values, and that guard
    inside a lane loop stops LLVM from vectorizing it."""
    return np.uint64(i)


# ---------------------------------------------------------------- one tile of rows, decoded
# Flat scratch, lane l fastest (R = _ROWS):
#   tile[w*R + l]  word w (uint32, little-endian) of row l's bytes;
#   wv[e*R + l]    value e of the current weight block as float32 (Q6_K: minus 32; Q8_0: signed);
#   ws[i*R + l]    its integer scales as float32 (Q4_K: 8 scales then 8 mins; Q6_K: 16 int8 scales);
#   wd[f*R + l]    its fp16 fields as float32 (Q4_K: d, dmin; Q6_K, Q8_0: d).


@njit(cache=True, inline="always")
def _gather_tile(ww, t, tile):
    """Rows _ROWS*t .. of ``ww`` (rows of uint32 words) into ``tile``; past the last row, the last
    row again (those outputs are dropped)."""
    n = ww.shape[0]
    r0 = t * _ROWS
    for w in range(ww.shape[1]):
        for l in range(_ROWS):
            tile[_ix(w * _ROWS + l)] = ww[min(r0 + l, n - 1), w]


@njit(cache=True, inline="always")
def _gather_tile16(wh, t, tile):
    """As _gather_tile, from rows of uint16 halves (a byte count of 2 mod 4; the last half-word 0)."""
    n = wh.shape[0]
    r0 = t * _ROWS
    for l in range(_ROWS):
        r = min(r0 + l, n - 1)
        for w in range(tile.size // _ROWS):
            lo = np.uint32(wh[r, 2 * w])
            hi = np.uint32(wh[r, 2 * w + 1]) if 2 * w + 1 < wh.shape[1] else np.uint32(0)
            tile[_ix(w * _ROWS + l)] = lo | (hi << np.uint32(16))


@njit(cache=True, inline="always")
def _f32(i):
    """A small int as float32, converted through int32 (AVX2 converts int32 vectors; Numba's ints
    are int64)."""
    return np.float32(np.int32(i))


@njit(cache=True, inline="always")
def _byte(tile, o, l):
    """Byte ``o`` of row l (an int)."""
    return np.int32((np.int64(tile[_ix((o >> 2) * _ROWS + l)]) >> ((o & 3) * 8)) & 255)


@njit(cache=True, inline="always")
def _fp16_fields(tile, o, nf, wd, h2f):
    """The fp16 fields at bytes o, o+2, ... (nf of them) of every row, as float32."""
    for f in range(nf):
        for l in range(_ROWS):
            wd[_ix(f * _ROWS + l)] = h2f[_byte(tile, o + 2 * f, l) | (_byte(tile, o + 2 * f + 1, l) << 8)]


@njit(cache=True, inline="always")
def _decode_q4_k(tile, kb, wv, ws, wd, h2f):
    """Super-block kb: d, dmin, the 8 (scale, min) pairs (get_scale_min_k4) and the 256 nibbles."""
    wo = kb * _Q4_K
    _fp16_fields(tile, wo, 2, wd, h2f)
    for sb in range(4):
        for l in range(_ROWS):
            ws[_ix(sb * _ROWS + l)] = _f32(_byte(tile, wo + 4 + sb, l) & 63)
            ws[_ix((8 + sb) * _ROWS + l)] = _f32(_byte(tile, wo + 8 + sb, l) & 63)
    for sb in range(4, 8):
        for l in range(_ROWS):
            b = _byte(tile, wo + 8 + sb, l)
            ws[_ix(sb * _ROWS + l)] = _f32((b & 0x0F) | ((_byte(tile, wo + sb, l) >> 6) << 4))
            ws[_ix((8 + sb) * _ROWS + l)] = _f32((b >> 4) | ((_byte(tile, wo + 4 + sb, l) >> 6) << 4))
    # sub-block 2c: low nibbles of qs[32c .. 32c+31]; sub-block 2c+1: their high nibbles
    for c in range(4):
        for b in range(32):
            for l in range(_ROWS):
                q = _byte(tile, wo + 16 + 32 * c + b, l)
                wv[_ix((64 * c + b) * _ROWS + l)] = _f32(q & 15)
                wv[_ix((64 * c + 32 + b) * _ROWS + l)] = _f32(q >> 4)


@njit(cache=True, inline="always")
def _decode_q6_k(tile, kb, wv, ws, wd, h2f):
    """Super-block kb: d, the 16 int8 scales and the 256 six-bit values minus 32 (dequantize_row_q6_K)."""
    wo = kb * _Q6_K
    _fp16_fields(tile, wo + 208, 1, wd, h2f)
    for t in range(16):
        for l in range(_ROWS):
            sc = _byte(tile, wo + 192 + t, l)
            ws[_ix(t * _ROWS + l)] = _f32(sc - ((sc >> 7) << 8))
    for h in range(2):  # 128 values per half: ql[64h ..], qh[32h ..]
        for m in range(32):
            for l in range(_ROWS):
                a = _byte(tile, wo + 64 * h + m, l)
                b = _byte(tile, wo + 64 * h + 32 + m, l)
                hb = _byte(tile, wo + 128 + 32 * h + m, l)
                e = 128 * h + m
                wv[_ix(e * _ROWS + l)] = _f32(((a & 15) | ((hb & 3) << 4)) - 32)
                wv[_ix((e + 32) * _ROWS + l)] = _f32(((b & 15) | (((hb >> 2) & 3) << 4)) - 32)
                wv[_ix((e + 64) * _ROWS + l)] = _f32(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                wv[_ix((e + 96) * _ROWS + l)] = _f32(((b >> 4) | (((hb >> 6) & 3) << 4)) - 32)


@njit(cache=True, inline="always")
def _decode_q8_0(tile, kb, wv, wd, h2f):
    """Block kb: d and the 32 int8 values."""
    wo = kb * _Q8_0
    _fp16_fields(tile, wo, 1, wd, h2f)
    for e in range(_Q8_0_QK):
        for l in range(_ROWS):
            q = _byte(tile, wo + 2 + e, l)
            wv[_ix(e * _ROWS + l)] = _f32(q - ((q >> 7) << 8))


# ---------------------------------------------------------------- one thread step, _ROWS rows at once
# yv[j, e]: column j's q8_1 int e as float32; yd[j, b]: its q8_1 block b's d. ``a`` is the lane's
# offset into acc. The sums of products below are the kernel's dp4a sums (exact, see _EXACT).


@njit(cache=True, inline="always")
def _step_q4_k(acc, a, kb, iqs, wv, ws, wd, yv, yd, j):
    """vec_dot_q4_K_q8_1, ints iqs and iqs+1: sub-blocks 2c and 2c+1, 4 values at pos and pos+16."""
    R = _ROWS
    c = iqs // 8
    e = 64 * c + 4 * ((iqs // 2) % 4)  # the thread's first value of sub-block 2c (2c+1: +32)
    yo = kb * _QK + e
    u0, u1, u2, u3 = yv[j, yo], yv[j, yo + 1], yv[j, yo + 2], yv[j, yo + 3]
    u4, u5, u6, u7 = yv[j, yo + 16], yv[j, yo + 17], yv[j, yo + 18], yv[j, yo + 19]
    v0, v1, v2, v3 = yv[j, yo + 32], yv[j, yo + 33], yv[j, yo + 34], yv[j, yo + 35]
    v4, v5, v6, v7 = yv[j, yo + 48], yv[j, yo + 49], yv[j, yo + 50], yv[j, yo + 51]
    ysum0 = u0 + u1 + u2 + u3 + u4 + u5 + u6 + u7  # the column's ints summed (dot2 of sub-block 2c)
    ysum1 = v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7
    d80 = yd[j, kb * _Q8_1_PER_SUPER + 2 * c]
    d81 = yd[j, kb * _Q8_1_PER_SUPER + 2 * c + 1]
    w = e * R
    s = 2 * c * R
    for l in range(R):
        dt0 = (wv[_ix(w + l)] * u0 + wv[_ix(w + R + l)] * u1 + wv[_ix(w + 2 * R + l)] * u2
               + wv[_ix(w + 3 * R + l)] * u3 + wv[_ix(w + 16 * R + l)] * u4 + wv[_ix(w + 17 * R + l)] * u5
               + wv[_ix(w + 18 * R + l)] * u6 + wv[_ix(w + 19 * R + l)] * u7)
        dt1 = (wv[_ix(w + 32 * R + l)] * v0 + wv[_ix(w + 33 * R + l)] * v1 + wv[_ix(w + 34 * R + l)] * v2
               + wv[_ix(w + 35 * R + l)] * v3 + wv[_ix(w + 48 * R + l)] * v4 + wv[_ix(w + 49 * R + l)] * v5
               + wv[_ix(w + 50 * R + l)] * v6 + wv[_ix(w + 51 * R + l)] * v7)
        sumf_d = fmaf(d80, dt0 * ws[_ix(s + l)], _ZERO)
        sumf_m = fmaf(d80, ysum0 * ws[_ix(s + 8 * R + l)], _ZERO)
        sumf_d = fmaf(d81, dt1 * ws[_ix(s + R + l)], sumf_d)
        sumf_m = fmaf(d81, ysum1 * ws[_ix(s + 9 * R + l)], sumf_m)
        acc[_ix(a + l)] = acc[_ix(a + l)] + fmaf(wd[_ix(l)], sumf_d, -(wd[_ix(R + l)] * sumf_m))


@njit(cache=True, inline="always")
def _step_q6_k(acc, a, kb, iqs, wv, ws, wd, yv, yd, j):
    """vec_dot_q6_K_q8_1, int iqs: 4 values in each of two q8_1 blocks, one scale each."""
    R = _ROWS
    h = iqs // 16
    rr = iqs % 16
    e = 128 * h + 32 * (rr // 8) + 4 * (rr % 8)  # values e.. (q8_1 block b) and e+64.. (block b+2)
    yo = kb * _QK + e
    b = kb * _Q8_1_PER_SUPER + 4 * h + rr // 8
    u0, u1, u2, u3 = yv[j, yo], yv[j, yo + 1], yv[j, yo + 2], yv[j, yo + 3]
    v0, v1, v2, v3 = yv[j, yo + 64], yv[j, yo + 65], yv[j, yo + 66], yv[j, yo + 67]
    d80 = yd[j, b]
    d81 = yd[j, b + 2]
    w = e * R
    s = (8 * h + rr // 4) * R  # scales 8h + rr/4 and +4
    for l in range(R):
        dt0 = (wv[_ix(w + l)] * u0 + wv[_ix(w + R + l)] * u1 + wv[_ix(w + 2 * R + l)] * u2
               + wv[_ix(w + 3 * R + l)] * u3)
        dt1 = (wv[_ix(w + 64 * R + l)] * v0 + wv[_ix(w + 65 * R + l)] * v1 + wv[_ix(w + 66 * R + l)] * v2
               + wv[_ix(w + 67 * R + l)] * v3)
        sumf = fmaf(d80, dt0 * ws[_ix(s + l)], _ZERO)
        sumf = fmaf(d81, dt1 * ws[_ix(s + 4 * R + l)], sumf)
        acc[_ix(a + l)] = fmaf(wd[_ix(l)], sumf, acc[_ix(a + l)])


@njit(cache=True, inline="always")
def _step_q8_0(acc, a, kb, iqs, wv, wd, yv, yd, j):
    """vec_dot_q8_0_q8_1, ints iqs and iqs+1 of the block: 8 values."""
    R = _ROWS
    e = 4 * iqs
    yo = kb * _Q8_0_QK + e
    u0, u1, u2, u3 = yv[j, yo], yv[j, yo + 1], yv[j, yo + 2], yv[j, yo + 3]
    u4, u5, u6, u7 = yv[j, yo + 4], yv[j, yo + 5], yv[j, yo + 6], yv[j, yo + 7]
    d8 = yd[j, kb]
    w = e * R
    for l in range(R):
        dt = (wv[_ix(w + l)] * u0 + wv[_ix(w + R + l)] * u1 + wv[_ix(w + 2 * R + l)] * u2
              + wv[_ix(w + 3 * R + l)] * u3 + wv[_ix(w + 4 * R + l)] * u4 + wv[_ix(w + 5 * R + l)] * u5
              + wv[_ix(w + 6 * R + l)] * u6 + wv[_ix(w + 7 * R + l)] * u7)
        acc[_ix(a + l)] = fmaf(wd[_ix(l)] * d8, dt, acc[_ix(a + l)])


@njit(cache=True, inline="always")
def _reduce(acc, a, s, nwarps):
    """Warp hand-over in warp order, then lane 0 of the xor butterfly, for the threads' partials
    acc[a + tid*_ROWS + l] of each of the _ROWS rows l; the results are s[l].

    s[lane*_ROWS + l] is lane ``lane`` of row l, so each loop below is one float add per lane and
    row, with index i = lane*_ROWS + l.
    """
    m = 32 * _ROWS
    for i in range(m):
        s[_ix(i)] = acc[_ix(a + i)]
    for wp in range(1, nwarps):
        for i in range(m):
            s[_ix(i)] = s[_ix(i)] + acc[_ix(a + wp * m + i)]
    # Lane L adds lane L^off; after each step lanes L and L+off hold the same value,
    # so lane 0's result is this in-place halving.
    off = 16
    while off > 0:
        for i in range(off * _ROWS):
            s[_ix(i)] = s[_ix(i)] + s[_ix(i + off * _ROWS)]
        off //= 2


@njit(cache=True)
def _mmvq_emulate(type_id, qk, tpb, ww, nwords, yv, yd, nwarps, h2f, out, t0, t1):
    """Tiles t0 .. t1-1 (rows _ROWS*t ..) of the mat-vec, all columns, into out (ncols, N)."""
    R = _ROWS
    n = out.shape[1]
    ncols = yv.shape[0]
    nb = yv.shape[1] // qk
    nthreads = 32 * nwarps
    tile = np.empty(nwords * R, dtype=np.uint32)
    wv = np.empty(qk * R, dtype=np.float32)  # one decoded weight block of the tile
    ws = np.empty(16 * R, dtype=np.float32)
    wd = np.empty(2 * R, dtype=np.float32)
    acc = np.empty(ncols * nthreads * R, dtype=np.float32)  # [column, thread, row]
    s = np.empty(32 * R, dtype=np.float32)
    for t in range(t0, t1):
        if ww.itemsize == 4:
            _gather_tile(ww, t, tile)
        else:
            _gather_tile16(ww, t, tile)
        acc[:] = _ZERO
        for kb in range(nb):
            if type_id == _Q4_K_ID:
                _decode_q4_k(tile, kb, wv, ws, wd, h2f)
            elif type_id == _Q6_K_ID:
                _decode_q6_k(tile, kb, wv, ws, wd, h2f)
            else:
                _decode_q8_0(tile, kb, wv, wd, h2f)
            # The kernel's kbx loop: thread tid (for tid in range(nthreads)) takes blocks tid // tpb,
            # then + bpi, + 2 * bpi, ... in order. Walking the blocks in order and giving part u of
            # block kb to thread (kb * tpb + u) % nthreads performs every thread's steps in that order.
            for j in range(ncols):
                for u in range(tpb):
                    a = (j * nthreads + (kb * tpb + u) % nthreads) * R
                    if type_id == _Q4_K_ID:  # 16 threads per super-block, ints 2u, 2u+1
                        _step_q4_k(acc, a, kb, 2 * u, wv, ws, wd, yv, yd, j)
                    elif type_id == _Q6_K_ID:  # 32 threads per super-block, int u
                        _step_q6_k(acc, a, kb, u, wv, ws, wd, yv, yd, j)
                    else:  # Q8_0: 4 threads per block, ints 2u, 2u+1
                        _step_q8_0(acc, a, kb, 2 * u, wv, wd, yv, yd, j)
        for j in range(ncols):
            _reduce(acc, j * nthreads * R, s, nwarps)
            for l in range(min(R, n - t * R)):
                out[j, t * R + l] = s[l]


@njit(cache=True)
def _columns(y, ys, h2f, yv, yd):
    """The columns' q8_1 ints as float32 (exact) and their blocks' d, once per call."""
    for j in range(y.shape[0]):
        for b in range(yd.shape[1]):
            yd[j, b] = h2f[u16le(y, j, b * _Q8_1)]
            for e in range(_Q8_1_QK):
                yv[j, _Q8_1_QK * b + e] = np.float32(ys[j, b * _Q8_1 + 4 + e])


@njit(cache=True, parallel=True)
def _mmvq_parallel(type_id, qk, tpb, ww, nwords, yv, yd, nwarps, h2f, out, ntiles, nchunks):
    per = (ntiles + nchunks - 1) // nchunks
    for c in prange(nchunks):  # rows are independent: any split gives the same bits
        _mmvq_emulate(type_id, qk, tpb, ww, nwords, yv, yd, nwarps, h2f, out, c * per,
                      min(ntiles, (c + 1) * per))


def emulate(w: np.ndarray, qtype: str, xq: np.ndarray, plan: MatVecPlan) -> np.ndarray:
    """The mat-vec kernel's outputs for ``plan``, on the CPU: float32 (ncols, N).

    ``w`` uint8 (N, row_bytes) blocks of ``qtype``; ``xq`` q8_1 bytes (ncols, K/32*36) in
    llama.cpp's layout. Rows per block and columns per launch change no output, so only
    ``plan.nwarps`` is used. Inputs are not checked (the CPU backend checks them).
    """
    t = matvec_traits(qtype)
    if not w.flags.c_contiguous:  # (ascontiguousarray of a memory-mapped weight costs ~6 us a call)
        w = np.ascontiguousarray(w)
    if not xq.flags.c_contiguous:
        xq = np.ascontiguousarray(xq)
    ncols, n = xq.shape[0], w.shape[0]
    k = xq.shape[1] // _Q8_1 * _Q8_1_QK
    out = np.empty((ncols, n), dtype=np.float32)
    if ncols == 0 or n == 0:
        return out
    yv = np.empty((ncols, k), dtype=np.float32)
    yd = np.empty((ncols, k // _Q8_1_QK), dtype=np.float32)
    _columns(xq, xq.view(np.int8), F16_TO_F32, yv, yd)
    ww = w.view(np.uint32 if w.shape[1] % 4 == 0 else np.uint16)  # a row's byte count is even
    nwords = (w.shape[1] + 3) // 4
    ntiles = (n + _ROWS - 1) // _ROWS
    args = (t.type_id, t.qk, t.threads_per_block, ww, nwords, yv, yd, plan.nwarps, F16_TO_F32, out)
    nthreads = numba.get_num_threads()
    if nthreads > 1 and ntiles > 1 and n * k * ncols >= _PARALLEL_MIN:
        # chunks handed out one at a time as threads come free: a thread that other processes
        # delay holds up the call by one chunk at most (the setting is per thread; ~10 us)
        with numba.parallel_chunksize(1):
            _mmvq_parallel(*args, ntiles, min(ntiles, 8 * nthreads))
    else:
        _mmvq_emulate(*args, 0, ntiles)
    return out
