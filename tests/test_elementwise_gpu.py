"""CUDA elementwise kernels == their CPU emulators, bit for bit (needs CuPy and a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.backends import get_backend

pytestmark = pytest.mark.gpu

CPU = get_backend("cpu")  # the emulators


def _cuda():
    return get_backend("cuda")  # the kernels


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("n,rows", [(128, 1), (128, 96), (1024, 3), (4096, 9), (1056, 2)])
def test_rms_norm_kernel_equals_emulator(n, rows):
    import cupy as cp


    rng = np.random.default_rng(n + rows)
    x = (rng.standard_normal((rows, n)) * 7).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    got = cp.asnumpy(_cuda().rms_norm(cp.asarray(x), cp.asarray(w), 1e-6))
    assert np.array_equal(_bits(got), _bits(CPU.rms_norm(x, w, 1e-6)))


def test_rope_kernel_equals_emulator():
    import cupy as cp

    from hiraishin.kernels.rope import rope_tables

    cos_t, sin_t = rope_tables(600, 128, 1e6)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 16, 128)).astype(np.float32)
    pos = np.array([0, 1, 255, 256, 300, 511, 599], np.int32)
    got = cp.asnumpy(_cuda().rope(cp.asarray(x), pos, cp.asarray(cos_t), cp.asarray(sin_t)))
    assert np.array_equal(_bits(got), _bits(CPU.rope(x, pos, cos_t, sin_t)))


def test_swiglu_and_add_kernels_equal_emulators():
    import cupy as cp


    rng = np.random.default_rng(2)
    g = np.concatenate([rng.standard_normal(100_000) * 6, [-100.0, -88.5, -87.0, -0.0, 0.0, 88.5, 1e30]])
    g = g.astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    got = cp.asnumpy(_cuda().swiglu(cp.asarray(g), cp.asarray(u)))
    assert np.array_equal(_bits(got), _bits(CPU.swiglu(g, u)))
    got = cp.asnumpy(_cuda().add(cp.asarray(g), cp.asarray(u)))
    assert np.array_equal(_bits(got), _bits(CPU.add(g, u)))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16", "F32"])
def test_get_rows_kernel_equals_emulator(qtype):
    import cupy as cp

    from hiraishin.quant import quantize

    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 768)).astype(np.float32)
    table = quantize(x, qtype)
    ids = np.array([32, 0, 5, 5, 17], np.int32)
    got = cp.asnumpy(_cuda().get_rows(cp.asarray(table), qtype, ids))
    assert np.array_equal(_bits(got), _bits(CPU.get_rows(table, qtype, ids)))


@pytest.mark.parametrize("n", [151936, 3000, 17])
def test_argmax_rows_kernel_equals_numpy(n):
    import cupy as cp

    rng = np.random.default_rng(n)
    x = rng.standard_normal((6, n)).astype(np.float32)
    x[0, [n // 3, n // 2, n - 1]] = 40.0  # a tie: the first index
    x[1, [2, n - 2]] = np.nan  # NaN counts as the largest
    x[2, :] = -np.inf
    x[3, :] = 0.0
    x[3, 1] = -0.0
    x[4, n - 1] = 1e30
    got = cp.asnumpy(_cuda().argmax_rows(cp.asarray(x)))
    assert got.tolist() == np.argmax(x, axis=1).tolist() == CPU.argmax_rows(x).tolist()
