"""q8_1 activation quantization: emulator bytes vs an independent numpy version, accuracy, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.backends import get_backend
from hiraishin.errors import BackendError, QuantError
from hiraishin.fp import f32_to_f16_bits
from hiraishin.quant import dequantize
from numba import njit


def quantize_q8_1(x, backend: str = "cpu", layout=None):
    return get_backend(backend).quantize_q8_1(x, layout)


def dequantize_q8_1(xq):
    """float64 f(d) * q of q8_1 bytes (ncols, K)."""
    return dequantize(xq, "Q8_1").astype(np.float64)


def _numpy_q8_1(x: np.ndarray) -> np.ndarray:
    """The same algorithm written with vectorized numpy float32 ops (IEEE, like the kernel)."""
    ncols, k = x.shape
    blocks = x.reshape(ncols, k // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    # xor butterfly: lane 0 after offsets 16, 8, 4, 2, 1 is this halving tree
    s = blocks.copy()
    for off in (16, 8, 4, 2, 1):
        s = s[..., :off] + s[..., off:2 * off]
    total = s[..., 0]
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (blocks / d[..., None]).astype(np.float32)
    # round half away from zero, exactly (float64 holds |r| + 0.5 without rounding)
    r64 = ratio.astype(np.float64)
    q = np.where(amax[..., None] == 0, 0, np.sign(r64) * np.floor(np.abs(r64) + 0.5)).astype(np.int8)
    out = np.empty((ncols, k // 32, 36), dtype=np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = total.astype(np.float16)[..., None].view(np.uint8)
    out[..., 4:] = q.view(np.uint8)
    return out.reshape(ncols, -1)


def _inputs(seed: int, ncols: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ncols, k)) * rng.uniform(0.01, 50.0, size=(ncols, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0, q = 0
    # amax 127 makes d exactly 1, so these ratios are exact halves: half away from zero
    x[-1, 32:64] = 0.0
    x[-1, 32:40] = [127.0, 63.5, -63.5, 2.5, -2.5, 0.5, -0.5, 1.5]
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emulator_matches_numpy_bytes(seed):
    x = _inputs(seed, ncols=5, k=1024)
    got = quantize_q8_1(x, "cpu")
    assert got.shape == (5, 1024 // 32 * 36) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, _numpy_q8_1(x))


def test_zero_block_and_rounding_rule():
    x = _inputs(3, ncols=2, k=256)
    q = quantize_q8_1(x, "cpu")
    blk0 = q[0, :36]
    assert blk0[:2].view(np.float16)[0] == 0 and not blk0[4:].any()
    blk1 = q[1, 36:72]
    assert blk1[:2].view(np.float16)[0] == 1.0
    assert list(blk1[4:12].view(np.int8)) == [127, 64, -64, 3, -3, 1, -1, 2]


def test_sum_is_of_unquantized_values_in_butterfly_order():
    x = _inputs(4, ncols=3, k=512)
    q = quantize_q8_1(x, "cpu").reshape(3, -1, 36)
    s = q[..., 2:4].copy().view(np.float16)[..., 0]
    blocks = x.reshape(3, -1, 32).astype(np.float64).sum(-1)
    np.testing.assert_allclose(s.astype(np.float64), blocks, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("seed", [5, 6])
def test_dequantized_close_to_input(seed):
    """|f(h(d)) q - x| <= d/2 + |d - h(d)| * 127 <= 0.57 * amax / 127 for every value."""
    x = _inputs(seed, ncols=4, k=2048)
    back = dequantize_q8_1(quantize_q8_1(x, "cpu"))
    amax = np.abs(x.reshape(4, -1, 32)).max(-1).astype(np.float64)
    bound = np.repeat(0.57 * amax / 127.0, 32, axis=1)
    assert (np.abs(back - x) <= bound).all()


@njit(cache=True)
def _convert_all(a, out):
    for i in range(a.size):
        out[i] = f32_to_f16_bits(a[i])


def test_f32_to_f16_bits_matches_numpy():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0x33000000, 0x47800000, size=200_000, dtype=np.uint64).astype(np.uint32)
    a = np.concatenate([bits, near, np.array([0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001], np.uint32)])
    a = a.view(np.float32)
    out = np.empty(a.size, np.int64)
    _convert_all(a, out)
    with np.errstate(over="ignore"):
        ref = a.astype(np.float16).view(np.uint16).astype(np.int64)
    finite = ~np.isnan(a)
    np.testing.assert_array_equal(out[finite], ref[finite])
    assert ((out[~finite] & 0x7C00) == 0x7C00).all() and ((out[~finite] & 0x3FF) != 0).all()


@settings(max_examples=25, deadline=None)
@given(
    ncols=st.integers(1, 3),
    k=st.integers(1, 200),
    dtype=st.sampled_from([np.float32, np.float64, np.float16]),
)
def test_bad_inputs_raise_quant_error(ncols, k, dtype):
    x = np.zeros((ncols, k), dtype=dtype)
    if dtype == np.float32 and k % 32 == 0:
        assert quantize_q8_1(x).shape == (ncols, k // 32 * 36)
        return
    with pytest.raises(QuantError, match=r"\(%d, %d\)" % (ncols, k)):
        quantize_q8_1(x)


def test_bad_backend_and_array_type():
    x = np.zeros((1, 32), np.float32)
    with pytest.raises(BackendError, match="backend"):
        quantize_q8_1(x, "tpu")
    # a list becomes a float64 array: the error names the dtype the kernel cannot take
    with pytest.raises(QuantError, match="float64"):
        quantize_q8_1(x.tolist(), "cpu")
    with pytest.raises(QuantError):
        quantize_q8_1(np.zeros(32, np.float32))
