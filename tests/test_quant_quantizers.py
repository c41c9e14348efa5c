"""Quantizers vs llama.cpp's reference algorithms (ggml/src/ggml-quants.c).

The first half of this file is a plain scalar transliteration of quantize_row_q4_K_ref
(+ make_qkx2_quants), quantize_row_q6_K_ref (+ make_qx_quants) and quantize_row_q8_1_ref:
one block at a time, loops and np.float32 scalars, statements in C order.  It is the
independent check that the vectorized quantizers in hiraishin.quant give the same bytes.
gguf 0.19 implements only Q8_0 of these (no Q4_K/Q6_K/Q8_1 quantize), so Q8_0 is also
compared to gguf directly.
"""

from __future__ import annotations

import struct
import warnings

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiraishin import quant as Q

# ----------------------------------------------------------------------------------------
# Scalar transliteration of the C reference (slow; a few blocks per test).
# ----------------------------------------------------------------------------------------

F = np.float32
QK_K = 256
GROUP_MAX_EPS = F(1e-15)


def nearest_int(f) -> int:
    val = F(F(f) + F(12582912.0))
    (i,) = struct.unpack("<i", struct.pack("<f", val))
    return (i & 0x007FFFFF) - 0x00400000


def roundf(f) -> float:
    f = float(F(f))
    a = abs(f)
    r = float(np.floor(a))
    if a - r >= 0.5:
        r += 1.0
    return -r if f < 0 else r


def c_int8(f) -> int:
    """(int8_t)f on x86-64: cvttss2si (INT32_MIN for NaN/inf/out of range), low byte."""
    f = float(f)
    v = int(f) if np.isfinite(f) and abs(f) < 2.0**31 else -(2**31)
    return ((v & 0xFF) ^ 0x80) - 0x80


def h_bits(f) -> int:
    return int(np.array([F(f)], dtype=np.float32).astype(np.float16).view(np.uint16)[0])


