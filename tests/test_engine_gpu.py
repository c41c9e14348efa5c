"""The CUDA engine: fused passes and CUDA-graph replays give the eager, recorded and CPU bits.

Run on a GPU (``-m gpu``). Every width 1..16 replays a graph; the graphs of a width are reused
across positions (captured again only when the attention plan changes, at most once per 256 cells).
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin import Qwen3, ReductionOrder

pytestmark = pytest.mark.gpu

ORDERS = [ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK]


def _bits(a):
    return np.asarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def models(tiny_model_path):
    graphs = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=1280)
    eager = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=False, n_ctx=1280)
    cpu = Qwen3.from_gguf(tiny_model_path, device="cpu", progress=False, n_ctx=1280)
    return graphs, eager, cpu


# after 1040 cells (past plans.attention.SHARED_MIN_KV) the exact orders' wide passes take fattn_vec_shared
@pytest.mark.parametrize("order,prompt_len", [(o, 40) for o in ORDERS] + [(o, 1040) for o in ORDERS[1:]],
                         ids=lambda x: x.name if isinstance(x, ReductionOrder) else f"kv{x}")
def test_every_width_graph_equals_eager_recorded_and_cpu(models, order, prompt_len):
    graphs, eager, cpu = models
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, graphs.config.n_vocab, prompt_len).tolist()
    for m in models:
        m.reset()
        m.forward(prompt, 0, order)
    start = len(prompt)
    for width in range(1, 17):
        tokens = rng.integers(0, graphs.config.n_vocab, width).tolist()
        outs = []
        for _ in range(3):  # eager warm-up, capture, replay
            outs.append(graphs.forward(tokens, start, order))
        want = eager.forward(tokens, start, order)
        rec = {}
        recorded = eager.forward(tokens, start, order, record=rec)
        ref = cpu.forward(tokens, start, order)
        for got in outs + [recorded, ref]:
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"width {width}")
        # the greedy tokens of the device argmax (in the replayed graph, eager, on the CPU)
        best = np.argmax(want, axis=1).tolist()
        for m in models:
            assert m.forward_argmax(tokens, start, order).tolist() == best, f"width {width}"
    assert graphs._graphs.captures >= 16


def test_graphs_are_reused_across_positions_and_plans(models):
    graphs, eager, _ = models
    order = ReductionOrder.BATCH_INVARIANT
    for m in (graphs, eager):
        m.reset()
    captures0 = graphs._graphs.captures
    token = 7
    for pos in range(0, 300):  # crosses the 256-cell boundary: one new attention plan
        a = graphs.forward([token], pos, order)
        b = eager.forward([token], pos, order)
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=f"position {pos}")
        token = int(np.argmax(a[0]))
    # one capture per distinct attention plan of the one-token pass, not one per step, and only
    # the recent plans' graphs are kept (host memory stays flat over long generations)
    assert graphs._graphs.captures - captures0 <= 4
    from hiraishin.backends.graphs import GRAPHS_PER_WIDTH

    assert len(graphs._graphs._graphs[(order, 1)]) <= GRAPHS_PER_WIDTH


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("width", [1, 3, 8, 16])
def test_grouped_matvecs_equal_separate_ones(qtype, width):
    """Q, K, V (gate, up) of one type in one mmvq_multi launch give each weight's own bits."""
    from hiraishin.backends import get_backend
    from hiraishin.quant import random_blocks

    be = get_backend("cuda")
    k = 4096
    ws = [be.to_device(random_blocks(qtype, n, k, seed=n)) for n in (4096, 1024, 1024)]
    x = be.to_device(np.random.default_rng(width).standard_normal((width, k)).astype(np.float32))
    for order in ORDERS[:2]:
        together = be.mul_mats([(w, qtype) for w in ws], x, order)
        for w, got in zip(ws, together):
            np.testing.assert_array_equal(_bits(be.to_host(got)), _bits(be.to_host(be.mul_mat(w, qtype, x, order))))


@pytest.mark.parametrize("k", [1024, 4096])
@pytest.mark.parametrize("width", [1, 2, 3, 8])
def test_mixed_type_matvecs_equal_separate_ones(monkeypatch, k, width):
    """Q4_K Q and K beside a Q6_K V in one mmvq_mixed launch (HIRAISHIN_MMVQ_MIXED, on) give each weight's
    own bits, and the launch is the mixed one."""
    import importlib

    from hiraishin.backends import get_backend
    from hiraishin.quant import random_blocks

    monkeypatch.setattr(importlib.import_module("hiraishin.kernels.mmvq.launch"), "MIXED", True)
    be = get_backend("cuda")
    weights = [(be.to_device(random_blocks(q, n, k, seed=n + i)), q)
               for i, (q, n) in enumerate((("Q4_K", 2048), ("Q4_K", 1024), ("Q6_K", 1024)))]
    x = be.to_device(np.random.default_rng(width).standard_normal((width, k)).astype(np.float32))
    for order in ORDERS[:2]:
        together = be.mul_mats(weights, x, order)
        for (w, q), got in zip(weights, together):
            np.testing.assert_array_equal(_bits(be.to_host(got)), _bits(be.to_host(be.mul_mat(w, q, x, order))),
                                          err_msg=f"{order.name} {q}")
    assert any(key[0] == "mixed" for key in be.ops._multis), "no mmvq_mixed launch was made"


