"""Speculative decoding whose draft runs ahead: it guesses the next cycle while the target verifies this one.

In :func:`hiraishin.decode.speculative.speculative_decode` a cycle drafts, then verifies: on one GPU the draft's
passes (latency-bound, small) and the target's verify pass run one after the other. Here, once a cycle's verify
pass is enqueued behind its guesses, the draft goes on (``greedy_chain_more``, on its own CUDA stream, nothing
waiting for it) as if every guess will be accepted: it feeds its last guess and makes ``n_draft + 1`` more
tokens, ``c_0, c_1, ...``. ``c_0`` is its guess of the token the target emits after the guesses. When the verify
accepted every guess **and** emitted ``c_0``, the next cycle's guesses ``c_1 ..`` are made already (its draft
cache holds them too): that cycle verifies at once, and drafts the one after beside its own verify. Otherwise
the guesses made ahead are dropped (the draft's cache rolls back past them) and the next cycle drafts as usual;
when every guess was accepted its catch-up pass then feeds one token, not two (the last guess went in ahead).

Only the target decides which tokens are emitted, and it verifies every token it emits as in the plain loop:
the output equals plain greedy decoding exactly when the order makes the target batch-invariant, as there.
What changes is when the draft's passes run, and that some of them are wasted. The draft needs no confidence
cut (every guess of a chain is made before the host sees any).
"""

from __future__ import annotations

import time

import numpy as np

from ..model.chains import ChainTokens
from ..order import ReductionOrder
from .cycles import Cycle, new_tokens, prefill, room_for_guesses
from .passes import greedy_chain, greedy_tokens

__all__ = ["speculative_decode_ahead", "draft_chain", "draft_more", "next_chain", "run_ahead", "drafting_seconds",
           "MIN_AHEAD_PASSES"]

# The fewest passes worth running ahead: the draft's guess of the target's next token (c_0) and one guess after it.
MIN_AHEAD_PASSES = 2


def draft_chain(draft, tokens, start: int, n: int, order) -> ChainTokens:
    """The draft's ``n`` guesses after ``tokens`` fed at ``start`` (on the device, not waited for, where it can)."""
    start_chain = getattr(draft, "greedy_chain_async", None)
    if start_chain is not None and order.verify_limit(start, len(tokens)) == len(tokens):
        return start_chain(tokens, start, n, order=order)
    return ChainTokens(host=np.asarray(greedy_chain(draft, tokens, start, n, order), dtype=np.int64))


def draft_more(draft, after: ChainTokens, pos: int, n: int, order) -> ChainTokens:
    """``n`` greedy tokens more after the chain ``after`` (the draft's last), the first pass feeding its last token
    at ``pos``: ``greedy_chain_more`` where the model has it, else the loop of one-token passes it stands for."""
    more = getattr(draft, "greedy_chain_more", None)
    if more is not None and getattr(draft, "kv_len", pos) == pos:
        return more(after, n, order=order)
    out, last = [], int(after.tokens()[-1])
    for p in range(pos, pos + n):
        last = int(greedy_tokens(draft, [last], p, order)[-1])
        out.append(last)
    return ChainTokens(host=np.asarray(out, dtype=np.int64))


def next_chain(draft, ahead: ChainTokens | None, pending, draft_len: int, pos: int, k: int, order):
    """Where a cycle's ``k`` guesses come from, the one step both loops of the draft running ahead share (this
    module's and the oracle bench's, :func:`hiraishin.bench_spec.speculative_decode_ahead`). ``ahead``: the chain made
    during the verify before (``c_0`` fed at the pending token's position ``pos``, then its guesses), or None: then a
    new chain of ``pending`` fed at ``draft_len``. Returns ``(k, chain, made, fed)``: ``k`` cut to the guesses the
    chain made ahead holds; ``chain`` the guesses' chain (None when ``k`` is 0); ``made`` the chain the next one may go
    on from (its end is the draft's last pass; None for a cut chain made ahead); ``fed`` the draft cache's length
    behind ``chain``'s passes."""
    if k <= 0:
        return 0, None, None, draft_len
    if ahead is not None:
        k = min(k, ahead.n - 1)
        return k, ahead.tail(1, 1 + k), (ahead if k == ahead.n - 1 else None), pos + ahead.n - 1
    chain = draft_chain(draft, pending, draft_len, k, order)
    return k, chain, chain, draft_len + len(pending) + k - 1


def run_ahead(draft, made: ChainTokens | None, fed: int, m: int, order, n_ctx: int | None) -> ChainTokens | None:
    """The chain of up to ``m`` passes the draft makes beside a verify, on from ``made`` (fed up to ``fed``), or
    None: nothing to go on from, or fewer than :data:`MIN_AHEAD_PASSES` fit the draft's cache of ``n_ctx`` cells."""
    if made is None:
        return None
    if n_ctx is not None:
        m = min(m, n_ctx - fed)
    return draft_more(draft, made, fed, m, order) if m >= MIN_AHEAD_PASSES else None


