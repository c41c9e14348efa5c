"""The host side of ``hiraishin.backends.graphs`` on the CPU, with a stand-in for CuPy.

``PassGraphs`` decides which passes run eagerly, which are captured and which replay, what is copied
where before a pass, and how chains and the plain-decoding stream hand tokens from one pass to the next.
A fake CuPy (arrays in host memory, copies done at once, a "capture" that records the pass and a "graph"
that runs it again) and a fake model whose pass computes a token from each (token, position) run all of
that here; the GPU tests run it on the real thing. Copies happen in issue order, so what this cannot see
is a race between streams.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from hiraishin.backends.graphs import STREAM_AHEAD, PassGraphs
from hiraishin.order import ReductionOrder
from hiraishin.plans import attention_plan

N_VOCAB = 1000
ORDER = ReductionOrder.BATCH_INVARIANT


def next_token(token: int, pos: int) -> int:
    """The fake model's greedy token after ``token`` at ``pos``."""
    return (31 * int(token) + 7 * int(pos) + 3) % N_VOCAB


def logit_of(token: int) -> float:
    return float(np.float32(token) / np.float32(8))


def fake_logits(token: int) -> np.ndarray:
    """The fake pass's logits: the largest at ``token``, then its neighbours."""
    return -np.abs(np.arange(N_VOCAB, dtype=np.float32) - np.float32(token))


def _fake_topk_row(x_row, k, out):
    from hiraishin.kernels.elementwise import emulate_topk_row

    out[:] = emulate_topk_row(np.asarray(x_row), k)
    return out


class DevArray(np.ndarray):
    """A "device" array: host memory with CuPy's ``.data.ptr`` and ``.get()``."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self):
        return np.array(self)


class FakeStream:
    current = None

    def __init__(self, non_blocking: bool = False):
        self.ptr = id(self)
        self.recording = None  # the passes a capture records

    def __enter__(self):
        self._before, FakeStream.current = FakeStream.current, self
        return self

    def __exit__(self, *exc):
        FakeStream.current = self._before

    def synchronize(self):
        pass

    def wait_event(self, event):
        assert isinstance(event, FakeEvent) and event.recorded

    def begin_capture(self):
        self.recording = []

    def end_capture(self):
        graph, self.recording = FakeGraph(self.recording), None
        return graph

    def is_capturing(self):
        return self.recording is not None


class FakeGraph:
    def __init__(self, passes):
        self.passes = passes

    def launch(self, stream):
        for body in self.passes:
            body()


class FakeEvent:
    def __init__(self, disable_timing: bool = False):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        assert self.recorded


def _memcpy(dst, src, nbytes, kind, stream):
    ctypes.memmove(dst, src, nbytes)


def _memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
    for row in range(height):
        ctypes.memmove(dst + row * dpitch, src + row * spitch, width)


def fake_cupy():
    runtime = types.SimpleNamespace(memcpyAsync=_memcpy, memcpy2DAsync=_memcpy2d, memcpyHostToDevice=1,
                                    memcpyDeviceToHost=2, memcpyDeviceToDevice=3)
    cuda = types.SimpleNamespace(Stream=FakeStream, Event=FakeEvent, runtime=runtime,
                                 get_elapsed_time=lambda a, b: 1.0)
    zeros = lambda shape, dtype: np.zeros(shape, dtype).view(DevArray)  # noqa: E731
    return types.SimpleNamespace(cuda=cuda, zeros=zeros, empty=zeros)


class FakeModel:
    """What PassGraphs needs of a model; its pass writes each position's greedy token (next_token), and,
    given the advance, the next one-token pass's inputs and the token log, as hx_argmax_rows does."""

    n_ctx = 300
    config = types.SimpleNamespace(n_head=4, n_head_kv=2, head_dim=128, n_vocab=N_VOCAB)

    def __init__(self):
        cp = fake_cupy()
        self.backend = types.SimpleNamespace(
            xp=cp, synchronize=lambda: None, to_host=np.asarray,
            attention_plan=lambda order, T, kv, H, Hkv, D: attention_plan(order, T, kv, H, Hkv, D).launched(),
            ops=types.SimpleNamespace(attention_scratch=lambda *a: None, topk_row=_fake_topk_row))
        self._buffers = {}
        self.eager_passes = 0
        self.cells = {}  # position -> the token a pass fed there (the "KV cache")

    def pass_buffers(self, T):
        if T not in self._buffers:
            self._buffers[T] = {"argmax": self.backend.xp.zeros((T,), np.int32),
                                "logits": self.backend.xp.zeros((T, N_VOCAB), np.float32)}
        return self._buffers[T]

    def run_pass(self, ids, pos, start_pos, order, buf):
        def body():
            ids_h, pos_h = np.array(ids), np.array(pos)
            out = [next_token(t, p) for t, p in zip(ids_h, pos_h)]
            buf["argmax"][:] = out
            buf["logits"][:] = [fake_logits(t) for t in out]  # largest at each position's token
            self.cells.update({int(p): int(t) for t, p in zip(ids_h, pos_h)})
            if "advance" in buf:
                io, log = buf["advance"]
                nxt = int(pos_h[-1]) + 1
                io[0], io[1] = out[-1], nxt
                log[nxt, 0] = out[-1]
                log[nxt, 1] = np.float32(logit_of(out[-1])).view(np.int32)

        stream = FakeStream.current
        if stream is not None and stream.recording is not None:
            stream.recording.append(body)  # captured: runs at each launch, on that launch's inputs
        else:
            self.eager_passes += 1
            body()


