"""GPU: the stock MMQ kernel (hiraishin/kernels/mmq_stock) equals its emulator bit for bit.

The Qwen3-8B mat-vec shapes at widths 9..16, 64 and 512 (prefill: J = 128, several column
tiles), on this GPU's SM count (the order's stream-k split depends on it) and on the H200
profile's, rows that the 128-row tile does not divide; no register spills. Large N: a fixed
subset of rows is emulated (the emulator takes the launch's pieces for the full weight).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

WIDTHS = list(range(9, 17)) + [64, 512]
SHAPES = [  # (qtype, K, N)
    ("Q4_K", 4096, 4096), ("Q4_K", 4096, 1024), ("Q4_K", 4096, 12288),
    ("Q6_K", 12288, 4096), ("Q6_K", 4096, 151936),
    ("Q4_K", 4096, 1003), ("Q6_K", 768, 200),
]
MAX_CHECKED_ROWS = 256


def _row_ranges(n):
    """Row ranges compared: all rows of small N, else the first 130 (two tiles), 100 in the middle, the last 40."""
    if n <= MAX_CHECKED_ROWS:
        return [(0, n)]
    mid = n // 2 - 37
    return [(0, 130), (mid, mid + 100), (n - 40, n)]


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("qtype,k,n", SHAPES)
def test_kernel_equals_emulator(cp, qtype, k, n):
    from hiraishin.devices import DeviceProfile, current_device
    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq_stock import emulate, launch
    from hiraishin.plans.mmq_stock import mmq_stock_plan
    from hiraishin.quant import random_blocks

    w = random_blocks(qtype, n, k, seed=k + n)
    x = np.random.default_rng(n).standard_normal((max(WIDTHS), k)).astype(np.float32)
    xq = quantize.emulate(x)
    w_d = cp.asarray(w)
    xq_d = cp.asarray(xq)
    here = current_device()
    # the H200 profile, this GPU's SM count, and a few SMs (tiles split into many pieces)
    devices = ["h200"] + ([here] if here.sm_count != 132 else []) + [
        DeviceProfile(name="7 SMs", compute_capability=900, sm_count=7)]
    for device in devices:
        for wd in WIDTHS:
            plan = mmq_stock_plan(wd, qtype, k, n, device)
            out = cp.full((wd, n), cp.nan, dtype=cp.float32)
            launch(w_d, qtype, xq_d[:wd], plan, out)
            got = cp.asnumpy(out)
            assert np.isfinite(got).all(), (wd, "unwritten outputs")
            for a, b in _row_ranges(n):
                ref = emulate(w[a:b], qtype, xq[:wd], plan, row0=a)
                np.testing.assert_array_equal(got[:, a:b].view(np.uint32), ref.view(np.uint32),
                                              err_msg=f"{qtype} K={k} N={n} width={wd} rows {a}..{b} "
                                                      f"SMs={plan.sm_count}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_no_register_spills(cp, qtype):
    from hiraishin.kernels.compile import kernel_attributes
    from hiraishin.kernels.mmq_stock.launch import _kernels
    from hiraishin.plans.mmq_stock import mmq_stock_plan

    for k in (4096, 12288):
        for wd in (9, 16, 64, 512):
            main, fixup = _kernels(mmq_stock_plan(wd, qtype, k, 4096))
            for kern in (main, fixup):
                attrs = kernel_attributes(kern)
                print(qtype, k, wd, attrs)
                assert attrs["local_size_bytes"] == 0, (qtype, k, wd, attrs)
