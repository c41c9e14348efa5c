"""GPU: the sub-block order kernels (hiraishin/kernels/mmq) equal the emulator bit for bit.

Every Qwen3-8B mat-vec shape at widths 1..16 and a prefill width (37), rows that the 16-row tile
does not divide, Q6_K rows of an odd number of super-blocks (2-byte aligned rows in one tile),
uneven K-segments; no register spills. Large N: a fixed subset of rows is compared (rows are
independent; the order depends on K only).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from hiraishin.kernels.quantize.layout import as_layout

pytestmark = pytest.mark.gpu

WIDTHS = list(range(1, 17)) + [37]
SHAPES = [  # (qtype, K, N)
    ("Q4_K", 4096, 4096), ("Q4_K", 4096, 1024), ("Q4_K", 4096, 12288),
    ("Q6_K", 12288, 4096), ("Q6_K", 4096, 151936),
    ("Q4_K", 4096, 1003), ("Q6_K", 12288, 77), ("Q6_K", 768, 45), ("Q4_K", 5120, 333), ("Q6_K", 256, 19),
]
MAX_CHECKED_ROWS = 192


def _rows(n):
    if n <= MAX_CHECKED_ROWS:
        return np.arange(n)
    rng = np.random.default_rng(n)
    return np.unique(np.concatenate([np.arange(40), np.arange(n - 40, n), rng.choice(n, 112, replace=False)]))


@pytest.fixture(autouse=True)
def _mma_one_column(monkeypatch):
    """The MMA kernel's tests, its one-column form included: one column of rows of 16 super-blocks is the dp4a
    kernel by default (plans/subblock.py HIRAISHIN_SUBBLOCK_DP4A), tested by its own test below, which sets it back."""
    import hiraishin.plans.subblock as sb

    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 0)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _plans(qtype, k, n=None):
    from hiraishin.plans.subblock import subblock_plan
    return {wd: subblock_plan(wd, qtype, k, n=n) for wd in WIDTHS}


@pytest.mark.parametrize("qtype,k,n", SHAPES)
def test_kernel_equals_emulator(cp, qtype, k, n):
    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq import emulate, launch
    from hiraishin.kernels.mmq.launch import precompile
    from hiraishin.quant import random_blocks

    plans = _plans(qtype, k, n)
    precompile(plans.values())
    w = random_blocks(qtype, n, k, seed=k + n)
    x = np.random.default_rng(n).standard_normal((max(WIDTHS), k)).astype(np.float32)
    xq = quantize.emulate(x)
    rows = _rows(n)
    ref = emulate(w[rows], qtype, xq, plans[1])
    w_d = cp.asarray(w)
    x_d = cp.asarray(x)
    xq_d = cp.empty(xq.shape, dtype=cp.uint8)
    quantize.launch(x_d, xq_d)
    assert np.array_equal(cp.asnumpy(xq_d), xq)
    for wd, plan in plans.items():
        out = cp.full((wd, n), cp.nan, dtype=cp.float32)
        launch(w_d, qtype, xq_d[:wd], plan, out)
        got = cp.asnumpy(out)
        assert np.isfinite(got).all(), (wd, "unwritten outputs")
        np.testing.assert_array_equal(got[:, rows].view(np.uint32), ref[:wd].view(np.uint32),
                                      err_msg=f"{qtype} K={k} N={n} width={wd}")


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 4096, 4096), ("Q4_K", 4096, 12288), ("Q6_K", 12288, 4096),
                                       ("Q6_K", 4096, 151936), ("Q4_K", 5120, 333)])
def test_no_register_spills(cp, qtype, k, n):
    from hiraishin.kernels.compile import kernel_attributes
    from hiraishin.kernels.mmq.launch import mmq_kernel

    for wd, plan in _plans(qtype, k, n).items():
        attrs = kernel_attributes(mmq_kernel(plan)[0])
        print(qtype, k, wd, plan.kernel, attrs)
        assert attrs["local_size_bytes"] == 0, (qtype, k, wd, attrs)


@pytest.mark.parametrize("xlayout", [1, 0, 2])
@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 5120, 333), ("Q6_K", 768, 45), ("Q6_K", 12288, 77), ("Q4_K", 4096, 50)])
def test_launch_variants_change_no_bit(cp, qtype, k, n, xlayout, monkeypatch):
    """Warps per CUDA block, register caps, the activation prefetch and the shared-lane epilogue
    (HX_LIVE, widths 2..4) are launch facts, with the activations in the MMA layouts, in llama.cpp's or in the
    columns-interleaved MMA8 layouts (HX_XLAYOUT 1, 0, 2; Q6_K too, as HIRAISHIN_MMQ_MMA8_Q6K=1 has it)."""
    import dataclasses
    import importlib

    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMQ_XLAYOUT", xlayout)
    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMA8_MIN_COLS", 1)  # every width
    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmq.launch"), "MMA8_Q6K", True)

    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq import emulate
    from hiraishin.kernels.mmq.launch import ENV_MMQ_LIVE, MMQLaunch
    from hiraishin.plans.subblock import subblock_plan
    from hiraishin.quant import random_blocks

    w = random_blocks(qtype, n, k, seed=3)
    x = np.random.default_rng(4).standard_normal((37, k)).astype(np.float32)
    xq = quantize.emulate(x)
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    w_d, xq_d = cp.asarray(w), cp.asarray(xq)
    for wd, base in [(wd, subblock_plan(wd, qtype, k)) for wd in (1, 2, 3, 4, 9, 16, 37)] + [
            # 9..16 columns as two one-tile CUDA blocks per row tile, side by side (SubBlockPlan.interleave),
            (wd, dataclasses.replace(subblock_plan(wd, qtype, k), cols_per_block=8, interleave=2)) for wd in (9, 16)] + [
            # and as one CUDA block whose warps split over two one-tile column groups (SubBlockPlan.warp_split)
            (wd, dataclasses.replace(subblock_plan(wd, qtype, k), warp_split=2)) for wd in (9, 16)] + [
            # 32 rows per CUDA block, two row tiles per warp (mmq.cu HX_MT)
            (wd, dataclasses.replace(subblock_plan(wd, qtype, k), tile_rows=32)) for wd in (2, 3, 9, 16, 37)]:
        warps = {base.nseg, min(8, base.nseg), min(4, base.nseg), 1}
        if base.warp_split > 1:  # two warps per K-segment
            warps = {2 * nw for nw in warps if 2 * nw <= 16}
        for nw in sorted(warps):
            for cap in (64, 96, None) if xlayout == 1 else (None,):  # (other layouts: fewer variants to compile)
                few = base.cols_per_block == 8 and wd > 1
                for pre, live in ((0, 0), (1, 0), (0, 1)) if few else ((0, 0), (1, 0)) if wd == 1 else ((0, 0),):
                    monkeypatch.setenv(ENV_MMQ_LIVE, str(live))
                    lw = MMQLaunch(n, dataclasses.replace(base, nwarps=nw), max_regs=cap, prefetch=pre)
                    assert (lw.layout is None) == (xlayout == 0)
                    out = cp.full((wd, n), cp.nan, dtype=cp.float32)
                    lw(w_d, as_layout(xq_d[:wd], lw.layout), out)
                    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint32), ref[:wd].view(np.uint32),
                                                  err_msg=f"{qtype} K={k} width={wd} nwarps={nw} cap={cap} pre={pre} "
                                                          f"live={live}")


def _q4_k_switch_keeps_bits(cp, monkeypatch, env: str, define: str, k: int, n: int, nwarps: int, widths,
                            seed: int, multi: bool) -> int:
    """Q4_K launches of ``widths`` columns with the opt-in switch ``env`` set equal the emulator (and, ``multi``,
    in an hx_mmq_multi launch of two weights); no spills. Returns how many of them compiled ``define`` in. The
    other opt-in weight-load switches are cleared first: a session's environment (a GPU run under
    HIRAISHIN_MMQ_STAGE_W=wide, which takes precedence over HX_PIPELINE_W) must not decide what is tested."""
    import dataclasses

    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq import emulate
    from hiraishin.kernels.mmq.launch import (ENV_MMQ_PIPELINE_W, ENV_MMQ_PREFETCH_NEXT, ENV_MMQ_STAGE_W, MMQLaunch,
                                              MMQMultiLaunch, kernel_defines)

    for other in (ENV_MMQ_PIPELINE_W, ENV_MMQ_PREFETCH_NEXT, ENV_MMQ_STAGE_W):
        monkeypatch.delenv(other, raising=False)
    from hiraishin.plans.subblock import subblock_plan
    from hiraishin.quant import random_blocks

    monkeypatch.setenv(env, "1")
    w = random_blocks("Q4_K", n, k, seed=seed)
    xq = quantize.emulate(np.random.default_rng(seed + 1).standard_normal((16, k)).astype(np.float32))
    ref = emulate(w, "Q4_K", xq, subblock_plan(1, "Q4_K", k))
    w_d, xq_d = cp.asarray(w), cp.asarray(xq)
    switched = 0
    for wd in widths:
        base = subblock_plan(wd, "Q4_K", k)
        plan = dataclasses.replace(base, nwarps=min(nwarps, base.nseg))
        switched += kernel_defines(plan)[define]
        lw = MMQLaunch(n, plan)
        out = cp.full((wd, n), cp.nan, dtype=cp.float32)
        lw(w_d, as_layout(xq_d[:wd], lw.layout), out)
        np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint32), ref[:wd].view(np.uint32),
                                      err_msg=f"{define} K={k} width={wd} nwarps={plan.nwarps}")
        assert int(lw.kernel.local_size_bytes) == 0, (k, wd, plan.nwarps)
        if multi:
            ml = MMQMultiLaunch((n, 19), plan)
            got = ml([w_d, w_d[:19]], as_layout(xq_d[:wd], ml.layout),
                     [cp.full((wd, n), cp.nan, cp.float32), cp.full((wd, 19), cp.nan, cp.float32)])
            np.testing.assert_array_equal(cp.asnumpy(got[0]).view(np.uint32), ref[:wd].view(np.uint32))
            np.testing.assert_array_equal(cp.asnumpy(got[1]).view(np.uint32), ref[:wd, :19].view(np.uint32))
    return switched


@pytest.mark.parametrize("k,n,nwarps", [(5120, 333, 8), (4096, 50, 4), (12288, 77, 16)])
def test_pipelined_weight_loads_change_no_bit(cp, k, n, nwarps, monkeypatch):
    """HX_PIPELINE_W (HIRAISHIN_MMQ_PIPELINE_W=1, Q4_K): the next super-block's loads issued early, across
    segments too (K=5120 at 8 warps: uneven segments, two per warp), change no bit at any width."""
    from hiraishin.kernels.mmq.launch import ENV_MMQ_PIPELINE_W

    widths = (1, 2, 3, 5, 9, 16)
    assert _q4_k_switch_keeps_bits(cp, monkeypatch, ENV_MMQ_PIPELINE_W, "HX_PIPELINE_W", k, n, nwarps, widths,
                                   seed=5, multi=False) == len(widths)


@pytest.mark.parametrize("k,n,nwarps", [(5120, 333, 8), (4096, 50, 4), (1024, 77, 2), (12288, 40, 4)])
def test_staged_weight_loads_change_no_bit(cp, k, n, nwarps, monkeypatch):
    """HX_STAGE_W (HIRAISHIN_MMQ_STAGE_W=1, Q4_K): each warp's next super-block copied into shared memory with
    cp.async, the first before the PDL wait, across segments (K=5120 at 8 warps: uneven segments), changes no
    bit at any width where its shared memory fits (launch.py stage_fits), in single and multi launches."""
    from hiraishin.kernels.mmq.launch import ENV_MMQ_STAGE_W

    staged = _q4_k_switch_keeps_bits(cp, monkeypatch, ENV_MMQ_STAGE_W, "HX_STAGE_W", k, n, nwarps,
                                     (1, 2, 3, 5, 8, 9, 16), seed=7, multi=True)
    assert staged >= 5, "HX_STAGE_W never compiled in"


@pytest.mark.parametrize("qtype,k,ns", [("Q4_K", 4096, (4096, 1024, 1024)), ("Q4_K", 4096, (12288, 12288)),
                                        ("Q6_K", 768, (45, 19, 33))])
@pytest.mark.parametrize("width", [1, 3, 9, 16, "9i", "16i", "3t", "16t"])
def test_multi_launch_equals_separate_launches(cp, qtype, k, ns, width):
    """hx_mmq_multi (Q/K/V or gate/up of one plan in one launch) == one hx_mmq launch per weight ("9i":
    9 columns in two one-tile CUDA blocks per row tile, side by side; "3t": 32 rows per CUDA block)."""
    import dataclasses

    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq.launch import MMQLaunch, MMQMultiLaunch
    from hiraishin.plans.subblock import subblock_plan
    from hiraishin.quant import random_blocks

    interleaved, two_tiles = str(width).endswith("i"), str(width).endswith("t")
    width = int(str(width).rstrip("it"))
    plan = subblock_plan(width, qtype, k, n=max(ns))
    if interleaved:
        plan = dataclasses.replace(plan, cols_per_block=8, interleave=2)
    if two_tiles:
        plan = dataclasses.replace(plan, tile_rows=32)
    ws = [cp.asarray(random_blocks(qtype, n, k, seed=60 + i)) for i, n in enumerate(ns)]
    x = np.random.default_rng(width).standard_normal((width, k)).astype(np.float32)
    multi = MMQMultiLaunch(ns, plan)
    xq = as_layout(cp.asarray(quantize.emulate(x)), multi.layout)
    got = multi(ws, xq, [cp.full((width, n), -1.0, cp.float32) for n in ns])
    for w, n, g in zip(ws, ns, got):
        want = MMQLaunch(n, plan)(w, xq, cp.empty((width, n), cp.float32))
        assert np.array_equal(g.get().view(np.uint32), want.get().view(np.uint32)), f"{qtype} {n} rows, {width} columns"


def test_passes_with_multi_launches_equal_passes_without(tiny_model_path, monkeypatch):
    """MMQ_MULTI (on; HIRAISHIN_MMQ_MULTI=0 turns it off): SUBBLOCK passes with Q/K/V and gate/up grouped give the
    same logits as with every mat-vec its own launch, and (MMQ_XLAYOUT=0, 1, 2 with MMA8_MIN_COLS=1) as with the
    activations in llama.cpp's q8_1 blocks, in the MMA layouts or in the columns-interleaved MMA8 layouts at every
    width instead of the default (MMA8 for launches of 6+ columns)."""
    import importlib

    from hiraishin import Qwen3, ReductionOrder

    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # the package's `launch` is a function

    order = ReductionOrder.SUBBLOCK

    def run():
        m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
        m.forward(list(range(20)), 0, order)
        outs = []
        for w in (1, 3, 9):
            for _ in range(3):  # eager warm-up, capture, replay
                out = m.forward(list(range(100, 100 + w)), 20, order)
            outs.append(out)
        return m, outs

    monkeypatch.setattr(mmq_launch, "MMQ_MULTI", False)
    _, plain = run()
    monkeypatch.setattr(mmq_launch, "MMQ_MULTI", True)
    m, grouped = run()
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", 0)  # and the activations in llama.cpp's q8_1 blocks
    _, llama_layout = run()
    for w, a, b in zip((1, 3, 9), llama_layout, grouped):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens, llama.cpp's layout"
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", 1)  # and in the MMA layouts at every width
    _, mma_layouts = run()
    for w, a, b in zip((1, 3, 9), mma_layouts, grouped):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens, MMA layouts"
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", 2)  # and in the columns-interleaved MMA8 layouts (every writer)
    monkeypatch.setattr(mmq_launch, "MMA8_MIN_COLS", 1)  # at every width
    _, interleaved = run()
    for w, a, b in zip((1, 3, 9), interleaved, grouped):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens, MMA8 layouts"
    monkeypatch.setattr(mmq_launch, "MMA8_Q6K", True)  # and Q6_K's launches in them too (HIRAISHIN_MMQ_MMA8_Q6K=1)
    _, interleaved_q6k = run()
    for w, a, b in zip((1, 3, 9), interleaved_q6k, grouped):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens, MMA8 layouts for Q6_K too"
    from hiraishin.plans import SubBlockPlan

    assert any(isinstance(key[2], SubBlockPlan) and len(ns) > 1 for key, ns in m.ops._multis), "nothing was grouped"
    for w, a, b in zip((1, 3, 9), plain, grouped):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens"


class _WideTable(dict):
    """A tuning table giving every launch of 9..16 columns the launch facts ``wide``."""

    def __init__(self, table, wide):
        super().__init__(table)
        self.wide = wide

    def get(self, key, default=None):
        return dict(self.wide) if key.endswith("/wide") else super().get(key, default)


@pytest.mark.parametrize("wide", [{"cols_per_block": 8}, {"warp_split": 2}], ids=["interleave", "warp-split"])
def test_passes_with_other_wide_launches_equal_passes_without(tiny_model_path, monkeypatch, wide):
    """9..16 columns as two one-tile CUDA blocks per row tile side by side (a "/wide" tuning entry with
    cols_per_block 8), or as one CUDA block whose warps split over two one-tile column groups (warp_split 2),
    give the bits of the two-tile CUDA blocks, in whole SUBBLOCK passes (graphs)."""
    import hiraishin.plans as plans
    import hiraishin.plans.subblock as sb
    from hiraishin import Qwen3, ReductionOrder

    order = ReductionOrder.SUBBLOCK

    def run():
        plans._matvec_cached.cache_clear()
        m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
        m.forward(list(range(20)), 0, order)
        outs = []
        for w in (9, 16):
            for _ in range(3):  # eager warm-up, capture, replay
                out = m.forward(list(range(100, 100 + w)), 20, order)
            outs.append(out)
        return outs

    try:
        two_tiles = run()
        monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", _WideTable(sb.SUBBLOCK_MMA_TUNING, wide))
        p = sb.subblock_plan(9, "Q4_K", 512)
        assert (p.interleave, p.warp_split) == ((2, 1) if "cols_per_block" in wide else (1, 2))
        other = run()
    finally:
        monkeypatch.undo()
        plans._matvec_cached.cache_clear()  # no such plan left for the next test
    for w, a, b in zip((9, 16), two_tiles, other):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{w} tokens"


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 4096, 4096), ("Q4_K", 4096, 1024), ("Q4_K", 4096, 12288),
                                       ("Q6_K", 12288, 4096), ("Q6_K", 4096, 151936), ("Q6_K", 12288, 77),
                                       ("Q4_K", 12288, 1003), ("Q6_K", 4096, 1025)])
@pytest.mark.parametrize("xstage,wstage", [(0, 0), (1, 0), (1, 1)])
def test_dp4a_kernel_equals_emulator_and_multi(cp, qtype, k, n, xstage, wstage, monkeypatch):
    """The dp4a kernel (HIRAISHIN_SUBBLOCK_DP4A=2, onecol_dp4a.cu) gives the emulator's bits for every Qwen3-8B shape
    and rows its 4-row blocks do not divide, at one column and (rows of 16 super-blocks, HIRAISHIN_SUBBLOCK_DP4A_COLS)
    at 2-4, with no local memory, reading its activations from global memory or from its block's shared copy
    (HIRAISHIN_DP4A_XSTAGE), and its weights from global memory or from the block's cp.async copy (HIRAISHIN_DP4A_WSTAGE,
    rows of 4096 values); three weights in one hx_mmq_dp4a_multi launch give each weight's bits of its own launch."""
    import hiraishin.plans.subblock as sb
    from hiraishin.kernels import quantize
    from hiraishin.kernels.compile import kernel_attributes
    from hiraishin.kernels.mmq import emulate
    from hiraishin.kernels.mmq.launch import MMQLaunch, MMQMultiLaunch, mmq_kernel
    from hiraishin.quant import random_blocks

    monkeypatch.setattr(sb, "SUBBLOCK_DP4A", 2)
    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_COLS", sb.SUBBLOCK_DP4A_MAX_COLS)
    # (the module itself: the package's name `launch` is a function)
    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")
    monkeypatch.setattr(mmq_launch, "DP4A_XSTAGE", xstage)
    monkeypatch.setattr(mmq_launch, "DP4A_WSTAGE", bool(wstage))
    w = random_blocks(qtype, n, k, seed=k + n + 1)
    x = np.random.default_rng(n + 1).standard_normal((sb.SUBBLOCK_DP4A_MAX_COLS, k)).astype(np.float32)
    xq = quantize.emulate(x)
    rows = _rows(n)
    w_d = cp.asarray(w)
    ns = (min(n, 1003), 5, 77)
    ws = [w_d[:ns[0]], cp.asarray(random_blocks(qtype, 5, k, seed=2)), cp.asarray(random_blocks(qtype, 77, k, seed=3))]
    for wd in range(1, sb.SUBBLOCK_DP4A_MAX_COLS + 1) if k == 4096 else (1,):
        plan = sb.subblock_plan(wd, qtype, k, n=n)
        assert plan.kernel == "dp4a" and plan.ncols == wd
        assert mmq_launch.dp4a_wstage(plan) == (wstage if k == 4096 else 0)
        for name in ("hx_mmq", "hx_mmq_multi"):
            attrs = kernel_attributes(mmq_kernel(plan, name=name)[0])
            assert attrs["local_size_bytes"] == 0, (name, wd, attrs)
        ref = emulate(w[rows], qtype, xq[:wd], plan)
        launch = MMQLaunch(n, plan)
        xl = as_layout(cp.asarray(xq[:wd]), launch.layout)
        got = launch(w_d, xl, cp.full((wd, n), cp.nan, cp.float32)).get()
        assert np.isfinite(got).all(), f"unwritten outputs at {wd} columns"
        np.testing.assert_array_equal(got[:, rows].view(np.uint32), ref.view(np.uint32),
                                      err_msg=f"{qtype} K={k} N={n} width={wd}")
        outs = MMQMultiLaunch(ns, plan)(ws, xl, [cp.full((wd, m), -1.0, cp.float32) for m in ns])
        for wi, m, o in zip(ws, ns, outs):
            want = MMQLaunch(m, plan)(wi, xl, cp.empty((wd, m), cp.float32))
            assert np.array_equal(o.get().view(np.uint32), want.get().view(np.uint32)), f"multi: {m} rows, {wd} cols"


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 4096, 12288), ("Q4_K", 4096, 1024), ("Q4_K", 12288, 4096),
                                       ("Q6_K", 12288, 4096), ("Q6_K", 4096, 1024), ("Q6_K", 4096, 151936)])