@pytest.fixture
def graphs(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.zeros(shape, dtype)))
    return PassGraphs(FakeModel(), max_tokens=16, pdl=False)


def reference(tokens, start_pos, n):
    """The n greedy tokens after ``tokens`` fed at ``start_pos``, one pass at a time."""
    out = [next_token(tokens[-1], start_pos + len(tokens) - 1)]
    pos = start_pos + len(tokens)
    while len(out) < n:
        out.append(next_token(out[-1], pos))
        pos += 1
    return out


@pytest.mark.parametrize("first", [[5], [5, 9]])
def test_chain_feeds_each_pass_the_token_before(graphs, first):
    for round_ in range(3):  # eager warm-up of each width, capture, replay
        pending = graphs.chain_async(np.array(first, np.int32), 20, 6, ORDER)
        assert pending.tokens().tolist() == reference(first, 20, 6)
        assert graphs.model.cells[20 + len(first) + 4] == reference(first, 20, 6)[4]
    assert graphs.captures == (2 if len(first) > 1 else 1)
    assert graphs.model.eager_passes == (2 if len(first) > 1 else 1)


def test_chain_across_a_plan_change_captures_once_more(graphs):
    # 120..131: the launched plan gains its second parallel block at 129 cells (a capture mid-chain)
    for _ in range(3):
        assert graphs.chain_async(np.array([3], np.int32), 120, 12, ORDER).tokens().tolist() == reference([3], 120, 12)
    assert graphs.captures == 2 and graphs.graph_count() == 2


def test_greedy_steps_yields_each_token_and_its_logit(graphs):
    for _ in range(3):
        got = list(graphs.greedy_steps(11, 40, 7, ORDER))
        want = reference([11], 40, 7)
        assert [t for t, _ in got] == want
        assert [v for _, v in got] == [logit_of(t) for t in want]


def test_greedy_steps_stopped_early_enqueued_one_pass_more(graphs):
    steps = graphs.greedy_steps(11, 40, 50, ORDER)
    taken = [next(steps)[0] for _ in range(3)]
    steps.close()
    assert taken == reference([11], 40, 3)
    fed = max(graphs.model.cells)  # the last position a pass fed
    assert fed == 40 + 2 + STREAM_AHEAD  # passes for the three tokens taken, and STREAM_AHEAD ahead of them


def test_greedy_steps_stops_at_the_log(graphs):
    n_log = graphs._log.shape[0]  # n_ctx + 1 rows
    got = list(graphs.greedy_steps(2, n_log - 4, 100, ORDER))
    assert len(got) == 3  # positions n_ctx - 3 .. n_ctx - 1


def test_verify_behind_a_chain_takes_its_tokens(graphs, monkeypatch):
    draft = PassGraphs(FakeModel(), max_tokens=16, pdl=False)
    for _ in range(3):
        pending = draft.chain_async(np.array([8], np.int32), 30, 3, ORDER)
        guesses = reference([8], 30, 3)
        best = graphs.run_after(8, pending, 31, ORDER)  # the target's pass of [8] + guesses at 31
        ids = [8] + guesses
        assert best.tolist() == [next_token(t, 31 + i) for i, t in enumerate(ids)]
        oracle = np.array([8, 1, 2, 3], np.int32)
        best = graphs.run_after(8, pending, 31, ORDER, oracle)
        assert best.tolist() == [next_token(t, 31 + i) for i, t in enumerate(oracle)]


