"""CPU: the sub-block order (hiraishin/kernels/mmq, hiraishin/plans/subblock.py).

The emulator's outputs do not depend on the width (every column of widths 1..16 and 37 has the
bits it has alone), rows that the 16-row tile does not divide, both weight types, uneven
K-segments; accuracy against a float64 reference within the recursive-summation bound; the plan.
(The kernels themselves are compared with the emulator on a GPU: tests/test_mmq_gpu.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.errors import PlanError
from hiraishin.kernels import quantize
from hiraishin.kernels.mmq import emulate
from hiraishin.kernels.quantize.layout import as_layout
from hiraishin.plans.subblock import (
    SUBBLOCK_MAX_SEGMENTS,
    subblock_plan,
    subblock_segments,
)
from hiraishin.quant import dequantize, random_blocks

CASES = [("Q4_K", 1024, 37), ("Q6_K", 768, 19), ("Q4_K", 5120, 5), ("Q6_K", 256, 3)]


def _activations(xq, wd: int, layout):
    """The first ``wd`` columns of q8_1 bytes ``xq`` in ``layout``; in an MMA8 layout the padding columns of
    the last group hold other (random) activations, not copies of the last column: the kernels read them
    and must drop what they compute."""
    from hiraishin.kernels.quantize.layout import LAYOUT_COLUMN_GROUP, layout_rows

    extra = layout_rows(wd, layout) - wd if layout in LAYOUT_COLUMN_GROUP else 0
    if extra:
        k = xq.shape[1] // 36 * 32
        junk = quantize.emulate((np.random.default_rng(wd).standard_normal((extra, k)) * 50).astype(np.float32))
        return as_layout(np.concatenate([xq[:wd], junk]), layout)
    return as_layout(xq[:wd], layout)


def _inputs(qtype, k, n, ncols=37, seed=0):
    w = random_blocks(qtype, n, k, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((ncols, k)).astype(np.float32)
    return w, quantize.emulate(x)


@pytest.mark.parametrize("qtype,k,n", CASES)
def test_every_width_gives_the_one_column_bits(qtype, k, n):
    w, xq = _inputs(qtype, k, n)
    alone = np.concatenate([emulate(w, qtype, xq[j:j + 1], subblock_plan(1, qtype, k)) for j in range(37)])
    for wd in list(range(1, 17)) + [37]:
        got = emulate(w, qtype, xq[:wd], subblock_plan(wd, qtype, k))
        assert got.shape == (wd, n)
        np.testing.assert_array_equal(got.view(np.uint32), alone[:wd].view(np.uint32))


def test_float_activations_are_quantized_as_q8_1():
    w, _ = _inputs("Q4_K", 512, 7)
    x = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    plan = subblock_plan(3, "Q4_K", 512)
    np.testing.assert_array_equal(emulate(w, "Q4_K", x, plan), emulate(w, "Q4_K", quantize.emulate(x), plan))


def _reference(w, qtype, xq, k):
    """float64 value of the order's terms: W.x_q8 with (Q4_K) the min term on the q8_1 ``s`` field."""
    ncols = xq.shape[0]
    W = dequantize(w, qtype).reshape(w.shape[0], k).astype(np.float64)
    blocks = xq.reshape(ncols, k // 32, 36)
    dx = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    sx = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    qx = blocks[:, :, 4:].view(np.int8).astype(np.float64)
    xd = (dx[:, :, None] * qx).reshape(ncols, k)
    ref = xd @ W.T
    mag = np.abs(xd) @ np.abs(W).T
    if qtype == "Q4_K":
        w0 = w.copy().reshape(w.shape[0], k // 256, 144)
        w0[:, :, 16:] = 0  # q = 0: every value is -dmin*m of its sub-block
        mins = dequantize(w0.reshape(w.shape[0], -1), "Q4_K").reshape(w.shape[0], k // 32, 32)[:, :, 0]
        mins = mins.astype(np.float64)
        delta = sx - xd.reshape(ncols, k // 32, 32).sum(axis=2)  # s field minus the sum of the q8 values
        ref = ref + delta @ mins.T
        mag = mag + np.abs(sx) @ np.abs(mins).T
    return ref, mag


@pytest.mark.parametrize("qtype,k,n", CASES)
def test_accuracy_against_float64(qtype, k, n):
    w, xq = _inputs(qtype, k, n, ncols=9, seed=7)
    plan = subblock_plan(9, qtype, k)
    got = emulate(w, qtype, xq, plan).astype(np.float64)
    ref, mag = _reference(w, qtype, xq, k)
    # Each output is a chain of 2 (Q4_K) or 1 rounded fma per q8_1 block plus the scale product,
    # then NSEG - 1 adds: |error| <= (terms + 1) * 2^-24 * sum |term| (first order).
    terms = (2 if qtype == "Q4_K" else 1) * (k // 32) + plan.nseg + 2
    bound = terms * 2.0**-24 * mag
    assert (np.abs(got - ref) <= bound).all(), np.max(np.abs(got - ref) / bound)


def test_plan(monkeypatch):
    import hiraishin.plans.subblock as sb

    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 0)  # the MMA kernel's one-column form (dp4a: tests/test_mmq_dp4a.py)
    for wd in (1, 2, 9, 16, 37, 512):
        p = subblock_plan(wd, "Q6_K", 12288)
        assert p.nseg == subblock_segments(12288) == SUBBLOCK_MAX_SEGMENTS
        assert p.kernel == ("onecol" if wd == 1 else "mma")
        assert [b - a for a, b in p.segment_bounds()] == [3] * 16
        assert "K-segments" in p.describe()
    assert subblock_plan(1, "Q4_K", 1024).nseg == 4
    assert [b - a for a, b in subblock_plan(1, "Q4_K", 5120).segment_bounds()].count(2) == 4
    for bad in [(0, "Q4_K", 4096), (1, "Q8_0", 4096), (1, "Q4_K", 4000), (1, "Q6_K", 0)]:
        with pytest.raises(PlanError):
            subblock_plan(*bad)


# ---- mmq.cu on the CPU: g++ shim (tests/cuda_shim.py) plus a software mma.sync ----

MMA_SHIM_H = r"""// Software mma.sync.m16n8k32 / m16n8k16 (.s8.s8.s32) for the CPU shim, PTX fragment layout
// (lane = 4g + t): A a0 (row g, k 4t..4t+3), a1 (row g+8), [k32: a2 (row g, k 16+4t..),
// a3 (row g+8, k 16+4t..)]; B b0 (k 4t..4t+3, column g) [k32: b1 (k 16+4t..)];
// C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
#pragma once
static int g_mma_a[1024][4], g_mma_b[1024][2];
inline int hx_s8(int word, int i) { return (int)(signed char)(word >> (8 * i)); }
inline void hx_mma_sw(int c[4], int kdim) {
    const int tid = hx_ltid(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    g_warp_barriers[warp]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        int acc = 0;
        for (int k = 0; k < kdim; ++k) {
            const int half = k / 16, kk = k % 16;
            const int la = warp * 32 + 4 * (r % 8) + kk / 4;
            const int areg = (r >= 8 ? 1 : 0) + 2 * half;
            const int lb = warp * 32 + 4 * n + kk / 4;
            acc += hx_s8(g_mma_a[la][areg], kk % 4) * hx_s8(g_mma_b[lb][half], kk % 4);
        }
        c[i] = acc;
    }
    g_warp_barriers[warp]->arrive_and_wait();
}
inline void hx_mma_k32(int c[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    const int tid = hx_ltid();
    g_mma_a[tid][0] = a0; g_mma_a[tid][1] = a1; g_mma_a[tid][2] = a2; g_mma_a[tid][3] = a3;
    g_mma_b[tid][0] = b0; g_mma_b[tid][1] = b1;
    hx_mma_sw(c, 32);
}
inline void hx_mma_k16(int c[4], int a0, int a1, int b0) {
    const int tid = hx_ltid();
    g_mma_a[tid][0] = a0; g_mma_a[tid][1] = a1; g_mma_b[tid][0] = b0;
    hx_mma_sw(c, 16);
}
inline void hx_cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }  // done at once
inline void hx_cp_async_commit() {}
template <int N> inline void hx_cp_async_wait() {}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (sh & 31));
}
"""

MMQ_MAIN = r"""
int main(int argc, char** argv) {
    // argv: weights, q8_1, nrows, ncols, byte offset of the weights in their buffer, out
    int nrows = atoi(argv[3]), ncols = atoi(argv[4]), shift = atoi(argv[5]);
    auto w0 = hx_read(argv[1]); auto x = hx_read(argv[2]);
    std::vector<unsigned char> w(w0.size() + 16);
    std::memcpy(w.data() + shift, w0.data(), w0.size());
    std::vector<float> out((size_t)ncols * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + HX_BLOCK_ROWS - 1) / HX_BLOCK_ROWS * HX_CGROUPS), (unsigned)((ncols + HX_CGROUPS * HX_BLOCK_COLS - 1) / (HX_CGROUPS * HX_BLOCK_COLS)), 1},
              {32u * HX_NWARPS, 1, 1}, HX_STAGE_BYTES,
              [&] { hx_mmq(w.data() + shift, x.data(), out.data(), nrows, ncols, (long long)nrows); });
    hx_write(argv[6], out.data(), out.size() * 4);
}"""

# (qtype, K, rows, widths, weight byte offset, nwarps, prefetch): both kernels, a partial row
# tile, 2-byte aligned Q6_K blocks (offset 2; K=768: rows of an odd number of super-blocks, so
# both alignments in one tile), uneven segments (K=5120), fewer warps than segments.
# Under HIRAISHIN_MMQ_LIVE=1 (SWITCHES below: every case runs under each) widths 2 and 3-4 run the
# shared-lane epilogue (HX_LIVE 2 and 4; not with prefetch 1), 5-8 the plain one-tile kernel, 9-16
# two tiles.
SHIM_CASES = [("Q4_K", 1024, 19, (1, 3, 9), 0, 4, 0), ("Q4_K", 5120, 17, (1, 2), 0, 8, 1),
              ("Q4_K", 2048, 21, (2, 4), 0, 8, 0), ("Q6_K", 768, 19, (1, 3, 5, 16), 2, 3, 0),
              ("Q6_K", 1024, 17, (1, 2, 8), 0, 2, 1), ("Q6_K", 512, 33, (2, 4), 0, 2, 0)]


# "default": the MMA layouts, their MMA8 forms for launches of 6+ columns; "mma-layouts": the MMA layouts at
# every width (HIRAISHIN_MMQ_XLAYOUT=1); "llama-layout": llama.cpp's q8_1 blocks (=0).
SWITCHES = {"default": {}, "mma-layouts": {"HIRAISHIN_MMQ_XLAYOUT": "1"}, "llama-layout": {"HIRAISHIN_MMQ_XLAYOUT": "0"},
            "live-on": {"HIRAISHIN_MMQ_LIVE": "1"},
            "prefetch-next": {"HIRAISHIN_MMQ_PREFETCH_NEXT": "1"},  # (the L2 hint is a no-op in the shim)
            "pipeline-w": {"HIRAISHIN_MMQ_PIPELINE_W": "1"},  # (Q4_K cases; Q6_K ones run without it)
            "stage-w": {"HIRAISHIN_MMQ_STAGE_W": "1"},  # (Q4_K cases; cp.async a plain copy in the shim)
            # the MMA8 layouts (8 columns' records interleaved) at every width; and for Q6_K too
            "interleaved": {"HIRAISHIN_MMQ_XLAYOUT": "2", "HIRAISHIN_MMQ_MMA8_MIN_COLS": "1"},
            "interleaved-q6k": {"HIRAISHIN_MMQ_XLAYOUT": "2", "HIRAISHIN_MMQ_MMA8_MIN_COLS": "1",
                                "HIRAISHIN_MMQ_MMA8_Q6K": "1"}}


@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("case", SHIM_CASES, ids=lambda c: f"{c[0]}-K{c[1]}")
def test_mmq_source_equals_emulator_on_cpu(tmp_path, case, switch, monkeypatch):
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cuda_shim import GXX, ShimBuilder, run

    import importlib

    from hiraishin.kernels.mmq.launch import SOURCE, activation_layout, kernel_defines

    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # the package's `launch` is a function

    if GXX is None:
        pytest.skip("needs g++ (C++20)")
    for var, value in SWITCHES[switch].items():
        monkeypatch.setenv(var, value)
    chosen = SWITCHES[switch]  # (both read at import)
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", int(chosen.get("HIRAISHIN_MMQ_XLAYOUT", mmq_launch.DEFAULT_MMQ_XLAYOUT)))
    monkeypatch.setattr(mmq_launch, "MMA8_MIN_COLS",
                        int(chosen.get("HIRAISHIN_MMQ_MMA8_MIN_COLS", mmq_launch.DEFAULT_MMA8_MIN_COLS)))
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", chosen.get("HIRAISHIN_MMQ_MMA8_Q6K") == "1")
    qtype, k, n, widths, shift, nwarps, prefetch = case
    builder = ShimBuilder(tmp_path)
    (tmp_path / "hx_mma_shim.h").write_text(MMA_SHIM_H)
    w, xq = _inputs(qtype, k, n, ncols=max(widths), seed=11)
    w.tofile(tmp_path / "w.bin")
    xq.tofile(tmp_path / "x.bin")
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    plans = []
    for wd in widths:
        plan = dataclasses.replace(subblock_plan(wd, qtype, k), nwarps=nwarps)
        plans.append(plan)
        if wd > 8 and switch in ("default", "mma-layouts", "llama-layout", "interleaved", "interleaved-q6k"):  # 9..16 columns as two one-tile blocks
            plans.append(dataclasses.replace(plan, cols_per_block=8, interleave=2))
        if wd > 8 and switch != "live-on":  # and as one block whose warps split over two one-tile column groups
            plans.append(dataclasses.replace(plan, warp_split=2, nwarps=2 * nwarps))
        if wd > 1 and switch in ("default", "mma-layouts", "llama-layout", "interleaved-q6k"):  # two row tiles a warp
            plans.append(dataclasses.replace(plan, tile_rows=32))
    for plan in plans:
        wd = plan.ncols
        defines = dict(kernel_defines(plan, None, prefetch), HX_SHIM=1)
        exe = builder.build(SOURCE, defines, MMQ_MAIN, "mmq")
        _activations(xq, wd, activation_layout(plan)).tofile(tmp_path / "x.bin")
        run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, wd, shift, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(wd, n)
        np.testing.assert_array_equal(got.view(np.uint32), ref[:wd].view(np.uint32),
                                      err_msg=f"{defines} weight offset {shift}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_mma8_launches_past_the_last_group_read_within_the_buffer(tmp_path, qtype, monkeypatch):
    """Prefill widths in the MMA8 layouts (17 and 23 columns: a CUDA block of 16 columns whose second n-tile lies
    past the last group of 8, which it then reads in place of one that does not exist) give the emulator's bits.
    (That the read stays inside the buffer, which holds exactly its whole groups, the shim cannot see:
    compute-sanitizer memcheck on a GPU can.)"""
    import dataclasses
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cuda_shim import GXX, ShimBuilder, run

    from hiraishin.kernels.mmq.launch import SOURCE, activation_layout, kernel_defines

    if GXX is None:
        pytest.skip("needs g++ (C++20)")
    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", 2)
    monkeypatch.setattr(mmq_launch, "MMA8_MIN_COLS", 1)
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", True)
    k, n = 512, 19
    builder = ShimBuilder(tmp_path)
    (tmp_path / "hx_mma_shim.h").write_text(MMA_SHIM_H)
    w, xq = _inputs(qtype, k, n, ncols=23, seed=5)
    w.tofile(tmp_path / "w.bin")
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    for wd in (17, 23):
        plan = dataclasses.replace(subblock_plan(wd, qtype, k), nwarps=2)
        assert plan.cols_per_block == 16 and activation_layout(plan).startswith("MMA8_")
        exe = builder.build(SOURCE, dict(kernel_defines(plan, None), HX_SHIM=1), MMQ_MAIN, "mmq")
        _activations(xq, wd, activation_layout(plan)).tofile(tmp_path / "x.bin")
        run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, wd, 0, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(wd, n)
        np.testing.assert_array_equal(got.view(np.uint32), ref[:wd].view(np.uint32), err_msg=f"{qtype} {wd} columns")


def test_committed_tuning_files_are_valid_and_library_json_is_the_library(monkeypatch):
    """bench/tuning/*.json (A/B tuning files) read without error; library.json equals the library's tables."""
    import json
    from pathlib import Path

    import hiraishin.plans.subblock as sb

    folder = Path(__file__).resolve().parents[1] / "bench" / "tuning"
    files = sorted(folder.glob("*.json"))
    assert {f.name for f in files} >= {"library.json", "split-wide.json"}
    for f in files:
        sb._read_tuning(str(f))
    assert json.loads((folder / "library.json").read_text()) == {**sb.SUBBLOCK_FEW_COLS_TUNING,
                                                                 **sb.SUBBLOCK_WIDE_COLS_TUNING}
    monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", sb._read_tuning(str(folder / "split-wide.json")))
    p = sb.subblock_plan(16, "Q4_K", 4096, n=12288)
    assert (p.warp_split, p.nwarps, p.max_regs, p.cols_per_block) == (2, 8, 80, 16)


def test_weight_prefetch_is_on_for_short_rows_only_and_the_environment_overrides_it(monkeypatch):
    """HX_PREFETCH_W (a cache hint) where it was measured faster: rows of <= 3072 values (launch.py)."""
    from hiraishin.kernels.mmq.launch import ENV_MMQ_PREFETCH_W, MMQ_PREFETCH_W_MAX_K, kernel_defines
    from hiraishin.plans import subblock, subblock_plan

    monkeypatch.setattr(subblock, "SUBBLOCK_DP4A", 0)  # switches of the MMA kernel, its one-column form too
    monkeypatch.delenv(ENV_MMQ_PREFETCH_W, raising=False)
    assert MMQ_PREFETCH_W_MAX_K == 3072
    on = {k: kernel_defines(subblock_plan(3, "Q4_K", k))["HX_PREFETCH_W"] for k in (1024, 3072, 4096, 12288)}
    assert on == {1024: 1, 3072: 1, 4096: 0, 12288: 0}
    monkeypatch.setenv(ENV_MMQ_PREFETCH_W, "0")
    assert kernel_defines(subblock_plan(1, "Q4_K", 1024))["HX_PREFETCH_W"] == 0
    monkeypatch.setenv(ENV_MMQ_PREFETCH_W, "1")
    assert kernel_defines(subblock_plan(1, "Q6_K", 12288))["HX_PREFETCH_W"] == 1


def test_staging_switch_picks_the_launches_and_their_dynamic_shared_memory(monkeypatch):
    """HIRAISHIN_MMQ_STAGE_W: "wide" stages only the two-n-tile (9..16-column) Q4_K launches, "1" every Q4_K
    launch, Q6_K none; the dynamic shared memory a launch gives is two 16-row stages per warp; a bad value is
    named."""
    from hiraishin.kernels.mmq.launch import ENV_MMQ_STAGE_W, kernel_defines, stage_bytes
    from hiraishin.plans import subblock, subblock_plan

    monkeypatch.setattr(subblock, "SUBBLOCK_DP4A", 0)  # switches of the MMA kernel, its one-column form too
    def staged(value, width, qtype="Q4_K"):
        monkeypatch.setenv(ENV_MMQ_STAGE_W, value)
        d = kernel_defines(subblock_plan(width, qtype, 4096, n=4096))
        return d["HX_STAGE_W"], stage_bytes(d), d["HX_NWARPS"]

    assert [staged("wide", w)[0] for w in (1, 3, 8, 9, 16)] == [0, 0, 0, 1, 1]
    assert [staged("1", w)[0] for w in (1, 3, 8, 9, 16)] == [1, 1, 1, 1, 1]
    assert [staged("0", w)[0] for w in (1, 16)] == [0, 0]
    assert staged("1", 16, "Q6_K")[:2] == (0, 0)
    on, shared, nwarps = staged("wide", 16)
    assert shared == nwarps * 2 * 16 * 144 and shared > 48 * 1024 - 16 * 16 * 16 * 4  # past the static limit
    monkeypatch.setenv(ENV_MMQ_STAGE_W, "yes")
    with pytest.raises(ValueError, match="HIRAISHIN_MMQ_STAGE_W='yes'"):
        kernel_defines(subblock_plan(16, "Q4_K", 4096, n=4096))


def test_interleaved_layouts_are_q4_k_only_and_the_switch_is_checked(monkeypatch):
    """HIRAISHIN_MMQ_XLAYOUT=2: Q4_K kernels read the MMA8 layouts (HX_XLAYOUT 2), Q6_K ones too unless
    HIRAISHIN_MMQ_MMA8_Q6K=0 (then the MMA layouts); 0 and 1 as before; any other value is named."""
    import importlib

    from hiraishin.plans import subblock_plan

    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")
    assert mmq_launch.MMA8_Q6K is (mmq_launch._env_choice(mmq_launch.ENV_MMQ_MMA8_Q6K, ("0", "1"), "1") == "1")
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", False)  # HIRAISHIN_MMQ_MMA8_Q6K=0
    seen = {}
    for x in (0, 1, 2):
        monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", x)
        for qtype in ("Q4_K", "Q6_K"):
            plan = subblock_plan(9, qtype, 4096, n=4096)
            seen[x, qtype] = (mmq_launch.kernel_defines(plan)["HX_XLAYOUT"], mmq_launch.activation_layout(plan))
    assert seen == {(0, "Q4_K"): (0, None), (0, "Q6_K"): (0, None), (1, "Q4_K"): (1, "MMA_Q4_K"),
                    (1, "Q6_K"): (1, "MMA_Q6_K"), (2, "Q4_K"): (2, "MMA8_Q4_K"), (2, "Q6_K"): (1, "MMA_Q6_K")}
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", True)  # the default: Q6_K reads them too
    plan = subblock_plan(9, "Q6_K", 4096, n=4096)
    assert (mmq_launch.kernel_defines(plan)["HX_XLAYOUT"], mmq_launch.activation_layout(plan)) == (2, "MMA8_Q6_K")
    assert mmq_launch.xlayout_setting()[2] == ("Q4_K", "Q6_K")  # part of every prepared launch's cache key
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", False)
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", 2)  # launches below MMA8_MIN_COLS columns keep the MMA layouts
    monkeypatch.setattr(mmq_launch, "MMA8_MIN_COLS", 6)
    assert [mmq_launch.plan_xlayout(subblock_plan(w, "Q4_K", 4096, n=4096)) for w in (1, 5, 6, 16)] == [1, 1, 2, 2]
    choice = (mmq_launch.ENV_MMQ_XLAYOUT, mmq_launch.MMQ_XLAYOUT_VALUES, "1")  # as MMQ_XLAYOUT is read at import
    monkeypatch.setenv(mmq_launch.ENV_MMQ_XLAYOUT, "2")
    assert mmq_launch._env_choice(*choice) == "2"
    monkeypatch.delenv(mmq_launch.ENV_MMQ_XLAYOUT)
    assert mmq_launch._env_choice(*choice) == "1"
    monkeypatch.setenv(mmq_launch.ENV_MMQ_XLAYOUT, "interleaved")
    with pytest.raises(ValueError, match="HIRAISHIN_MMQ_XLAYOUT='interleaved'"):
        mmq_launch._env_choice(*choice)


MMQ_MULTI_MAIN = r"""
int main(int argc, char** argv) {
    // argv: weights of the three row counts one after another, q8_1, n0, n1, n2, ncols, out
    int n[3] = {atoi(argv[3]), atoi(argv[4]), atoi(argv[5])}, ncols = atoi(argv[6]);
    auto w = hx_read(argv[1]); auto x = hx_read(argv[2]);
    const size_t row_bytes = (size_t)HX_NB * HX_BLOCK_BYTES;
    int nt[3]; unsigned tiles = 0;
    for (int i = 0; i < 3; ++i) { nt[i] = (n[i] + HX_BLOCK_ROWS - 1) / HX_BLOCK_ROWS; tiles += nt[i]; }
    const unsigned char* wp[3] = {w.data(), w.data() + (size_t)n[0] * row_bytes, w.data() + (size_t)(n[0] + n[1]) * row_bytes};
    std::vector<float> out((size_t)ncols * (n[0] + n[1] + n[2]), -12345.0f);
    float* op[3] = {out.data(), out.data() + (size_t)ncols * n[0], out.data() + (size_t)ncols * (n[0] + n[1])};
    hx_launch({tiles * HX_CGROUPS, (unsigned)((ncols + HX_CGROUPS * HX_BLOCK_COLS - 1) / (HX_CGROUPS * HX_BLOCK_COLS)), 1},
              {32u * HX_NWARPS, 1, 1}, HX_STAGE_BYTES,
              [&] { hx_mmq_multi(x.data(), ncols, wp[0], op[0], n[0], nt[0], wp[1], op[1], n[1], nt[1], wp[2], op[2], n[2]); });
    hx_write(argv[7], out.data(), out.size() * 4);
}"""


@pytest.mark.parametrize("xlayout", [1, 2])
@pytest.mark.parametrize("qtype,widths", [("Q4_K", (1, 3, 12, 16)), ("Q6_K", (2, 16))])
def test_mmq_multi_source_equals_separate_emulators_on_cpu(tmp_path, qtype, widths, xlayout, monkeypatch):
    """Q, K and V (or gate and up) in one hx_mmq_multi launch: each weight's rows have the bits of its
    own launch (the emulator), for row counts the 16-row tile does not divide; in the MMA layouts and in their
    columns-interleaved forms."""
    import dataclasses
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cuda_shim import GXX, ShimBuilder, run

    from hiraishin.kernels.mmq.launch import SOURCE, activation_layout, kernel_defines

    if GXX is None:
        pytest.skip("needs g++ (C++20)")
    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMQ_XLAYOUT", xlayout)
    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMA8_MIN_COLS", 1)  # every width
    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMA8_Q6K", True)  # both types
    k, ns = 512, (19, 5, 33)
    builder = ShimBuilder(tmp_path)
    (tmp_path / "hx_mma_shim.h").write_text(MMA_SHIM_H)
    ws = [random_blocks(qtype, n, k, seed=20 + i) for i, n in enumerate(ns)]
    xq = quantize.emulate(np.random.default_rng(4).standard_normal((max(widths), k)).astype(np.float32))
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    for wd in widths:
        plan = dataclasses.replace(subblock_plan(wd, qtype, k), nwarps=2)
        if 8 < wd <= 12:  # two one-tile CUDA blocks per row tile, side by side (SubBlockPlan.interleave)
            plan = dataclasses.replace(plan, cols_per_block=8, interleave=2)
        elif wd > 12:  # one CUDA block whose warps split over two one-tile column groups
            plan = dataclasses.replace(plan, warp_split=2)
        elif wd > 1 and xlayout == 2:  # 32 rows a CUDA block, two row tiles a warp
            plan = dataclasses.replace(plan, tile_rows=32)
        exe = builder.build(SOURCE, dict(kernel_defines(plan, None), HX_SHIM=1), MMQ_MULTI_MAIN, "mmq_multi")
        _activations(xq, wd, activation_layout(plan)).tofile(tmp_path / "x.bin")
        run(exe, tmp_path / "w.bin", tmp_path / "x.bin", *ns, wd, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32)
        at = 0
        for w, n in zip(ws, ns):
            part = got[at:at + wd * n].reshape(wd, n)
            at += wd * n
            np.testing.assert_array_equal(part.view(np.uint32), emulate(w, qtype, xq[:wd], plan).view(np.uint32),
                                          err_msg=f"{qtype} weight of {n} rows, {wd} columns")


def test_mmq_multi_is_on_unless_turned_off(monkeypatch):
    """On unless HIRAISHIN_MMQ_MULTI=0 was in the environment at import (MMQ_MULTI, read once)."""
    import importlib
    import os

    launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # the package's `launch` is a function

    assert launch.MMQ_MULTI == (os.environ.get(launch.ENV_MMQ_MULTI, "1").strip() != "0")
    monkeypatch.setattr(launch, "MMQ_MULTI", False)
    assert not launch.multi_enabled()
    monkeypatch.setattr(launch, "MMQ_MULTI", True)
    assert launch.multi_enabled()


def test_live_columns_only_when_asked_and_only_for_one_tile_of_at_most_four(monkeypatch):
    from hiraishin.kernels.mmq.launch import ENV_MMQ_LIVE, kernel_defines
    from hiraishin.plans import subblock_plan

    live = {}
    for v in ("", "0", "1"):
        monkeypatch.setenv(ENV_MMQ_LIVE, v)
        live[v] = [kernel_defines(subblock_plan(w, "Q4_K", 2048))["HX_LIVE"] for w in (1, 2, 3, 4, 5, 8, 9, 16)]
    assert live[""] == live["0"] == [0] * 8
    assert live["1"] == [0, 2, 4, 4, 0, 0, 0, 0]
    assert kernel_defines(subblock_plan(3, "Q4_K", 2048), prefetch=1)["HX_LIVE"] == 0  # HX_PREFETCH_X excludes it


def test_tuning_file_sets_launch_facts_of_the_keyed_shape_and_widths_only(tmp_path, monkeypatch):
    """A tuning file (HIRAISHIN_MMQ_TUNING, read at import) changes warps, register cap and activation
    prefetch of launches of 2..8 columns of the keyed shape, and with a "/wide" key those of 9..16 columns
    (and their columns per CUDA block); bad files raise PlanError naming the file."""
    import json

    import hiraishin.plans.subblock as sb
    from hiraishin.kernels.mmq.launch import kernel_defines, launch_grid

    f = tmp_path / "tuning.json"
    f.write_text(json.dumps({"Q4_K/many/4096": {"nwarps": 4, "max_regs": 80, "prefetch_x": 1}}))
    monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", sb._read_tuning(str(f)))
    p = sb.subblock_plan(3, "Q4_K", 4096, n=12288)
    assert (p.nwarps, p.max_regs, p.prefetch_x) == (4, 80, 1)
    d = kernel_defines(p)
    assert d["HX_NWARPS"] == 4 and d["HX_PREFETCH_X"] == 1 and d["HX_MIN_BLOCKS"] == 6
    assert sb.subblock_plan(1, "Q4_K", 4096, n=12288).max_regs is None  # one column: not tuned
    assert sb.subblock_plan(9, "Q4_K", 4096, n=12288).max_regs is None  # 9..16 columns: their own "/wide" key
    f.write_text(json.dumps({"Q4_K/many/4096/wide": {"cols_per_block": 8, "nwarps": 4, "max_regs": 96,
                                                      "prefetch_x": 1}}))
    monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", sb._read_tuning(str(f)))
    assert sb.tuning_key("Q4_K", 12288, 4096, 9) == "Q4_K/many/4096/wide"
    for wd in (9, 16):
        p = sb.subblock_plan(wd, "Q4_K", 4096, n=12288)
        assert (p.cols_per_block, p.interleave, p.nwarps, p.max_regs, p.prefetch_x) == (8, 2, 4, 96, 1)
        d = kernel_defines(p)
        assert d["HX_NT"] == 1 and d["HX_CGROUPS"] == 2 and d["HX_PREFETCH_X"] == 1
        assert "2 column groups" in p.describe()
    assert launch_grid(3, sb.subblock_plan(16, "Q4_K", 4096, n=12288)) == (6, 1, 1)
    assert sb.subblock_plan(3, "Q4_K", 4096, n=12288).max_regs is None  # a wide key does not tune 2..8 columns
    assert sb.subblock_plan(17, "Q4_K", 4096, n=12288).interleave == 1  # nor prefill widths
    f.write_text(json.dumps({"Q4_K/many/4096/wide": {"warp_split": 2, "nwarps": 8}}))
    monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", sb._read_tuning(str(f)))
    p = sb.subblock_plan(12, "Q4_K", 4096, n=12288)
    assert (p.cols_per_block, p.interleave, p.warp_split, p.nwarps) == (16, 1, 2, 8)
    d = kernel_defines(p)
    assert (d["HX_NT"], d["HX_WSPLIT"], d["HX_CGROUPS"]) == (1, 2, 1) and "split over 2" in p.describe()
    assert launch_grid(3, p) == (3, 1, 1)
    p16 = sb.subblock_plan(16, "Q4_K", 4096, n=4096)  # untuned: one two-tile CUDA block per row tile
    assert (p16.cols_per_block, p16.interleave) == (16, 1) and launch_grid(3, p16) == (3, 1, 1)
    assert launch_grid(3, sb.subblock_plan(40, "Q4_K", 4096)) == (3, 3, 1)
    assert sb.subblock_plan(3, "Q4_K", 4096, n=4096).max_regs is None  # another key
    for bad in ("[1]", '{"Q4_K/many/4096": {"nwarps": 40}}', '{"Q4_K": {"nwarps": 4}}', "{",
                '{"Q4_K/few/4096": {"live": 1}}',
                '{"Q4_K/few/4096": {"nwarp": 4}}', '{"Q4_K/few/4096": {"prefetch_x": true}}',
                '{"Q4_K/few/4096": {"cols_per_block": 8}}', '{"Q4_K/few/4096/wide": {"cols_per_block": 4}}',
                '{"Q4_K/few/4096/tall": {"nwarps": 4}}', '{"Q4_K/few/4096": {"warp_split": 2}}',
                '{"Q4_K/few/4096/wide": {"warp_split": 3}}', '{"Q4_K/few/4096/wide": {"warp_split": 2, "nwarps": 5}}',
                '{"Q4_K/few/4096/wide": {"warp_split": 2, "cols_per_block": 8}}'):
        f.write_text(bad)
        with pytest.raises(PlanError, match="tuning.json"):
            sb._read_tuning(str(f))
    with pytest.raises(PlanError, match="missing.json"):
        sb._read_tuning(str(tmp_path / "missing.json"))
    assert sb._read_tuning("none") == {}
    tables = {**sb.SUBBLOCK_FEW_COLS_TUNING, **sb.SUBBLOCK_WIDE_COLS_TUNING}
    assert sb._read_tuning("") == tables
    f.write_text(json.dumps(tables))
    assert sb._read_tuning(str(f)) == tables  # the tables are a valid tuning file


def test_register_cap_is_relaxed_one_block_at_a_time_while_it_spills():
    """compile.relax_register_cap: the rule mmq_kernel, the stock MMQ kernels and bench/regs_mmq.py share."""
    from hiraishin.kernels.compile import relax_register_cap

    tried = []

    def spills_above_two(defines):  # spills while more than two blocks must fit
        tried.append(defines["HX_MIN_BLOCKS"])
        return f"kernel@{defines['HX_MIN_BLOCKS']}", 8 if defines["HX_MIN_BLOCKS"] > 2 else 0

    assert relax_register_cap({"HX_MIN_BLOCKS": 4, "X": 1}, spills_above_two) == ("kernel@2", {"HX_MIN_BLOCKS": 2,
                                                                                            "X": 1})
    assert tried == [4, 3, 2]
    # down to no cap at all (one block), spilling or not
    assert relax_register_cap({"HX_MIN_BLOCKS": 2}, lambda d: (d["HX_MIN_BLOCKS"], 4))[0] == 1
