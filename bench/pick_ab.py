"""Pick the value of an A/B (final_session.sh's ab step) that the rest of a GPU call runs under.

    python3 bench/pick_ab.py OUT VAR BASE CANDIDATE [--model 8b] [--widths 9,12,16] [--gain 0.01]

Reads ``OUT/replay-VAR-<value>.json`` of both values and prints CANDIDATE when its replays of ``--model`` at
``--widths`` took at least ``--gain`` less time in total than BASE's with the same logits digests at every
width (a change that must keep every bit), else BASE; the comparison goes to stderr. A rule fixed before the
run, so that one call can measure a change and then benchmark whichever setting won.
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
    ta, tb = sum(r["replay_ms"] for r in a.values()), sum(r["replay_ms"] for r in b.values())
    return tb <= ta * (1 - gain), f"{ta:.3f} -> {tb:.3f} ms over {len(a)} replays"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("var")
    ap.add_argument("base")
    ap.add_argument("candidate")
    ap.add_argument("--model", default="8b")
    ap.add_argument("--widths", default="9,12,16")
    ap.add_argument("--gain", type=float, default=0.01)
    args = ap.parse_args(argv)

    def rows(value):
        with open(f"{args.out}/replay-{args.var}-{value.replace('/', '_')}.json") as f:
            return json.load(f)["rows"]

    try:
        wins, why = pick(rows(args.base), rows(args.candidate), args.model,
                         {int(w) for w in args.widths.split(",")}, args.gain)
    except (OSError, KeyError, ValueError) as exc:
        wins, why = False, f"cannot compare: {exc}"
    print(f"{args.var}: {args.candidate if wins else args.base} ({why})", file=sys.stderr)
    print(args.candidate if wins else args.base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
