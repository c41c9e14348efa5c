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


def _models(path):
    from hiraishin.model.qwen3 import Qwen3

    return (Qwen3.from_gguf(path, device="cpu", n_ctx=N_CTX, progress=False),
            Qwen3.from_gguf(path, device="cuda", n_ctx=N_CTX, progress=False))


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


def test_greedy_output_identical_on_both_backends(tiny_model_path):
    cpu, gpu = _models(tiny_model_path)
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