@pytest.mark.parametrize("wstage", [False, True])
def test_kernels_reading_tiles_equal_emulator(cp, qtype, k, n, wstage, monkeypatch):
    """Q4_K and Q6_K weights in 16-row tile records (kernels/mmq/wtile.py): the MMA kernel at 1-4, 9 and 16 columns
    (its one-column form too) and the dp4a kernel at one column (reading the tiles from global memory, or,
    HIRAISHIN_DP4A_WSTAGE, from its block's copy of its pieces of them) give the emulator's bits from the tiles, with
    no local memory at 1-4 columns (Q4_K; Q6_K's one-column MMA form at K = 12288 is relaxed as its cap spills)."""
    import hiraishin.plans.subblock as sb
    from hiraishin.kernels import quantize
    from hiraishin.kernels.compile import kernel_attributes
    from hiraishin.kernels.mmq import emulate
    from hiraishin.kernels.mmq.launch import MMQLaunch, mmq_kernel
    from hiraishin.kernels.mmq.wtile import tile_weight
    from hiraishin.quant import random_blocks

    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")
    monkeypatch.setattr(mmq_launch, "DP4A_WSTAGE", wstage)
    w = random_blocks(qtype, n, k, seed=k + n + 7)
    xq = quantize.emulate(np.random.default_rng(n + 7).standard_normal((16, k)).astype(np.float32))
    rows = _rows(n)
    ref = emulate(w[rows], qtype, xq, sb.subblock_plan(1, qtype, k))
    w_t = cp.asarray(tile_weight(w, qtype))
    for dp4a in (0, 2):  # (2: the dp4a kernel for rows of any multiple of 16 super-blocks)
        monkeypatch.setattr(sb, "SUBBLOCK_DP4A", dp4a)
        for wd in ((1,) if dp4a else (1, 2, 3, 4, 9, 16)):
            plan = sb.subblock_plan(wd, qtype, k, n=n)
            assert (plan.kernel == "dp4a") == bool(dp4a)
            if dp4a:
                assert mmq_launch.dp4a_wstage(plan, True) == int(wstage and k == 4096)
            launch = MMQLaunch(n, plan, wtile=True)
            got = launch(w_t, as_layout(cp.asarray(xq[:wd]), launch.layout), cp.full((wd, n), cp.nan, cp.float32))
            np.testing.assert_array_equal(got.get()[:, rows].view(np.uint32), ref[:wd].view(np.uint32),
                                          err_msg=f"{qtype} K={k} N={n} width={wd} {plan.kernel}")
            if wd <= 4 and (qtype == "Q4_K" or plan.kernel != "onecol"):
                attrs = kernel_attributes(mmq_kernel(plan, wtile=True)[0])
                assert attrs["local_size_bytes"] == 0, (plan.kernel, wd, attrs)


