"""Pick the value of an A/B (final_session.sh's ab step) that the rest of a GPU call runs under.

    python3 bench/pick_ab.py OUT VAR BASE CANDIDATE [--model 8b] [--widths 9,12,16] [--gain 0.01] [--threshold]

Reads ``OUT/replay-VAR-<value>.json`` of both values and prints CANDIDATE when its replays of ``--model`` at
``--widths`` took at least ``--gain`` less time in total than BASE's with the same logits digests at every
width (a change that must keep every bit; logits that are not all finite compare nothing), else BASE; the
comparison goes to stderr. A rule fixed before the run, so that one call can measure a change and then
benchmark whichever setting won.

``--threshold``: VAR is the fewest columns a change applies to (BASE: where it applies now, CANDIDATE: lower,
measured at the widths between); prints the smallest measured width from which on every measured width is at
least ``--gain`` faster with the same digests, else BASE.
"""

from __future__ import annotations

import argparse
import json
import sys


def pick(rows_base: list, rows_cand: list, model: str, widths: set, gain: float) -> tuple[bool, str]:
    """(candidate wins, why) for two replay_widths.py row lists."""
    def chosen(rows):
        return {(r["model"], r["order"], r["width"]): r for r in rows if model in r["model"] and r["width"] in widths}

    a, b = chosen(rows_base), chosen(rows_cand)
    if not a or a.keys() != b.keys():
        return False, f"rows differ or none match ({sorted(a)} vs {sorted(b)})"
    if any(a[k]["logits_sha256"] != b[k]["logits_sha256"] for k in a):
        return False, "logits digests differ"
    if not all(r.get("logits_finite", True) for r in (*a.values(), *b.values())):
        return False, "non-finite logits: equal digests compare nothing"
    ta, tb = sum(r["replay_ms"] for r in a.values()), sum(r["replay_ms"] for r in b.values())
    return tb <= ta * (1 - gain), f"{ta:.3f} -> {tb:.3f} ms over {len(a)} replays"


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
    ap.add_argument("candidate")
    ap.add_argument("--model", default="8b")
    ap.add_argument("--widths", default="9,12,16")
    ap.add_argument("--gain", type=float, default=0.01)
    ap.add_argument("--threshold", action="store_true", help="VAR is the fewest columns a change applies to")
    args = ap.parse_args(argv)

    def rows(value):
        with open(f"{args.out}/replay-{args.var}-{value.replace('/', '_')}.json") as f:
            return json.load(f)["rows"]

    widths = {int(w) for w in args.widths.split(",")}
    chosen = args.base
    try:
        if args.threshold:
            low, why = pick_threshold(rows(args.base), rows(args.candidate), args.model, widths, args.gain)
            chosen = args.base if low is None else str(low)
        else:
            wins, why = pick(rows(args.base), rows(args.candidate), args.model, widths, args.gain)
            chosen = args.candidate if wins else args.base
    except (OSError, KeyError, ValueError) as exc:
        why = f"cannot compare: {exc}"
    print(f"{args.var}: {chosen} ({why})", file=sys.stderr)
    print(chosen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
