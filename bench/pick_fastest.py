"""Which value of an A/B (``final_session.sh`` step ``ab``) made the chosen passes fastest, all digests equal.

    python3 bench/pick_fastest.py OUT VAR "V1 V2 ..." MODEL:ORDER:WIDTH [MODEL:ORDER:WIDTH ...]

Reads ``OUT/replay-VAR-V.json`` of every value; scores a value by the sum over the named passes of its
replay time relative to the first value's; prints the value with the lowest score (the first value
when any logits digest differs from the first value's, or a pass is missing). Diagnostics go to stderr.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    out, var, values, passes = argv[0], argv[1], argv[2].split(), argv[3:]
    runs = {}
    for v in values:
        rows = json.load(open(f"{out}/replay-{var}-{v.replace('/', '_')}.json"))["rows"]
        runs[v] = {(r["model"], r["order"], str(r["width"])): r for r in rows}
    base = runs[values[0]]
    keys = [tuple(p.split(":")) for p in passes]
    scores = {}
    for v in values:
        try:
            if any(runs[v][k]["logits_sha256"] != base[k]["logits_sha256"] for k in base):
                print(f"{var}={v}: digests differ", file=sys.stderr)
                continue
            scores[v] = sum(runs[v][k]["replay_ms"] / base[k]["replay_ms"] for k in keys)
        except KeyError as e:
            print(f"{var}={v}: no pass {e}", file=sys.stderr)
    for v, s in scores.items():
        print(f"{var}={v}: score {s:.4f}", file=sys.stderr)
    print(min(scores, key=scores.get) if scores else values[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
