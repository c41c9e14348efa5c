"""Pick the value of an A/B (final_session.sh's ab step) that the rest of a GPU call runs under.

    python3 bench/pick_ab.py OUT VAR BASE CANDIDATE [--model 8b] [--widths 9,12,16] [--gain 0.01] [--threshold]
    python3 bench/pick_ab.py OUT VAR BASE CANDIDATE [CANDIDATE ...] --passes MODEL:ORDER:WIDTH,... [--gain 0.01]

Reads ``OUT/replay-VAR-<value>.json`` of both values (``/`` in a value as ``_``, ``:`` as ``-``, as
final_session.sh names them) and prints CANDIDATE when its replays of ``--model`` at
``--widths`` took at least ``--gain`` less time in total than BASE's with the same logits digests at every
width (a change that must keep every bit; logits that are not all finite compare nothing), else BASE; the
comparison goes to stderr. A rule fixed before the run, so that one call can measure a change and then
benchmark whichever setting won.

``--threshold``: VAR is the fewest columns a change applies to (BASE: where it applies now, CANDIDATE: lower,
measured at the widths between); prints the smallest measured width from which on every measured width is at
least ``--gain`` faster with the same digests, else BASE.

``--passes MODEL:ORDER:WIDTH,...`` (several CANDIDATEs allowed): scores each value by the sum over the named
passes of its replay time relative to BASE's (so a small model's pass counts as much as a large one's) and
prints the lowest-scoring candidate that is at least ``--gain`` below BASE's score with every digest of
BASE's rows equal and finite logits, else BASE.
"""

from __future__ import annotations

import argparse
import json
import sys


def _keyed(rows: list, keep=lambda r: True) -> dict:
    return {(r["model"], r["order"], r["width"]): r for r in rows if keep(r)}


def _incomparable(a: dict, b: dict) -> str | None:
    """Why two keyed row sets cannot be compared (None: they can): other passes, other bits, or bits that
    compare nothing."""
    if not a or a.keys() != b.keys():
        return f"rows differ or none match ({sorted(a)} vs {sorted(b)})"
    if any(a[k]["logits_sha256"] != b[k]["logits_sha256"] for k in a):
        return "logits digests differ"
    if not all(r.get("logits_finite", True) for r in (*a.values(), *b.values())):
        return "non-finite logits: equal digests compare nothing"
    return None


def pick(rows_base: list, rows_cand: list, model: str, widths: set, gain: float) -> tuple[bool, str]:
    """(candidate wins, why) for two replay_widths.py row lists."""
    def keep(r):
        return model in r["model"] and r["width"] in widths

    a, b = _keyed(rows_base, keep), _keyed(rows_cand, keep)
    why = _incomparable(a, b)
    if why:
        return False, why
    ta, tb = sum(r["replay_ms"] for r in a.values()), sum(r["replay_ms"] for r in b.values())
    return tb <= ta * (1 - gain), f"{ta:.3f} -> {tb:.3f} ms over {len(a)} replays"


def pick_fastest(rows_base: list, candidates: dict, passes: list, gain: float) -> tuple[str | None, str]:
    """(the candidate, of ``{value: rows}``, whose ``passes`` ((model, order, width), ...) took the least time
    relative to the base's, at least ``gain`` below the base's score, with every digest of the base equal; or
    None; why). A candidate that lacks a pass or a base row cannot win."""
    base = _keyed(rows_base)
    scores, notes = {}, []
    for value, rows in candidates.items():
        cand = _keyed(rows)
        why = _incomparable(base, {k: cand[k] for k in base if k in cand})
        if why or any(p not in base for p in passes):
            notes.append(f"{value}: {why or 'a named pass is missing'}")
            continue
        scores[value] = sum(cand[p]["replay_ms"] / base[p]["replay_ms"] for p in passes)
        notes.append(f"{value}: score {scores[value]:.4f} (base {len(passes)})")
    best = min(scores, key=scores.get) if scores else None
    if best is None or scores[best] > len(passes) * (1 - gain):
        return None, "; ".join(notes)
    return best, "; ".join(notes)


def pick_threshold(rows_base: list, rows_cand: list, model: str, widths: set, gain: float) -> tuple[int | None, str]:
    """(the smallest width w of ``widths`` such that the candidate wins at every width >= w, or None; why)."""
    low = None
    for w in sorted(widths, reverse=True):
        wins, why = pick(rows_base, rows_cand, model, {w}, gain)
        if not wins:
            return low, f"stops at width {w}: {why}"
        low = w
    return low, "every width wins"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("var")
    ap.add_argument("base")
    ap.add_argument("candidate", nargs="+")
    ap.add_argument("--model", default="8b")
    ap.add_argument("--widths", default="9,12,16")
    ap.add_argument("--gain", type=float, default=0.01)
    ap.add_argument("--threshold", action="store_true", help="VAR is the fewest columns a change applies to")
    ap.add_argument("--passes", help="MODEL:ORDER:WIDTH,...: the fastest of several candidates on these passes")
    args = ap.parse_args(argv)

    def rows(value):
        with open(f"{args.out}/replay-{args.var}-{value.replace('/', '_').replace(':', '-')}.json") as f:
            return json.load(f)["rows"]

    widths = {int(w) for w in args.widths.split(",")}
    chosen = args.base
    if not args.passes and len(args.candidate) > 1:
        ap.error("several candidates need --passes")
    try:
        if args.passes:
            passes = [(m, o, int(w)) for m, o, w in (p.rsplit(":", 2) for p in args.passes.split(","))]
            best, why = pick_fastest(rows(args.base), {v: rows(v) for v in args.candidate}, passes, args.gain)
            chosen = args.base if best is None else best
        elif args.threshold:
            low, why = pick_threshold(rows(args.base), rows(args.candidate[0]), args.model, widths, args.gain)
            chosen = args.base if low is None else str(low)
        else:
            wins, why = pick(rows(args.base), rows(args.candidate[0]), args.model, widths, args.gain)
            chosen = args.candidate[0] if wins else args.base
    except (OSError, KeyError, ValueError) as exc:
        why = f"cannot compare: {exc}"
    print(f"{args.var}: {chosen} ({why})", file=sys.stderr)
    print(chosen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
