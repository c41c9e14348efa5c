"""hx_norm_mmvq on a GPU == the fused norm launch then the mat-vec launch == the emulators, bit for bit.

Needs CuPy and a GPU (``-m gpu``). Shapes of Qwen3-0.6B and -8B (Q, K and V of one launch; gate and
up; a lone Q6_K V), rows the rows per block do not divide, one to four tokens, with and without the
residual, each launch also with one CUDA block per SM (the blocks then stride over several blocks' rows);
then whole passes: a model whose norms fuse (turned on: the default is off, measured slower) gives the same
logits with the fusion off.
"""

from __future__ import annotations

import numpy as np
import pytest
from graph_passes import assert_same_decoding, greedy_outputs, replayed_passes

from hiraishin import Qwen3, ReductionOrder

pytestmark = pytest.mark.gpu

EPS = np.float32(1e-6)


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# (qtype, k, row counts of the weights in one launch)
SHAPES = [("Q4_K", 1024, (2048, 1024, 1024)), ("Q4_K", 1024, (3072, 3072)), ("Q6_K", 1024, (1024,)),
          ("Q4_K", 4096, (4096, 1024, 1024)), ("Q4_K", 2048, (11, 5, 7)), ("Q8_0", 1024, (300, 77))]


@pytest.mark.parametrize("qtype,k,ns", SHAPES)
@pytest.mark.parametrize("T", [1, 2, 4])
def test_norm_mmvq_equals_norm_launch_then_matvec_and_emulator(qtype, k, ns, T):
    import cupy as cp

    from hiraishin.kernels.fused.launch import AddRmsNormQ8_1Launch, RmsNormQ8_1Launch
    from hiraishin.kernels.mmvq.launch import MultiMatVecLaunch
    from hiraishin.kernels.norm_mmvq import emulate
    from hiraishin.kernels.norm_mmvq.launch import NormMatVecLaunch, norm_mmvq_geometry
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for
    from hiraishin.plans import matvec_plan
    from hiraishin.quant import random_blocks

    plan = matvec_plan(ReductionOrder.BATCH_INVARIANT, T, qtype, k=k)
    assert plan.kernel == "mmvq" and norm_mmvq_geometry(k, plan.nwarps) is not None
    rng = np.random.default_rng(k * 10 + T)
    ws = [random_blocks(qtype, n, k, seed=40 + i) for i, n in enumerate(ns)]
    x = (rng.standard_normal((T, k)) * 2).astype(np.float32)
    r = (rng.standard_normal((T, k)) * 3).astype(np.float32)
    nw = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    xd, rd, nwd = cp.asarray(x), cp.asarray(r), cp.asarray(nw)
    wds = [cp.asarray(w) for w in ws]
    layout = layout_for(qtype)
    fused = NormMatVecLaunch(qtype, ns, k, T, plan.rows_per_block, plan.nwarps, layout, float(EPS), per_sm=0)
    # one CUDA block per SM: each strides over the rows of several blocks (NORM_MMVQ_PER_SM)
    strided = NormMatVecLaunch(qtype, ns, k, T, plan.rows_per_block, plan.nwarps, layout, float(EPS), per_sm=1)
    assert strided.grid[0] == min(fused.grid[0], cp.cuda.Device().attributes["MultiProcessorCount"])
    multi = MultiMatVecLaunch(qtype, ns, k, T, plan.rows_per_block, plan.nwarps)
    for residual, launch in ((True, fused), (False, fused), (True, strided), (False, strided)):
        got = [cp.full((T, n), -1.0, cp.float32) for n in ns]
        s = cp.full((T, k), -1.0, cp.float32) if residual else None
        launch(xd, rd if residual else None, nwd, s, wds, got)
        xq = cp.zeros(output_shape(T, k, layout), cp.uint8)
        s_ref = cp.empty((T, k), cp.float32)
        if residual:
            AddRmsNormQ8_1Launch(T, k, float(EPS), layout)(xd, rd, nwd, s_ref, xq)
        else:
            RmsNormQ8_1Launch(T, k, float(EPS), layout)(xd, nwd, xq)
        ref = multi(wds, xq, [cp.empty((T, n), cp.float32) for n in ns])
        emu, s_emu = emulate(x, r if residual else None, nw, EPS, [(w, qtype) for w in ws], plan)
        for n, g, want, e in zip(ns, got, ref, emu):
            where = f"{qtype} {n} rows, T={T}, grid {launch.grid[0]} of {launch.blocks}"
            assert np.array_equal(_bits(g.get()), _bits(want.get())), f"{where}: kernel != unfused"
            assert np.array_equal(_bits(g.get()), _bits(e)), f"{where}: kernel != emulator"
        if residual:
            assert np.array_equal(_bits(s.get()), _bits(s_ref.get()))
            assert np.array_equal(_bits(s.get()), _bits(s_emu))