def test_mixed_type_launches_keep_every_pass_bit(monkeypatch, tiny_model_path):
    """Whole passes (eager and graph-replayed, widths 1..4) with and without mmvq_mixed: the same logits."""
    import importlib

    from hiraishin.kernels.mmvq.launch import ENV_MIXED

    mmvq_launch = importlib.import_module("hiraishin.kernels.mmvq.launch")
    prompt = np.random.default_rng(3).integers(0, 1000, 20).tolist()
    order = ReductionOrder.BATCH_INVARIANT
    outs = {}
    for setting in ("0", "1"):
        monkeypatch.setattr(mmvq_launch, "MIXED", setting == "1")
        for graphs in (False, True):
            m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=graphs, n_ctx=256)
            m.forward(prompt, 0, order)
            got = []
            for width in range(1, 5):
                toks = [(7 * width + j) % m.config.n_vocab for j in range(width)]
                for _ in range(2 if graphs else 1):  # capture, then replay
                    logits = m.forward(toks, 20, order)
                got.append(_bits(logits))
            outs[(setting, graphs)] = got
            # the tiny shape's layers 2 and 3 hold a Q6_K attn_v: the mixed launch ran exactly when it is on
            mixed = any(key[0] == "mixed" for key in m.backend.ops._multis)
            assert mixed == (setting == "1"), f"{ENV_MIXED}={setting}: mmvq_mixed launches made: {mixed}"
    want = outs[("0", False)]
    for key, got in outs.items():
        for width, (a, b) in enumerate(zip(got, want), start=1):
            np.testing.assert_array_equal(a, b, err_msg=f"{ENV_MIXED}={key[0]} graphs={key[1]} width {width}")


@pytest.mark.parametrize("order", [ReductionOrder.FIXED_SPLIT,
                                   ReductionOrder.custom(name="one_block", parallel_blocks=1)], ids=lambda o: o.name)
def test_attention_q8_1_keeps_every_pass_bit(monkeypatch, tiny_model_path, order):
    """Passes whose attention has one parallel block (FIXED_SPLIT under 256 cells; a custom P = 1, whose
    verify passes use the shared-K/V kernel), eager and graph-replayed, widths 1..4 and 9, with and without
    the attention kernel's own q8_1 store (HIRAISHIN_ATTN_Q8_1): the same logits, and the fused launch
    ran exactly when it is on."""
    from hiraishin.backends import cuda_attention
    from hiraishin.kernels.fused import launch as fused_launch

    calls = []
    real = cuda_attention.launch_attention_q8_1
    monkeypatch.setattr(cuda_attention, "launch_attention_q8_1", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = np.random.default_rng(5).integers(0, 1000, 20).tolist()
    outs = {}
    for setting in (False, True):
        monkeypatch.setattr(fused_launch, "ATTN_Q8_1", setting)
        for graphs in (False, True):
            calls.clear()
            m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=graphs, n_ctx=256)
            m.forward(prompt, 0, order)
            got = []
            for width in (1, 2, 3, 4, 9):
                toks = [(5 * width + j) % m.config.n_vocab for j in range(width)]
                for _ in range(2 if graphs else 1):  # capture, then replay
                    got.append(_bits(m.forward(toks, 20, order)))
            outs[(setting, graphs)] = got
            assert bool(calls) == setting, f"ATTN_Q8_1={setting}: fused attention launches made: {len(calls)}"
    want = outs[(False, False)]
    for key, got in outs.items():
        for i, (a, b) in enumerate(zip(got, want if not key[1] else [w for w in want for _ in (0, 1)])):
            np.testing.assert_array_equal(a, b, err_msg=f"ATTN_Q8_1={key[0]} graphs={key[1]} pass {i}")


@pytest.mark.parametrize("spec", ["o,ffn1,down1,qkv1", "o,qkv1/line"])
def test_l2_ahead_keeps_every_pass_bit(monkeypatch, tiny_model_path, spec):
    """Whole passes (eager and graph-replayed, widths 1, 3, 9) with and without L2 prefetches beside
    them: the same logits, every graph captured (a side stream left unjoined would fail the capture)."""
    import warnings

    from hiraishin.model.l2_ahead import ENV_L2_AHEAD

    prompt = np.random.default_rng(4).integers(0, 1000, 20).tolist()
    order = ReductionOrder.SUBBLOCK
    outs = {}
    for setting in ("off", spec):
        monkeypatch.setenv(ENV_L2_AHEAD, setting)
        for graphs in (False, True):
            m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=graphs, n_ctx=256)
            m.forward(prompt, 0, order)
            got = []
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a failed capture warns and runs eagerly
                for width in (1, 3, 9):
                    toks = [(5 * width + j) % m.config.n_vocab for j in range(width)]
                    for _ in range(3 if graphs else 1):  # eager, capture, replay
                        logits = m.forward(toks, 20, order)
                    got.append(_bits(logits))
            if graphs:
                assert m._graphs.captures == 3
            if setting != "off":
                assert m.backend.ops._ahead is not None and not m.backend.ops._ahead_open
            outs[(setting, graphs)] = got
    want = outs[("off", False)]
    for key, got in outs.items():
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=f"{key}")
