"""CPU: the sub-block order's one-column dp4a kernel (hiraishin/kernels/mmq/onecol_dp4a.cu) gives the emulator's bits.

The very CUDA source runs on the g++ shim (tests/cuda_shim.py): both weight types, rows of 16 and 48 super-blocks
(the Qwen3-8B's K = 4096 and 12288: one and three 128-value halves per lane), row counts the 4-row CUDA block does
not divide, Q6_K super-blocks at both 4-byte alignments (and a weight buffer starting 2 bytes past a word), one
weight per launch and three in one hx_mmq_dp4a_multi launch. Mutants of the order (the segments added in reverse;
each segment's second lane starting its chain from 0 and adding the first lane's value after) must fail, so the
comparison can see an order change. The plan switch (HIRAISHIN_SUBBLOCK_DP4A) and the launcher's defines are
checked without a compiler; on a GPU: tests/test_mmq_gpu.py.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cuda_shim import GXX, ShimBuilder, run  # noqa: E402
from test_mmq import MMA_SHIM_H, MMQ_MULTI_MAIN, _inputs  # noqa: E402

from hiraishin.kernels.mmq import emulate  # noqa: E402
from hiraishin.kernels.quantize.layout import as_layout  # noqa: E402
from hiraishin.plans.subblock import SUBBLOCK_DP4A_NWARPS, SubBlockPlan, subblock_plan, subblock_segments  # noqa: E402

MAIN = r"""
int main(int argc, char** argv) {
    // argv: weights, activations (HX_DCOLS columns, MMA layout), nrows, byte offset of the weights in their buffer,
    // out (HX_DCOLS, nrows)
    int nrows = atoi(argv[3]), shift = atoi(argv[4]);
    auto w0 = hx_read(argv[1]); auto x = hx_read(argv[2]);
    std::vector<unsigned char> w(w0.size() + 16);
    std::memcpy(w.data() + shift, w0.data(), w0.size());
    std::vector<float> out((size_t)HX_DCOLS * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + HX_BLOCK_ROWS_DP4A - 1) / HX_BLOCK_ROWS_DP4A), 1, 1}, {32u * HX_NWARPS, 1, 1}, 0,
              [&] { hx_mmq_dp4a(w.data() + shift, x.data(), out.data(), nrows, HX_DCOLS, (long long)nrows); });
    hx_write(argv[5], out.data(), out.size() * 4);
}"""

# test_mmq.py's hx_mmq_multi driver (the dp4a multi kernel takes the same arguments), with the launch facts it reads
# that mmq.cu defines: 4-row CUDA blocks of one column group, every column in the block, no staging
MULTI_MAIN = ("#define HX_BLOCK_ROWS HX_BLOCK_ROWS_DP4A\n#define HX_CGROUPS 1\n#define HX_BLOCK_COLS HX_DCOLS\n"
              "#define HX_STAGE_BYTES 0\n" + MMQ_MULTI_MAIN.replace("hx_mmq_multi(", "hx_mmq_dp4a_multi("))


def _dp4a_plan(qtype: str, k: int, ncols: int = 1) -> SubBlockPlan:
    """The plan subblock_plan gives ``ncols`` columns under HIRAISHIN_SUBBLOCK_DP4A=2 (1: K = 4096 only) and
    HIRAISHIN_SUBBLOCK_DP4A_COLS >= ncols."""
    return SubBlockPlan(qtype=qtype, ncols=ncols, k=k, nseg=subblock_segments(k), kernel="dp4a",
                        tile_rows=SUBBLOCK_DP4A_NWARPS, cols_per_block=ncols, nwarps=SUBBLOCK_DP4A_NWARPS)


@pytest.fixture
def builder(tmp_path):
    if GXX is None:
        pytest.skip("needs g++ (C++20)")
    b = ShimBuilder(tmp_path)
    (tmp_path / "hx_mma_shim.h").write_text(MMA_SHIM_H)
    return b


def _run_one(builder, tmp_path, qtype, k, n, shift, edit=None, seed=3, ncols=1, xstage=0, wstage=0):
    from hiraishin.kernels.mmq.launch import DP4A_SOURCE, activation_layout, kernel_defines

    plan = _dp4a_plan(qtype, k, ncols)
    w, xq = _inputs(qtype, k, n, ncols=ncols, seed=seed)
    w.tofile(tmp_path / "w.bin")
    as_layout(xq, activation_layout(plan)).tofile(tmp_path / "x.bin")
    defines = dict(kernel_defines(plan), HX_SHIM=1, HX_XSTAGE=xstage, HX_WSTAGE=wstage)
    exe = builder.build(DP4A_SOURCE, defines, MAIN, f"dp4a{xstage}{wstage}", edit=edit)
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, shift, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))  # (ncols, n): every column the one-column order
    return (got[0], ref[0]) if ncols == 1 else (got, ref)


# (qtype, K, rows, byte offset of the weight buffer, columns): rows the 4-row block does not divide; K = 12288 Q6_K
# with the buffer 2 bytes past a word (every super-block's alignment flips); 2-4 columns (HX_DCOLS) at K = 4096
CASES = [("Q4_K", 4096, 7, 0, 1), ("Q4_K", 12288, 5, 0, 1), ("Q6_K", 4096, 6, 0, 1), ("Q6_K", 12288, 3, 2, 1),
         ("Q6_K", 8192, 9, 0, 1), ("Q4_K", 4096, 5, 0, 2), ("Q4_K", 4096, 6, 0, 3), ("Q6_K", 4096, 7, 2, 4)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-K{c[1]}-n{c[2]}-at{c[3]}-c{c[4]}")
def test_dp4a_source_equals_emulator_on_cpu(builder, tmp_path, case):
    qtype, k, n, shift, ncols = case
    got, ref = _run_one(builder, tmp_path, qtype, k, n, shift, ncols=ncols)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"{case}")


# HX_XSTAGE=1 (the block's shared copy of its columns): one and three halves a lane, 1-4 columns, rows the block
# does not divide (its last warps copy and wait like the others), a weight buffer 2 bytes past a word
XSTAGE_CASES = [("Q4_K", 4096, 7, 0, 1), ("Q6_K", 12288, 3, 2, 1), ("Q4_K", 12288, 5, 0, 1), ("Q6_K", 4096, 6, 0, 2),
                ("Q4_K", 4096, 5, 0, 3), ("Q6_K", 4096, 9, 2, 4)]


@pytest.mark.parametrize("case", XSTAGE_CASES, ids=lambda c: f"{c[0]}-K{c[1]}-n{c[2]}-at{c[3]}-c{c[4]}")
def test_dp4a_shared_copy_changes_no_bit_on_cpu(builder, tmp_path, case):
    qtype, k, n, shift, ncols = case
    got, ref = _run_one(builder, tmp_path, qtype, k, n, shift, ncols=ncols, xstage=1)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"{case}")


# HX_WSTAGE=1 (the block's shared copy of its weight rows), with and without the activations' copy: 16-byte chunks
# (weights 16-byte aligned) and 2-byte copies (2 bytes past a word: every Q6_K super-block's alignment flips), rows
# the block does not divide (the last rows copied again in their place), 1-4 columns
WSTAGE_CASES = [("Q4_K", 4096, 7, 0, 1, 1), ("Q6_K", 4096, 6, 0, 1, 1), ("Q6_K", 4096, 9, 2, 1, 1),
                ("Q4_K", 4096, 5, 0, 3, 1), ("Q6_K", 4096, 11, 2, 4, 1), ("Q4_K", 4096, 6, 0, 2, 0),
                ("Q6_K", 4096, 3, 2, 1, 0)]


@pytest.mark.parametrize("case", WSTAGE_CASES, ids=lambda c: f"{c[0]}-n{c[2]}-at{c[3]}-c{c[4]}-x{c[5]}")
def test_dp4a_weight_copy_changes_no_bit_on_cpu(builder, tmp_path, case):
    qtype, k, n, shift, ncols, xstage = case
    got, ref = _run_one(builder, tmp_path, qtype, k, n, shift, ncols=ncols, xstage=xstage, wstage=1)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"{case}")


def _copy_rows_shifted(text: str) -> str:
    old = "hx_dp4a_load(ws, HX_NWARPS, (int)(threadIdx.x >> 5), wl);"
    assert old in text
    return text.replace(old, "hx_dp4a_load(ws, HX_NWARPS, min((int)(threadIdx.x >> 5) + 1, HX_NWARPS - 1), wl);")


@pytest.mark.parametrize("shift", [0, 2])
def test_a_wrong_weight_copy_is_seen(builder, tmp_path, shift):
    """Warps reading the next row of the copy: wrong outputs, both copy paths."""
    got, ref = _run_one(builder, tmp_path, "Q6_K", 4096, 9, shift, edit=_copy_rows_shifted, xstage=1, wstage=1)
    assert not np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def _stage_half_one_as_half_zero(text: str) -> str:
    old = "HX_XS_HALF * ((t - 2) >> 3)"
    assert old in text
    return text.replace(old, "0 * ((t - 2) >> 3)")


def test_a_wrong_shared_copy_is_seen(builder, tmp_path):
    """A copy that puts both halves of a super-block in one place: the lanes of half 0 read half 1's values."""
    got, ref = _run_one(builder, tmp_path, "Q4_K", 4096, 5, 0, edit=_stage_half_one_as_half_zero, ncols=2, xstage=1)
    assert not np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def _reverse_segments(text: str) -> str:
    first = "for (int col = 0; col < C; ++col) v[col] = __shfl_sync(0xffffffffu, acc[col], gbase + 1, 32);"
    loop = "for (int s = 1; s < HX_NSEG; ++s)"
    assert first in text and loop in text
    return (text.replace(first, first.replace("gbase + 1, 32", "gbase + 2 * HX_NSEG - 1, 32"))
            .replace(loop, "for (int s = HX_NSEG - 2; s >= 0; --s)"))


