"""greedy_chain on CUDA graphs == a loop of forward_argmax on an eager model: the same tokens, the same
cache (needs CuPy and a GPU, ``-m gpu``).

The chained passes take each token id from the previous pass's argmax on the device and wait on the
host once; they must make exactly the loop's passes: the same greedy tokens, and the same logits
for whatever comes next. Also across a 256-cell boundary (a new attention plan: a capture in the
middle of a chain), from a two-token first pass, and under each order.
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin import Qwen3, ReductionOrder
from hiraishin.testing import greedy_loop

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def models(tiny_model_path):
    chained = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    eager = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=False, n_ctx=512)
    return chained, eager


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK,
                                   ReductionOrder.BATCH_VARIANT], ids=lambda o: o.name)
@pytest.mark.parametrize("prompt_len,first,n", [(20, 1, 6), (20, 2, 4), (250, 1, 12)])
def test_chain_on_graphs_equals_the_eagergreedy_loop(models, order, prompt_len, first, n):
    chained, eager = models
    rng = np.random.default_rng(prompt_len + first)
    prompt = rng.integers(0, chained.config.n_vocab, prompt_len).tolist()
    tokens = rng.integers(0, chained.config.n_vocab, first).tolist()
    for m in models:
        m.reset()
        m.forward(prompt, 0, order)
    want = greedy_loop(eager, tokens, prompt_len, n, order)
    for _ in range(3):  # eager warm-up of each width, capture, replay
        got = chained.greedy_chain(tokens, prompt_len, n, order)
        assert got.tolist() == want
        assert chained.kv_len == eager.kv_len == prompt_len + first + n - 1
    nxt = [want[-1]]
    np.testing.assert_array_equal(chained.forward(nxt, chained.kv_len, order), eager.forward(nxt, eager.kv_len, order))


def test_chain_replays_graphs_it_captured_once(models):
    chained, _ = models
    order = ReductionOrder.BATCH_INVARIANT
    chained.reset()
    chained.forward([1, 2, 3], 0, order)
    chained.greedy_chain([4], 3, 8, order)
    before = chained.pass_graphs.captures
    for _ in range(3):
        chained.greedy_chain([4], 3, 8, order)
    assert chained.pass_graphs.captures == before
