"""Divergence reports: what a replay found, as a table, as JSON, as a plot; and where it starts.

A :class:`ReplayReport` holds one :class:`BatchSizeReport` per batch size of a
replay (:func:`hiraishin.decode.replay.replay`): the largest |Δlogit|, which
positions differ at all, where the argmax flips (with the plain top-2 gap
there, the margin the flip had to overcome) and histograms of both.
:func:`localize` reruns the first differing position with the model's
``record`` hook and names the first op whose output differs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ..errors import HiraishinError

__all__ = [
    "ReplayReport",
    "BatchSizeReport",
    "Flip",
    "Localization",
    "localize",
    "top_two",
    "DELTA_EDGES",
    "GAP_EDGES",
]

# Histogram bin edges for nonzero |Δlogit| (exact zeros are counted apart). The
# smallest nonzero difference of two float32 logits near 1 is one ulp, 1.2e-7;
# the top edge is a finite stand-in for infinity so that JSON stays standard.
DELTA_EDGES = (0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e308)
# Bin edges for the plain top-2 logit gap at argmax flips.
GAP_EDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e308)


def top_two(row: np.ndarray) -> tuple[int, int, float]:
    """``(best, second, gap)`` of one logit row; ties go to the lower id, like ``np.argmax``."""
    row = np.asarray(row)
    best = int(np.argmax(row))
    rest = row.copy()
    rest[best] = -np.inf
    second = int(np.argmax(rest))
    return best, second, float(np.float64(row[best]) - np.float64(row[second]))


@dataclass
class Flip:
    """A position where the batched argmax differs from the plain one."""

    position: int
    plain_token: int
    batched_token: int
    plain_gap: float  # plain top-1 minus top-2 logit: the margin the batch overturned


@dataclass
class BatchSizeReport:
    """Replay of one batch size against the plain run."""

    batch_size: int
    max_abs_diff: float
    diff_by_position: list[float]  # max |Δlogit| over the vocabulary, per compared position
    positions_differ: list[int]  # positions where any logit differs in any bit
    flips: list[Flip]
    first_diff: int | None
    fraction_differ: float
    delta_hist: list[int]  # counts of nonzero |Δlogit| per DELTA_EDGES bin, over all logits
    n_zero: int  # logits with Δ == 0
    gap_hist: list[int]  # counts of flips' plain top-2 gap per GAP_EDGES bin

    @classmethod
    def build(cls, batch_size, start, diff, differs, flips, delta_counts, n_zero) -> "BatchSizeReport":
        positions = [int(start + i) for i in np.flatnonzero(differs)]
        gaps = np.array([f.plain_gap for f in flips], dtype=np.float64)
        return cls(
            batch_size=int(batch_size),
            max_abs_diff=float(diff.max()) if len(diff) else 0.0,
            diff_by_position=[float(d) for d in diff],
            positions_differ=positions,
            flips=list(flips),
            first_diff=positions[0] if positions else None,
            fraction_differ=len(positions) / max(1, len(diff)),
            delta_hist=[int(c) for c in delta_counts],
            n_zero=int(n_zero),
            gap_hist=[int(c) for c in np.histogram(gaps, bins=GAP_EDGES)[0]],
        )

    @classmethod
    def from_dict(cls, d: dict) -> "BatchSizeReport":
        d = dict(d)
        d["flips"] = [Flip(**f) for f in d["flips"]]
        return cls(**d)


@dataclass
class Localization:
    """The first op whose output differs at one position, plain pass vs batched pass."""

    position: int
    batch_size: int
    pass_start: int  # first position of the batched pass that holds ``position``
    pass_size: int
    name: str | None  # recorded tensor name, e.g. "blk.3.ffn_down"; None: no recorded op differs
    layer: int | None
    op: str | None
    max_abs_diff: float  # at that op, at that position
    ops: list[list] = field(default_factory=list)  # [name, max |Δ| at the position] in record order

    def __str__(self) -> str:
        where = (f"position {self.position} (batch {self.batch_size}, pass "
                 f"{self.pass_start}..{self.pass_start + self.pass_size - 1})")
        if self.name is None:
            return f"no recorded op differs at {where}"
        layer = "" if self.layer is None else f"layer {self.layer}, "
        return (f"first differing op at {where}: {self.name} ({layer}op {self.op}), "
                f"max |Δ| {self.max_abs_diff:.3g}")


@dataclass
class ReplayReport:
    """What a replay found, per batch size. ``str()`` is a table; JSON round-trips."""

    model: str
    backend: str
    order: str
    order_fields: dict
    tokens: list[int]  # the whole sequence, prefix included
    start: int  # first compared position
    prefill_batch: int
    plain_argmax: list[int]  # per compared position
    plain_gap: list[float]  # plain top-1 minus top-2 logit, per compared position
    plain_top_k: list[list[int]]
    batches: list[BatchSizeReport]
    timings: dict = field(default_factory=dict)
    localization: Localization | None = None

    # --- summaries -------------------------------------------------------------------------

    @property
    def batch_sizes(self) -> list[int]:
        return [b.batch_size for b in self.batches]

    @property
    def positions(self) -> range:
        """The compared positions."""
        return range(self.start, self.start + len(self.plain_argmax))

    @property
    def max_abs_diff(self) -> float:
        """Largest |Δlogit| over every batch size and position."""
        return max((b.max_abs_diff for b in self.batches), default=0.0)

    @property
    def flips(self) -> list[Flip]:
        """Argmax flips of every batch size, in batch-size order."""
        return [f for b in self.batches for f in b.flips]

    @property
    def first_divergence(self) -> int | None:
        """The first position where any batch size differs in any bit (None: all identical)."""
        firsts = [b.first_diff for b in self.batches if b.first_diff is not None]
        return min(firsts) if firsts else None

    @property
    def identical(self) -> bool:
        """True when every logit of every batch size equals the plain run's, bit for bit."""
        return all(not b.positions_differ for b in self.batches)

    def __getitem__(self, batch_size: int) -> BatchSizeReport:
        for b in self.batches:
            if b.batch_size == batch_size:
                return b
        raise KeyError(f"no batch size {batch_size} in this replay (have {self.batch_sizes})")

    def localize(self, model, batch_size: int | None = None, progress: bool = False) -> Localization | None:
        """Name the first op that differs at the first differing position (see :func:`localize`)."""
        return localize(model, self, batch_size=batch_size, progress=progress)

    # --- text ------------------------------------------------------------------------------

    def __str__(self) -> str:
        n = len(self.plain_argmax)
        lines = [
            f"replay of {self.model} on {self.backend}, order {self.order}: "
            f"{n} positions ({self.start}..{self.start + n - 1})"
            + (f" after a {self.start}-token prefix" if self.start else ""),
            f"{'batch':>5}  {'max|Δlogit|':>11}  {'positions≠':>12}  {'fraction':>8}  {'flips':>5}  "
            f"{'first≠':>6}  {'min gap at flip':>15}",
        ]
        for b in self.batches:
            gap = min((f.plain_gap for f in b.flips), default=None)
            lines.append(
                f"{b.batch_size:>5}  {_num(b.max_abs_diff):>11}  "
                f"{f'{len(b.positions_differ)}/{n}':>12}  {b.fraction_differ:>8.3f}  {len(b.flips):>5}  "
                f"{'-' if b.first_diff is None else b.first_diff:>6}  "
                f"{'-' if gap is None else _num(gap):>15}"
            )
        if self.identical:
            lines.append("every logit is bit-identical to the plain run")
        else:
            lines.append(f"first divergence at position {self.first_divergence}")
            shown = self.flips[:8]
            for f in shown:
                lines.append(f"  flip at {f.position}: plain {f.plain_token} -> batched {f.batched_token} "
                             f"(plain top-2 gap {_num(f.plain_gap)})")
            if len(self.flips) > len(shown):
                lines.append(f"  ... {len(self.flips) - len(shown)} more flips")
        if self.localization is not None:
            lines.append(str(self.localization))
        return "\n".join(lines)

    def histogram_table(self) -> str:
        """Counts of |Δlogit| per decade, one column per batch size."""
        labels = ["0"] + [f"{_num(lo)}..{_num(hi)}" if hi < 1e300 else f">={_num(lo)}"
                          for lo, hi in zip(DELTA_EDGES[:-1], DELTA_EDGES[1:])]
        rows = [f"{'|Δlogit|':>13}  " + "  ".join(f"{'b=' + str(b.batch_size):>10}" for b in self.batches)]
        for i, label in enumerate(labels):
            counts = [b.n_zero if i == 0 else b.delta_hist[i - 1] for b in self.batches]
            if i and not any(counts):
                continue
            rows.append(f"{label:>13}  " + "  ".join(f"{c:>10}" for c in counts))
        return "\n".join(rows)

    # --- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ReplayReport":
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise HiraishinError(f"replay report has unknown keys {sorted(unknown)}")
        d["batches"] = [BatchSizeReport.from_dict(b) for b in d["batches"]]
        if d.get("localization") is not None:
            d["localization"] = Localization(**d["localization"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    def save(self, path) -> Path:
        """Write the report as JSON."""
        path = Path(path)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path) -> "ReplayReport":
        """Read a report written by :meth:`save`."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise HiraishinError(f"{path}: not a replay report JSON ({e})") from e
        return cls.from_dict(data)

    # --- plot ------------------------------------------------------------------------------

    def plot(self, ax=None, title: str | None = None):
        """Max |Δlogit| by position, one line per batch size, argmax flips marked. Returns the Figure."""
        if ax is None:
            from matplotlib.figure import Figure

            fig = Figure(figsize=(9, 4), layout="constrained")
            ax = fig.add_subplot()
        else:
            fig = ax.figure
        x = np.asarray(self.positions)
        for b in self.batches:
            y = np.asarray(b.diff_by_position)
            (line,) = ax.plot(x, y, drawstyle="steps-mid", lw=1.2, label=f"batch {b.batch_size}")
            if b.flips:
                fx = [f.position for f in b.flips]
                ax.plot(fx, y[np.asarray(fx) - self.start], "x", ms=9, mew=2, color=line.get_color())
        ax.plot([], [], "x", color="0.3", label="argmax flip")
        positive = [d for b in self.batches for d in b.diff_by_position if d > 0]
        ax.set_yscale("symlog", linthresh=min(positive) if positive else 1e-7)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("position")
        ax.set_ylabel("max |Δlogit| vs one-token passes")
        ax.set_title(title or f"{self.model} · {self.backend} · {self.order}")
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
        return fig


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


# --- localization ----------------------------------------------------------------------------

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

    Picks the batch size whose first difference comes earliest (or ``batch_size``),
    replays the shared prefix, then compares every recorded tensor's row for that
    position between the one-token pass and the batched pass that holds it, in
    record order. The first op that differs in any bit is named (and stored in
    ``report.localization``). Returns None when the replay found no difference.
    """
    from ..order import ReductionOrder
    from .replay import _progress, feed, pass_spans

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
    with _progress(p - start + 1, "localize", progress) as bar:
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
