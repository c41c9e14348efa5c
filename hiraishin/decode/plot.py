"""The replay figure: max |Δlogit| by position, one panel per batch size; and the price-of-exactness
figure: a verify pass's cost against its width, per order (:func:`plot_verify_cost`).

One panel per batch size, so that equal curves (batches 2, 3 and 4 often agree exactly) do not
hide each other. Each panel marks the prompt's end, the edges of the batched passes (ticks at
the bottom), the KV lengths where attention's geometry changes (256, 384, 512 cells) and every
argmax flip with the plain top-2 gap it overturned. A panel whose logits all equal the plain
run's says so in words instead of showing an empty axis.
"""

from __future__ import annotations

import numpy as np

from ..order import ReductionOrder
from .passes import pass_spans

__all__ = ["plot_replay", "plot_verify_cost", "KV_MARKS"]

# KV lengths (cells) where attention's geometry can change: 256 is llama.cpp's KV padding
# (FATTN_KQ_STRIDE; a pass crossing it changes the attended range), 384 is where the fourth
# 128-cell chunk gets real cells (with 3 vs 4 parallel blocks the merge order differs from
# there on), 512 the next padding step.
KV_MARKS = (256, 384, 512)
# Pass-edge ticks are drawn when a panel has at most this many passes (more would be a smear).
MAX_PASS_TICKS = 400
# Flips labelled with their plain top-2 gap per panel (the closest calls; more would overlap).
MAX_GAP_LABELS = 6
PANEL_HEIGHT_IN = 1.5
FIG_WIDTH_IN = 10.0


