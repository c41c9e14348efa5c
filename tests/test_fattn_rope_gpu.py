"""The q/k norms, RoPE and KV store inside a one-token attention launch (``fattn_vec_q1_rope``) on a GPU.

The launch (each build of ``ATTN_EARLY_LEVELS``) must give the bits of ``QkNormRopeKvLaunch`` then the plan's
one-query attention: both
caches (the token's cell, stored by several blocks, and every other cell), the normalised rows and
their q8_1 with one parallel block, the partials, block maxima and sums with several. A model with
``HIRAISHIN_ATTN_ROPE``'s launch (``ATTN_ROPE``) must decode the same tokens and logits as one without,
eagerly and on CUDA graphs, with one and with several parallel blocks. Needs CuPy (``-m gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest
from fattn_inputs import rope_inputs

pytestmark = pytest.mark.gpu

EPS = np.float32(1e-6)


# (order, n_head, n_head_kv, head_dim, position, n_ctx, q8_1 layout): the 8B's and the 0.6B's heads, short
# caches (one block) and long ones (several; the cell in the last chunk of a block that walks several)
# (order, n_head, n_head_kv, head_dim, first position, tokens, n_ctx, q8_1 layout): one-token passes, and verify
# passes on caches under 1,024 cells (the one-query kernel), one across a chunk boundary
CASES = [("BATCH_INVARIANT", 32, 8, 128, 4095, 1, 4096, "Q4_K"), ("BATCH_INVARIANT", 16, 8, 128, 40, 1, 256, "Q4_K"),
         ("FIXED_SPLIT", 16, 8, 128, 700, 1, 1024, "Q6_K"), ("BATCH_VARIANT", 16, 8, 128, 1500, 1, 2048, "Q4_K"),
         ("BATCH_INVARIANT", 8, 1, 64, 300, 1, 512, None), ("BATCH_INVARIANT", 4, 4, 64, 0, 1, 256, None),
         ("BATCH_INVARIANT", 32, 8, 128, 40, 3, 256, "Q4_K"), ("SUBBLOCK", 32, 8, 128, 125, 6, 512, "MMA_Q4_K"),
         ("BATCH_INVARIANT", 16, 8, 128, 500, 16, 1024, "Q6_K")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-H{c[1]}x{c[2]}-D{c[3]}-pos{c[4]}-T{c[5]}")
def test_rope_attention_launch_equals_qk_norm_rope_kv_then_attention(case):
    import cupy as cp

    from hiraishin import ReductionOrder
    from hiraishin.kernels.attention.launch import current_profile, launch_partials
    from hiraishin.kernels.fused.launch import QkNormRopeKvLaunch, RopeAttentionLaunch, launch_attention_q8_1
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.rope import rope_tables
    from hiraishin.plans import attention_plan

    order_name, H, Hkv, D, pos, T, n_ctx, layout = case
    plan = attention_plan(getattr(ReductionOrder, order_name), T, pos + T, H, Hkv, D, current_profile(D)).launched()
    assert plan.kernel_name == "fattn_vec_q1", plan.describe()
    q, k, v, wq, wk, cache, _ = rope_inputs(H, Hkv, D, pos, n_ctx, seed=pos + H, T=T)
    cos_t, sin_t = rope_tables(n_ctx, D, 1e6)
    qd, kd, vd, wqd, wkd, cosd, sind = map(cp.asarray, (q, k, v, wq, wk, cos_t, sin_t))
    posd = cp.asarray(np.arange(pos, pos + T, dtype=np.int32))
    P = plan.parallel_blocks
    runs = []
    for fused in (0, 1, 2, 3, None):  # the builds of ATTN_EARLY_LEVELS (3: made for T tokens), then the two launches
        kc, vc = cp.asarray(cache), cp.asarray(cache)
        out = cp.full((T, H, D), np.nan, cp.float32)
        parts, meta = cp.full((T, H, P, D), np.nan, cp.float32), cp.full((T, H, P, 2), np.nan, cp.float32)
        yq = cp.full(output_shape(T, H * D, layout), 0xAB, cp.uint8)
        if fused is not None:
            RopeAttentionLaunch(T, H, Hkv, D, P, plan.chunk_cells, plan.kv_attended, float(EPS), layout, early=fused)(
                qd, kd, vd, wqd, wkd, posd, cosd, sind, kc, vc, parts, meta, yq, out)
        else:
            q_roped = cp.empty((T, H, D), cp.float32)
            QkNormRopeKvLaunch(T, H, Hkv, D, EPS)(qd, kd, vd, wqd, wkd, posd, cosd, sind, q_roped, kc, vc)
            if P == 1:
                launch_attention_q8_1(q_roped, kc, vc, posd, plan, yq, out, layout, kv_from_positions=True)
            else:
                launch_partials(q_roped, kc, vc, posd, plan, out, parts, meta, kv_from_positions=True)
        runs.append({"K": kc.get().view(np.uint16), "V": vc.get().view(np.uint16), "out": out.get().view(np.uint32),
                     "parts": parts.get().view(np.uint32), "meta": meta.get().view(np.uint32), "yq": yq.get()})
    *fused, unfused = runs
    names = ("K", "V", "out", "yq") if P == 1 else ("K", "V", "parts", "meta")
    for early, run in enumerate(fused):
        for name in names:
            assert np.array_equal(run[name], unfused[name]), f"{name} (P = {P}, early loads {early})"


@pytest.mark.parametrize("order_name", ["BATCH_INVARIANT", "FIXED_SPLIT", "BATCH_VARIANT"])
@pytest.mark.parametrize("prompt_len", [40, 150])
def test_models_with_the_rope_attention_launch_decode_the_same(tiny_model_path, monkeypatch, order_name,
                                                                prompt_len):
    from hiraishin.kernels.fused import launch as fused_launch

    runs = []
    for on in (False, True):
        monkeypatch.setattr(fused_launch, "ATTN_ROPE_TOKENS", fused_launch.ROPE_MAX_TOKENS if on else 0)
        runs.append(_decode(tiny_model_path, order_name, prompt_len))
    _assert_same(*runs)


@pytest.mark.parametrize("order_name", ["BATCH_INVARIANT", "BATCH_VARIANT"])
@pytest.mark.parametrize("prompt_len", [40, 150])
def test_models_decode_the_same_at_every_early_loads_level(tiny_model_path, monkeypatch, order_name, prompt_len):
    """HIRAISHIN_ATTN_EARLY's levels on whole models, on CUDA graphs (PDL: level 3 reads the cache's earlier
    cells before its wait) and eagerly: the same tokens, logits and caches as level 0."""
    from hiraishin.kernels.fused import launch as fused_launch

    runs = []
    for level in sorted(fused_launch.ATTN_EARLY_LEVELS):
        monkeypatch.setattr(fused_launch, "ATTN_EARLY", level)
        runs.append(_decode(tiny_model_path, order_name, prompt_len))
    for run in runs[1:]:
        _assert_same(runs[0], run)


def _decode(path, order_name, prompt_len):
    """A model's first token, a chain, a stream, a verify pass and an eager pass after them, and two layers' K
    caches, as bits."""
    from hiraishin import Qwen3, ReductionOrder

    order = getattr(ReductionOrder, order_name)
    prompt = [5 + (7 * i) % 900 for i in range(prompt_len)]
    m = Qwen3.from_gguf(path, device="cuda", progress=False, cuda_graphs=True, n_ctx=256)
    first = int(m.forward_argmax(prompt, 0, order)[-1])
    chain = m.greedy_chain([first], prompt_len, 10, order).tolist()
    stream = list(m.greedy_stream(first, prompt_len, 10, order))
    verify = m.forward(chain[:4], prompt_len, order).view(np.uint32)  # a verify pass (graphs)
    m.cuda_graphs = False
    logits = m.forward([chain[-1]], m.kv_len, order)  # an eager one-token pass
    cache = [m.backend.to_host(m.cache.k(il)).view(np.uint16).copy() for il in (0, m.config.n_layer - 1)]
    return (first, chain, [t for t, _ in stream], np.array([v for _, v in stream], np.float32).view(np.uint32),
            logits.view(np.uint32), cache, verify)


def _assert_same(a, b):
    (f0, c0, s0, v0, l0, k0, w0), (f1, c1, s1, v1, l1, k1, w1) = a, b
    assert f0 == f1 and c0 == c1 and s0 == s1 == c0
    assert np.array_equal(v0, v1) and np.array_equal(l0, l1) and np.array_equal(w0, w1)
    assert all(np.array_equal(x, y) for x, y in zip(k0, k1))
