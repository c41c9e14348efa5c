"""How a run cuts a sequence into forward passes: the one home of prompt-prefill spans.

Every decode path (plain greedy, speculative verify, replay, the localizer) feeds tokens
through :func:`feed`, whose passes come from :func:`pass_spans`: at most ``batch_size`` tokens
each, and never across the order's KV boundary (``order.verify_limit``). So plain decoding's
prompt passes are the passes a speculative verifier under the same order would make, and a
replay's batched run makes the passes a verifier of that width would make.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import HiraishinError
from ..order import ReductionOrder

__all__ = ["pass_spans", "feed", "greedy_tokens", "greedy_chain", "draft_and_verify", "progress_bar"]


def pass_spans(start: int, stop: int, batch_size: int, order: ReductionOrder) -> Iterator[tuple[int, int]]:
    """``(pos, n)`` for passes that feed positions ``start..stop-1``, at most ``batch_size`` each.

    Every pass also ends at the order's KV boundary (``order.verify_limit``), as a speculative
    verifier under that order would cut it.
    """
    if batch_size < 1:
        raise HiraishinError(f"batch_size must be >= 1, got {batch_size}")
    pos = start
    while pos < stop:
        n = order.verify_limit(pos, min(batch_size, stop - pos))
        yield pos, n
        pos += n


def feed(model, tokens: Sequence[int], start_pos: int, order: ReductionOrder,
         batch_size: int | None = None) -> np.ndarray:
    """Feed ``tokens`` into ``model``'s KV cache from ``start_pos``; return the last position's logits.

    Passes take at most ``batch_size`` tokens (all of them if None) and stop at the order's KV
    boundaries. This is the prompt prefill of every decode path.
    """
    tokens = list(tokens)
    if not tokens:
        raise HiraishinError("feed needs at least one token")
    logits = None
    for pos, n in pass_spans(start_pos, start_pos + len(tokens), batch_size or len(tokens), order):
        logits = model.forward(tokens[pos - start_pos:pos - start_pos + n], pos, order=order)
    return np.asarray(logits[-1])


def greedy_tokens(model, tokens: Sequence[int], start_pos: int, order: ReductionOrder) -> np.ndarray:
    """One pass of ``tokens`` at ``start_pos``; each position's argmax (T,). On the device where the
    model can (``forward_argmax``: no logits copied to the host), else from the host logits: the
    same pass either way."""
    step = getattr(model, "forward_argmax", None)
    if step is not None:
        return step(tokens, start_pos, order=order)
    return np.asarray(model.forward(tokens, start_pos, order=order)).argmax(axis=1)


def greedy_chain(model, tokens: Sequence[int], start_pos: int, n: int, order: ReductionOrder) -> list[int]:
    """The ``n`` greedy tokens after ``tokens`` fed at ``start_pos``: the pass of ``tokens`` (cut at
    the order's KV boundaries, as :func:`feed` cuts it) gives the first, then one-token passes of
    each token before. Through the model's ``greedy_chain`` where it has one and ``tokens`` is one
    pass (with CUDA graphs: one host wait for all ``n``), else pass by pass: the same passes."""
    tokens = [int(t) for t in tokens]
    chain = getattr(model, "greedy_chain", None)
    if chain is not None and order.verify_limit(start_pos, len(tokens)) == len(tokens):
        return [int(t) for t in chain(tokens, start_pos, n, order=order)]
    best = None
    for pos, m in pass_spans(start_pos, start_pos + len(tokens), len(tokens), order):
        best = greedy_tokens(model, tokens[pos - start_pos:pos - start_pos + m], pos, order)
    out = [int(best[-1])]
    pos = start_pos + len(tokens)
    while len(out) < n:
        out.append(int(greedy_tokens(model, [out[-1]], pos, order)[-1]))
        pos += 1
    return out


def draft_and_verify(draft, target, tokens: Sequence[int], start_pos: int, n: int, first: int, pos: int,
                     order: ReductionOrder, draft_order: ReductionOrder | None = None,
                     verify_tokens: Sequence[int] | None = None):
    """One speculative cycle's passes: the draft's ``n`` greedy guesses after ``tokens`` fed at
    ``start_pos`` (:func:`greedy_chain`), then the target's pass of ``[first] + guesses`` at ``pos``
    (:func:`greedy_tokens`). Returns ``(guesses, best, draft_s, verify_s)``: the guesses (list of n
    ints), the target's argmax at each position (1 + n,), and the seconds of each part.

    Where both models can (``greedy_chain_async`` / ``verify_chain``: CUDA graphs), the verify
    pass is enqueued behind the draft's on the device, its ids copied there from the draft's
    argmaxes: no host round trip between them. The host then sees neither the end of the drafting
    nor the start of the verifying: ``draft_s`` is the draft chain's device time (CUDA events) and
    ``verify_s`` the rest of the call (the verify pass and the host's share). Otherwise the two run
    one after the other and each is timed on the host. ``verify_tokens`` (``1 + n`` ids, a
    benchmark's oracle guesses): verify these instead, still behind the draft's passes. The same
    passes, hence the same tokens, as the two calls one after the other.
    """
    draft_order = order if draft_order is None else draft_order
    tokens = [int(t) for t in tokens]
    start = getattr(draft, "greedy_chain_async", None)
    verify = getattr(target, "verify_chain", None)
    t0 = time.perf_counter()
    if (start is not None and verify is not None
            and draft_order.verify_limit(start_pos, len(tokens)) == len(tokens)):
        chain = start(tokens, start_pos, n, order=draft_order)
        t1 = time.perf_counter()
        best = verify(first, chain, pos, order=order, tokens=verify_tokens)
        guesses = [int(t) for t in chain.tokens()]
        t2 = time.perf_counter()
        spans = chain.device_spans()
        if spans is None:  # the chain was made on the host: each part timed there
            return guesses, best, t1 - t0, t2 - t1
        draft_s = min(spans[0], t2 - t0)
        return guesses, best, draft_s, (t2 - t0) - draft_s
    guesses = greedy_chain(draft, tokens, start_pos, n, draft_order)
    t1 = time.perf_counter()
    batch = [int(first)] + guesses if verify_tokens is None else [int(t) for t in verify_tokens]
    best = greedy_tokens(target, batch, pos, order)
    return guesses, best, t1 - t0, time.perf_counter() - t1


def progress_bar(total: int, desc: str, enabled: bool, unit: str = "tok"):
    """A tqdm bar that disappears when done (``enabled=False``: a silent stand-in)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)
