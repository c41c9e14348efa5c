"""greedy_chain on CUDA graphs == a loop of forward_argmax on an eager model: the same tokens, the same
cache (needs CuPy and a GPU, ``-m gpu``).

The chained passes take each token id and position from what the previous pass's argmax wrote on the
device (no copy between the graphs) and wait on the host once; they must make exactly the loop's
passes: the same greedy tokens, and the same logits for whatever comes next. Also across a 256-cell
boundary and the 128-cell one where the launched attention plan gains its second parallel block (a
new plan: a capture in the middle of a chain), from a two-token first pass, and under each order.
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
@pytest.mark.parametrize("prompt_len,first,n", [(20, 1, 6), (20, 2, 4), (250, 1, 12), (122, 1, 12)])
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
        # the token log: row p holds the greedy token fed at position p (and its logit's bits)
        log = chained.pass_graphs._log[prompt_len + first:prompt_len + first + n].get()
        assert log[:, 0].tolist() == want
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


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK], ids=lambda o: o.name)
def test_verify_behind_the_chain_on_the_device_equals_the_two_calls(tiny_model_path, models, order):
    """draft_and_verify with both models on graphs: the verify's ids copied on the device from the draft's
    argmaxes (no host round trip) give the same guesses and the same verify argmaxes as greedy_chain then
    greedy_tokens on eager models; with given ids (an oracle's) the pass of those ids."""
    from hiraishin.decode.passes import draft_and_verify, greedy_tokens

    chained, eager = models  # chained: the draft on graphs; eager: the reference draft
    target = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    ref_t = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=False, n_ctx=512)
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, target.config.n_vocab, 30).tolist()
    for m in (chained, eager, target, ref_t):
        m.reset()
        m.forward(prompt, 0, order)
    start = len(prompt)
    for n in (1, 3, 4, 3, 4):  # widths warm up eagerly, are captured, then replay
        for m in (chained, eager, target, ref_t):
            m.rollback(start)
        first = int(rng.integers(0, target.config.n_vocab))
        want_g = greedy_loop(eager, [first], start, n, order)
        want_b = greedy_tokens(ref_t, [first] + want_g, start, order).tolist()
        guesses, best, t_draft, t_verify = draft_and_verify(chained, target, [first], start, n, first, start,
                                                            order)
        assert guesses == want_g and best.tolist() == want_b
        assert t_draft > 0 and t_verify > 0
        assert chained.kv_len == eager.kv_len == start + n and target.kv_len == start + 1 + n
        oracle = [first] + [(g + 1) % target.config.n_vocab for g in want_g]
        ref_t.rollback(start)
        want_o = greedy_tokens(ref_t, oracle, start, order).tolist()
        _, best_o, _, _ = draft_and_verify(chained, target, [first], start, n, first, start, order,
                                           verify_tokens=oracle)
        assert best_o.tolist() == want_o
    assert target.pass_graphs.captures > 0


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK,
                                   ReductionOrder.FIXED_SPLIT], ids=lambda o: o.name)
@pytest.mark.parametrize("prompt_len,n", [(20, 9), (122, 12), (250, 10)])
def test_greedy_stream_equals_the_eager_loop(models, order, prompt_len, n):
    """greedy_stream (a pass enqueued ahead of the host, no copy between the graphs): the eager loop's
    tokens, each with the bits of its logit in an eager pass, and the eager loop's cache; across the
    128- and 256-cell plan changes (captures in the middle of a stream)."""
    chained, eager = models
    rng = np.random.default_rng(prompt_len + n)
    prompt = rng.integers(0, chained.config.n_vocab, prompt_len).tolist()
    first = int(rng.integers(0, chained.config.n_vocab))
    for m in models:
        m.reset()
        m.forward(prompt, 0, order)
    want = greedy_loop(eager, [first], prompt_len, n, order)
    for _ in range(3):  # eager warm-up of the width, capture, replay
        got = list(chained.greedy_stream(first, prompt_len, n, order))
        assert [t for t, _ in got] == want
        assert chained.kv_len == eager.kv_len == prompt_len + n
    eager.rollback(prompt_len)  # the logits of the same one-token passes, eagerly
    rows = [eager.forward([t], prompt_len + i, order)[0] for i, t in enumerate([first] + want[:-1])]
    values = np.array([row[t] for row, t in zip(rows, want)], np.float32)
    assert np.array_equal(np.array([v for _, v in got], np.float32).view(np.uint32), values.view(np.uint32))
    nxt = [want[-1]]
    np.testing.assert_array_equal(chained.forward(nxt, chained.kv_len, order), eager.forward(nxt, eager.kv_len, order))


