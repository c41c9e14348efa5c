"""Divergence reports: what a replay found, as a table, as JSON, as a plot; and where it starts.

A :class:`ReplayReport` holds one :class:`BatchSizeReport` per batch size of a
replay (:func:`hiraishin.decode.replay.replay`): the largest |Δlogit|, which
positions differ at all, where the argmax flips (with the plain top-2 gap
there, the margin the flip had to overcome) and histograms of both. This module
holds data and formatting only; the localizer, which reruns the model, is
:func:`hiraishin.decode.localize.localize`.

Positions, everywhere (replay, speculative, the demo): **position p** is the p-th
token of the whole sequence, counting from 0 at the first prompt token; "the
logits at position p" are the ones computed for that token, and their argmax is
the token at position p + 1. A flip at position p and a speculative run whose
first wrong token sits at p + 1 name the same event with the same number.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ..atomic import atomic_write
from ..errors import HiraishinError

__all__ = [
    "ReplayReport",
    "BatchSizeReport",
    "Flip",
    "Localization",
    "top_two",
    "json_ready",
    "dump_json",
    "SCHEMA_VERSION",
    "POSITION_NOTE",
    "DELTA_EDGES",
    "GAP_EDGES",
]

# Histogram bin edges for nonzero |Δlogit| (exact zeros are counted apart). The
# smallest nonzero difference of two float32 logits near 1 is one ulp, 1.2e-7;
# the top edge is a finite stand-in for infinity so that JSON stays standard.
DELTA_EDGES = (0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e308)
# Bin edges for the plain top-2 logit gap at argmax flips.
GAP_EDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e308)

# Version of the JSON every command and report writes; bump it when a key changes meaning.
SCHEMA_VERSION = 1
# Written beside positions in JSON and printed under tables (see the module docstring).
POSITION_NOTE = ("position p: the p-th token of the sequence, 0 = the first prompt token; the logits at p "
                 "choose the token at p + 1")
# What JSON gets in place of NaN and infinities (standard JSON has neither).
NON_FINITE_NOTE = ("non-finite numbers (NaN, inf) are written as null; they are the model's own results "
                   "(its logits, or numbers computed from them), listed under 'paths'")


def json_ready(obj, path: str = "$", found: list | None = None):
    """``obj`` with numpy values as Python ones and non-finite floats as None.

    Returns ``(clean, paths)``: ``paths`` lists where a non-finite number was, as
    ``"$.batches[0].max_abs_diff = nan"``.
    """
    found = [] if found is None else found
    if isinstance(obj, dict):
        return {str(k): json_ready(v, f"{path}.{k}", found)[0] for k, v in obj.items()}, found
    if isinstance(obj, (list, tuple)):
        return [json_ready(v, f"{path}[{i}]", found)[0] for i, v in enumerate(obj)], found
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist(), path, found)
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item(), found
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if not math.isfinite(x):
            found.append(f"{path} = {x}")
            return None, found
        return x, found
    return obj, found


def dump_json(data: dict, path) -> Path:
    """Write ``data`` as standard JSON to ``path``, atomically (see :mod:`hiraishin.atomic`).

    Non-finite numbers become null, and ``data["meta"]["non_finite"]`` says where they were.
    """
    clean, paths = json_ready(data)
    if paths:
        meta = clean.setdefault("meta", {}) if isinstance(clean, dict) else {}
        meta["non_finite"] = {"note": NON_FINITE_NOTE, "paths": paths[:100], "count": len(paths)}
    path = Path(path)
    with atomic_write(path) as f:
        json.dump(clean, f, indent=1, allow_nan=False)
    return path


def _finite_or_nan(x) -> float:
    return float("nan") if x is None else float(x)


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
        # null in JSON stands for a non-finite difference (see dump_json)
        d["max_abs_diff"] = _finite_or_nan(d["max_abs_diff"])
        d["diff_by_position"] = [_finite_or_nan(x) for x in d["diff_by_position"]]
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
    n_prompt: int | None = None  # tokens given (the rest were decoded greedily in the plain run)
    meta: dict = field(default_factory=dict)  # what the command line records (schema, file hash, date)

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

    def flips_by_position(self) -> list[tuple[int, list[int], list[Flip]]]:
        """``(position, batch sizes, flips)`` for every position that flips at any batch size."""
        by_pos: dict[int, list[tuple[int, Flip]]] = {}
        for b in self.batches:
            for f in b.flips:
                by_pos.setdefault(f.position, []).append((b.batch_size, f))
        return [(p, [b for b, _ in v], [f for _, f in v]) for p, v in sorted(by_pos.items())]

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
            grouped = self.flips_by_position()
            shown = grouped[:8]
            for p, sizes, flips in shown:
                f = flips[0]
                to = sorted({g.batched_token for g in flips})
                lines.append(f"  flip at position {p} (batch {', '.join(map(str, sizes))}): plain {f.plain_token}"
                             f" -> batched {', '.join(map(str, to))} (plain top-2 gap {_num(f.plain_gap)})")
            if len(grouped) > len(shown):
                lines.append(f"  ... {len(grouped) - len(shown)} more positions flip")
            lines.append(f"  ({POSITION_NOTE})")
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
        d["plain_gap"] = [_finite_or_nan(x) for x in d["plain_gap"]]
        if d.get("localization") is not None:
            d["localization"] = Localization(**d["localization"])
        return cls(**d)

    def to_json(self) -> str:
        """Standard JSON (non-finite numbers as null, noted under ``meta.non_finite``)."""
        clean, paths = json_ready(self.to_dict())
        if paths:
            clean["meta"]["non_finite"] = {"note": NON_FINITE_NOTE, "paths": paths[:100], "count": len(paths)}
        return json.dumps(clean, indent=1, allow_nan=False)

    def save(self, path) -> Path:
        """Write the report as JSON, atomically."""
        return dump_json(self.to_dict(), path)

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

    def plot(self, fig=None, title: str | None = None, ax=None):
        """One panel per batch size of max |Δlogit| by position; see :func:`hiraishin.decode.plot.plot_replay`."""
        from .plot import plot_replay

        return plot_replay(self, fig=fig, title=title, ax=ax)


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"