@pytest.mark.parametrize("k,ns,rows", [(1024, (2048, 1024, 1024), (1, 1, 1)), (4096, (4096, 1024, 1024), (4, 4, 2)),
                                       (2048, (11, 5, 7), (2, 2, 1))])
@pytest.mark.parametrize("T", [1, 2])  # (three 8B rows in two layouts and the hand-over pass 48 KiB)
def test_norm_mmvq_mixed_equals_norm_launch_then_mmvq_mixed_and_emulator(k, ns, rows, T):
    """Q4_K Q and K beside a Q6_K V (hx_norm_mmvq_mixed): the norm launch writing both layouts, then mmvq_mixed."""
    import cupy as cp

    from hiraishin.kernels.fused.launch import AddRmsNormQ8_1Launch
    from hiraishin.kernels.mmvq.launch import MixedMatVecLaunch
    from hiraishin.kernels.norm_mmvq import emulate
    from hiraishin.kernels.norm_mmvq.launch import NormMixedMatVecLaunch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.plans import MatVecPlan
    from hiraishin.quant import random_blocks

    qtypes = ("Q4_K", "Q4_K", "Q6_K")
    rng = np.random.default_rng(k + T)
    ws = [random_blocks(q, n, k, seed=80 + i) for i, (q, n) in enumerate(zip(qtypes, ns))]
    x = (rng.standard_normal((T, k)) * 2).astype(np.float32)
    r = (rng.standard_normal((T, k)) * 3).astype(np.float32)
    nw = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    xd, rd, nwd = cp.asarray(x), cp.asarray(r), cp.asarray(nw)
    wds = [cp.asarray(w) for w in ws]
    ya, yb = cp.zeros(output_shape(T, k, "Q4_K"), cp.uint8), cp.zeros(output_shape(T, k, "Q6_K"), cp.uint8)
    AddRmsNormQ8_1Launch(T, k, float(EPS), "Q4_K", "Q6_K")(xd, rd, nwd, cp.empty((T, k), cp.float32), ya, None, yb)
    ref = MixedMatVecLaunch(qtypes, ns, rows, k, T, 4)(wds, ya, yb, [cp.empty((T, n), cp.float32) for n in ns])
    plan = MatVecPlan("mmvq", "Q4_K", nwarps=4, rows_per_block=1, cols_per_launch=T, ncols=T)
    emu, _ = emulate(x, r, nw, EPS, list(zip(ws, qtypes)), plan)
    for per_sm in (0, 1):
        launch = NormMixedMatVecLaunch(qtypes, ns, rows, k, T, 4, float(EPS), per_sm=per_sm)
        assert launch.kernel.local_size_bytes == 0, (k, T)
        got = launch(xd, rd, nwd, None, wds, [cp.full((T, n), -1.0, cp.float32) for n in ns])
        for n, g, want, e in zip(ns, got, ref, emu):
            where = f"{n} rows, k={k}, T={T}, grid {launch.grid[0]} of {launch.blocks}"
            assert np.array_equal(_bits(g.get()), _bits(want.get())), f"{where}: kernel != unfused"
            assert np.array_equal(_bits(g.get()), _bits(e)), f"{where}: kernel != emulator"