def test_greedy_stream_stopped_early_leaves_the_tokens_taken(models):
    """A consumer that stops after m tokens: the cache holds the prompt, the first token and m - 1 more
    (the passes enqueued past them are waited for and forgotten), as after an eager loop of m passes."""
    chained, eager = models
    order = ReductionOrder.BATCH_INVARIANT
    prompt = list(range(40, 70))
    for m in models:
        m.reset()
        m.forward(prompt, 0, order)
    want = greedy_loop(eager, [5], len(prompt), 4, order)
    stream = chained.greedy_stream(5, len(prompt), 50, order)
    taken = [next(stream)[0] for _ in range(4)]
    stream.close()
    assert taken == want and chained.kv_len == len(prompt) + 4 == eager.kv_len
    nxt = [want[-1]]
    np.testing.assert_array_equal(chained.forward(nxt, chained.kv_len, order), eager.forward(nxt, eager.kv_len, order))


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT], ids=lambda o: o.name)
def test_generate_on_graphs_equals_generate_eager(models, order):
    """hiraishin's plain decoding with top_k=1 and 3 and 20 (passes enqueued ahead on graphs; the top logits
    found on the device behind each pass): the eager model's tokens and top logits, bit for bit; a stream()
    left after a few tokens leaves the eager loop's cache."""
    from hiraishin.decode.greedy import generate, stream

    chained, eager = models
    prompt = list(range(300, 324))
    for k in (1, 3, 20):
        got = generate(chained, prompt, max_new_tokens=12, order=order, stop_at_eos=False, top_k=k)
        want = generate(eager, prompt, max_new_tokens=12, order=order, stop_at_eos=False, top_k=k)
        assert got.tokens == want.tokens
        assert np.array_equal(got.top_k_ids, want.top_k_ids)
        assert np.array_equal(got.top_k_logits.view(np.uint32), want.top_k_logits.view(np.uint32))
        assert chained.kv_len == eager.kv_len == len(prompt) + 11
    for k in (1, 4):
        for m in models:
            it = stream(m, prompt, max_new_tokens=30, order=order, stop_at_eos=False, top_k=k)
            [next(it) for _ in range(5)]
            it.close()
        assert chained.kv_len == eager.kv_len == len(prompt) + 4


def test_topk_row_kernel_equals_top_k_of():
    """hx_topk_row on a GPU: top_k_of's places and the values' bits (ties, -0.0, NaN, a row of the vocabulary's
    length), launch after launch on one scratch."""
    import cupy as cp

    from hiraishin.kernels.elementwise import emulate_topk_row
    from hiraishin.kernels.elementwise.launch import TOPK_MAX, TopKRow

    rng = np.random.default_rng(3)
    x = rng.standard_normal(151936).astype(np.float32)
    x[[10, 70000, 151935]] = 5.0
    x[[20, 21]] = [-0.0, 0.0]
    x[[5, 99999]] = np.nan
    xd = cp.asarray(x)
    for k in (1, 5, TOPK_MAX):
        top = TopKRow(cp, x.size, k)
        for _ in range(2):
            out = cp.full((k, 2), -7, cp.int32)
            top(xd, out)
            np.testing.assert_array_equal(out.get(), emulate_topk_row(x, k))
        assert int(top.counter.get()[0]) == 0


@pytest.fixture(scope="module")
def blocked(tiny_model_path):
    """A model on graphs that captures chained one-token passes four to a graph (graph_passes)."""
    m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    m.pass_graphs.graph_passes = 4
    return m


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT,
                                   ReductionOrder.SUBBLOCK], ids=lambda o: o.name)
@pytest.mark.parametrize("prompt_len,n", [(20, 13), (122, 12), (250, 10)])
def test_blocks_of_passes_equal_the_eager_loop(blocked, models, order, prompt_len, n):
    """Chains and greedy_stream with four passes to a graph: the eager loop's tokens, logit bits and cache,
    also where the attention plan changes inside what would be a block (passes one graph at a time there)."""
    _, eager = models
    rng = np.random.default_rng(prompt_len + 3 * n)
    prompt = rng.integers(0, blocked.config.n_vocab, prompt_len).tolist()
    first = int(rng.integers(0, blocked.config.n_vocab))
    for m in (blocked, eager):
        m.reset()
        m.forward(prompt, 0, order)
    want = greedy_loop(eager, [first], prompt_len, n, order)
    for _ in range(3):  # warm-up, one-pass captures, block captures, replays
        assert blocked.greedy_chain([first], prompt_len, n, order).tolist() == want
        log = blocked.pass_graphs._log[prompt_len + 1:prompt_len + 1 + n].get()
        got = list(blocked.greedy_stream(first, prompt_len, n, order))
        assert [t for t, _ in got] == want and log[:, 0].tolist() == want
    # Blocks are kept per (order, passes a block): a block of four was captured and used.
    assert blocked.pass_graphs._blocks.get((order, 4)), "no block of four passes was used"
    eager.rollback(prompt_len)
    rows = [eager.forward([t], prompt_len + i, order)[0] for i, t in enumerate([first] + want[:-1])]
    values = np.array([row[t] for row, t in zip(rows, want)], np.float32)
    assert np.array_equal(np.array([v for _, v in got], np.float32).view(np.uint32), values.view(np.uint32))
    assert np.array_equal(log[:, 1].astype(np.int32).view(np.uint32), values.view(np.uint32))
    nxt = [want[-1]]
    np.testing.assert_array_equal(blocked.forward(nxt, blocked.kv_len, order), eager.forward(nxt, eager.kv_len, order))
