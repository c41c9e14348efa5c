"""Greedy chains of passes on a :class:`~hiraishin.model.qwen3.Qwen3`: the draft's guesses, plain decoding's
stream of tokens, and a verify pass behind a chain (a mixin of ``Qwen3``, so ``qwen3.py`` keeps the forward pass).

With CUDA graphs (:class:`~hiraishin.backends.graphs.PassGraphs`) a chain's passes are enqueued before the first
finishes, each reading the token the pass before made on the device; without them every method is the loop of
:meth:`Qwen3.forward_argmax` it stands for. Either way the same passes, hence the same tokens and cells.
"""

from __future__ import annotations

import numpy as np

from ..errors import HiraishinError
from ..kernels.elementwise.launch import TOPK_MAX
from ..order import ReductionOrder

__all__ = ["ChainTokens", "ChainMethods"]


class ChainTokens:
    """The ``n`` greedy tokens of :meth:`Qwen3.greedy_chain_async`: made already (``host``) or still
    being made on the device (``pending``, a :class:`~hiraishin.backends.graphs.PendingChain`).
    ``tokens()`` gives them (int64 (n,)), waiting if it must."""

    __slots__ = ("pending", "_host")

    def __init__(self, host: np.ndarray | None = None, pending=None):
        if (host is None) == (pending is None):
            raise HiraishinError("ChainTokens takes host tokens or a pending chain, not both or neither")
        self.pending, self._host = pending, host

    @property
    def n(self) -> int:
        return self.pending.n if self.pending is not None else int(self._host.size)

    def tokens(self) -> np.ndarray:
        if self._host is None:
            self._host = self.pending.tokens().astype(np.int64)
        return self._host.copy()

    def tail(self, start: int, stop: int | None = None) -> "ChainTokens":
        """Tokens ``start..stop-1`` (to the end by default), as a chain :meth:`ChainMethods.verify_chain` takes (on
        the device still, if they are there). Tokens read already come with it: a later chain may reuse the
        page-locked buffer they were copied into, and a verify pass that falls back to the host must not read
        another chain's tokens there."""
        if self.pending is None:
            return ChainTokens(host=self._host[start:stop].copy())
        out = ChainTokens(pending=self.pending.tail(start, stop))
        if self._host is not None:
            out._host = self._host[start:stop].copy()
        return out

    def device_spans(self) -> tuple[float, float | None] | None:
        """Device seconds of the chain and of a :meth:`Qwen3.verify_chain` pass behind it (None: made on
        the host, no device spans)."""
        return None if self.pending is None else self.pending.spans()