def _split_chains(text: str) -> str:
    old = "for (int col = 0; col < C; ++col) acc[col] = __shfl_sync(0xffffffffu, acc[col], lane & ~1, 32);"
    assert old in text
    text = text.replace("    float acc[C];\n", "    float acc[C], hx_first[C];\n", 1)
    text = text.replace(old, "for (int col = 0; col < C; ++col) { hx_first[col] = __shfl_sync(0xffffffffu, acc[col], "
                             "lane & ~1, 32); acc[col] = (lane & 1) ? 0.0f : acc[col]; }")
    anchor = "    // out = seg[0] + seg[1]"
    assert anchor in text
    return text.replace(anchor, "    if (lane & 1) for (int col = 0; col < C; ++col) acc[col] = __fadd_rn(hx_first[col], "
                                "acc[col]);\n" + anchor)


@pytest.mark.parametrize("mutant", [_reverse_segments, _split_chains], ids=["reversed-segments", "split-chains"])
@pytest.mark.parametrize("qtype,ncols", [("Q4_K", 1), ("Q6_K", 1), ("Q4_K", 3)])
def test_an_other_order_is_seen(builder, tmp_path, qtype, ncols, mutant):
    """The same sums in another order round differently somewhere in 64 rows: the comparison above can fail, at one
    column and at several (whose chains and sums interleave)."""
    got, ref = _run_one(builder, tmp_path, qtype, 4096, 64, 0, edit=mutant, seed=9, ncols=ncols)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-3)  # the same sums,
    assert not np.array_equal(got.view(np.uint32), ref.view(np.uint32))  # other bits


