"""The fused CUDA kernels == the unfused CUDA kernels == the emulators, bit for bit (needs CuPy and a GPU).

For each fused kernel (hiraishin/kernels/fused) the same inputs go through (1) the fused launch,
(2) the unfused launches it replaces, in the forward pass's order (rmsnorm.launch,
quantize.launch, elementwise.launch_add / launch_swiglu, rope.launch, the f16 cast into the KV
cache as the backend's write_kv does it), and (3) the fused emulator; every output (q8_1 bytes,
float32 rows, f16 cache cells, untouched cells included) must be identical. A few seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

EPS = np.float32(1e-6)  # Qwen3's rms_eps (float32 in its GGUF)
LAYOUTS = (None, "Q4_K", "Q6_K", "MMA_Q4_K", "MMA_Q6_K")


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == np.float32:
        got, want = _bits(got), _bits(want)
    assert got.shape == want.shape, what
    assert np.array_equal(got, want), f"{what}: {int((got != want).sum())} of {got.size} differ"


def _activations(rng, rows, n, scale=3.0):
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    x[0, :32] = 0.0  # a zero q8_1 block
    if rows > 1:
        x[1, 32:40] = [127.0, 63.5, -63.5, 2.5, -2.5, 0.5, -0.5, 1.5]
        x[-1, -32:] *= 1000.0
    return x


# rows 1 (decode), 3 and 9 (verify widths, not a multiple of anything); n = 1024 (0.6B), 4096 (8B),
# 800 (not a multiple of 256: llama.cpp's layout only)
NORM_CASES = [(1, 4096), (9, 4096), (3, 1024), (5, 800)]


@pytest.mark.parametrize("rows,n", NORM_CASES)
def test_rms_norm_q8_1_equals_unfused_and_emulator(rows, n):
    import cupy as cp

    from hiraishin.kernels import quantize, rmsnorm
    from hiraishin.kernels.fused.emulate import emulate_rms_norm_q8_1
    from hiraishin.kernels.fused.launch import RmsNormQ8_1Launch
    from hiraishin.kernels.quantize.launch import output_shape

    rng = np.random.default_rng(rows * 7 + n)
    x = _activations(rng, rows, n)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    xd, wd = cp.asarray(x), cp.asarray(w)
    for layout in LAYOUTS if n % 256 == 0 else (None,):
        shape = output_shape(rows, n, layout)
        yu = rmsnorm.launch(xd, wd, EPS, cp.empty_like(xd))
        qu = quantize.launch(yu, cp.full(shape, 0xAB, cp.uint8), layout)
        launch = RmsNormQ8_1Launch(rows, n, EPS, layout)
        qf, yf = cp.full(shape, 0xCD, cp.uint8), cp.full((rows, n), np.nan, cp.float32)
        launch(xd, wd, qf, yf)
        qf2 = launch(xd, wd, cp.full(shape, 0xEF, cp.uint8))  # no float output (null pointer)
        qe, ye = emulate_rms_norm_q8_1(x, w, EPS, layout)
        _same(cp.asnumpy(qf), cp.asnumpy(qu), f"fused vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(qf2), cp.asnumpy(qu), f"fused (no float out) vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(qf), qe, f"fused vs emulator q8_1 ({layout})")
        _same(cp.asnumpy(yf), cp.asnumpy(yu), "fused vs unfused normed rows")
        _same(cp.asnumpy(yf), ye, "fused vs emulator normed rows")


@pytest.mark.parametrize("rows,n", NORM_CASES)
def test_add_rms_norm_q8_1_equals_unfused_and_emulator(rows, n):
    import cupy as cp

    from hiraishin.kernels import quantize, rmsnorm
    from hiraishin.kernels.elementwise import launch_add
    from hiraishin.kernels.fused.emulate import emulate_add_rms_norm_q8_1
    from hiraishin.kernels.fused.launch import AddRmsNormQ8_1Launch
    from hiraishin.kernels.quantize.launch import output_shape

    rng = np.random.default_rng(rows * 11 + n)
    a = _activations(rng, rows, n)
    b = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    ad, bd, wd = cp.asarray(a), cp.asarray(b), cp.asarray(w)
    for layout in LAYOUTS if n % 256 == 0 else (None,):
        shape = output_shape(rows, n, layout)
        su = launch_add(ad, bd, cp.empty_like(ad))
        yu = rmsnorm.launch(su, wd, EPS, cp.empty_like(ad))
        qu = quantize.launch(yu, cp.full(shape, 0xAB, cp.uint8), layout)
        sf, qf, yf = cp.full_like(ad, np.nan), cp.full(shape, 0xCD, cp.uint8), cp.full_like(ad, np.nan)
        AddRmsNormQ8_1Launch(rows, n, EPS, layout)(ad, bd, wd, sf, qf, yf)
        se, qe, ye = emulate_add_rms_norm_q8_1(a, b, w, EPS, layout)
        for got, unfused, emulated, what in ((sf, su, se, "sum"), (qf, qu, qe, f"q8_1 ({layout})"),
                                             (yf, yu, ye, "normed rows")):
            _same(cp.asnumpy(got), cp.asnumpy(unfused), f"fused vs unfused {what}")
            _same(cp.asnumpy(got), emulated, f"fused vs emulator {what}")


# k = 3072 (0.6B n_ff), 12288 (8B n_ff), 800 (25 q8_1 blocks: a partial CUDA block of warps)
@pytest.mark.parametrize("rows,k", [(1, 12288), (9, 12288), (3, 3072), (5, 800)])
def test_swiglu_q8_1_equals_unfused_and_emulator(rows, k):
    import cupy as cp

    from hiraishin.kernels import quantize
    from hiraishin.kernels.elementwise import launch_swiglu
    from hiraishin.kernels.fused.emulate import emulate_swiglu_q8_1
    from hiraishin.kernels.fused.launch import SwigluQ8_1Launch
    from hiraishin.kernels.quantize.launch import output_shape

    rng = np.random.default_rng(rows * 13 + k)
    g = (rng.standard_normal((rows, k)) * 6).astype(np.float32)
    g[0, :4] = [-100.0, -88.5, 88.5, 1e30]  # exp() under- and overflow
    u = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
    u[0, 32:64] = 0.0
    gd, ud = cp.asarray(g), cp.asarray(u)
    for layout in LAYOUTS if k % 256 == 0 else (None,):
        shape = output_shape(rows, k, layout)
        mu = launch_swiglu(gd, ud, cp.empty_like(gd))
        qu = quantize.launch(mu, cp.full(shape, 0xAB, cp.uint8), layout)
        qf, mf = cp.full(shape, 0xCD, cp.uint8), cp.full_like(gd, np.nan)
        launch = SwigluQ8_1Launch(rows, k, layout)
        launch(gd, ud, qf, mf)
        qf2 = launch(gd, ud, cp.full(shape, 0xEF, cp.uint8))
        qe, me = emulate_swiglu_q8_1(g, u, layout)
        _same(cp.asnumpy(qf), cp.asnumpy(qu), f"fused vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(qf2), cp.asnumpy(qu), f"fused (no float out) vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(qf), qe, f"fused vs emulator q8_1 ({layout})")
        _same(cp.asnumpy(mf), cp.asnumpy(mu), "fused vs unfused swiglu")
        _same(cp.asnumpy(mf), me, "fused vs emulator swiglu")


# (T, H, Hkv, D, positions, n_ctx): the 8B and 0.6B head counts; the last cells of the RoPE table.
@pytest.mark.parametrize("T,H,Hkv,D,positions,n_ctx", [
    (1, 32, 8, 128, [4095], 4096), (9, 32, 8, 128, list(range(4087, 4096)), 4096),
    (3, 16, 8, 128, [0, 255, 256], 512), (2, 4, 2, 64, [7, 3], 8)])
def test_qk_norm_rope_kv_equals_unfused_and_emulator(T, H, Hkv, D, positions, n_ctx):
    import cupy as cp

    from hiraishin.kernels import rmsnorm, rope
    from hiraishin.kernels.fused.emulate import emulate_qk_norm_rope_kv
    from hiraishin.kernels.fused.launch import QkNormRopeKvLaunch
    from hiraishin.kernels.rope import rope_tables

    rng = np.random.default_rng(T * 17 + H)
    q = (rng.standard_normal((T, H, D)) * 4).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, D)) * 4).astype(np.float32)
    v = (rng.standard_normal((T, Hkv, D)) * 3).astype(np.float32)
    v[0, 0, :3] = [1e5, -7e4, 65519.0]  # beyond the f16 range, and a tie at its top
    wq = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    wk = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    wk[:4] *= 1e6
    pos = np.array(positions, np.int32)
    cos_t, sin_t = rope_tables(n_ctx, D, 1e6)
    cache0 = rng.integers(0, 0x7C00, (n_ctx, Hkv, D), dtype=np.uint16).view(np.float16)
    qd, kd, vd, wqd, wkd = map(cp.asarray, (q, k, v, wq, wk))
    posd, cosd, sind = cp.asarray(pos), cp.asarray(cos_t), cp.asarray(sin_t)

    # unfused, as the forward pass runs it: head norms, rope, f16 stores (KV cells pos[t])
    qn = rmsnorm.launch(qd.reshape(T * H, D), wqd, EPS, cp.empty((T * H, D), cp.float32)).reshape(T, H, D)
    kn = rmsnorm.launch(kd.reshape(T * Hkv, D), wkd, EPS, cp.empty((T * Hkv, D), cp.float32)).reshape(T, Hkv, D)
    qu = rope.launch(qn, posd, cosd, sind, cp.empty_like(qn))
    ku = rope.launch(kn, posd, cosd, sind, cp.empty_like(kn))
    kcu, vcu = cp.asarray(cache0), cp.asarray(cache0)
    for t, p in enumerate(positions):  # the CuPy cast of the backend's write_kv (round to nearest even)
        kcu[p:p + 1] = ku[t:t + 1]
        vcu[p:p + 1] = vd[t:t + 1]

    kcf, vcf = cp.asarray(cache0), cp.asarray(cache0)
    qf, kf = cp.full((T, H, D), np.nan, cp.float32), cp.full((T, Hkv, D), np.nan, cp.float32)
    launch = QkNormRopeKvLaunch(T, H, Hkv, D, EPS)
    launch(qd, kd, vd, wqd, wkd, posd, cosd, sind, qf, kcf, vcf, kf)
    kcf2, vcf2, qf2 = cp.asarray(cache0), cp.asarray(cache0), cp.empty((T, H, D), cp.float32)
    launch(qd, kd, vd, wqd, wkd, posd, cosd, sind, qf2, kcf2, vcf2)  # without the float k

    kce, vce = cache0.copy(), cache0.copy()
    qe, ke = emulate_qk_norm_rope_kv(q, k, v, wq, wk, EPS, pos, cos_t, sin_t, kce, vce)
    for got, unfused, emulated, what in ((qf, qu, qe, "q"), (kf, ku, ke, "k (float)"), (qf2, qu, qe, "q (no k out)"),
                                         (kcf, kcu, kce, "K cache"), (vcf, vcu, vce, "V cache"),
                                         (kcf2, kcu, kce, "K cache (no k out)"), (vcf2, vcu, vce, "V cache (no k out)")):
        g, u = cp.asnumpy(got), cp.asnumpy(unfused)
        if g.dtype == np.float16:
            g, u, emulated = g.view(np.uint16), u.view(np.uint16), emulated.view(np.uint16)
        _same(g, u, f"fused vs unfused {what}")
        _same(g, emulated, f"fused vs emulator {what}")


def test_fused_launches_replay_in_a_cuda_graph_with_new_positions():
    """Captured once, replayed with other positions in the device array: the eager launch's bits."""
    import cupy as cp

    from hiraishin.kernels.fused.launch import QkNormRopeKvLaunch
    from hiraishin.kernels.rope import rope_tables

    T, H, Hkv, D, n_ctx = 2, 4, 2, 128, 64
    rng = np.random.default_rng(5)
    q, k, v = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((T, H, D), (T, Hkv, D), (T, Hkv, D)))
    wq, wk = (cp.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32)) for _ in range(2))
    cos_t, sin_t = (cp.asarray(t) for t in rope_tables(n_ctx, D, 1e6))
    launch = QkNormRopeKvLaunch(T, H, Hkv, D, EPS)
    pos = cp.zeros((T,), cp.int32)
    qo, kc, vc = cp.empty((T, H, D), cp.float32), cp.zeros((n_ctx, Hkv, D), cp.float16), cp.zeros((n_ctx, Hkv, D), cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()  # the inputs above were made on the default stream, which it does not wait for
    with stream:
        launch(q, k, v, wq, wk, pos, cos_t, sin_t, qo, kc, vc)  # compile outside the capture
        stream.synchronize()
        stream.begin_capture()
        launch(q, k, v, wq, wk, pos, cos_t, sin_t, qo, kc, vc)
        graph = stream.end_capture()
        for p in ([10, 11], [62, 63]):
            pos[...] = cp.asarray(p, cp.int32)
            graph.launch(stream)
            stream.synchronize()
            got_q, got_k = cp.asnumpy(qo), cp.asnumpy(kc[p[0]:p[1] + 1])
            want_q, want_kc, want_vc = cp.empty_like(qo), cp.zeros_like(kc), cp.zeros_like(vc)
            launch(q, k, v, wq, wk, cp.asarray(p, cp.int32), cos_t, sin_t, want_q, want_kc, want_vc)
            stream.synchronize()
            _same(got_q, cp.asnumpy(want_q), f"graph replay q at {p}")
            _same(got_k.view(np.uint16), cp.asnumpy(want_kc[p[0]:p[1] + 1]).view(np.uint16), f"graph replay K at {p}")


# P = 1 vector attention with its q8_1 store: (kernel plan kind, T, H, Hkv, kv_len, D)
ATTN_CASES = [("q1", 1, 16, 8, 33, 128), ("qn", 3, 4, 2, 200, 128), ("shared", 5, 8, 2, 129, 64),
              ("shared", 16, 32, 8, 255, 128)]


@pytest.mark.parametrize("kind,T,H,Hkv,kv_len,D", ATTN_CASES)
def test_attention_q8_1_equals_attention_then_quantize_and_emulator(kind, T, H, Hkv, kv_len, D):
    import cupy as cp
    from fattn_inputs import make_inputs

    from hiraishin.kernels import attention, quantize
    from hiraishin.kernels.fused.emulate import emulate_attention_q8_1
    from hiraishin.kernels.fused.launch import launch_attention_q8_1
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import LAYOUT_COLUMN_GROUP, mma8_columns
    from hiraishin.plans.attention import AttentionPlan

    qpb = {"q1": 1, "qn": 2, "shared": 4}[kind]
    plan = AttentionPlan("vec", qpb, 1, chunk_cells=256, split_cells=256, kv_attended=-(-kv_len // 256) * 256,
                         shared_kv=kind == "shared", kv_len=kv_len, n_head=H, n_head_kv=Hkv, n_queries=T,
                         head_dim=D)
    q, k, v = make_inputs(seed=T * 31 + kv_len, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    qd, kd, vd, pd = (cp.asarray(a) for a in (q, k, v, q_pos))
    for layout in (None, "Q4_K", "Q6_K", "MMA_Q4_K", "MMA8_Q4_K", "MMA8_Q6_K") if H * D % 256 == 0 else (None,):
        shape = output_shape(T, H * D, layout)
        o = attention.launch(qd, kd, vd, pd, plan, cp.empty((T, H, D), cp.float32), kv_from_positions=True)
        qu = quantize.launch(o.reshape(T, H * D), cp.full(shape, 0xAB, cp.uint8), layout)
        of = cp.full((T, H, D), np.nan, cp.float32)
        qf = launch_attention_q8_1(qd, kd, vd, pd, plan, cp.full(shape, 0xAB, cp.uint8), of, layout, True)
        qf2 = launch_attention_q8_1(qd, kd, vd, pd, plan, cp.full(shape, 0xAB, cp.uint8), None, layout, True)
        _same(cp.asnumpy(qf), cp.asnumpy(qu), f"{kind}: fused vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(qf2), cp.asnumpy(qu), f"{kind}: fused (no float out) vs unfused q8_1 ({layout})")
        _same(cp.asnumpy(of), cp.asnumpy(o), f"{kind}: fused vs unfused rows")
        qe, oe = emulate_attention_q8_1(q, k, v, q_pos, plan, layout)
        _same(cp.asnumpy(of), oe, f"{kind}: fused rows vs emulator")
        if layout in LAYOUT_COLUMN_GROUP:  # the emulator's padding columns are its own
            _same(cp.asnumpy(mma8_columns(qf, T)), mma8_columns(np.asarray(qe), T), f"{kind}: vs emulator ({layout})")
        else:
            _same(cp.asnumpy(qf), qe, f"{kind}: fused vs emulator q8_1 ({layout})")


@pytest.mark.parametrize("qtype,rows,n", [("Q6_K", 1, 1024), ("Q4_K", 3, 4096), ("Q8_0", 2, 800), ("F16", 9, 1024)])
def test_embed_rms_norm_q8_1_equals_get_rows_then_norm_and_emulator(qtype, rows, n):
    """One launch for a pass's embedding and first norm: get_rows' rows and the norm's q8_1 (two layouts)
    and floats, as the two launches make them and as the emulator does."""
    import cupy as cp

    from hiraishin import quant
    from hiraishin.kernels.elementwise.launch import launch_get_rows
    from hiraishin.kernels.fused.emulate import emulate_embed_rms_norm_q8_1
    from hiraishin.kernels.fused.launch import launch_embed_rms_norm_q8_1, launch_rms_norm_q8_1
    from hiraishin.kernels.quantize.launch import output_shape

    rng = np.random.default_rng(rows + n)
    table = np.ascontiguousarray(quant.quantize((rng.standard_normal((13, n)) * 2).astype(np.float32), qtype))
    table = table.view(np.uint8).reshape(13, -1)
    ids = rng.integers(0, 13, rows).astype(np.int32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    td, idd, wd = cp.asarray(table), cp.asarray(ids), cp.asarray(w)
    for layout, layout2 in ((None, None), ("Q4_K", "Q6_K")) if n % 256 == 0 else ((None, None),):
        es, eq, ey = emulate_embed_rms_norm_q8_1(table, qtype, ids, w, EPS, layout)
        eq2 = None if layout2 is None else emulate_embed_rms_norm_q8_1(table, qtype, ids, w, EPS, layout2)[1]
        s = cp.full((rows, n), -1.0, cp.float32)
        q = cp.zeros(output_shape(rows, n, layout), cp.uint8)
        q2 = None if layout2 is None else cp.zeros(output_shape(rows, n, layout2), cp.uint8)
        y = cp.full((rows, n), -1.0, cp.float32)
        launch_embed_rms_norm_q8_1(td, qtype, idd, wd, float(EPS), s, q, y, layout, q2, layout2)
        us = launch_get_rows(td, qtype, idd, cp.empty((rows, n), cp.float32))
        uq, uy = cp.zeros_like(q), cp.empty_like(y)
        launch_rms_norm_q8_1(us, wd, float(EPS), uq, uy, layout)
        for got, unfused, emulated, what in ((s, us, es, "rows"), (q, uq, eq, "q8_1"), (y, uy, ey, "normed")):
            _same(got.get(), unfused.get(), f"{qtype} {layout} {what}: fused vs get_rows + norm")
            _same(got.get(), emulated, f"{qtype} {layout} {what}: fused vs emulator")
        if q2 is not None:
            _same(q2.get(), eq2, f"{qtype} second layout {layout2}")


def test_passes_with_the_embedding_fused_equal_the_two_launches(tiny_model_path, monkeypatch):
    """Whole passes with HIRAISHIN_EMBED_NORM's one launch: the logits of the get_rows + norm passes."""
    from hiraishin import Qwen3, ReductionOrder
    from hiraishin.kernels.fused import launch as fused_launch

    model = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=False, n_ctx=256)
    tokens = list(range(3, 40, 3))
    for order in (ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK):
        want = [model.forward(tokens, 0, order), model.forward([5], len(tokens), order)]
        monkeypatch.setattr(fused_launch, "EMBED_NORM", True)
        got = [model.forward(tokens, 0, order), model.forward([5], len(tokens), order)]
        monkeypatch.setattr(fused_launch, "EMBED_NORM", False)
        for g, w in zip(got, want):
            _same(g, w, f"{order.name} logits")