@pytest.mark.parametrize("passes", [1, 4])
def test_chain_more_continues_the_chain_and_a_verify_takes_its_tail(passes, monkeypatch):
    """chain_more: the passes continuing the last chain (each fed the token before, from the advance), its tokens
    in a host buffer of its own (the chain's stay readable), twice in a row; a verify pass behind a tail of it
    takes those rows. Refused (None) behind anything but the last chain."""
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.zeros(shape, dtype)))
    draft = PassGraphs(FakeModel(), max_tokens=16, pdl=False, graph_passes=passes)
    target = PassGraphs(FakeModel(), max_tokens=16, pdl=False)
    for _ in range(3):  # warm-up, capture, replay
        chain = draft.chain_async(np.array([8], np.int32), 30, 4, ORDER)
        more = draft.chain_more(chain, 34, 4, ORDER)  # the chain fed up to 33; its last token goes in at 34
        want = reference([8], 30, 12)
        assert more.tokens().tolist() == want[4:8]  # read before the next chain_more reuses its host buffer
        again = draft.chain_more(more, 38, 4, ORDER)
        assert chain.tokens().tolist() == want[:4]  # not overwritten by the continuations (same length)
        assert again.tokens().tolist() == want[8:]
        assert draft.model.cells[41] == want[10]
        tail = again.tail(1, 3)
        assert tail.n == 2 and tail.tokens().tolist() == want[9:11]
        best = target.run_after(want[8], tail, 42, ORDER)  # [c_0] + c_1, c_2 at 42
        assert best.tolist() == [next_token(t, 42 + i) for i, t in enumerate(want[8:11])]
    assert draft.chain_more(chain, 42, 2, ORDER) is None  # not the last chain
    draft.run(np.array([3], np.int32), 50, ORDER, want="argmax")
    assert draft.chain_more(again, 42, 2, ORDER) is None  # a pass ran since


def test_run_argmax_of_a_pass(graphs):
    for _ in range(3):
        got = graphs.run(np.array([4, 5, 6], np.int32), 10, ORDER, want="argmax")
        assert got.tolist() == [next_token(t, 10 + i) for i, t in enumerate([4, 5, 6])]


@pytest.fixture
def blocks(monkeypatch):
    """PassGraphs capturing chained one-token passes four to a graph."""
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.zeros(shape, dtype)))
    return PassGraphs(FakeModel(), max_tokens=16, pdl=False, graph_passes=4)


def _launches(graphs, monkeypatch) -> list:
    """Each graph launch's pass count, recorded from now on."""
    seen = []
    launch = FakeGraph.launch

    def counted(self, stream):
        seen.append(len(self.passes))
        launch(self, stream)

    monkeypatch.setattr(FakeGraph, "launch", counted)
    return seen


def test_chain_in_blocks_of_passes_makes_the_same_tokens(blocks, monkeypatch):
    for _ in range(2):  # eager warm-up, one-pass capture, then the block's capture
        assert blocks.chain_async(np.array([5], np.int32), 20, 11, ORDER).tokens().tolist() == reference([5], 20, 11)
    seen = _launches(blocks, monkeypatch)
    pending = blocks.chain_async(np.array([5], np.int32), 20, 11, ORDER)
    assert pending.n == 11 and pending.tokens().tolist() == reference([5], 20, 11)
    assert seen == [1, 4, 4, 1, 1]  # the first pass (its own inputs), two blocks, the two passes left over
    assert len(blocks._blocks[ORDER, 4]) == 1 and blocks.model.cells[30] == reference([5], 20, 11)[9]