@pytest.mark.parametrize("qtype,ncols,xstage,wstage", [("Q4_K", 1, 0, 0), ("Q6_K", 1, 0, 0), ("Q4_K", 3, 0, 0),
                                                      ("Q6_K", 2, 0, 0), ("Q4_K", 1, 1, 0), ("Q6_K", 3, 1, 0),
                                                      ("Q6_K", 1, 1, 1), ("Q4_K", 2, 0, 1)])
def test_dp4a_multi_source_equals_separate_emulators_on_cpu(builder, tmp_path, qtype, ncols, xstage, wstage):
    """Three weights (Q, K and V; or gate, up and a third) in one hx_mmq_dp4a_multi launch: each weight's rows have
    the bits of its own launch, for row counts the 4-row block does not divide, at one and several columns."""
    from hiraishin.kernels.mmq.launch import DP4A_SOURCE, activation_layout, kernel_defines
    from hiraishin.quant import random_blocks

    k, ns = 4096, (9, 5, 6)
    plan = _dp4a_plan(qtype, k, ncols)
    ws = [random_blocks(qtype, n, k, seed=30 + i) for i, n in enumerate(ns)]
    _, xq = _inputs(qtype, k, 1, ncols=ncols, seed=4)
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    as_layout(xq, activation_layout(plan)).tofile(tmp_path / "x.bin")
    exe = builder.build(DP4A_SOURCE, dict(kernel_defines(plan), HX_SHIM=1, HX_XSTAGE=xstage, HX_WSTAGE=wstage),
                        MULTI_MAIN, f"dp4a_multi{xstage}{wstage}")
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", *ns, ncols, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    at = 0
    for w, n in zip(ws, ns):
        ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
        np.testing.assert_array_equal(got[at:at + ncols * n].reshape(ncols, n).view(np.uint32), ref.view(np.uint32),
                                      err_msg=f"{n} rows")
        at += ncols * n


