"""CPU: the dp4a kernel for short rows (plans/subblock.py HIRAISHIN_SUBBLOCK_DP4A_SHORT; onecol_dp4a.cu HX_RPW rows a
warp on groups of 2 HX_NB lanes) gives the emulator's bits on the g++ shim.

Rows of 1, 2, 4 and 8 super-blocks (the 0.6B draft's K = 1024 and 2048 among them), both weight types, row counts the
CUDA block does not divide, Q6_K buffers 2 bytes past a word, the activations' shared copy on and off, weights in
ggml's rows and in tiles, one weight per launch and three in one multi launch; a mutant adding the segments in reverse
must fail. The plan switch is checked without a compiler.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cuda_shim import run  # noqa: E402
from test_mmq import _inputs  # noqa: E402
from test_mmq_dp4a import MAIN, MULTI_MAIN, _reverse_segments, builder  # noqa: E402,F401  (builder: the fixture)

from hiraishin.kernels.mmq import emulate  # noqa: E402
from hiraishin.kernels.mmq.wtile import tile_weight  # noqa: E402
from hiraishin.kernels.quantize.layout import as_layout  # noqa: E402

sb = importlib.import_module("hiraishin.plans.subblock")
mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # (the package's `launch` is a function)


@pytest.fixture
def short(monkeypatch):
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_SHORT", True)


def test_plan_takes_short_rows_only_when_asked(monkeypatch):
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_SHORT", False)
    assert sb.subblock_plan(1, "Q4_K", 1024).kernel == "onecol"
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_SHORT", True)
    for k, rpw in ((256, 16), (512, 8), (1024, 4), (2048, 2)):
        plan = sb.subblock_plan(1, "Q4_K", k)
        assert plan.kernel == "dp4a" and plan.nseg == k // 256 and plan.tile_rows == plan.nwarps * rpw, plan
    assert sb.subblock_plan(1, "Q4_K", 3072).kernel == "onecol"  # 12 super-blocks: 16 is no multiple of 12
    assert sb.subblock_plan(2, "Q4_K", 1024).kernel == "mma"  # one column only
    assert sb.subblock_plan(1, "Q4_K", 4096).tile_rows == sb.SUBBLOCK_DP4A_NWARPS  # (rows of 16: a warp a row)
    d = mmq_launch.kernel_defines(sb.subblock_plan(1, "Q6_K", 1024))
    assert d["HX_NB"] == d["HX_NSEG"] == 4 and d["HX_WSTAGE"] == 0  # (the weight copies are of rows of 16)


def _run(builder, tmp_path, qtype, k, n, shift=0, xstage=1, tiles=False, edit=None, seed=5):
    plan = sb.subblock_plan(1, qtype, k)
    assert plan.kernel == "dp4a"
    w, xq = _inputs(qtype, k, n, ncols=1, seed=seed)
    (tile_weight(w, qtype) if tiles else w).tofile(tmp_path / "w.bin")
    as_layout(xq, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
    defines = dict(mmq_launch.kernel_defines(plan, wtile=tiles), HX_SHIM=1, HX_XSTAGE=xstage)
    exe = builder.build(mmq_launch.DP4A_SOURCE, defines, MAIN, f"dp4a_short{xstage}{int(tiles)}", edit=edit)
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, shift, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    return got, emulate(w, qtype, xq, sb.subblock_plan(1, qtype, k))[0]


# (type, K, rows, weight offset, activation copy, tiles): rows the block (8 warps x rows a warp) does not divide
CASES = [("Q4_K", 1024, 37, 0, 1, False), ("Q4_K", 2048, 21, 0, 0, False), ("Q6_K", 1024, 45, 2, 1, False),
         ("Q6_K", 512, 70, 0, 0, False), ("Q4_K", 256, 33, 0, 1, False), ("Q4_K", 1024, 64, 0, 1, True),
         ("Q6_K", 2048, 48, 0, 1, True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-K{c[1]}-n{c[2]}-at{c[3]}-x{c[4]}-t{int(c[5])}")
def test_short_rows_equal_emulator_on_cpu(builder, tmp_path, short, case):
    qtype, k, n, shift, xstage, tiles = case
    got, ref = _run(builder, tmp_path, qtype, k, n, shift, xstage, tiles)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"{case}")


def test_segments_in_another_order_are_seen(builder, tmp_path, short):
    got, ref = _run(builder, tmp_path, "Q4_K", 2048, 96, edit=_reverse_segments, seed=9)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-3)  # the same sums,
    assert not np.array_equal(got.view(np.uint32), ref.view(np.uint32))  # other bits


@pytest.mark.parametrize("qtype,k", [("Q4_K", 1024), ("Q6_K", 2048)])
def test_short_rows_multi_equals_separate_emulators_on_cpu(builder, tmp_path, short, qtype, k):
    from hiraishin.quant import random_blocks

    plan = sb.subblock_plan(1, qtype, k)
    ns = (37, 5, 64)
    ws = [random_blocks(qtype, n, k, seed=50 + i) for i, n in enumerate(ns)]
    _, xq = _inputs(qtype, k, 1, ncols=1, seed=6)
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    as_layout(xq, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
    exe = builder.build(mmq_launch.DP4A_SOURCE, dict(mmq_launch.kernel_defines(plan), HX_SHIM=1), MULTI_MAIN,
                        "dp4a_short_multi")
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", *ns, 1, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    at = 0
    for w, n in zip(ws, ns):
        ref = emulate(w, qtype, xq, sb.subblock_plan(1, qtype, k))
        np.testing.assert_array_equal(got[at:at + n].view(np.uint32), ref[0].view(np.uint32), err_msg=f"{n} rows")
        at += n


def test_short_rows_compile_without_local_memory(tmp_path, short):
    import shutil
    import subprocess

    from hiraishin.kernels.compile import NVRTC_OPTIONS, defines_text, load_source

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    for qtype, k in (("Q4_K", 1024), ("Q6_K", 2048)):
        plan = sb.subblock_plan(1, qtype, k)
        src = tmp_path / "dp4a.cu"
        src.write_text(defines_text(mmq_launch.kernel_defines(plan)) + load_source(*mmq_launch.kernel_source(plan)))
        proc = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-o", str(tmp_path / "dp4a.cubin"), *NVRTC_OPTIONS,
                               "-Xptxas", "-v", str(src)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "0 bytes stack frame" in proc.stderr and " bytes stack frame" in proc.stderr
        assert all(b == "0" for b in re.findall(r"(\d+) bytes stack frame", proc.stderr)), proc.stderr