def test_a_new_graph_passes_captures_blocks_of_its_own(blocks, monkeypatch):
    """Changing ``graph_passes`` on a live PassGraphs (bench/chain_steps.py does) must not launch the blocks of the
    old count as if they held the new one (H200, session 22: blocks of 2 launched for blocks of 4 skipped passes)."""
    blocks.graph_passes = 2
    for _ in range(2):
        blocks.chain_async(np.array([5], np.int32), 20, 11, ORDER).tokens()
    blocks.graph_passes = 4
    for _ in range(2):
        blocks.chain_async(np.array([5], np.int32), 20, 11, ORDER).tokens()
    seen = _launches(blocks, monkeypatch)
    blocks.model.cells.clear()  # what the chains before wrote: only this chain's passes may fill the cells
    pending = blocks.chain_async(np.array([5], np.int32), 20, 11, ORDER)
    assert pending.tokens().tolist() == reference([5], 20, 11) and seen == [1, 4, 4, 1, 1]
    assert all(blocks.model.cells.get(20 + j) == t for j, t in enumerate([5] + reference([5], 20, 11)[:10]))


def test_blocks_stay_inside_one_attention_plan(blocks, monkeypatch):
    # 120..131: the launched plan gains its second parallel block at 129 cells (position 128)
    for _ in range(2):
        blocks.chain_async(np.array([3], np.int32), 120, 12, ORDER).tokens()
    seen = _launches(blocks, monkeypatch)
    assert blocks.chain_async(np.array([3], np.int32), 120, 12, ORDER).tokens().tolist() == reference([3], 120, 12)
    # 120 alone; a block at 121..124; 125..128 would straddle the change (kv 129 at 128): single passes to 127;
    # a block at 128..131
    assert seen == [1, 4, 1, 1, 1, 4]


def test_greedy_steps_in_blocks_yields_every_token(blocks):
    for _ in range(3):
        got = list(blocks.greedy_steps(11, 40, 14, ORDER))
        want = reference([11], 40, 14)
        assert [t for t, _ in got] == want and [v for _, v in got] == [logit_of(t) for t in want]


def test_greedy_steps_in_blocks_stopped_early(blocks):
    list(blocks.greedy_steps(11, 40, 14, ORDER))  # warm-up and captures
    blocks.model.cells.clear()
    steps = blocks.greedy_steps(11, 40, 50, ORDER)
    taken = [next(steps)[0] for _ in range(3)]
    steps.close()
    assert taken == reference([11], 40, 3)
    # at most the rest of the block holding the last token taken, and STREAM_AHEAD blocks past it
    assert max(blocks.model.cells) <= 40 + 2 + 3 + STREAM_AHEAD * 4


def test_graph_passes_from_the_environment(monkeypatch):
    from hiraishin.backends import graphs as g

    monkeypatch.setenv(g.GRAPH_PASSES_ENV, "8")
    assert g._graph_passes_from_env() == 8
    for bad in ("0", "x", "65"):
        monkeypatch.setenv(g.GRAPH_PASSES_ENV, bad)
        with pytest.raises(ValueError, match=g.GRAPH_PASSES_ENV):
            g._graph_passes_from_env()
    monkeypatch.delenv(g.GRAPH_PASSES_ENV)
    assert g._graph_passes_from_env() == g.GRAPH_PASSES


def test_greedy_steps_with_the_top_k_of_each_pass(graphs):
    for _ in range(3):
        got = list(graphs.greedy_steps(11, 40, 7, ORDER, top_k=3))
        want = reference([11], 40, 7)
        assert [g[0] for g in got] == want and [g[1] for g in got] == [logit_of(t) for t in want]
        for (tok, _, ids, vals) in got:  # each pass's own logits' top 3: its token, then the lower neighbour
            assert ids.tolist() == [tok, tok - 1, tok + 1][:3] if 0 < tok < N_VOCAB - 1 else ids[0] == tok
            assert vals.tolist() == fake_logits(tok)[ids].tolist()
    single = list(graphs.greedy_steps(11, 40, 7, ORDER))
    assert [len(g) for g in single] == [2] * 7  # top_k 1: (token, logit) as before


def test_greedy_steps_with_top_k_take_one_pass_a_graph(blocks, monkeypatch):
    """Blocks of passes would give the top logits of their last pass only: with top_k > 1 every pass is alone."""
    list(blocks.greedy_steps(11, 40, 14, ORDER))  # warm-up and captures, blocks included
    seen = _launches(blocks, monkeypatch)
    got = list(blocks.greedy_steps(11, 40, 9, ORDER, top_k=2))
    assert [g[0] for g in got] == reference([11], 40, 9) and all(g[2][0] == g[0] for g in got)
    assert seen == [1] * 9
