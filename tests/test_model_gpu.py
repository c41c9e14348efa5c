"""CUDA backend == CPU backend, bit for bit, for the whole Qwen3 forward pass (needs CuPy + a GPU).

On a mismatch the message names the first recorded op whose output differs, so a failure points
at one kernel.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hiraishin.order import ReductionOrder

pytestmark = pytest.mark.gpu

ORDERS = [ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT]
N_CTX = 320


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _first_difference(cpu_rec: dict, gpu_rec: dict) -> str:
    for name, a in cpu_rec.items():
        b = gpu_rec.get(name)
        if b is None or a.shape != b.shape or not np.array_equal(_bits(a), _bits(b)):
            diff = "missing" if b is None else f"max |Δ| {np.nanmax(np.abs(a - b)) if a.shape == b.shape else 'shape'}"
            return f"first differing op: {name} ({diff})"
    return "no recorded op differs"


def _models(path, cuda_graphs=None):
    from hiraishin.model.qwen3 import Qwen3

    return (Qwen3.from_gguf(path, device="cpu", n_ctx=N_CTX, progress=False),
            Qwen3.from_gguf(path, device="cuda", n_ctx=N_CTX, progress=False, cuda_graphs=cuda_graphs))


def _passes(n_vocab: int):
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, n_vocab, 37).tolist()
    # a prefill of 37 tokens (wider than 8 and 16 columns), a 5-token pass, then 3 one-token passes
    return [(prompt, 0), (rng.integers(0, n_vocab, 5).tolist(), 37)] + [
        ([int(t)], 42 + i) for i, t in enumerate(rng.integers(0, n_vocab, 3))]


@pytest.mark.parametrize("shape", ["micro", "tiny"])
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
def test_cuda_logits_equal_cpu_logits(shape, order, request):
    path = request.getfixturevalue(f"{shape}_model_path")
    cpu, gpu = _models(path)
    for tokens, pos in _passes(cpu.config.n_vocab):
        rc, rg = {}, {}
        a = cpu.forward(tokens, pos, order=order, record=rc)
        b = gpu.forward(tokens, pos, order=order, record=rg)
        assert isinstance(b, np.ndarray) and b.shape == a.shape
        assert np.array_equal(_bits(a), _bits(b)), f"pass at {pos} ({len(tokens)} tokens): {_first_difference(rc, rg)}"
        # the same pass again without recording: passes of <= 16 tokens replay a CUDA graph (on by default)
        c = gpu.forward(tokens, pos, order=order)
        assert np.array_equal(_bits(a), _bits(c)), f"pass at {pos} ({len(tokens)} tokens), graphs={gpu.cuda_graphs}"


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
def test_cuda_graph_replays_equal_eager_passes(micro_model_path, order):
    """CUDA graphs (on by default) replay passes of 1..16 tokens: the same bits as eager launches,
    at first capture and at a replay at other positions (same width)."""
    from hiraishin.model.qwen3 import Qwen3

    graphs = Qwen3.from_gguf(micro_model_path, device="cuda", n_ctx=N_CTX, progress=False)
    eager = Qwen3.from_gguf(micro_model_path, device="cuda", n_ctx=N_CTX, progress=False, cuda_graphs=False)
    assert graphs.cuda_graphs and not eager.cuda_graphs
    rng = np.random.default_rng(11)
    pos = 0
    for rnd in range(2):  # round 0 captures each width, round 1 replays it
        for width in range(1, 17):
            tokens = rng.integers(0, graphs.config.n_vocab, width).tolist()
            a = graphs.forward(tokens, pos, order=order)
            b = eager.forward(tokens, pos, order=order)
            assert isinstance(a, np.ndarray) and a.shape == b.shape == (width, graphs.config.n_vocab)
            assert np.array_equal(_bits(a), _bits(b)), f"round {rnd}, {width} tokens at {pos}"
            pos += width
    assert pos <= N_CTX


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
def test_greedy_output_identical_on_both_backends(tiny_model_path, cuda_graphs):
    cpu, gpu = _models(tiny_model_path, cuda_graphs)
    prompt = "The capital of France is"
    for order in ORDERS:
        a = cpu.generate(prompt, max_new_tokens=8, order=order, stop_at_eos=False)
        b = gpu.generate(prompt, max_new_tokens=8, order=order, stop_at_eos=False)
        assert a.tokens == b.tokens and a.text == b.text
        assert np.array_equal(_bits(a.top_k_logits), _bits(b.top_k_logits))


def test_gpu_memory_is_weights_plus_cache(tiny_model_path):
    import cupy as cp

    from hiraishin.model.qwen3 import Qwen3

    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    model = Qwen3.from_gguf(tiny_model_path, device="cuda", n_ctx=N_CTX, progress=False)
    held = pool.used_bytes() - before
    file_size = os.path.getsize(tiny_model_path)
    assert held <= 1.1 * (file_size + model.cache.nbytes), (held, file_size, model.cache.nbytes)
    model.forward(list(range(16)), 0)  # runs, and the activations of a pass are released after it
    assert pool.used_bytes() - before <= 1.1 * (file_size + model.cache.nbytes)
