"""Passes of up to 16 tokens replayed from CUDA graphs: decode steps and speculative verify passes.

A whole pass (embedding, every layer, output head) is captured into ONE CUDA graph per (order,
width, attention plan) and replayed at every position with the same plan: the token ids and
positions live in device buffers filled before the replay, the KV store writes the cells those
positions name, and the attention kernels take the KV length from them (``pos[-1] + 1``). Only
the attention plan depends on the position (the attended range is the KV length padded to 256
cells, and the parallel blocks follow from it), so a width's graph is re-captured when the plan
changes, at most once per 256 positions; the last ``GRAPHS_PER_WIDTH`` plans' graphs are kept.

A replay runs exactly the launches of the eager pass (same kernels, arguments and buffers, in
the same order): the same bits. The first pass of each (order, width) runs eagerly (kernels
compiled, launches prepared, scratch allocated); later ones capture or replay. Everything runs
on a stream of its own (capture needs a non-default stream) and is synchronized by the logits
copy at the end, like an eager pass. If a capture fails, that (order, width) falls back to eager
passes with a warning.

Inside a capture the kernels launch with programmatic dependent launch where the device allows
it (``hiraishin/kernels/pdl.py``): each kernel's blocks may start while the previous one finishes
and wait in ``HX_PDL_ENTRY`` for its results, which hides part of the gap between nodes and
changes no bit. ``PassGraphs(..., pdl=False)`` or ``HIRAISHIN_PDL=0`` captures plain launches.

Every pass's argmax kernel also writes the inputs of the next one-token pass (its last row's greedy
token and position + 1) into the one-token buffer, and that token with its logit into a log indexed by
position (``hx_argmax_rows``'s advance). So a chain of one-token passes (:meth:`PassGraphs.chain_async`)
is its graphs launched back to back, with no copy between them, each feeding the token the one before
made; the chain's tokens are read from the log once at its end. :meth:`PassGraphs.greedy_steps` keeps such
passes enqueued ahead of the host while it reads each token (plain greedy decoding).

Chained one-token passes may also be captured N to a graph (``graph_passes``, or
``HIRAISHIN_GRAPH_PASSES=N``; 1, the default, captures none): between two graph launches the next
graph's first kernels start only after the last kernel of the one before has finished, while inside
a graph programmatic dependent launch lets them start early, as between the kernels of one pass. The
same launches in the same order: the same bits. A block is used only where its N positions share one
attention plan; elsewhere the passes go one graph at a time. (Off until a measurement says it pays:
``bench/chain_steps.py --graph-passes``.)

Host work per replay is kept small, since the GPU idles while the host prepares the next pass
(bench/host_overhead.py measures it): a width's token ids and positions live in ONE device buffer
filled by one asynchronous copy from a page-locked staging buffer, and the greedy tokens of an
argmax pass come back the same way (a pageable copy is staged by the driver, synchronously).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from ..kernels.pdl import pdl_scope
from ..switches import env_int

__all__ = ["PassGraphs", "PendingChain", "GRAPHS_PER_WIDTH", "GRAPH_PASSES", "GRAPH_PASSES_ENV", "STREAM_AHEAD",
           "STREAM_RING"]

# Captured graphs kept per (order, width): the attention plan only moves forward as a sequence
# grows (a verify pass never straddles a 256-cell boundary under the exact orders), so the
# current plan and the one before suffice; older graphs are dropped, which keeps host memory
# flat over long generations (measured on the H200 soak, bench/results/2026-12-01-h200-engine2/:
# with every plan's graph kept, host RSS grew ~2.5 MB per 256 tokens of the 0.6B shape).
GRAPHS_PER_WIDTH = 2

# greedy_steps(): passes enqueued ahead of the host's reads (the first enqueue puts in this many), and the
# page-locked rows their tokens come back to (a slot is reused STREAM_RING passes later, well after
# the host read it)
STREAM_AHEAD = 2
STREAM_RING = 4

# Chained one-token passes per captured graph (see the module docstring): 1 captures none. Chains from
# blocks of 2-4 save 3-7 us a pass (H100, bench/results/2026-12-05-h100-session23), but end to end 2 did not
# pay (H100, bench/results/2026-12-05-h100-session25/c-graph-passes-head-argmax, the bench against the same
# machine's default run two minutes before): plain decoding 2.746 -> 2.720 ms/token, exact speculation
# SUBBLOCK 1.62x -> 1.59x, BATCH_INVARIANT 1.40x -> 1.39x (a cycle's drafting 1.399 -> 1.431 ms: what
# plain decoding gains, speculation does not). So off by default; HIRAISHIN_GRAPH_PASSES sets it for an A/B.
GRAPH_PASSES = 1
GRAPH_PASSES_ENV = "HIRAISHIN_GRAPH_PASSES"
MAX_GRAPH_PASSES = 64


def _graph_passes_from_env() -> int:
    return env_int(GRAPH_PASSES_ENV, range(1, MAX_GRAPH_PASSES + 1), GRAPH_PASSES, "passes per graph")


class PendingChain:
    """The greedy tokens of a :meth:`PassGraphs.chain_async` still being made on the device.

    ``n`` passes were enqueued; ``tokens()`` waits for them (int32 (n,)). ``dev`` is where they are on
    the device (int32 (n, 2): token, logit bits; rows of the graphs' token log). ``started`` and ``done``
    are CUDA events around the chain's work on its stream, ``verified`` (after a
    :meth:`PassGraphs.run_after`) the end of the pass behind it: :meth:`spans` gives the device
    time of each. The buffers are the graphs' own, reused by the next chain: read the tokens
    before making another.
    """

    __slots__ = ("n", "dev", "host", "started", "done", "verified")

    def __init__(self, n: int, dev, host, started, done):
        self.n, self.dev, self.host, self.started, self.done = n, dev, host, started, done
        self.verified = None

    def tokens(self) -> np.ndarray:
        self.done.synchronize()
        return self.host[:self.n, 0].copy()

    def tail(self, start: int, stop: int | None = None) -> "PendingChain":
        """The chain's tokens ``start..stop-1`` (its rows; to the end by default; the same events): what a verify
        pass takes when the chain's first tokens are settled already (a draft that ran ahead)."""
        stop = self.n if stop is None else min(int(stop), self.n)
        return PendingChain(stop - start, self.dev[start:stop], self.host[start:stop], self.started, self.done)

    def spans(self) -> tuple[float, float | None]:
        """Device seconds of the chain (``started`` to ``done``) and of the pass behind it (``done`` to
        ``verified``; None without one). Waits for them."""
        from cupy.cuda import get_elapsed_time

        self.done.synchronize()
        chain = get_elapsed_time(self.started, self.done) / 1e3
        if self.verified is None:
            return chain, None
        self.verified.synchronize()
        return chain, get_elapsed_time(self.done, self.verified) / 1e3