def _check_chain(order, n, what: str) -> int:
    """A chain's order and token count, checked (``what``: the method, for the message); the count as an int."""
    if not isinstance(order, ReductionOrder):
        raise HiraishinError(f"order must be a ReductionOrder (e.g. ReductionOrder.BATCH_INVARIANT), "
                             f"got {type(order).__name__}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise HiraishinError(f"{what} needs n >= 1 tokens to make, got {n!r}")
    return int(n)


class ChainMethods:
    """Chains of greedy passes (a mixin: the model provides ``forward_argmax``, ``_check_tokens``, ``_check_start``,
    ``cache``, ``kv_len``, ``n_ctx`` and ``_graphs``, its :class:`~hiraishin.backends.graphs.PassGraphs` or None)."""

    def greedy_chain(self, tokens, start_pos: int, n: int,
                     order: ReductionOrder = ReductionOrder.BATCH_INVARIANT) -> np.ndarray:
        """The ``n`` greedy tokens after ``tokens``: int64 (n,). The pass of ``tokens`` at ``start_pos``
        gives the first (its last position's argmax); then ``n - 1`` one-token passes, each of the
        token before, at ``start_pos + len(tokens)``, ... The cache then holds ``tokens`` and the
        first ``n - 1`` greedy tokens (the last is in no cache, as after :meth:`forward_argmax`).

        Exactly the passes of a loop of :meth:`forward_argmax`, hence the same tokens and cells. With
        CUDA graphs every pass is enqueued before the first finishes (each token id copied on the
        device from the previous pass's argmax), so the host waits once, not once per token: what a
        speculative draft wants, whose guesses the host needs only all together."""
        return self.greedy_chain_async(tokens, start_pos, n, order).tokens()

    def greedy_chain_async(self, tokens, start_pos: int, n: int,
                           order: ReductionOrder = ReductionOrder.BATCH_INVARIANT) -> "ChainTokens":
        """:meth:`greedy_chain` without waiting for the tokens where CUDA graphs let it: a
        :class:`ChainTokens` whose ``tokens()`` waits. Another model's :meth:`verify_chain` can take
        it as it is, its pass enqueued behind the chain's on the device (a speculative verify with no
        host round trip between the draft's passes and the target's). Without graphs the tokens are
        made at once, by the loop itself."""
        n = _check_chain(order, n, "greedy_chain")
        tokens = self._check_tokens(tokens)
        T0 = tokens.size
        start_pos = self._check_start(start_pos, T0 + n - 1)
        out = []
        if self._graphs is not None and T0 <= self._graphs.max_tokens:
            if start_pos < self.kv_len:
                self.cache.rollback(start_pos)
            pending = self._graphs.chain_async(tokens.astype(np.int32), start_pos, n, order)
            if pending is not None:
                self.cache.commit(start_pos + T0 + pending.n - 1)
                if pending.n == n:
                    return ChainTokens(pending=pending)
                out = [int(t) for t in pending.tokens()]  # a capture failed on the way: the rest below
        if not out:  # no graphs (or none for this width): the loop itself
            out = [int(self.forward_argmax(tokens, start_pos, order)[-1])]
        pos = start_pos + T0 + len(out) - 1
        while len(out) < n:
            out.append(int(self.forward_argmax([out[-1]], pos, order)[-1]))
            pos += 1
        return ChainTokens(host=np.asarray(out, dtype=np.int64))

    def greedy_stream(self, token: int, start_pos: int, n: int,
                      order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, top_k: int = 1):
        """Plain greedy decoding from ``token`` at ``start_pos`` on CUDA graphs, or None where the model has
        none (then decode one :meth:`forward` at a time). An iterator of ``(greedy token, its logit)``, one
        per one-token pass, at most ``n`` (and no pass past ``n_ctx``): pass ``j`` feeds, at
        ``start_pos + j``, the token pass ``j - 1`` made (pass 0: ``token``). Each pass is enqueued
        before the host reads the token of the one before (:meth:`PassGraphs.greedy_steps`), so the GPU does
        not wait for the host between tokens. The cache holds the tokens fed so far: ``start_pos`` plus
        one cell per token taken. The same passes as a loop of :meth:`forward_argmax`, hence the same
        tokens (the first index of the largest logit; a NaN logit counts as the largest, numpy's
        ``argmax`` rule). It may stop before ``n`` (a failed capture): continue one pass at a time.
        ``top_k`` > 1 (at most ``TOPK_MAX``, else None): ``(token, logit, ids, values)``, each pass's ``top_k``
        largest logits beside it (``hiraishin.decode.greedy.top_k_of``'s rule), found on the device."""
        if not isinstance(order, ReductionOrder):
            raise HiraishinError(f"order must be a ReductionOrder (e.g. ReductionOrder.BATCH_INVARIANT), "
                                 f"got {type(order).__name__}")
        if self._graphs is None or not 1 <= int(top_k) <= TOPK_MAX:
            return None
        token = int(self._check_tokens([token])[0])
        start_pos = self._check_start(start_pos, 1)
        n = max(0, min(int(n), self.n_ctx - start_pos))
        return self._greedy_stream(token, start_pos, n, order, int(top_k))

    def _greedy_stream(self, token: int, start_pos: int, n: int, order, top_k: int):
        if start_pos < self.kv_len:
            self.cache.rollback(start_pos)
        passes = self._graphs.greedy_steps(token, start_pos, n, order, top_k)
        taken = 0
        try:
            for got in passes:
                taken += 1
                self.cache.commit(start_pos + taken)
                yield got
        finally:
            passes.close()  # waits for the passes enqueued (up to STREAM_AHEAD more than taken, if stopped early)

    def verify_chain(self, first: int, chain: "ChainTokens", start_pos: int,
                     order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, tokens=None) -> np.ndarray:
        """:meth:`forward_argmax` of ``[first] + chain.tokens()`` at ``start_pos``: int64 (1 + n,).

        ``chain`` comes from a model's :meth:`greedy_chain_async` (a speculative draft's guesses).
        With CUDA graphs on both sides the pass is enqueued behind the chain's passes on the device,
        its ids copied there from the chain, and the host waits once for both; otherwise the host
        takes the chain's tokens and runs the pass. ``tokens`` (``1 + n`` ids): run the pass of these
        ids instead, still behind the chain (a benchmark's oracle guesses). The same pass either way."""
        n = chain.n
        if tokens is not None:
            tokens = self._check_tokens(tokens)
            if tokens.size != 1 + n:
                raise HiraishinError(f"verify_chain: {tokens.size} tokens given for a chain of {n} (need {1 + n})")
        else:
            first = int(self._check_tokens([first])[0])
        pending = chain.pending
        if pending is not None and self._graphs is not None and 1 + n <= self._graphs.max_tokens:
            start_pos = self._check_start(start_pos, 1 + n)
            if start_pos < self.kv_len:
                self.cache.rollback(start_pos)
            out = self._graphs.run_after(first, pending, start_pos, order,
                                         None if tokens is None else tokens.astype(np.int32))
            if out is not None:
                self.cache.commit(start_pos + 1 + n)
                return out.astype(np.int64)
        ids = tokens if tokens is not None else np.concatenate([[first], chain.tokens()]).astype(np.int64)
        return self.forward_argmax(ids, start_pos, order)

    def greedy_chain_more(self, after: ChainTokens, n: int,
                          order: ReductionOrder = ReductionOrder.BATCH_INVARIANT) -> ChainTokens:
        """``n`` greedy tokens more after ``after``, this model's last chain (:meth:`greedy_chain_async` or
        ``greedy_chain_more``, no pass since): one-token passes, the first of ``after``'s last token at
        :attr:`kv_len` (where the chain left it, in no cache yet), each later one of the token before. The
        passes a loop of :meth:`forward_argmax` would run, hence the same tokens and cells; the cache then holds
        ``after``'s last token and the first ``n - 1`` new ones. With CUDA graphs they are enqueued behind the
        chain on this model's stream and nothing waits: a speculative draft guessing the next cycle's tokens
        while the target verifies this cycle's (``hiraishin.decode.ahead``). Without graphs, made at once."""
        n = _check_chain(order, n, "greedy_chain_more")
        pos = self._check_start(self.kv_len, n)
        out: list[int] = []
        if after.pending is not None and self._graphs is not None:
            pending = self._graphs.chain_more(after.pending, pos, n, order)
            if pending is not None:
                self.cache.commit(pos + pending.n)
                if pending.n == n:
                    return ChainTokens(pending=pending)
                out = [int(t) for t in pending.tokens()]  # a capture failed on the way: the rest below
        last = out[-1] if out else int(after.tokens()[-1])
        pos += len(out)
        while len(out) < n:
            last = int(self.forward_argmax([last], pos, order)[-1])
            out.append(last)
            pos += 1
        return ChainTokens(host=np.asarray(out, dtype=np.int64))