def test_norm_mmvq_spills_nothing():
    from hiraishin.kernels.norm_mmvq.launch import NormMatVecLaunch
    from hiraishin.plans import matvec_plan

    for qtype, k, ns in SHAPES:
        for T in (1, 4):
            plan = matvec_plan(ReductionOrder.BATCH_INVARIANT, T, qtype, k=k)
            launch = NormMatVecLaunch(qtype, ns, k, T, plan.rows_per_block, plan.nwarps, None if qtype == "Q8_0"
                                      else qtype, float(EPS))
            assert launch.kernel.local_size_bytes == 0, (qtype, k, T)


@pytest.mark.parametrize("per_sm", [0, 1])
@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT],
                         ids=lambda o: o.name)
def test_passes_with_the_norm_fused_equal_passes_without(tiny_model_path, order, per_sm, monkeypatch):
    from hiraishin.kernels.norm_mmvq import launch as norm_mmvq

    monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_MAX_TOKENS", 4)  # off by default (measured slower)
    monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_PER_SM", per_sm)
    if per_sm:  # the tiny model's launches have fewer blocks than an H200 has SMs: one CUDA block strides over all
        monkeypatch.setattr(norm_mmvq, "strided_grid", lambda kernel, blocks, block, shared, per_sm: (1, 1, 1))
    fused = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, fused.config.n_vocab, 20).tolist()
    steps = [rng.integers(0, fused.config.n_vocab, w).tolist() for w in (1, 2, 3, 4, 1)]

    with_fusion = replayed_passes(fused, prompt, steps, order)
    launches = [launch for v in fused.ops._norm_multis.values() if v for launch, _ in v]
    assert launches, "no norm was fused: the comparison would be empty"
    if per_sm:
        assert all(launch.grid[0] == 1 for launch in launches) and any(launch.blocks > 1 for launch in launches)
    monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_MAX_TOKENS", 0)
    plain = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    without = replayed_passes(plain, prompt, steps, order)
    for i, (a, b) in enumerate(zip(with_fusion, without)):
        assert np.array_equal(_bits(a), _bits(b)), f"step {i} ({len(steps[i])} tokens)"


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT],
                         ids=lambda o: o.name)
@pytest.mark.parametrize("per_sm", [0, 1])
def test_a_pass_ending_in_one_launch_makes_the_same_tokens(tiny_model_path, order, per_sm, monkeypatch):
    """The norm, the head and the greedy token in one launch (hx_norm_mmvq_argmax: the norm fused and
    HIRAISHIN_HEAD_ARGMAX=1) against the three launches: the same chain of tokens, logged logit bits and logits."""
    import sys

    from hiraishin.kernels.norm_mmvq import launch as norm_mmvq

    mmvq_launch = sys.modules["hiraishin.kernels.mmvq.launch"]  # (the package's `launch` is a function)
    prompt = [3 + (11 * i) % 700 for i in range(24)]
    runs = []
    for fused in (False, True):
        monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_MAX_TOKENS", 1 if fused else 0)
        monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_MAX_BLOCKS", 1 << 30)  # the head's too
        monkeypatch.setattr(norm_mmvq, "NORM_MMVQ_PER_SM", per_sm)
        monkeypatch.setattr(mmvq_launch, "HEAD_ARGMAX", fused)
        m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=256)
        runs.append(greedy_outputs(m, prompt, 12, order))
        heads = [launch for v in m.ops._norm_multis.values() if v for launch, _ in v
                 if isinstance(launch, norm_mmvq.NormArgmaxLaunch)]
        assert bool(heads) == fused, "the one-launch end was (not) taken"
    assert_same_decoding(*runs)