def test_plan_takes_dp4a_only_when_asked_and_only_for_whole_segments(monkeypatch):
    import hiraishin.plans.subblock as sb

    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 0)
    assert sb.subblock_plan(1, "Q4_K", 4096).kernel == "onecol"
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 2)
    for qtype, k in (("Q4_K", 4096), ("Q6_K", 12288), ("Q4_K", 8192)):
        plan = sb.subblock_plan(1, qtype, k, n=1024)
        assert plan == _dp4a_plan(qtype, k)
        assert plan.nseg == 16
    for k in (1024, 3072, 5120):  # fewer than 16 segments, or segments of unequal super-blocks
        assert sb.subblock_plan(1, "Q4_K", k).kernel == "onecol"
    assert sb.subblock_plan(2, "Q4_K", 4096).kernel == "mma"  # one column only
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 1)  # rows of 16 super-blocks only
    assert sb.subblock_plan(1, "Q4_K", 4096) == _dp4a_plan("Q4_K", 4096)
    for qtype, k in (("Q6_K", 12288), ("Q4_K", 8192), ("Q4_K", 3072)):
        assert sb.subblock_plan(1, qtype, k).kernel == "onecol"
    # several columns: up to SUBBLOCK_DP4A_COLS, rows of 16 super-blocks only, at either level
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_COLS", 3)
    for level in (1, 2):
        monkeypatch.setattr(sb, "SUBBLOCK_DP4A", level)
        for wd in (2, 3):
            assert sb.subblock_plan(wd, "Q6_K", 4096, n=151936) == _dp4a_plan("Q6_K", 4096, wd)
        assert sb.subblock_plan(4, "Q4_K", 4096).kernel == "mma"
        assert sb.subblock_plan(2, "Q6_K", 12288).kernel == "mma"
    # several columns for tall weights only (the output head), where asked
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 1)
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_COLS_MIN_ROWS", 65536)
    assert sb.subblock_plan(3, "Q6_K", 4096, n=151936) == _dp4a_plan("Q6_K", 4096, 3)
    for n in (4096, 12288, None):
        assert sb.subblock_plan(3, "Q4_K", 4096, n=n).kernel == "mma"
    assert sb.subblock_plan(1, "Q4_K", 4096, n=1024) == _dp4a_plan("Q4_K", 4096)  # one column: every weight
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 0)
    assert sb.subblock_plan(2, "Q4_K", 4096).kernel == "mma"


# (switch, text, what it reads as; None: a ValueError naming the variable)
SWITCH_TEXTS = [("level", t, v) for t, v in ((None, 1), ("0", 0), (" 1 ", 1), ("2", 2), ("3", None), ("on", None),
                                             ("", 1))] + [
    ("cols", t, v) for t, v in ((None, 1), ("1", 1), (" 4 ", 4), ("0", None), ("5", None), ("x", None))]


@pytest.mark.parametrize("switch,text,want", SWITCH_TEXTS)
def test_dp4a_switches_from_the_environment(monkeypatch, switch, text, want):
    import hiraishin.plans.subblock as sb

    var, read = {"level": (sb.ENV_SUBBLOCK_DP4A, sb._dp4a_from_env),
                 "cols": (sb.ENV_SUBBLOCK_DP4A_COLS, sb._dp4a_cols_from_env)}[switch]
    if text is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, text)
    if want is None:
        with pytest.raises(ValueError, match=var):
            read()
    else:
        assert read() == want


