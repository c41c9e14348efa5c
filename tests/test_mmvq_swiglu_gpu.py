"""The gate/up mat-vecs with SwiGLU as their epilogue (``mmvq_swiglu``) on a GPU (needs CuPy, ``-m gpu``).

The launch must give ``mmvq_multi``'s gate and up rows and ``hx_swiglu_q8_1``'s product and q8_1 bytes bit for
bit (and the emulators'), at the Qwen3-0.6B's and -8B's shapes, one and three columns, twice on one set of
counters; a model with ``HIRAISHIN_SWIGLU_EPILOGUE``'s launch the same logits, greedy chains and tokens as one
without, eager and on CUDA graphs.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k,ncols,rows,down", [(3072, 1024, 1, 1, "Q6_K"), (12288, 4096, 1, 1, "Q4_K"),
                                                 (3072, 1024, 3, 2, "Q4_K"), (12288, 4096, 2, 2, "Q6_K")])
def test_swiglu_launch_equals_the_gate_up_launch_then_swiglu(n, k, ncols, rows, down):
    import cupy as cp

    from hiraishin.kernels import quantize
    from hiraishin.kernels.fused.launch import launch_swiglu_q8_1
    from hiraishin.kernels.mmvq.launch import MultiMatVecLaunch
    from hiraishin.kernels.mmvq_swiglu import emulate
    from hiraishin.kernels.mmvq_swiglu.launch import SwigluMatVecLaunch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for, to_layout
    from hiraishin.plans import MatVecPlan
    from hiraishin.quant import random_blocks

    qtype, layout = "Q4_K", layout_for(down)
    wg, wu = random_blocks(qtype, n, k, seed=n), random_blocks(qtype, n, k, seed=n + 1)
    xq = quantize.emulate((np.random.default_rng(k).standard_normal((ncols, k)) * 2).astype(np.float32))
    wgd, wud, yd = cp.asarray(wg), cp.asarray(wu), cp.asarray(to_layout(xq, qtype))
    g0, u0 = cp.empty((ncols, n), cp.float32), cp.empty((ncols, n), cp.float32)
    MultiMatVecLaunch(qtype, (n, n), k, ncols, rows, 4)([wgd, wud], yd, [g0, u0])
    yq0 = cp.zeros(output_shape(ncols, n, layout), cp.uint8)
    m0 = cp.empty((ncols, n), cp.float32)
    launch_swiglu_q8_1(g0, u0, yq0, m0, layout)
    fused = SwigluMatVecLaunch(qtype, n, k, ncols, rows, 4, layout)
    for _ in range(2):  # the second launch on the counters the first left
        g, u, m = (cp.full((ncols, n), np.nan, cp.float32) for _ in range(3))
        yq = cp.full(output_shape(ncols, n, layout), 0xAB, cp.uint8)
        fused(wgd, wud, yd, g, u, yq, m)
        for name, a, b in (("g", g, g0), ("u", u, u0), ("m", m, m0)):
            assert np.array_equal(a.get().view(np.uint32), b.get().view(np.uint32)), name
        assert np.array_equal(yq.get(), yq0.get())
        assert not fused.counters.get().any()
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
    eg, eu, eyq, em = emulate(wg, wu, qtype, xq, plan, layout)
    assert np.array_equal(eg.view(np.uint32), g0.get().view(np.uint32))
    assert np.array_equal(em.view(np.uint32), m0.get().view(np.uint32)) and np.array_equal(eyq, yq0.get())


@pytest.mark.parametrize("order_name", ["BATCH_INVARIANT", "BATCH_VARIANT"])
def test_models_with_the_swiglu_epilogue_decode_the_same(tiny_model_path, monkeypatch, order_name):
    from hiraishin import Qwen3, ReductionOrder

    switch = sys.modules["hiraishin.kernels.mmvq_swiglu.launch"]
    order = getattr(ReductionOrder, order_name)
    prompt = list(range(5, 45))
    runs = []
    for on in (False, True):
        monkeypatch.setattr(switch, "SWIGLU_EPILOGUE", on)
        per_graphs = []
        for graphs in (False, True):
            m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=graphs, n_ctx=256)
            first = int(m.forward_argmax(prompt, 0, order)[-1])
            chain = m.greedy_chain([first], len(prompt), 10, order).tolist()
            verify = m.forward(chain[-3:], m.kv_len, order)  # a three-token pass
            one = m.forward([chain[0]], m.kv_len, order)
            fused_keys = [key for key in m.ops._token_scratch if isinstance(key, tuple) and key[0] == "swiglu"]
            assert bool(fused_keys) == on  # the epilogue launch ran where it is on, and only there
            per_graphs.append((first, chain, verify.view(np.uint32), one.view(np.uint32)))
        runs.append(per_graphs)
    base = runs[0][0]
    for per_graphs in runs:
        for first, chain, verify, one in per_graphs:
            assert first == base[0] and chain == base[1]
            assert np.array_equal(verify, base[2]) and np.array_equal(one, base[3])
