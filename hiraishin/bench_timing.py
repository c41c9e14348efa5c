"""Timed passes of a model: the host-side stopwatch of ``hiraishin bench`` (:mod:`hiraishin.benchmark`).

Each helper runs passes as a decoding loop would and returns what they gave with the seconds they took,
bracketed by ``backend.synchronize()`` where a pass is timed alone. Only the model API is used
(``forward_argmax`` or ``forward``, ``greedy_chain``, ``greedy_stream``, ``backend``).
"""

from __future__ import annotations

import time

import numpy as np

from .decode.passes import greedy_chain, greedy_tokens, pass_spans

__all__ = ["timed_pass", "timed_chain", "seeded_prompt", "timed_feed", "timed_greedy_steps", "even_out"]


def timed_pass(model, tokens, start_pos: int, order) -> tuple[np.ndarray, float]:
    """One forward pass bracketed by synchronizations: (each position's greedy token, seconds).

    The tokens come from :meth:`~hiraishin.model.qwen3.Qwen3.forward_argmax` (argmax on the
    device, T token ids to the host) where the model has it, as a decoding loop wants them; the
    time covers the pass, the argmax and that copy. A model without it: argmax of the host logits.
    """
    sync = model.backend.synchronize
    sync()
    t0 = time.perf_counter()
    best = greedy_tokens(model, tokens, start_pos, order)
    sync()
    return best, time.perf_counter() - t0


def timed_chain(model, tokens, start_pos: int, n: int, order) -> tuple[list[int], float]:
    """The ``n`` greedy tokens after ``tokens`` (:func:`~hiraishin.decode.passes.greedy_chain`: the
    pass of ``tokens``, then ``n - 1`` one-token passes, on CUDA graphs with one host wait),
    bracketed by synchronizations: (the tokens, seconds)."""
    sync = model.backend.synchronize
    sync()
    t0 = time.perf_counter()
    out = greedy_chain(model, tokens, start_pos, n, order)
    sync()
    return out, time.perf_counter() - t0


def seeded_prompt(model, n: int, seed: int = 0) -> list[int]:
    """``n`` seeded token ids (synthetic models have no meaningful text)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, model.config.n_vocab, n)]


def timed_feed(model, tokens, start_pos: int, order) -> tuple[np.ndarray, float]:
    """Feed ``tokens`` in the passes plain decoding makes (cut at ``order.verify_limit``): (the last
    pass's greedy tokens, seconds)."""
    total, best = 0.0, None
    for pos, n in pass_spans(start_pos, start_pos + len(tokens), len(tokens), order):
        best, dt = timed_pass(model, tokens[pos - start_pos:pos - start_pos + n], pos, order)
        total += dt
    return best, total


def even_out(gaps: list[float], block: int) -> list[float]:
    """Seconds per token from the gaps between tokens reaching the host. When passes come ``block`` to a
    graph (``PassGraphs.graph_passes`` > 1) their tokens arrive together, so a median of the gaps would
    be no time per token: each token then gets the mean gap of the run. ``block`` 1: the gaps as they are."""
    if block <= 1 or not gaps:
        return list(gaps)
    return [sum(gaps) / len(gaps)] * len(gaps)


def timed_greedy_steps(model, token: int, start_pos: int, n: int, order) -> tuple[list[int], list[float]]:
    """``n`` plain greedy one-token passes from ``token`` at ``start_pos``: (their tokens, seconds
    between successive tokens reaching the host). Through the model's ``greedy_stream`` (CUDA graphs,
    the next pass enqueued before a token is read) as far as it goes, the rest one synchronous
    :func:`timed_pass` pass at a time."""
    tokens, times = [], []
    stream = getattr(model, "greedy_stream", None)
    ahead = stream(token, start_pos, n, order) if stream is not None and n > 0 else None
    if ahead is not None:
        model.backend.synchronize()
        t0 = time.perf_counter()
        for tok, _ in ahead:
            now = time.perf_counter()
            tokens.append(tok)
            times.append(now - t0)
            t0 = now
    while len(tokens) < n:
        prev = tokens[-1] if tokens else token
        best, dt = timed_pass(model, [prev], start_pos + len(tokens), order)
        tokens.append(int(best[-1]))
        times.append(dt)
    return tokens, times
