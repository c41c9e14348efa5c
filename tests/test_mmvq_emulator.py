"""The fast mat-vec emulator against a plain one: every output bit for bit.

``hiraishin.kernels.mmvq.emulate`` runs 32 rows as SIMD lanes, decodes each weight block once per
call, and does the dp4a integer sums in float32 (exact below 2**24). ``_reference`` below is the
kernel written out one output at a time, as ``mmvq.cu`` and llama.cpp's ``vecdotq.cuh`` read: each
thread walks its weight blocks in kbx order with integer dot products and the kernel's float
operations (``fmaf`` where it writes ``__fmaf_rn``), then the warp hand-over and the butterfly.
Both must agree on every bit for every type, warp count, width, row count the tile does not
divide, row length (including rows whose byte count is not a multiple of 4), extreme activation
bytes, unaligned weights, and the multi-threaded path.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from numba import njit

from hiraishin.fp import F16_TO_F32, fmaf
from hiraishin.kernels import mmvq, quantize
from hiraishin.plans import MatVecPlan
from hiraishin.plans.matvec import MATVEC_TRAITS
from hiraishin.quant import random_blocks

fast = importlib.import_module("hiraishin.kernels.mmvq.emulate")  # the package exports the function
_Q4_K, _Q6_K = MATVEC_TRAITS["Q4_K"].type_id, MATVEC_TRAITS["Q6_K"].type_id
F32 = np.float32


@njit(cache=True)
def _u16(a, i, o):
    return np.int64(a[i, o]) | (np.int64(a[i, o + 1]) << 8)


@njit(cache=True)
def _i8(b):
    return b - 256 if b > 127 else b


@njit(cache=True)
def _step_q4_k(w, r, kbx, iqs, y, j, h2f):
    """vec_dot_q4_K_q8_1 (vdr 2) of thread ints iqs, iqs+1 of super-block kbx with column j."""
    wo = kbx * 144
    c = iqs // 8
    pos = 4 * ((iqs // 2) % 4)
    sumf_d = F32(0.0)
    sumf_m = F32(0.0)
    for i in range(2):
        sb = 2 * c + i
        if sb < 4:
            sc = np.int64(w[r, wo + 4 + sb]) & 63
            m = np.int64(w[r, wo + 8 + sb]) & 63
        else:
            sc = (np.int64(w[r, wo + 8 + sb]) & 0x0F) | ((np.int64(w[r, wo + sb]) >> 6) << 4)
            m = (np.int64(w[r, wo + 8 + sb]) >> 4) | ((np.int64(w[r, wo + 4 + sb]) >> 6) << 4)
        bo = (kbx * 8 + sb) * 36
        dot1 = 0
        dot2 = 0
        for k in range(4):
            q0 = (np.int64(w[r, wo + 16 + 32 * c + pos + k]) >> (4 * i)) & 15
            q1 = (np.int64(w[r, wo + 16 + 32 * c + pos + 16 + k]) >> (4 * i)) & 15
            u0 = _i8(np.int64(y[j, bo + 4 + pos + k]))
            u1 = _i8(np.int64(y[j, bo + 4 + pos + 16 + k]))
            dot1 += q0 * u0 + q1 * u1
            dot2 += u0 + u1
        d8 = h2f[_u16(y, j, bo)]
        sumf_d = fmaf(d8, F32(dot1 * sc), sumf_d)
        sumf_m = fmaf(d8, F32(dot2 * m), sumf_m)
    d = h2f[_u16(w, r, wo)]
    dmin = h2f[_u16(w, r, wo + 2)]
    return fmaf(d, sumf_d, -(dmin * sumf_m))  # the caller adds it: acc + this


@njit(cache=True)
def _step_q6_k(acc, w, r, kbx, iqs, y, j, h2f):
    """vec_dot_q6_K_q8_1 (vdr 1) of thread int iqs of super-block kbx with column j."""
    wo = kbx * 210
    h = iqs // 16
    rr = iqs % 16
    sumf = F32(0.0)
    for i in range(2):
        sc = _i8(np.int64(w[r, wo + 192 + 8 * h + rr // 4 + 4 * i]))
        bo = (kbx * 8 + 4 * h + rr // 8 + 2 * i) * 36
        dot = 0
        for k in range(4):
            lo = (np.int64(w[r, wo + 4 * iqs + k]) >> (4 * i)) & 15
            hi = (np.int64(w[r, wo + 128 + 32 * h + 4 * (rr % 8) + k]) >> (2 * (rr // 8) + 4 * i)) & 3
            dot += ((lo | (hi << 4)) - 32) * _i8(np.int64(y[j, bo + 4 + 4 * (rr % 8) + k]))
        sumf = fmaf(h2f[_u16(y, j, bo)], F32(dot * sc), sumf)
    return fmaf(h2f[_u16(w, r, wo + 208)], sumf, acc)


@njit(cache=True)
def _step_q8_0(acc, w, r, kbx, iqs, y, j, h2f):
    """vec_dot_q8_0_q8_1 (vdr 2) of thread ints iqs, iqs+1 of block kbx with column j."""
    wo = kbx * 34
    bo = kbx * 36
    dot = 0
    for k in range(8):
        dot += _i8(np.int64(w[r, wo + 2 + 4 * iqs + k])) * _i8(np.int64(y[j, bo + 4 + 4 * iqs + k]))
    return fmaf(h2f[_u16(w, r, wo)] * h2f[_u16(y, j, bo)], F32(dot), acc)


@njit(cache=True)
def _reference(type_id, tpb, nb, w, y, nwarps, h2f, out):
    nthreads = 32 * nwarps
    bpi = nthreads // tpb
    acc = np.empty(nthreads, dtype=np.float32)
    s = np.empty(32, dtype=np.float32)
    for r in range(w.shape[0]):
        for j in range(y.shape[0]):
            for tid in range(nthreads):
                a = F32(0.0)
                for kbx in range(tid // tpb, nb, bpi):
                    if type_id == _Q4_K:
                        a = a + _step_q4_k(w, r, kbx, 2 * (tid % tpb), y, j, h2f)
                    elif type_id == _Q6_K:
                        a = _step_q6_k(a, w, r, kbx, tid % tpb, y, j, h2f)
                    else:
                        a = _step_q8_0(a, w, r, kbx, 2 * (tid % tpb), y, j, h2f)
                acc[tid] = a
            for lane in range(32):  # warp 0 adds warps 1, 2, ... lane by lane
                s[lane] = acc[lane]
            for wp in range(1, nwarps):
                for lane in range(32):
                    s[lane] = s[lane] + acc[32 * wp + lane]
            off = 16  # xor butterfly; lane 0's value
            while off > 0:
                for lane in range(off):
                    s[lane] = s[lane] + s[lane + off]
                off //= 2
            out[j, r] = s[0]


def reference(w, qtype, xq, nwarps):
    t = MATVEC_TRAITS[qtype]
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    _reference(t.type_id, t.threads_per_block, w.shape[1] // t.block_bytes, w, xq, nwarps, F16_TO_F32, out)
    return out


def emulate(w, qtype, xq, nwarps):
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=1, cols_per_launch=1, ncols=xq.shape[0])
    return mmvq.emulate(w, qtype, xq, plan)


def _columns(ncols, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ncols, k)) * rng.uniform(0.1, 4.0, size=(ncols, 1))
    return quantize.emulate(x.astype(np.float32))


def _assert_same_bits(got, want, what):
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=what)


# K values: whole multiples of the 4-byte words, and block counts whose rows are 2 mod 4 bytes long
# (Q6_K 3 x 210, Q8_0 3 x 34); N = 37 and 5 are not multiples of the 32-row tile.
SHAPES = {"Q4_K": [(37, 512), (5, 768)], "Q6_K": [(37, 512), (5, 768)], "Q8_0": [(37, 256), (5, 96)]}


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_every_warp_count_and_width(qtype):
    for n, k in SHAPES[qtype]:
        w = random_blocks(qtype, n, k, seed=n)
        xq = _columns(16, k, seed=k)
        for nwarps in range(1, 9):
            want = reference(w, qtype, xq, nwarps)
            for ncols in range(1, 17):
                _assert_same_bits(emulate(w, qtype, xq[:ncols], nwarps), want[:ncols],
                                  f"{qtype} N={n} K={k} nwarps={nwarps} ncols={ncols}")


# Bytes that give each type its largest integer products (the fp16 fields stay as drawn, finite):
# Q4_K scales and mins 63 and nibbles 15; Q6_K values -32 and int8 scales -128; Q8_0 values -128.
EXTREME = {"Q4_K": [(slice(4, 144), 255)], "Q6_K": [(slice(0, 192), 0), (slice(192, 208), 0x80)],
           "Q8_0": [(slice(2, 34), 0x80)]}


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_extreme_bytes_and_more_warps(qtype):
    """The largest integer sums, every activation int from -128 to 127, up to 16 warps."""
    t = MATVEC_TRAITS[qtype]
    n, k = 40, 1024
    w = random_blocks(qtype, n, k, seed=3)
    blocks = w.reshape(n, -1, t.block_bytes)
    for part, value in EXTREME[qtype]:
        blocks[:8, :, part] = value
    xq = _columns(3, k, seed=5)
    q8 = xq.reshape(3, -1, 36)
    q8[:, :, 4:] = np.arange(256, dtype=np.uint8).reshape(8, 32)[np.arange(q8.shape[1]) % 8]
    q8[2, :, 4:] = 0x80  # -128 everywhere
    for nwarps in (1, 3, 8, 16):
        _assert_same_bits(emulate(w, qtype, xq, nwarps), reference(w, qtype, xq, nwarps),
                          f"{qtype} nwarps={nwarps}")


def test_unaligned_and_strided_inputs():
    """Weights at an odd byte offset of their buffer and a non-contiguous column slice."""
    for qtype in ("Q4_K", "Q6_K", "Q8_0"):
        k = 512
        w = random_blocks(qtype, 33, k, seed=7)
        buf = np.zeros(w.size + 8, dtype=np.uint8)
        buf[2:2 + w.size] = w.ravel()
        w_odd = buf[2:2 + w.size].reshape(w.shape)
        xq = _columns(6, k, seed=8)
        want = reference(w, qtype, xq[::2], 4)
        _assert_same_bits(emulate(w_odd, qtype, xq[::2], 4), want, qtype)


def test_parallel_path_gives_the_same_bits(monkeypatch):
    """Rows split among threads (forced for a small call) give the single-thread bits."""
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("one Numba thread")
    for qtype in ("Q4_K", "Q6_K"):
        w = random_blocks(qtype, 200, 512, seed=9)
        xq = _columns(5, 512, seed=10)
        serial = emulate(w, qtype, xq, 4)
        monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
        _assert_same_bits(emulate(w, qtype, xq, 4), serial, qtype)
        monkeypatch.undo()
        _assert_same_bits(serial, reference(w, qtype, xq, 4), qtype)


def test_exactness_bound():
    """The float32 integer sums are exact: the largest one is below 2**24."""
    assert fast._EXACT < 2**24
    assert fast._EXACT >= 4 * 32 * 128 * 128  # Q6_K: 4 x |q - 32| x |q8| x |scale|