@pytest.mark.parametrize("q6k", ["0", "1"])
def test_passes_from_tiles_equal_passes_from_rows(tiny_model_path, q6k, monkeypatch):
    """A model whose Q4_K projections are laid out as tiles (Qwen3.set_weight_layout, in place on the device) gives
    SUBBLOCK logits with the bits of one in ggml's rows, at 1, 3, 9 and 16 tokens, graphs and all (the graphs captured
    before the change are dropped); another order's pass of it is refused by name; back in rows, that order runs and
    SUBBLOCK gives the same bits again; a model loaded as tiles does too."""
    from hiraishin import Qwen3, ReductionOrder
    from hiraishin.errors import HiraishinError
    from hiraishin.kernels.mmq.wtile import ENV_MMQ_WTILE_Q6K

    monkeypatch.setenv(ENV_MMQ_WTILE_Q6K, q6k)  # (HIRAISHIN_MMQ_WTILE_Q6K=1: the Q6_K projections and head too)
    order = ReductionOrder.SUBBLOCK

    def run(m):
        m.reset()
        m.forward(list(range(20)), 0, order)
        outs = []
        for w in (1, 3, 9, 16):
            for _ in range(3):  # eager warm-up, capture, replay
                out = m.forward(list(range(100, 100 + w)), 20, order)
                m.rollback(20)
            outs.append(out)
        return outs

    def same(a, b, what):
        for w, x, y in zip((1, 3, 9, 16), a, b):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), f"{what}: {w} tokens"

    m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    rows = run(m)
    captured = m.pass_graphs.captures
    assert captured > 0
    m.set_weight_layout("tiles")
    assert m.weight_layout == "tiles" and m.backend.tiled, "no weight was tiled"
    assert m.pass_graphs.captures == 0, "graphs of the old layout kept"
    same(rows, run(m), "tiles")
    m.reset()
    with pytest.raises(HiraishinError, match="set_weight_layout"):
        m.forward([5], 0, ReductionOrder.BATCH_INVARIANT)
    m.set_weight_layout("rows")
    assert not m.backend.tiled
    m.reset()
    m.forward([5], 0, ReductionOrder.BATCH_INVARIANT)
    same(rows, run(m), "rows again")
    loaded = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512,
                             weight_layout="tiles")
    assert loaded.weight_layout_for(order) == "tiles" and loaded.weight_layout_for(ReductionOrder.BATCH_INVARIANT) == "rows"
    same(rows, run(loaded), "loaded as tiles")
    import gc

    held = set(loaded.backend.tiled)
    assert held
    del loaded
    gc.collect()
    assert not held & m.backend.tiled, "a freed model's weights still marked as tiles"


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 1024, 2048), ("Q4_K", 1024, 3072), ("Q6_K", 1024, 1024),
                                       ("Q4_K", 2048, 1024), ("Q4_K", 512, 77)])
