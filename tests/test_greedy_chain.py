"""greedy_chain: the n greedy tokens after a pass, as a loop of forward_argmax makes them (CPU).

On the CPU (no CUDA graphs) the model's greedy_chain is that loop itself; these tests pin its
contract (the tokens, the cache it leaves, the errors) and decode.passes.greedy_chain's fallback for
models without it or passes that cross the order's KV boundary. tests/test_greedy_chain_gpu.py
checks the chained replays on a GPU against the same loop.
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin import Qwen3, ReductionOrder
from hiraishin.testing import greedy_loop
from hiraishin.decode.passes import greedy_chain
from hiraishin.errors import HiraishinError

ORDER = ReductionOrder.BATCH_INVARIANT


@pytest.fixture(scope="module")
def model(micro_model_path):
    return Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=64)


@pytest.mark.parametrize("first", [[5], [5, 9]])
def test_chain_equals_the_loop_and_leaves_the_same_cache(model, first):
    model.reset()
    model.forward([1, 2, 3], 0, ORDER)
    want = greedy_loop(model, first, 3, 5)
    after_loop = model.forward([want[-1]], model.kv_len, ORDER)
    model.rollback(3)
    got = model.greedy_chain(first, 3, 5, ORDER)
    assert got.dtype == np.int64 and got.tolist() == want
    assert model.kv_len == 3 + len(first) + 4  # the tokens and the first four greedy tokens
    np.testing.assert_array_equal(model.forward([want[-1]], model.kv_len, ORDER), after_loop)


def test_chain_of_one_is_forward_argmax(model):
    model.reset()
    assert model.greedy_chain([4, 8], 0, 1, ORDER).tolist() == [int(model.forward_argmax([4, 8], 0, ORDER)[-1])]
    assert model.kv_len == 2


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "3"])
def test_chain_rejects_a_bad_count(model, n):
    with pytest.raises(HiraishinError, match="n >= 1"):
        model.greedy_chain([1], 0, n, ORDER)


def test_chain_rejects_positions_past_the_context(model):
    model.reset()
    with pytest.raises(HiraishinError, match="exceed n_ctx"):
        model.greedy_chain([1, 2], 0, 64, ORDER)  # the last pass would write cell 64


def test_chain_rejects_a_bad_order(model):
    with pytest.raises(HiraishinError, match="ReductionOrder"):
        model.greedy_chain([1], 0, 2, "invariant")


class _NoChain:
    """A model with forward only (like the decode tests' fakes): greedy_chain goes pass by pass."""

    def __init__(self, inner):
        self.inner = inner
        self.passes = []

    def forward(self, tokens, start_pos, order):
        self.passes.append((start_pos, len(tokens)))
        return self.inner.forward(tokens, start_pos, order)


def test_passes_greedy_chain_without_the_method_makes_the_same_passes(model):
    model.reset()
    model.forward([1, 2, 3], 0, ORDER)
    want = greedy_loop(model, [5, 9], 3, 4)
    model.rollback(3)
    fake = _NoChain(model)
    assert greedy_chain(fake, [5, 9], 3, 4, ORDER) == want
    assert fake.passes == [(3, 2), (5, 1), (6, 1), (7, 1)]


def test_passes_greedy_chain_cuts_the_first_pass_at_the_kv_boundary(micro_model_path):
    """Under an exact order a pass never straddles a 256-cell boundary: tokens that would are fed in
    two passes (as feed() cuts them), and the chain goes on from there."""
    m = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=512)
    rng = np.random.default_rng(0)
    m.forward(rng.integers(0, m.config.n_vocab, 255).tolist(), 0, ORDER)
    assert ORDER.verify_limit(255, 2) == 1
    from hiraishin.decode.passes import feed

    want = [int(np.argmax(feed(m, [5, 9], 255, ORDER)))]  # the cut passes, then one token at a time
    want += greedy_loop(m, [want[0]], 257, 2)
    m.rollback(255)
    fake = _NoChain(m)
    assert greedy_chain(fake, [5, 9], 255, 3, ORDER) == want
    assert fake.passes[:2] == [(255, 1), (256, 1)]


# ---- greedy_chain_async / verify_chain / draft_and_verify (the host side; the device side: GPU tests) ----

def test_chain_async_on_the_cpu_is_made_at_once(model):
    model.reset()
    model.forward([1, 2, 3], 0, ORDER)
    want = greedy_loop(model, [5], 3, 4)
    model.rollback(3)
    chain = model.greedy_chain_async([5], 3, 4, ORDER)
    assert chain.pending is None and chain.n == 4 and chain.device_spans() is None
    assert chain.tokens().tolist() == want
    assert model.kv_len == 3 + 1 + 3


def test_verify_chain_is_forward_argmax_of_first_and_the_chain(micro_model_path):
    draft = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=64)
    target = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=64)
    for m in (draft, target):
        m.forward([1, 2, 3], 0, ORDER)
    chain = draft.greedy_chain_async([7], 3, 3, ORDER)
    guesses = chain.tokens().tolist()
    got = target.verify_chain(7, chain, 3, ORDER)
    target.rollback(3)
    assert got.tolist() == target.forward_argmax([7] + guesses, 3, ORDER).tolist()
    # given ids instead of the chain's (an oracle's), the same pass of those ids
    got = target.verify_chain(7, chain, 3, ORDER, tokens=[7, 1, 2, 3])
    target.rollback(3)
    assert got.tolist() == target.forward_argmax([7, 1, 2, 3], 3, ORDER).tolist()
    with pytest.raises(HiraishinError, match="need 4"):
        target.verify_chain(7, chain, 3, ORDER, tokens=[7, 1])
    with pytest.raises(HiraishinError, match=r"\[0, "):
        target.verify_chain(-1, chain, 3, ORDER)


def test_chain_tokens_takes_one_source():
    from hiraishin.model.qwen3 import ChainTokens

    with pytest.raises(HiraishinError, match="not both or neither"):
        ChainTokens()
    assert ChainTokens(host=np.array([3, 4])).tokens().tolist() == [3, 4]


def test_draft_and_verify_equals_the_two_calls(micro_model_path):
    from hiraishin.decode.passes import draft_and_verify, greedy_tokens

    draft = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=64)
    target = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False, n_ctx=64)
    for m in (draft, target):
        m.forward([1, 2, 3, 4], 0, ORDER)
    guesses, best, t_draft, t_verify = draft_and_verify(draft, target, [9, 4], 2, 3, 4, 3, ORDER)
    assert t_draft > 0 and t_verify > 0  # on the CPU each part is timed on the host
    want_guesses = greedy_chain(draft, [9, 4], 2, 3, ORDER)
    target.rollback(3)
    assert guesses == want_guesses
    assert best.tolist() == greedy_tokens(target, [4] + want_guesses, 3, ORDER).tolist()
    # models without the device-side methods: the same two calls
    fake_d, fake_t = _NoChain(draft), _NoChain(target)
    g2, b2, _, _ = draft_and_verify(fake_d, fake_t, [9, 4], 2, 3, 4, 3, ORDER)
    assert g2 == guesses and b2.tolist() == best.tolist()
    assert fake_d.passes == [(2, 2), (4, 1), (5, 1)] and fake_t.passes == [(3, 4)]