def plot_replay(report, fig=None, title: str | None = None, ax=None):
    """Draw ``report`` (a :class:`~hiraishin.decode.report.ReplayReport`); returns the Figure.

    ``ax``: draw every batch size into that one Axes instead (lines with distinct styles, for
    embedding in a larger figure); ``fig``: an empty Figure to fill with one panel per batch size.
    """
    x = np.asarray(report.positions)
    order = ReductionOrder(**report.order_fields)
    if ax is not None:
        _single_axes(report, ax, x, title)
        return ax.figure
    if fig is None:
        from matplotlib.figure import Figure

        n = max(1, len(report.batches))
        fig = Figure(figsize=(FIG_WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * n), layout="constrained")
    axes = fig.subplots(max(1, len(report.batches)), 1, sharex=True, squeeze=False)[:, 0]
    linthresh = _linthresh(report)
    for a, b in zip(axes, report.batches):
        y = np.nan_to_num(np.asarray(b.diff_by_position, dtype=np.float64), nan=0.0)
        a.set_ylabel(f"batch {b.batch_size}\nmax |Δlogit|", fontsize="small")
        _marks(a, report, x)
        if not b.positions_differ:
            a.set_ylim(0, 1)
            a.set_yticks([0])
            a.text(0.5, 0.5, "bit-identical at every position", transform=a.transAxes, ha="center",
                   va="center", color="tab:green", fontsize="medium")
        else:
            a.plot(x, y, drawstyle="steps-mid", lw=1.2, color="tab:blue", label="max |Δlogit| vs one-token passes")
            a.set_yscale("symlog", linthresh=linthresh)
            a.set_ylim(bottom=0, top=max(y.max() * 3, linthresh * 2))
            for f in b.flips:
                a.plot([f.position], [y[f.position - report.start]], "x", ms=8, mew=2, color="tab:red",
                       label="argmax flip")
            # label the closest calls only (the smallest plain top-2 gaps), staggered, so labels stay legible
            labelled = sorted(b.flips, key=lambda f: (f.plain_gap, f.position))[:MAX_GAP_LABELS]
            for k, f in enumerate(sorted(labelled, key=lambda f: f.position)):
                a.annotate(f"gap {f.plain_gap:.2g}", (f.position, y[f.position - report.start]),
                           textcoords="offset points", xytext=(4, 4 + 9 * (k % 2)), fontsize="x-small",
                           color="tab:red")
        spans = list(pass_spans(report.start, report.start + len(x), b.batch_size, order))
        if 1 < len(spans) <= MAX_PASS_TICKS:
            edges = [s - 0.5 for s, _ in spans]
            a.vlines(edges, 0, 0.08, transform=a.get_xaxis_transform(), color="0.5", lw=0.6,
                     label="batched pass edges")
        a.grid(alpha=0.3)
    axes[-1].set_xlabel("position (0 = first prompt token; the logits at p choose token p + 1)")
    fig.suptitle(title or f"{report.model} · {report.backend} · {report.order}")
    handles, labels = {}, []
    for a in axes:
        for h, label in zip(*a.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    if handles:
        fig.legend([handles[k] for k in labels], labels, loc="outside lower center", ncols=min(5, len(labels)),
                   fontsize="small", frameon=False)
    return fig


def _linthresh(report) -> float:
    positive = [d for b in report.batches for d in b.diff_by_position if d > 0 and np.isfinite(d)]
    return min(positive) if positive else 1e-7


def _marks(a, report, x) -> None:
    """The prompt's end and the KV-length boundaries inside the plotted range."""
    if len(x) == 0:
        return
    lo, hi = x[0], x[-1]
    n_prompt = getattr(report, "n_prompt", None)
    if n_prompt is not None and lo < n_prompt - 1 < hi:
        a.axvline(n_prompt - 0.5, color="tab:purple", lw=1, ls=":", label="prompt ends")
    for cells in KV_MARKS:
        # the token at position p is KV cell p + 1 counting from 1: position `cells` is the first past it
        if lo < cells <= hi:
            a.axvline(cells - 0.5, color="tab:orange", lw=1, ls="--", label="256 / 384 / 512 KV cells")


def _single_axes(report, ax, x, title) -> None:
    styles = ("-", "--", "-.", ":")
    for i, b in enumerate(report.batches):
        y = np.nan_to_num(np.asarray(b.diff_by_position, dtype=np.float64), nan=0.0)
        (line,) = ax.plot(x, y, drawstyle="steps-mid", lw=1.2, ls=styles[i % len(styles)],
                          label=f"batch {b.batch_size}" + ("" if b.positions_differ else " (bit-identical)"))
        if b.flips:
            fx = [f.position for f in b.flips]
            ax.plot(fx, y[np.asarray(fx) - report.start], "x", ms=9, mew=2, color=line.get_color())
    ax.plot([], [], "x", color="0.3", label="argmax flip")
    _marks(ax, report, x)
    ax.set_yscale("symlog", linthresh=_linthresh(report))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("position")
    ax.set_ylabel("max |Δlogit| vs one-token passes")
    ax.set_title(title or f"{report.model} · {report.backend} · {report.order}")
    if report.identical:
        ax.text(0.5, 0.5, "bit-identical at every position", transform=ax.transAxes, ha="center",
                va="center", color="tab:green")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
    ax.grid(alpha=0.3)


def plot_verify_cost(verify: dict, title: str, style=None, ylabel: str = "ms per verify pass"):
    """Two panels: ms of one verify pass against its width, and the same ÷ the narrowest width's pass.

    ``verify``: order name -> {width: ms}. ``style(order name) -> (color, marker)`` (None: matplotlib's
    cycle, marker "o"). Dotted at 8.5 tokens: the mat-vec's launch limit. Returns the figure.
    """
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for name, per_width in verify.items():
        ws = sorted(per_width)
        color, marker = style(name) if style is not None else (None, "o")
        ax0.plot(ws, [per_width[w] for w in ws], marker=marker, color=color, label=name)
        ax1.plot(ws, [per_width[w] / per_width[ws[0]] for w in ws], marker=marker, color=color, label=name)
    for ax in (ax0, ax1):
        ax.axvline(8.5, color="k", ls=":", lw=1)
        ax.set_xlabel("verify width (tokens)")
        ax.set_xticks([1, 4, 8, 12, 16])
    ax0.set_ylabel(ylabel)
    ax1.set_ylabel("÷ one-token pass")
    ax1.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", title="order")
    fig.suptitle(title + "\ndotted: 8 tokens, the mat-vec's launch limit", fontsize=10)
    return fig
