"""Markdown rows of an A/B folder (final_session.sh's ab step), for a results README.

    python3 bench/ab_table.py FOLDER [FOLDER ...] [--label a]

Reads each FOLDER's ``replay-VAR-<value>.json`` (one file per value of a switch, in the order of
``AB_VALUES``, which the files' dates keep; the abmany step leaves several switches in one folder) and prints one
table row per switch and order: the switch and its values,
the order and its widths, then per model the replay times in ms of every width, values joined by "→" and widths
by " / ". A row whose logits digests differ between values at some width says so in its switch cell: the
results README's tables claim "the same logits digests in every row", so such a row must not go in them
unmarked. The models are the 8B and 0.6B synthetic shapes, in that column order.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

MODELS = ("qwen3-8b.gguf", "qwen3-0.6b.gguf")
ORDER_NAMES = {"subblock": "SUBBLOCK", "invariant": "BATCH_INVARIANT", "variant": "BATCH_VARIANT",
               "fixed_split": "FIXED_SPLIT", "invariant16": "BATCH_INVARIANT_16"}


def _runs(folder: Path) -> dict[str, list[tuple[str, list]]]:
    """Per switch of ``folder`` (one, or several from the abmany step), ``[(value, rows)]`` in the order the values
    ran."""
    files = sorted(folder.glob("replay-*.json"))
    if not files:
        raise SystemExit(f"{folder}: no replay-VAR-<value>.json files (not an ab step's folder?)")
    runs: dict[str, list] = {}
    for f in files:
        m = re.fullmatch(r"replay-(HIRAISHIN_[A-Z0-9_]+?)-([^-].*)\.json", f.name)
        if m is None:
            raise SystemExit(f"{f}: not named replay-HIRAISHIN_<VAR>-<value>.json")
        data = json.loads(f.read_text())
        runs.setdefault(m.group(1), []).append((data.get("date", ""), m.group(2), data["rows"]))
    # the order AB_VALUES ran them in (a stable sort: files of the same second keep their names' order)
    return {var: [(v, rows) for _, v, rows in sorted(rs, key=lambda r: r[0])] for var, rs in runs.items()}


def _rows_of_switch(var: str, runs: list, label: str) -> list[str]:
    values = [v for v, _ in runs]
    keyed = [{(r["model"], r["order"], r["width"]): r for r in rows} for _, rows in runs]
    out = []
    for order in sorted({k[1] for k in keyed[0]}):
        widths = sorted({k[2] for k in keyed[0] if k[1] == order})
        cells, same = [], True
        for model in MODELS:
            per_width = []
            for w in widths:
                rs = [kd.get((model, order, w)) for kd in keyed]
                if any(r is None for r in rs):
                    per_width.append("–")
                    continue
                same &= len({r["logits_sha256"] for r in rs}) == 1
                per_width.append(" → ".join(f"{r['replay_ms']:.3f}" for r in rs))
            cells.append(" / ".join(per_width))
        head = f"`{var}` {' → '.join(values)}" + (f" ({label})" if label else "")
        if not same:
            head += " **(digests differ)**"
        wtext = " / ".join(map(str, widths))
        out.append(f"| {head} | {ORDER_NAMES.get(order, order)}, {wtext} token{'s' if widths != [1] else ''} | "
                   + " | ".join(cells) + " |")
    return out


def rows_of(folder: Path, label: str = "") -> list[str]:
    """The Markdown rows of one A/B folder (see the module docstring), switch by switch in name order."""
    return [row for var, runs in sorted(_runs(folder).items()) for row in _rows_of_switch(var, runs, label)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--label", action="append", default=[],
                    help="a label for each folder in turn (e.g. its letter in the results README)")
    args = ap.parse_args(argv)
    for i, folder in enumerate(args.folders):
        for row in rows_of(folder, args.label[i] if i < len(args.label) else ""):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