def _signature(plan) -> tuple:
    """What a pass's captured launches depend on: everything of its attention plan but the KV length."""
    return (plan.kernel, plan.queries_per_block, plan.parallel_blocks, plan.chunk_cells, plan.kv_attended,
            plan.split_cells, plan.shared_kv)


def _nothing() -> None:
    """The inputs of a chained one-token pass: already written by the pass before (its advance)."""


class PassGraphs:
    """CUDA-graph replay of a model's passes of ``1..max_tokens`` tokens (see the module docstring).

    ``model`` provides ``pass_buffers(T)``, ``run_pass(ids, pos, start_pos, order, buf)`` (the
    eager pass into the width's buffers), ``config`` and ``backend`` (a CUDA backend).
    """

    def __init__(self, model, max_tokens: int, pdl: bool = True, graph_passes: int | None = None):
        cp = model.backend.xp
        self.model = model
        self.max_tokens = int(max_tokens)
        self.pdl = bool(pdl)  # capture with programmatic dependent launches (see the module docstring)
        # chained one-token passes per graph (1: one graph a pass; see the module docstring)
        self.graph_passes = _graph_passes_from_env() if graph_passes is None else int(graph_passes)
        if not 1 <= self.graph_passes <= MAX_GRAPH_PASSES:
            raise ValueError(f"graph_passes must be in 1..{MAX_GRAPH_PASSES}, got {graph_passes!r}")
        # (order, N) -> OrderedDict plan signature -> graph of N chained passes (N: graph_passes when captured; a
        # caller may change graph_passes, and a graph of other N passes must then not stand in for N)
        self._blocks: dict = {}
        self.stream = cp.cuda.Stream(non_blocking=True)
        # The stream does not wait for the default stream, where the model's weights, KV cache and
        # RoPE tables were just uploaded and zeroed (asynchronously): let that work finish first.
        model.backend.synchronize()
        self._io: dict = {}  # T -> int32 (2T,) device: token ids, then positions (the captured inputs)
        self._stage: dict = {}  # T -> page-locked int32 (2T,): what the next replay's inputs are
        self._out: dict = {}  # T -> page-locked int32 (T,): an argmax pass's tokens
        self._warm: set = set()  # (order, T) that ran once eagerly
        self._failed: set = set()  # (order, T) whose capture failed
        self._graphs: dict = {}  # (order, T) -> OrderedDict plan signature -> cupy Graph (recent last)
        self._chains: dict = {}  # (n, ahead) -> page-locked int32 (n, 2): a chain's log rows on the host
        self.last_chain = None  # the PendingChain of the last chain_async / chain_more (None once another pass ran)
        self.captures = 0  # graphs captured so far (for tests and benchmarks)
        # hx_argmax_rows's advance: the one-token buffer [id, position] and the token log by position
        # (row p: the greedy token fed at position p and its logit's bits), written by every pass
        n_log = int(getattr(model, "n_ctx", 0) or 0) + 1
        with self.stream:  # their zero fill ordered before every pass that writes them
            self._inputs(1)
            self._log = cp.zeros((max(n_log, 2), 2), np.int32)
        self._advance = (self._io[1], self._log)
        self._side = None  # greedy_steps(): the stream its tokens come back on (made on first use)
        self._ring = None  # greedy_steps(): page-locked int32 (STREAM_RING, rows, 2): log rows (and top-k places)
        self._topk = None  # greedy_steps(top_k > 1): int32 (STREAM_RING, top_k, 2) on the device

    def graph_count(self) -> int:
        """Graphs held now, blocks of passes included (for tests and memory checks)."""
        return sum(len(g) for g in self._graphs.values()) + sum(len(g) for g in self._blocks.values())

    def _inputs(self, T: int):
        """The device ids and positions (views of one (2T,) buffer) a T-token graph reads."""
        io = self._io.get(T)
        if io is None:
            import cupyx

            cp = self.model.backend.xp
            io = self._io[T] = cp.zeros((2 * T,), np.int32)
            self._stage[T] = cupyx.empty_pinned((2 * T,), np.int32)
            self._out[T] = cupyx.empty_pinned((T,), np.int32)
        return io[:T], io[T:]

    def _upload(self, T: int, tokens: np.ndarray, start_pos: int) -> None:
        """Token ids and positions into the width's device buffer: one asynchronous copy on the stream."""
        cp = self.model.backend.xp
        stage = self._stage[T]
        stage[:T] = tokens
        stage[T:] = np.arange(start_pos, start_pos + T, dtype=np.int32)
        io = self._io[T]
        cp.cuda.runtime.memcpyAsync(io.data.ptr, stage.ctypes.data, stage.nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    def _download(self, T: int, a) -> np.ndarray:
        """A (T,) int32 device result to the host through the page-locked buffer (then synchronized)."""
        cp = self.model.backend.xp
        out = self._out[T]
        cp.cuda.runtime.memcpyAsync(out.ctypes.data, a.data.ptr, out.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                    self.stream.ptr)
        self.stream.synchronize()
        return out.copy()  # the buffer is reused by the next pass

    def _plan(self, order, T: int, start_pos: int):
        c = self.model.config
        return self.model.backend.attention_plan(order, T, start_pos + T, c.n_head, c.n_head_kv, c.head_dim)

    def run(self, tokens: np.ndarray, start_pos: int, order, want: str = "logits") -> np.ndarray | None:
        """Logits (T, n_vocab) of ``tokens`` (int32, T <= max_tokens) at ``start_pos`` (the cache is
        not committed), or None when this (order, width) has no graphs: run an eager pass instead.
        ``want="argmax"``: each position's greedy token instead (int32 (T,), computed in the pass)."""
        T = int(tokens.size)
        self.last_chain = None
        with self.stream:
            buf = self._pass(T, start_pos, order, lambda: self._upload(T, tokens, start_pos))
            if buf is None:
                return None
            if want == "argmax":
                return self._download(T, buf[want])
            return self.model.backend.to_host(buf[want])

    def chain(self, tokens: np.ndarray, start_pos: int, n: int, order) -> np.ndarray | None:
        """The ``n`` greedy tokens after ``tokens`` (int32, T0 <= max_tokens) at ``start_pos``: the pass
        of ``tokens``, whose last position's argmax is the first, then ``n - 1`` one-token passes, each
        of the token before, at ``start_pos + T0 ..``. Every pass is enqueued on the stream before any
        finishes: a pass reads its token id and position from what the previous pass's argmax wrote, so the
        host waits once, for the last (int32 (m,), m <= n; m < n when a capture failed on the way:
        the caller makes the rest). The same passes as a loop of :meth:`run` with ``want="argmax"``,
        hence the same tokens and cache cells. None: the first pass cannot replay (run it eagerly)."""
        pending = self.chain_async(tokens, start_pos, n, order)
        return None if pending is None else pending.tokens()

    def chain_async(self, tokens: np.ndarray, start_pos: int, n: int, order) -> "PendingChain | None":
        """:meth:`chain` without the host wait: the passes are enqueued and a :class:`PendingChain`
        comes back at once (``.tokens()`` waits; :meth:`run_after` puts a pass behind it on the device).
        Its ``n`` is the number of passes enqueued (< ``n`` when a capture failed on the way).

        The one-token passes are their graphs launched back to back: each reads the token id and
        position the pass before wrote (``hx_argmax_rows``'s advance), and the tokens are read from
        the log (cells ``start_pos + T0 ..``) with one copy at the end."""
        cp = self.model.backend.xp
        T0 = int(tokens.size)
        first = start_pos + T0  # the log cell of the first greedy token
        self.last_chain = None
        if first + n > self._log.shape[0]:
            return None  # past the log (a cache this long has no room for the chain anyway)
        host = self._chain_buffers(n)
        with self.stream:
            started = cp.cuda.Event()
            started.record(self.stream)
            buf = self._pass(T0, start_pos, order, lambda: self._upload(T0, tokens, start_pos))
            if buf is None:
                return None
            made = 1 + self._chained(first, n - 1, order)
            self.last_chain = self._pending(first, made, host, started)
        return self.last_chain

    def chain_more(self, after: "PendingChain", start_pos: int, n: int, order) -> "PendingChain | None":
        """``n`` more chained one-token passes behind ``after``, the last chain enqueued here (:attr:`last_chain`:
        a :meth:`chain_async` or a ``chain_more``, no pass since): the first feeds ``after``'s last token at
        ``start_pos``, each later one the token before, their inputs the advance of the pass before (nothing
        uploaded, no host wait). A speculative draft running ahead while another stream verifies its guesses.
        The same passes as continuing the chain, hence the same tokens and cells. The host buffer is not the
        chains' (``after``'s tokens stay readable) but the next ``chain_more`` of the same length reuses it: read
        the tokens before making another. None: ``after`` is not the last chain, the log has no room, or no pass
        could replay."""
        cp = self.model.backend.xp
        if after is None or after is not self.last_chain or start_pos + 1 + n > self._log.shape[0]:
            return None
        host = self._chain_buffers(n, ahead=True)
        with self.stream:
            started = cp.cuda.Event()
            started.record(self.stream)
            made = self._chained(start_pos, n, order)
            self.last_chain = self._pending(start_pos + 1, made, host, started) if made else None
        return self.last_chain

    def _pending(self, first: int, made: int, host, started) -> "PendingChain":
        """The :class:`PendingChain` of ``made`` passes whose tokens are the log rows from cell ``first`` (call inside
        ``with self.stream``, behind them): their copy into ``host`` and the event that ends them."""
        cp = self.model.backend.xp
        dev = self._log[first:first + made]
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, 8 * made, cp.cuda.runtime.memcpyDeviceToHost,
                                    self.stream.ptr)
        done = cp.cuda.Event()
        done.record(self.stream)
        return PendingChain(made, dev, host, started, done)

    def _chained(self, pos: int, n: int, order) -> int:
        """Enqueue up to ``n`` chained one-token passes at ``pos ..`` (call inside ``with self.stream``), each fed
        the token the pass before made (its advance: nothing to enqueue first), ``graph_passes`` to a graph where
        they can; returns how many (fewer when a capture failed)."""
        made = 0
        while made < n:
            block = self._block(pos + made, n - made, order)
            if block:
                made += block
            elif self._pass(1, pos + made, order, _nothing) is not None:
                made += 1
            else:
                break
        return made

    def greedy_steps(self, token: int, start_pos: int, n: int, order, top_k: int = 1) -> Iterator[tuple]:
        """Plain greedy decoding on the graphs: up to ``n`` one-token passes, pass ``j`` feeding at
        ``start_pos + j`` the token pass ``j - 1`` made (pass 0: ``token``); yields each pass's
        ``(greedy token, its logit)``. Pass ``j + 1`` is enqueued before the host reads pass ``j``'s
        token, so the GPU does not wait for the host between passes (which only
        ``hx_argmax_rows``'s advance connects: no copy between them); each token comes back on a side
        stream, four bytes and its logit's four. The same passes as a loop of :meth:`run`, hence the same
        tokens and cells; a consumer that stops early leaves at most ``STREAM_AHEAD`` passes more done
        (their cells past the tokens taken: two in flight keep the GPU busy while the host handles a
        token). With ``graph_passes`` N > 1 the passes after the first go N to a graph where they can, their
        tokens come back N at a time, and an early stop leaves the rest of the block it stopped in and up to
        ``STREAM_AHEAD`` blocks more done. ``top_k`` > 1 (at most ``TOPK_MAX``): each pass's ``top_k`` largest
        logits too, found on the device behind the pass (``ops.topk_row``) and yielded as ``(token, logit, ids,
        values)`` (``hiraishin.decode.greedy.top_k_of``'s rule; one pass a graph).
        Stops early if a pass cannot replay (a failed capture). Closing the generator
        waits for every pass enqueued."""
        cp = self.model.backend.xp
        self.last_chain = None
        n = max(0, min(int(n), self._log.shape[0] - 1 - start_pos))
        top_k = int(top_k)
        N = self.graph_passes if top_k == 1 else 1
        rows = N + (top_k if top_k > 1 else 0)  # a slot: N log rows, or one log row and the top_k places
        if self._ring is None or self._ring.shape[1] != rows:
            import cupyx

            if self._side is None:
                self._side = cp.cuda.Stream(non_blocking=True)
            self._ring = cupyx.empty_pinned((STREAM_RING, rows, 2), np.int32)
        if top_k > 1 and (self._topk is None or self._topk.shape[1] != top_k):
            with self.stream:
                self._topk = cp.zeros((STREAM_RING, top_k, 2), np.int32)  # on the device, a slot per pass
        ring, side = self._ring, self._side
        first = np.array([token], np.int32)
        pending: list = []
        slots = iter(range(1 << 62))

        def enqueue(j: int) -> int:
            """Passes j.. onto the stream (one, or a block of N), their log rows copied back: how many."""
            with self.stream:
                if j == 0:
                    m = int(self._pass(1, start_pos, order, lambda: self._upload(1, first, start_pos)) is not None)
                else:
                    m = (N > 1 and self._block(start_pos + j, n - j, order)) or int(  # top_k > 1: N is 1
                        self._pass(1, start_pos + j, order, _nothing) is not None)
                if not m:
                    return 0
                slot = next(slots) % STREAM_RING
                if top_k > 1:  # behind the pass, before the next one overwrites its logits
                    self.model.backend.ops.topk_row(self.model.pass_buffers(1)["logits"][-1], top_k, self._topk[slot])
                made = cp.cuda.Event(disable_timing=True)
                made.record(self.stream)
            side.wait_event(made)
            log_rows = self._log[start_pos + j + 1:start_pos + j + 1 + m]  # [token, logit bits] of passes j..j+m-1
            cp.cuda.runtime.memcpyAsync(ring[slot].ctypes.data, log_rows.data.ptr, 8 * m,
                                        cp.cuda.runtime.memcpyDeviceToHost, side.ptr)
            if top_k > 1:
                cp.cuda.runtime.memcpyAsync(ring[slot, 1:].ctypes.data, self._topk[slot].data.ptr, 8 * top_k,
                                            cp.cuda.runtime.memcpyDeviceToHost, side.ptr)
            back = cp.cuda.Event(disable_timing=True)
            back.record(side)
            pending.append((back, slot, m))
            return m

        j = 0
        try:
            while j < n and len(pending) < STREAM_AHEAD and (m := enqueue(j)):
                j += m
            while pending:
                back, slot, m = pending.pop(0)
                back.synchronize()
                got = [(int(ring[slot, i, 0]), float(ring[slot, i, 1:2].view(np.float32)[0])) for i in range(m)]
                if top_k > 1:  # one pass: its token, its logit, and the places of its top_k (-1: past the row)
                    places = ring[slot, 1:][ring[slot, 1:, 0] >= 0]
                    got = [got[0] + (places[:, 0].astype(np.int64), places[:, 1].copy().view(np.float32))]
                if j < n and (more := enqueue(j)):  # the next passes go in before these tokens go out
                    j += more
                else:
                    n = j  # all enqueued (or a capture failed): enqueue no more
                yield from got
        finally:
            self.stream.synchronize()
            side.synchronize()

    def run_after(self, first: int, pending: "PendingChain", start_pos: int, order,
                  tokens: np.ndarray | None = None) -> np.ndarray | None:
        """Each position's greedy token (int32 (1 + pending.n,)) of ONE pass of ``first`` and the
        chain's tokens at ``start_pos``, enqueued behind the chain on the device: this stream waits
        for the chain's passes (``pending`` may come from another model's graphs, e.g. a speculative
        draft's), its ids are copied from the chain's device buffer, and the host waits once, for
        this pass. ``tokens`` (int32 (1 + pending.n,), e.g. an oracle's guesses): take these ids
        instead, still uploaded behind the chain. The same pass as :meth:`run` of the same ids.
        None: this width cannot replay (wait for ``pending.tokens()`` and run the pass eagerly)."""
        cp = self.model.backend.xp
        T = 1 + pending.n
        self.last_chain = None  # this pass's argmax writes the advance a chain_more would continue from
        if tokens is None:
            tokens = np.zeros(T, np.int32)
            tokens[0] = first
            from_chain = True
        else:
            from_chain = False

        def fill():
            self._upload(T, tokens, start_pos)
            self.stream.wait_event(pending.done)
            if from_chain:  # the chain's tokens (column 0 of its log rows, on the device) into ids[1..n]
                io = self._io[T]
                cp.cuda.runtime.memcpy2DAsync(io[1:].data.ptr, 4, pending.dev.data.ptr, 8, 4, pending.n,
                                              cp.cuda.runtime.memcpyDeviceToDevice, self.stream.ptr)

        with self.stream:
            buf = self._pass(T, start_pos, order, fill)
            if buf is None:
                return None
            out = self._out[T]
            cp.cuda.runtime.memcpyAsync(out.ctypes.data, buf["argmax"].data.ptr, out.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)
            pending.verified = cp.cuda.Event()
            pending.verified.record(self.stream)
            self.stream.synchronize()
        return out.copy()

    def _chain_buffers(self, n: int, ahead: bool = False):
        """The page-locked int32 (n, 2) buffer a chain of ``n`` copies its log rows into (one per length, and
        another per length for :meth:`chain_more`)."""
        hit = self._chains.get((n, ahead))
        if hit is None:
            import cupyx

            hit = self._chains[(n, ahead)] = cupyx.empty_pinned((n, 2), np.int32)
        return hit

    def _pass(self, T: int, start_pos: int, order, fill) -> dict | None:
        """Enqueue one T-token pass on the stream (call inside ``with self.stream``): ``fill()``
        enqueues the writes of its inputs, then the graph replays (or the pass runs eagerly the
        first time, or is captured the second). Its buffers, or None when it has no graphs."""
        if (order, T) in self._failed:
            return None
        m = self.model
        ids, pos = self._inputs(T)
        buf = m.pass_buffers(T)
        plan = self._plan(order, T, start_pos)
        sig = _signature(plan)
        width_graphs = self._graphs.setdefault((order, T), OrderedDict())
        fill()  # on this stream, before the launches that read them
        graph = width_graphs.get(sig)
        if graph is not None:
            width_graphs.move_to_end(sig)
            graph.launch(self.stream)
            return buf
        # the argmax of a pass run or captured here also writes the next one-token pass's inputs
        buf = {**buf, "advance": self._advance}
        if (order, T) not in self._warm:
            m.run_pass(ids, pos, start_pos, order, buf)
            self._warm.add((order, T))
        else:
            graph = self._capture(ids, pos, (start_pos,), order, buf)
            if graph is None:
                self._failed.add((order, T))
                return None
            width_graphs[sig] = graph
            while len(width_graphs) > GRAPHS_PER_WIDTH:
                width_graphs.popitem(last=False)
            graph.launch(self.stream)
        return buf

    def _block(self, start_pos: int, left: int, order) -> int:
        """Enqueue ``graph_passes`` chained one-token passes at ``start_pos ..`` as ONE graph (call inside
        ``with self.stream``; inputs: the previous pass's advance). Returns the passes enqueued: N, or 0
        (then run them one at a time) when N is 1, fewer than N are ``left``, the one-token width has
        no graph yet or cannot replay, or the N positions do not share one attention plan."""
        N = self.graph_passes
        if N < 2 or left < N or (order, 1) in self._failed or (order, ("block", N)) in self._failed:
            return 0
        sig = _signature(self._plan(order, 1, start_pos))
        if sig not in self._graphs.get((order, 1), ()):  # the width warmed up and captured first
            return 0
        if _signature(self._plan(order, 1, start_pos + N - 1)) != sig:  # the plan only moves forward
            return 0
        blocks = self._blocks.setdefault((order, N), OrderedDict())
        graph = blocks.get(sig)
        if graph is None:
            ids, pos = self._inputs(1)
            buf = {**self.model.pass_buffers(1), "advance": self._advance}
            graph = self._capture(ids, pos, tuple(range(start_pos, start_pos + N)), order, buf)
            if graph is None:
                self._failed.add((order, ("block", N)))  # one graph a pass from now on
                return 0
            blocks[sig] = graph
            while len(blocks) > GRAPHS_PER_WIDTH:
                blocks.popitem(last=False)
        blocks.move_to_end(sig)
        graph.launch(self.stream)
        return N

    def _capture(self, ids, pos, starts: tuple, order, buf: dict):
        """ONE graph of the passes at ``starts`` (one pass; or a block of chained one-token passes, each
        reading what the one before wrote), or None (with a warning) if the capture failed."""
        m = self.model
        c = m.config
        for start_pos in starts:  # each plan's attention scratch exists before capture (no allocation inside it)
            m.backend.ops.attention_scratch(self._plan(order, ids.size, start_pos), ids.size, c.n_head, c.head_dim)
        self.stream.synchronize()  # capture begins on an idle stream
        try:
            self.stream.begin_capture()
            try:
                with pdl_scope(self.pdl):
                    for start_pos in starts:
                        m.run_pass(ids, pos, start_pos, order, buf)
            finally:
                graph = self.stream.end_capture()
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager passes for this (order, T)
            self._abandon_capture()
            what = f"{ids.size}-token pass" if len(starts) == 1 else f"block of {len(starts)} one-token passes"
            warnings.warn(f"CUDA-graph capture of a {what} failed under {order.name} "
                          f"({type(exc).__name__}: {exc}); using "
                          f"{'eager passes' if len(starts) == 1 else 'one graph a pass'}", RuntimeWarning,
                          stacklevel=4)
            return None
        self.captures += 1
        return graph

    def _abandon_capture(self) -> None:
        try:
            if self.stream.is_capturing():
                self.stream.end_capture()
        except Exception:  # noqa: BLE001 - the capture is invalid anyway
            pass
        try:
            self.stream.synchronize()
        except Exception:  # noqa: BLE001
            pass
