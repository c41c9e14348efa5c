"""hx_swiglu_down on a GPU == the SwiGLU launch then the down mat-vec == the emulators, bit for bit.

Needs CuPy and a GPU (``-m gpu``). Shapes of Qwen3-0.6B's and -8B's down projections (Q4_K and Q6_K), rows the
rows per block do not divide, one and two tokens, the grid capped at one and at several CUDA blocks per SM
(each strides) and uncapped; no spills; then whole passes: a model that makes SwiGLU inside its down launches
(turned on: off by default, measured slower) gives the same logits as one that does not.
"""

from __future__ import annotations

import numpy as np
import pytest
from graph_passes import replayed_passes

from hiraishin import Qwen3, ReductionOrder

pytestmark = pytest.mark.gpu


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# (qtype, k = the product's length, rows of the down weight)
SHAPES = [("Q4_K", 3072, 1024), ("Q6_K", 3072, 1024), ("Q4_K", 12288, 4096), ("Q6_K", 12288, 4096),
          ("Q4_K", 1024, 37)]


@pytest.mark.parametrize("qtype,k,n", SHAPES)
@pytest.mark.parametrize("T", [1, 2])
def test_swiglu_down_equals_swiglu_launch_then_matvec_and_emulator(qtype, k, n, T):
    import cupy as cp

    from hiraishin.kernels.fused.launch import SwigluQ8_1Launch
    from hiraishin.kernels.mmvq.launch import MatVecLaunch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for
    from hiraishin.kernels.swiglu_down import emulate
    from hiraishin.kernels.swiglu_down.launch import SwigluDownLaunch
    from hiraishin.plans import matvec_plan
    from hiraishin.quant import random_blocks

    plan = matvec_plan(ReductionOrder.BATCH_INVARIANT, T, qtype, k=k, n=n)
    assert plan.kernel == "mmvq" and len(plan.launches()) == 1
    rng = np.random.default_rng(k + T)
    w = random_blocks(qtype, n, k, seed=60 + T)
    g = (rng.standard_normal((T, k)) * 3).astype(np.float32)
    u = (rng.standard_normal((T, k)) * 2).astype(np.float32)
    gd, ud, wd = cp.asarray(g), cp.asarray(u), cp.asarray(w)
    layout = layout_for(qtype)
    xq = cp.zeros(output_shape(T, k, layout), cp.uint8)
    SwigluQ8_1Launch(T, k, layout)(gd, ud, xq)
    ref = MatVecLaunch(qtype, n, k, T, plan.rows_per_block, plan.nwarps)(wd, xq, cp.empty((T, n), cp.float32))
    emu = emulate(g, u, w, qtype, plan)
    assert np.array_equal(_bits(ref.get()), _bits(emu)), "the unfused launches != the emulator"
    for per_sm in (0, 1, 2):
        launch = SwigluDownLaunch(qtype, n, k, T, plan.rows_per_block, plan.nwarps, per_sm=per_sm)
        assert launch.kernel.local_size_bytes == 0, (qtype, k, T, launch.defines)
        got = launch(gd, ud, wd, cp.full((T, n), -1.0, cp.float32))
        where = f"{qtype} k={k} n={n} T={T}, grid {launch.grid[0]} of {launch.blocks}"
        assert np.array_equal(_bits(got.get()), _bits(ref.get())), f"{where}: kernel != unfused"


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT],
                         ids=lambda o: o.name)
def test_passes_with_swiglu_in_the_down_launch_equal_passes_without(tiny_model_path, order, monkeypatch):
    from hiraishin.kernels.swiglu_down import launch as swiglu_down

    monkeypatch.setattr(swiglu_down, "SWIGLU_DOWN_TOKENS", 2)  # off by default (measured slower)
    # one CUDA block strides over every row
    monkeypatch.setattr(swiglu_down, "strided_grid", lambda kernel, blocks, block, shared, per_sm: (1, 1, 1))
    fused = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, fused.config.n_vocab, 20).tolist()
    steps = [rng.integers(0, fused.config.n_vocab, w).tolist() for w in (1, 2, 3, 1)]

    with_fusion = replayed_passes(fused, prompt, steps, order)
    launches = [v for key, v in fused.ops._token_scratch.items() if key[0] == "swiglu_down" and v is not None]
    assert launches, "no down launch made SwiGLU: the comparison would be empty"
    assert all(launch.grid[0] == 1 for launch in launches)
    monkeypatch.setattr(swiglu_down, "SWIGLU_DOWN_TOKENS", 0)
    plain = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    without = replayed_passes(plain, prompt, steps, order)
    for i, (a, b) in enumerate(zip(with_fusion, without)):
        assert np.array_equal(_bits(a), _bits(b)), f"step {i} ({len(steps[i])} tokens)"
