"""Replay: decode a sequence one position at a time, push it back in batches, compare logits.

The plain run feeds positions one token per pass (what plain greedy decoding
does). The batched run feeds the same tokens from the same start in passes of
``b`` tokens (what a speculative verifier does). Under a batch-invariant order
every logit must be bit-identical; under a batch-variant order the differences
*are* the bug, measured position by position.

>>> report = replay(model, tokens, batch_sizes=[2, 3, 5, 9, 16],
...                 order=ReductionOrder.BATCH_VARIANT)
>>> print(report)            # a table: max |Δlogit|, positions that differ, argmax flips
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..errors import HiraishinError
from ..order import ReductionOrder
from .inputs import backend_name, check_int, check_order, model_name, prompt_tokens
from .passes import feed, pass_spans, progress_bar
from .report import DELTA_EDGES, BatchSizeReport, Flip, ReplayReport, top_two

# pass_spans and feed are re-exported: they lived here before decode/passes.py
__all__ = ["replay", "pass_spans", "feed", "DEFAULT_BATCH_SIZES"]

# Batch sizes that straddle the mat-vec geometry switches of the variant policy:
# 2-4 columns keep the one-column warp count, 5-8 use fewer warps, 9 and 16 need
# two launches of at most 8 columns (reference §4.2, order.max_cols_per_launch).
DEFAULT_BATCH_SIZES = (2, 3, 5, 9, 16)

# Passes of the shared prefix (positions before ``start``) take this many tokens.
DEFAULT_PREFILL_BATCH = 16


def replay(model, tokens: Sequence[int] | str, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
           order: ReductionOrder = ReductionOrder.BATCH_VARIANT, *, n_new: int = 0, start: int = 0,
           prefill_batch: int = DEFAULT_PREFILL_BATCH, top_k: int = 5,
           progress: bool = False) -> ReplayReport:
    """Compare plain one-token passes with batched passes of the same sequence, position by position.

    Args:
        model: a model with ``forward(tokens, start_pos, order=)``, ``rollback(pos)``, ``reset()``.
        tokens: the sequence (token ids, or text for ``model.tokenizer``).
        batch_sizes: widths of the batched passes to compare against the plain run.
        order: the reduction order of every pass.
        n_new: greedy tokens to decode after ``tokens`` in the plain run (and replay too).
        start: positions before it are a shared prefix, fed once in passes of ``prefill_batch``
            tokens and not compared (so long sequences stay affordable).
        top_k: how many plain top tokens to keep per position.
        progress: show tqdm progress bars.

    Returns:
        A :class:`ReplayReport` with one :class:`BatchSizeReport` per batch size.

    Every argument is checked before the first pass.
    """
    order = check_order(order)
    seq = prompt_tokens(model, tokens)
    n_new = check_int("n_new", n_new, 0)
    start = check_int("start", start, 0)
    prefill_batch = check_int("prefill_batch", prefill_batch, 1)
    top_k = check_int("top_k", top_k, 1)
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, (Sequence, np.ndarray)) \
            or len(batch_sizes) == 0:
        raise HiraishinError(f"replay batch_sizes must be a non-empty sequence of integers, got {batch_sizes!r}")
    batch_sizes = [check_int("replay batch sizes", b, 1) for b in batch_sizes]
    if start >= len(seq):
        raise HiraishinError(f"replay start must be in 0..{len(seq) - 1} (the {len(seq)} tokens given), "
                             f"got {start}")
    n_ctx = getattr(model, "n_ctx", None)
    if n_ctx is not None and len(seq) + n_new > n_ctx:
        raise HiraishinError(f"replay of {len(seq)} tokens plus {n_new} new ones needs {len(seq) + n_new} "
                             f"KV cells; the model's cache holds {n_ctx}")
    n_prompt = len(seq)
    stop = len(seq) + n_new
    t_begin = time.perf_counter()

    model.reset()
    if start:
        feed(model, seq[:start], 0, order, prefill_batch)

    # plain run: one token per pass; decode greedily past the given tokens
    plain = None
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with progress_bar(stop - start, "replay plain", progress) as bar:
        for pos in range(start, stop):
            row = np.asarray(model.forward([seq[pos]], pos, order=order))[-1]
            if plain is None:
                plain = np.empty((stop - start, row.shape[0]), dtype=np.float32)
            plain[pos - start] = row
            if pos + 1 == len(seq) and len(seq) < stop:
                seq.append(int(np.argmax(row)))
            bar.update(1)
    timings["plain"] = time.perf_counter() - t0

    top = [top_two(row) for row in plain]
    order_top = np.argsort(-plain, axis=1, kind="stable")[:, :top_k]
    per_batch = []
    for b in batch_sizes:
        t0 = time.perf_counter()
        per_batch.append(_compare_batched(model, seq, start, stop, b, order, plain, top, progress))
        timings[f"batch_{b}"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_begin

    return ReplayReport(
        model=model_name(model),
        backend=backend_name(model),
        order=order.name,
        order_fields=_order_fields(order),
        tokens=seq,
        n_prompt=n_prompt,
        start=start,
        prefill_batch=prefill_batch,
        plain_argmax=[int(t[0]) for t in top],
        plain_gap=[float(t[2]) for t in top],
        plain_top_k=order_top.tolist(),
        batches=per_batch,
        timings=timings,
    )


def _compare_batched(model, seq, start, stop, b, order, plain, top, progress) -> BatchSizeReport:
    model.rollback(start)
    diff = np.zeros(stop - start, dtype=np.float64)
    differs = np.zeros(stop - start, dtype=bool)
    delta_counts = np.zeros(len(DELTA_EDGES) - 1, dtype=np.int64)
    flips = []
    with progress_bar(stop - start, f"replay batch {b}", progress) as bar:
        for pos, n in pass_spans(start, stop, b, order):
            logits = np.asarray(model.forward(seq[pos:pos + n], pos, order=order), dtype=np.float32)
            ref = plain[pos - start:pos - start + n]
            delta = np.abs(logits.astype(np.float64) - ref.astype(np.float64))
            diff[pos - start:pos - start + n] = delta.max(axis=1)
            differs[pos - start:pos - start + n] = (logits.view(np.uint32) != ref.view(np.uint32)).any(axis=1)
            delta_counts += np.histogram(delta[delta > 0], bins=DELTA_EDGES)[0]
            for i in range(n):
                p = pos + i
                batched_top = int(np.argmax(logits[i]))
                plain_top, _, gap = top[p - start]
                if batched_top != plain_top:
                    flips.append(Flip(position=p, plain_token=plain_top, batched_token=batched_top,
                                      plain_gap=float(gap)))
            bar.update(n)
    n_zero = int(plain.size - delta_counts.sum())
    return BatchSizeReport.build(b, start, diff, differs, flips, delta_counts, n_zero)


def _order_fields(order: ReductionOrder) -> dict:
    from dataclasses import asdict

    return asdict(order)