def h_val(bits: int) -> np.float32:
    return F(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def make_qkx2_quants(n, nmax, x, weights, rmin, rdelta, nstep):
    """Returns (scale, the_min, L list) -- use_mad = false."""
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = F(sum_w * x[0])
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w = F(sum_w + w)
        sum_x = F(sum_x + F(w * x[i]))
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return F(0), F(-mn), [0] * n
    iscale = F(F(nmax) / F(mx - mn))
    scale = F(F(1) / iscale)
    best_error = F(0)
    L = [0] * n
    for i in range(n):
        l = nearest_int(F(iscale * F(x[i] - mn)))
        L[i] = max(0, min(nmax, l))
        diff = F(F(F(scale * F(L[i])) + mn) - x[i])
        diff = F(diff * diff)
        best_error = F(best_error + F(weights[i] * diff))
    for is_ in range(nstep + 1):
        iscale = F(F(F(rmin + F(rdelta * F(is_))) + F(nmax)) / F(mx - mn))
        sum_l = sum_l2 = sum_xl = F(0)
        Laux = [0] * n
        for i in range(n):
            l = nearest_int(F(iscale * F(x[i] - mn)))
            l = max(0, min(nmax, l))
            Laux[i] = l
            w = weights[i]
            wl = F(w * F(l))
            sum_l = F(sum_l + wl)
            sum_l2 = F(sum_l2 + F(wl * F(l)))
            sum_xl = F(sum_xl + F(wl * x[i]))
        D = F(F(sum_w * sum_l2) - F(sum_l * sum_l))
        if D > 0:
            this_scale = F(F(F(sum_w * sum_xl) - F(sum_x * sum_l)) / D)
            this_min = F(F(F(sum_l2 * sum_x) - F(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = F(0)
                this_scale = F(sum_xl / sum_l2)
            cur_error = F(0)
            for i in range(n):
                diff = F(F(F(this_scale * F(Laux[i])) + this_min) - x[i])
                diff = F(diff * diff)
                cur_error = F(cur_error + F(weights[i] * diff))
            if cur_error < best_error:
                L = list(Laux)
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, F(-mn), L


def quantize_block_q4_k(x) -> bytes:
    x = [F(v) for v in x]
    L = [0] * QK_K
    scales = [F(0)] * 8
    mins = [F(0)] * 8
    max_scale = F(0)
    max_min = F(0)
    for j in range(8):
        sub = x[32 * j : 32 * j + 32]
        sum_x2 = F(0)
        for v in sub:
            sum_x2 = F(sum_x2 + F(v * v))
        av_x = F(np.sqrt(F(sum_x2 / F(32))))
        weights = [F(av_x + F(abs(v))) for v in sub]
        s, m, Lj = make_qkx2_quants(32, 15, sub, weights, F(-1.0), F(0.1), 20)
        scales[j], mins[j] = s, m
        L[32 * j : 32 * j + 32] = Lj
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = F(F(63) / max_scale) if max_scale > 0 else F(0)
    inv_min = F(F(63) / max_min) if max_min > 0 else F(0)
    sb = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(F(inv_scale * scales[j])) & 0xFF)
        lm = min(63, nearest_int(F(inv_min * mins[j])) & 0xFF)
        if j < 4:
            sb[j] = ls
            sb[j + 4] = lm
        else:
            sb[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sb[j - 4] |= (ls >> 4) << 6
            sb[j] |= (lm >> 4) << 6
    d = h_bits(F(max_scale / F(63)))
    dmin = h_bits(F(max_min / F(63)))
    for j in range(8):
        if j < 4:
            sc, m = sb[j] & 63, sb[j + 4] & 63
        else:
            sc = (sb[j + 4] & 0xF) | ((sb[j - 4] >> 6) << 4)
            m = (sb[j + 4] >> 4) | ((sb[j] >> 6) << 4)
        dd = F(h_val(d) * F(sc))
        if dd == 0:
            continue
        dm = F(h_val(dmin) * F(m))
        for ii in range(32):
            l = nearest_int(F(F(x[32 * j + ii] + dm) / dd))
            L[32 * j + ii] = max(0, min(15, l))
    qs = []
    for j in range(0, QK_K, 64):
        qs += [L[j + l] | (L[j + l + 32] << 4) for l in range(32)]
    return struct.pack("<HH", d, dmin) + bytes(sb) + bytes(qs)


def make_qx_quants(n, nmax, x):
    """rmse_type = 1, qw = NULL.  Returns (scale, L list of 0..2*nmax-1)."""
    mx = F(0)
    amax = F(0)
    for i in range(n):
        ax = F(abs(x[i]))
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        return F(0), [0] * n
    iscale = F(F(-nmax) / mx)
    sumlx = suml2 = F(0)
    L = [0] * n
    for i in range(n):
        l = nearest_int(F(iscale * x[i]))
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
        w = F(x[i] * x[i])
        sumlx = F(sumlx + F(F(w * x[i]) * F(l)))
        suml2 = F(suml2 + F(F(w * F(l)) * F(l)))
    scale = F(sumlx / suml2) if suml2 != 0 else F(0)
    best = F(scale * sumlx)
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = F(F(-F(F(nmax) + F(F(0.1) * F(is_)))) / mx)
        sumlx = suml2 = F(0)
        for i in range(n):
            l = nearest_int(F(iscale * x[i]))
            l = max(-nmax, min(nmax - 1, l))
            w = F(x[i] * x[i])
            sumlx = F(sumlx + F(F(w * x[i]) * F(l)))
            suml2 = F(suml2 + F(F(w * F(l)) * F(l)))
        if suml2 > 0 and F(sumlx * sumlx) > F(best * suml2):
            for i in range(n):
                l = nearest_int(F(iscale * x[i]))
                L[i] = nmax + max(-nmax, min(nmax - 1, l))
            scale = F(sumlx / suml2)
            best = F(scale * sumlx)
    return scale, L


def quantize_block_q6_k(x) -> bytes:
    x = [F(v) for v in x]
    L = [0] * QK_K
    scales = [F(0)] * 16
    max_scale = F(0)
    max_abs_scale = F(0)
    for ib in range(16):
        s, Lb = make_qx_quants(16, 32, x[16 * ib : 16 * ib + 16])
        scales[ib] = s
        L[16 * ib : 16 * ib + 16] = Lb
        a = F(abs(s))
        if a > max_abs_scale:
            max_abs_scale = a
            max_scale = s
    if max_abs_scale < GROUP_MAX_EPS:
        return bytes(210)
    iscale = F(F(-128) / max_scale)
    d = h_bits(F(F(1) / iscale))
    sc = [0] * 16
    for ib in range(16):
        v = min(127, nearest_int(F(iscale * scales[ib])))
        sc[ib] = ((v + 128) & 0xFF) - 128  # int -> int8_t store
    for j in range(16):
        dd = F(h_val(d) * F(sc[j]))
        if dd == 0:
            continue
        for ii in range(16):
            l = nearest_int(F(x[16 * j + ii] / dd))
            L[16 * j + ii] = max(-32, min(31, l)) + 32
    ql = [0] * 128
    qh = [0] * 64
    for half, j in enumerate(range(0, QK_K, 128)):
        for l in range(32):
            q1, q2, q3, q4 = (L[j + l + 32 * k] & 0xF for k in range(4))
            ql[64 * half + l] = q1 | (q3 << 4)
            ql[64 * half + l + 32] = q2 | (q4 << 4)
            qh[32 * half + l] = (
                (L[j + l] >> 4)
                | ((L[j + l + 32] >> 4) << 2)
                | ((L[j + l + 64] >> 4) << 4)
                | ((L[j + l + 96] >> 4) << 6)
            )
    return bytes(ql) + bytes(qh) + bytes(s & 0xFF for s in sc) + struct.pack("<H", d)


def quantize_block_q8_1(x) -> bytes:
    x = [F(v) for v in x]
    amax = F(0)
    for v in x:
        a = F(abs(v))
        amax = amax if amax > a else a
    d = F(amax / F(127))
    inv = F(F(1) / d) if d != 0 else F(0)
    qs = [0] * 32
    total = 0
    for j in range(16):
        qs[j] = c_int8(roundf(F(x[j] * inv)))
        qs[16 + j] = c_int8(roundf(F(x[16 + j] * inv)))
        total += qs[j] + qs[16 + j]
    return struct.pack("<HH", h_bits(d), h_bits(F(F(total) * d))) + bytes(q & 0xFF for q in qs)


def scalar_quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """Rows of x through the scalar transliteration, one block at a time -> uint8 rows."""
    block = {"Q4_K": quantize_block_q4_k, "Q6_K": quantize_block_q6_k, "Q8_1": quantize_block_q8_1}[qtype]
    qk = Q.BLOCK_ELEMS[qtype]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        rows = [b"".join(block(r[k : k + qk]) for k in range(0, r.size, qk)) for r in x]
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(x.shape[0], -1)


# ----------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------


def awkward_blocks(seed: int = 7) -> np.ndarray:
    """One 256-value block per row, each hitting a special path of the reference code."""
    rng = np.random.default_rng(seed)
    n = rng.standard_normal((24, 256)).astype(np.float32)
    rows = [
        np.zeros(256),  # all zero: flat sub-blocks, empty Q6_K block
        np.full(256, 3.0),  # constant positive: min clamps to 0
        np.full(256, -2.0),  # constant negative: max == min -> flat, the_min = 2
        np.where(np.arange(256) == 37, 100.0, n[0] * 0.01),  # one outlier
        n[1] * 1e-30,  # tiny: below GROUP_MAX_EPS (Q6_K), fp16 scale underflows (Q4_K)
        n[2] * 1e-6,  # fp16 subnormal scales
        n[3] * 3e-5,
        np.abs(n[4]),  # all positive
        -np.abs(n[5]),  # all negative
        np.where(n[6] > 0, n[6], 0.0),  # half zeros
        np.round(n[7] * 4) / 4,  # few distinct values: rounding ties
        np.tile([0.5, -0.5, 1.5, -2.5, 0.0, 127.0, -127.0, 63.5], 32),  # exact .5 ties
        n[8] * 1e4,
        n[9] * 1e7,  # fp16 scale overflows to inf
        n[10] * 1e30,  # squared sums overflow to inf in float32
        np.concatenate([np.zeros(128), n[11, :128]]),  # zero and non-zero sub-blocks side by side
        np.concatenate([n[12, :16] * 1e-20, n[12, 16:]]),  # one tiny sub-block among normal ones
        n[13] + 5.0,  # offset: large min
        n[14] * np.float32(1e-40),  # float32 subnormals
        np.where(np.arange(256) % 2 == 0, 1.0, -1.0),  # alternating signs
    ]
    return np.asarray(rows, dtype=np.float32)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_kquant_matches_scalar_reference_on_awkward_blocks(qtype):
    x = awkward_blocks()
    got = Q.quantize(x, qtype)
    want = scalar_quantize(x, qtype)
    bad = [i for i in range(x.shape[0]) if not np.array_equal(got[i], want[i])]
    assert bad == [], f"{qtype}: rows {bad} differ from the scalar reference"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_kquant_matches_scalar_reference_on_gaussian_rows(qtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 10, (6, 1))).astype(np.float32)
    assert np.array_equal(Q.quantize(x, qtype), scalar_quantize(x, qtype))


def _block_strategy():
    """256-value blocks: arbitrary finite float32, or small-integer patterns times a power of
    two (exact rounding ties, repeated values), with some zeroed sub-blocks."""
    f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
    arbitrary = st.lists(f32, min_size=256, max_size=256)
    patterned = st.builds(
        lambda ints, e, zero_mask: [
            0.0 if zero_mask >> (i // 32) & 1 else float(v) * 2.0**e for i, v in enumerate(ints)
        ],
        st.lists(st.integers(-8, 8), min_size=256, max_size=256),
        st.integers(-140, 100),
        st.integers(0, 255),
    )
    scaled = st.builds(
        lambda seed, e: (np.random.default_rng(seed).standard_normal(256) * 10.0**e).tolist(),
        st.integers(0, 2**32 - 1),
        st.integers(-38, 30),
    )
    return st.one_of(arbitrary, patterned, scaled).map(lambda v: np.asarray(v, dtype=np.float32)[None, :])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=_block_strategy(), qtype=st.sampled_from(["Q4_K", "Q6_K"]))
def test_kquant_matches_scalar_reference_property(x, qtype):
    assert np.array_equal(Q.quantize(x, qtype), scalar_quantize(x, qtype))


def test_q8_0_matches_gguf():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    x[0] = 0.0
    x[1, :32] = np.tile([0.5, -0.5, 1.5, -2.5, 127.0, -126.5, 3.5, 0.0], 4)  # d = 1: exact ties
    x[2] *= 1e-6
    x[3] *= 1e6
    x[4, 5] = 1e4
    got = Q.quantize(x, "Q8_0")
    assert np.array_equal(got, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0))
    # roundf is half away from zero: 0.5 -> 1, -0.5 -> -1, 1.5 -> 2, -2.5 -> -3
    qs = got[1, 2:34].view(np.int8)[:8]
    assert qs.tolist() == [1, -1, 2, -3, 127, -127, 4, 0]


@settings(max_examples=40, deadline=None)
@given(x=_block_strategy())
def test_q8_0_matches_gguf_property(x):
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(Q.quantize(x, "Q8_0"), want)


def test_q8_1_ref_matches_scalar_reference():
    x = np.concatenate([awkward_blocks(), np.random.default_rng(5).standard_normal((4, 256))]).astype(np.float32)
    got = Q.quantize_q8_1_ref(x)
    assert np.array_equal(got, scalar_quantize(x, "Q8_1"))


def test_q8_1_ref_sum_field_is_d_times_quant_sum():
    x = np.random.default_rng(9).standard_normal((8, 128)).astype(np.float32)
    blocks = Q.as_blocks(Q.quantize_q8_1_ref(x), "Q8_1")
    xb = x.reshape(8, 4, 32)
    d = np.abs(xb).max(axis=-1) / np.float32(127)  # the fp32 d, before fp16 rounding
    qsum = blocks["qs"].astype(np.int32).sum(axis=-1).astype(np.float32)
    assert np.array_equal(blocks["s"], (qsum * d).astype(np.float16))
    assert np.array_equal(blocks["d"], d.astype(np.float16))
    # q8_0 and q8_1 share d and qs
    q80 = Q.as_blocks(Q.quantize(x, "Q8_0"), "Q8_0")
    assert np.array_equal(q80["qs"], blocks["qs"]) and np.array_equal(q80["d"], blocks["d"])


def test_float_conversions_match_gguf():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-45, 39, 4096)).astype(np.float32)
    x[:6] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0]
    bf = Q.quantize(x, "BF16")
    assert bf.dtype == np.uint16
    assert np.array_equal(bf.view(np.uint8), gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint8))
    with np.errstate(over="ignore"):
        assert np.array_equal(Q.quantize(x, "F16").view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert np.array_equal(Q.quantize(x, "F32").view(np.uint32), x.view(np.uint32))


# Quantize -> dequantize RMSE on N(0,1) data (seed 0, 256 rows x 1024 values), measured with
# this implementation: Q8_0 0.005369, Q8_1 0.005369, Q6_K 0.017776, Q4_K 0.071552.
# The window is +-2 %: it catches a changed algorithm, not just a broken one.
RMSE_N01 = {"Q8_0": 0.005369, "Q8_1": 0.005369, "Q6_K": 0.017776, "Q4_K": 0.071552}


@pytest.mark.parametrize("qtype", sorted(RMSE_N01))
def test_roundtrip_rmse_on_gaussian(qtype):
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    y = Q.dequantize(Q.quantize(x, qtype), qtype)
    rmse = float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)))
    assert 0.98 * RMSE_N01[qtype] <= rmse <= 1.02 * RMSE_N01[qtype], f"{qtype}: rmse {rmse:.6f}"
