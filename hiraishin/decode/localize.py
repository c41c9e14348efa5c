"""The localizer: which op of the forward pass is the first whose output depends on the batch.

:func:`localize` reruns the first differing position of a replay twice with the model's
``record`` hook, once in a one-token pass and once inside the batched pass that held it, and
compares every recorded tensor's row for that position in record order.

>>> report = replay(model, tokens, [2, 3, 5, 9, 16], order=ReductionOrder.BATCH_VARIANT)
>>> print(localize(model, report))      # e.g. "first differing op ...: blk.0.ffn_down ..."
"""

from __future__ import annotations

import numpy as np

from ..order import ReductionOrder
from .passes import feed, pass_spans, progress_bar
from .report import Localization, ReplayReport

__all__ = ["localize"]


def _host(x) -> np.ndarray:
    get = getattr(x, "get", None)  # cupy arrays
    return np.asarray(get() if callable(get) and not isinstance(x, np.ndarray) else x)


def _row(tensor, i: int, n: int) -> np.ndarray | None:
    """Row ``i`` of a recorded tensor of a pass of ``n`` tokens (None: not per-token)."""
    a = _host(tensor)
    if a.ndim == 0 or a.shape[0] != n:
        return None
    return a[i]


def _parse_name(name: str) -> tuple[int | None, str]:
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1]), ".".join(parts[2:])
    return None, name


def localize(model, report: ReplayReport, batch_size: int | None = None,
             progress: bool = False) -> Localization | None:
    """Rerun the first differing position of ``report`` plain and batched, with the ``record`` hook.

    Picks the batch size whose first difference comes earliest (or ``batch_size``), replays the
    shared prefix, then compares every recorded tensor's row for that position between the
    one-token pass and the batched pass that holds it, in record order. The first op that
    differs in any bit is named (and stored in ``report.localization``). Returns None when the
    replay found no difference.
    """
    if batch_size is None:
        candidates = [b for b in report.batches if b.first_diff is not None]
        if not candidates:
            return None
        chosen = min(candidates, key=lambda b: (b.first_diff, b.batch_size))
    else:
        chosen = report[batch_size]
        if chosen.first_diff is None:
            return None
    b, p = chosen.batch_size, chosen.first_diff
    order = ReductionOrder(**report.order_fields)
    seq, start = report.tokens, report.start
    stop = start + len(report.plain_argmax)
    span = next((s, n) for s, n in pass_spans(start, stop, b, order) if s <= p < s + n)

    model.reset()
    if start:
        feed(model, seq[:start], 0, order, report.prefill_batch)
    with progress_bar(p - start + 1, "localize", progress) as bar:
        for pos in range(start, p):
            model.forward([seq[pos]], pos, order=order)
            bar.update(1)
        plain_rec: dict = {}
        model.forward([seq[p]], p, order=order, record=plain_rec)
        bar.update(1)
    model.rollback(start)
    for s, n in pass_spans(start, span[0], b, order):
        model.forward(seq[s:s + n], s, order=order)
    batch_rec: dict = {}
    model.forward(seq[span[0]:span[0] + span[1]], span[0], order=order, record=batch_rec)

    ops = []
    first = None
    for name, tensor in plain_rec.items():
        if name not in batch_rec:
            continue
        a = _row(tensor, 0, 1)
        c = _row(batch_rec[name], p - span[0], span[1])
        if a is None or c is None or a.shape != c.shape:
            continue
        differs = a.tobytes() != c.tobytes()
        d = float(np.max(np.abs(a.astype(np.float64) - c.astype(np.float64)))) if a.size else 0.0
        ops.append([name, d])
        if differs and first is None:
            first = (name, d)
    layer, op = _parse_name(first[0]) if first else (None, None)
    loc = Localization(position=p, batch_size=b, pass_start=span[0], pass_size=span[1],
                       name=first[0] if first else None, layer=layer, op=op,
                       max_abs_diff=first[1] if first else 0.0, ops=ops)
    report.localization = loc
    return loc