@pytest.mark.parametrize("tiles", [False, True])
def test_dp4a_short_rows_equal_emulator(cp, qtype, k, n, tiles, monkeypatch):
    """The dp4a kernel for short rows (HIRAISHIN_SUBBLOCK_DP4A_SHORT: several rows a warp, the 0.6B draft's shapes
    among them) gives the emulator's bits from ggml's rows and from tiles, alone and in the multi launch, every output
    written, no local memory."""
    import hiraishin.plans.subblock as sb
    from hiraishin.kernels import quantize
    from hiraishin.kernels.compile import kernel_attributes
    from hiraishin.kernels.mmq import emulate
    from hiraishin.kernels.mmq.launch import MMQLaunch, MMQMultiLaunch, mmq_kernel
    from hiraishin.kernels.mmq.wtile import tile_weight
    from hiraishin.quant import random_blocks

    monkeypatch.setattr(sb, "SUBBLOCK_DP4A_SHORT", True)
    plan = sb.subblock_plan(1, qtype, k, n=n)
    assert plan.kernel == "dp4a" and plan.nseg == k // 256
    tiles = tiles and n % 16 == 0
    w = random_blocks(qtype, n, k, seed=n + 11)
    xq = quantize.emulate(np.random.default_rng(k).standard_normal((1, k)).astype(np.float32))
    ref = emulate(w, qtype, xq, plan)
    w_d = cp.asarray(tile_weight(w, qtype) if tiles else w)
    launch = MMQLaunch(n, plan, wtile=tiles)
    xl = as_layout(cp.asarray(xq), launch.layout)
    got = launch(w_d, xl, cp.full((1, n), cp.nan, cp.float32)).get()
    assert np.isfinite(got).all(), "unwritten outputs"
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=f"{qtype} K={k} N={n}")
    assert kernel_attributes(mmq_kernel(plan, wtile=tiles)[0])["local_size_bytes"] == 0
    outs = MMQMultiLaunch((n, n), plan, tiles)((w_d, w_d), xl, [cp.full((1, n), -1.0, cp.float32) for _ in range(2)])
    for o in outs:
        np.testing.assert_array_equal(o.get().view(np.uint32), ref.view(np.uint32), err_msg="multi")