def drafting_seconds(chain: ChainTokens | None, made: ChainTokens | None, t0: float, t1: float, t2: float) -> float:
    """A cycle's drafting time: its chain's device time where it was drafted on the device behind the host (the
    host saw neither its end nor the verify's start before ``t2``), else the host's ``t1 - t0``; 0-ish for
    guesses made ahead (their passes counted in the verify before)."""
    spans = chain.device_spans() if chain is not None and chain is made else None
    return min(spans[0], t2 - t0) if spans is not None else t1 - t0


def _verify(target, first: int, chain: ChainTokens, pos: int, order) -> np.ndarray:
    """The target's argmax at each position of ``[first] + chain``'s tokens at ``pos`` (behind the chain on the
    device where both models can)."""
    verify = getattr(target, "verify_chain", None)
    if verify is not None:
        return verify(first, chain, pos, order=order)
    return greedy_tokens(target, [int(first)] + [int(t) for t in chain.tokens()], pos, order)


def speculative_decode_ahead(target, draft, prompt_tokens, max_new_tokens: int, *, n_draft: int = 8,
                             order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                             draft_order: ReductionOrder | None = None, eos_ids=(), on_cycle=None,
                             draft_min: int = 0, ahead_passes: int | None = None):
    """The loop with the draft running ahead (see the module docstring). Returns ``(new tokens, cycles, prefill
    seconds)`` like :func:`~hiraishin.decode.speculative.speculative_decode`; a cycle whose guesses were made
    during the verify before has ``ahead=True`` and ``draft_s`` about 0 (nothing drafted before its verify; the
    next cycle's passes, enqueued beside it, count in ``verify_s``). ``draft_order``: the draft's order (default
    ``order``; only the target's decides exactness). ``ahead_passes``: the most passes the draft makes ahead
    (at least 2: its guess of the target's next token and one guess; default ``n_draft + 1``); a cycle that
    verifies guesses made ahead verifies those only. The same stops as that loop: ``max_new_tokens``, an EOS id,
    a full target cache (and the draft's cache bounds the guesses)."""
    ahead_max = n_draft + 1 if ahead_passes is None else int(ahead_passes)
    draft_order = order if draft_order is None else draft_order
    n_ctx_d = getattr(draft, "n_ctx", None)
    seq, limit, prefill_s = prefill(target, draft, prompt_tokens, max_new_tokens, order, draft_order)
    n_prompt, eos, cycles = len(seq) - 1, set(eos_ids), []
    draft_len = n_prompt  # cells of the draft's cache that hold seq's tokens
    ahead = None  # (chain made ahead, its tokens): c_0 == seq[-1] was fed at seq's last position, c_1.. guess on
    while len(seq) - n_prompt < limit and seq[-1] not in eos:
        pos = len(seq) - 1  # the last accepted token: in the target's cache not yet
        room = room_for_guesses(order, seq, n_prompt, limit, n_draft, n_ctx_d)
        t0 = time.perf_counter()
        guesses = None
        if ahead is not None and room >= max(1, draft_min):
            cont, ctoks = ahead
            g, chain, made, fed = next_chain(draft, cont, None, draft_len, pos, room, draft_order)
            guesses = ctoks[1:1 + g]
        elif room > 0 and room >= draft_min:
            _, chain, made, fed = next_chain(draft, None, seq[draft_len:], draft_len, pos, room, draft_order)
        else:
            chain = made = None
            fed = draft_len
        t1 = time.perf_counter()
        more = run_ahead(draft, made, fed, ahead_max, draft_order, n_ctx_d)  # the next cycle's guesses, beside
        # this verify: c_0 guesses this cycle's last token
        m = more.n if more is not None else 0
        if chain is not None:
            best = _verify(target, seq[-1], chain, pos, order)
            if guesses is None:
                guesses = [int(t) for t in chain.tokens()]
        else:
            guesses, best = [], greedy_tokens(target, [seq[-1]], pos, order)
        t2 = time.perf_counter()
        k = 0
        while k < len(guesses) and guesses[k] == int(best[k]):
            k += 1
        seq += guesses[:k] + [int(best[k])]
        target.rollback(pos + k + 1)
        end = fed + m if chain is not None else draft_len  # the draft's cache after everything enqueued
        # read now, before a later chain_more copies into the same host buffer (the verify takes device rows)
        ctoks = [int(t) for t in more.tokens()] if more is not None and k == len(guesses) else None
        if ctoks is not None and ctoks[0] == seq[-1]:
            ahead, draft_len = (more, ctoks), end  # c_0 is seq[-1]: the cache's cells past it are the guesses
        else:
            ahead, draft_len = None, min(end, pos + k + 1)
            draft.rollback(draft_len)
        draft_s = drafting_seconds(chain, made, t0, t1, t2)
        t1 = t0 + draft_s
        cycles.append(Cycle(pos, len(guesses), k, draft_s, t2 - t1, time.perf_counter() - t2,
                            ahead=chain is not None and made is not chain))
        if on_cycle is not None:
            on_cycle(k + 1)
    return new_tokens(seq, n_prompt, eos, limit), cycles, prefill_s