def test_dp4a_defines_name_the_source_and_cap():
    from hiraishin.kernels.mmq.launch import (DP4A_MAX_REGS, DP4A_SOURCE, activation_layout, kernel_defines,
                                              kernel_source)
    from hiraishin.kernels.compile import blocks_for_register_cap

    for qtype, k, ncols in (("Q4_K", 4096, 1), ("Q6_K", 12288, 1), ("Q6_K", 4096, 3)):
        plan = _dp4a_plan(qtype, k, ncols)
        d = kernel_defines(plan)
        assert kernel_source(plan) == DP4A_SOURCE
        assert activation_layout(plan) == f"MMA_{qtype}"
        assert d["HX_NB"] == k // 256 and d["HX_NSEG"] == 16 and d["HX_NWARPS"] == SUBBLOCK_DP4A_NWARPS
        assert d["HX_DCOLS"] == ncols
        cap = DP4A_MAX_REGS.get((k // 4096, ncols), 128)
        assert d["HX_MIN_BLOCKS"] == blocks_for_register_cap(cap, 32 * SUBBLOCK_DP4A_NWARPS)
    assert kernel_source(dataclasses.replace(_dp4a_plan("Q4_K", 4096), kernel="onecol")) != DP4A_SOURCE


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("xstage,wstage", [(0, 0), (1, 0), (1, 1)])
@pytest.mark.parametrize("qtype,k,ncols", [("Q4_K", 4096, 1), ("Q4_K", 12288, 1), ("Q6_K", 4096, 1), ("Q6_K", 12288, 1)]
                         + [(q, 4096, c) for q in ("Q4_K", "Q6_K") for c in (2, 3, 4)])
def test_dp4a_kernels_use_no_local_memory_at_their_cap(tmp_path, qtype, k, ncols, xstage, wstage):
    """ptxas (sm_90, the library's source and defines): no stack frame at the register cap. A runtime index into
    a register array (the Q4_K scale word by the lane's half, session 28) puts it in local memory without a
    spill; CuPy's local_size_bytes then counts it and the launch relaxes its cap to none (234 registers)."""
    from hiraishin.kernels.compile import NVRTC_OPTIONS, defines_text, load_source
    from hiraishin.kernels.mmq.launch import kernel_defines, kernel_source

    plan = _dp4a_plan(qtype, k, ncols)
    src = tmp_path / "dp4a.cu"
    wstage = wstage if k == 4096 else 0  # (rows of 16 super-blocks only)
    src.write_text(defines_text(dict(kernel_defines(plan), HX_XSTAGE=xstage, HX_WSTAGE=wstage))
                   + load_source(*kernel_source(plan)))
    proc = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-o", str(tmp_path / "dp4a.cubin"), *NVRTC_OPTIONS,
                           "-Xptxas", "-v", str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frames = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame", proc.stderr, re.S)
    assert {name for name, _ in frames} == {"hx_mmq_dp4a", "hx_mmq_dp4a_multi"}
    assert all(b == "0" for _, b in frames), proc.stderr


def test_bench_mmq_times_the_other_one_column_form():
    """bench/bench_mmq.py's other_one_column: the form the library does not pick for a shape (MMA <-> dp4a) at every
    level, None where a shape has one form only; the level is left as it was."""
    import hiraishin.plans.subblock as sb

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_mmq import other_one_column

    saved = sb.SUBBLOCK_DP4A
    try:
        for level, kernels in ((2, ("onecol", "onecol")), (1, ("onecol", "dp4a")), (0, ("dp4a", "dp4a"))):
            sb.SUBBLOCK_DP4A = level
            assert tuple(other_one_column(q, k, 1024).kernel for q, k in (("Q4_K", 4096), ("Q6_K", 12288))) == kernels
            assert other_one_column("Q4_K", 1024, 1024) is None  # 4 segments: the MMA form only
            assert sb.SUBBLOCK_DP4A == level
    finally:
        sb.SUBBLOCK_DP4A = saved


def test_the_weight_copy_is_asked_only_where_it_fits(monkeypatch):
    """HX_WSTAGE: rows of 16 super-blocks only, and only while the block's static copies fit 48 KB."""
    import importlib

    launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # (the package exports a function `launch`)

    monkeypatch.setattr(launch, "DP4A_WSTAGE", False)
    assert launch.dp4a_wstage(_dp4a_plan("Q4_K", 4096)) == 0
    monkeypatch.setattr(launch, "DP4A_WSTAGE", True)
    monkeypatch.setattr(launch, "DP4A_XSTAGE", 1)
    for qtype in ("Q4_K", "Q6_K"):
        for ncols in range(1, 5):
            assert launch.dp4a_wstage(_dp4a_plan(qtype, 4096, ncols)) == 1, (qtype, ncols)
        assert launch.dp4a_wstage(_dp4a_plan(qtype, 12288)) == 0
        assert launch.kernel_defines(_dp4a_plan(qtype, 4096))["HX_WSTAGE"] == 1
    wide = dataclasses.replace(_dp4a_plan("Q6_K", 4096), nwarps=16, tile_rows=16)  # 16 rows of 3,360 bytes: 53 KB
    assert launch.dp4a_wstage(wide) == 0
