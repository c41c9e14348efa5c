"""Per-kernel GPU time of one decode step, for Nsight Compute: where a pass's time goes.

    ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --log-file OUT.csv \
        python bench/kernel_times.py MODEL.gguf [--order invariant] [--tokens 1]
    python bench/kernel_times.py --summarize OUT.csv [--json OUT.json]

The first form loads the model with CUDA graphs off (ncu times kernels one by one; a graph would
be one range), prefills a short prompt, runs two warm-up steps, then profiles exactly one
``--tokens``-wide eager pass between ``cudaProfilerStart``/``Stop``. ``--clock-control none``
leaves the card's clocks as they are (never lock them on a lent GPU); ``--cache-control none``
keeps L2 as a real decode step finds it. The second form groups the CSV by kernel name: launches,
total and mean microseconds, share of the pass; it also prints the sum, which a graph replay
(``hiraishin bench``) exceeds by the gaps between nodes.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path


def profile(model_path: str, order_name: str, tokens: int) -> None:
    import cupy as cp
    import numpy as np

    from hiraishin import Qwen3
    from hiraishin.commands.common import parse_order

    order = parse_order(order_name)
    model = Qwen3.from_gguf(model_path, device="cuda", n_ctx=512, progress=False, cuda_graphs=False)
    prompt = np.arange(16, dtype=np.int32) + 100
    model.use_weight_layout_for(order)  # (SUBBLOCK: the Q4_K projections as tiles)
    model.forward(prompt, 0, order=order)
    pos = len(prompt)
    for _ in range(2):  # compile and warm every kernel of the pass
        model.forward(np.full(tokens, 7, np.int32), pos, order=order)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    model.forward(np.full(tokens, 7, np.int32), pos, order=order)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()


def summarize(csv_path: str, json_path: str | None) -> dict:
    rows = []
    with open(csv_path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prefixes its CSV with ==PROF== lines
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        value = float(row["Metric Value"].replace(",", ""))
        us = value / 1000.0 if unit.startswith("n") else value if unit.startswith("u") else value * 1000.0
        rows.append((row["Kernel Name"].split("(")[0], row.get("Grid Size", ""), us))
    by = defaultdict(lambda: [0, 0.0])
    for name, _, us in rows:
        by[name][0] += 1
        by[name][1] += us
    total = sum(us for _, _, us in rows)
    table = sorted(({"kernel": k, "launches": n, "total_us": round(t, 2), "mean_us": round(t / n, 3),
                     "share": round(t / total, 4) if total else 0.0} for k, (n, t) in by.items()),
                   key=lambda r: -r["total_us"])
    by_grid = defaultdict(lambda: [0, 0.0])  # one mat-vec name covers every shape: the grid tells them apart
    for name, grid, us in rows:
        by_grid[(name, grid)][0] += 1
        by_grid[(name, grid)][1] += us
    grids = sorted(({"kernel": k, "grid": g, "launches": n, "total_us": round(t, 2), "mean_us": round(t / n, 3)}
                    for (k, g), (n, t) in by_grid.items()), key=lambda r: -r["total_us"])
    out = {"csv": Path(csv_path).name, "kernels": len(rows), "sum_us": round(total, 2), "by_kernel": table,
           "by_kernel_and_grid": grids, "launches": [{"kernel": k, "grid": g, "us": round(us, 3)} for k, g, us in rows]}
    print(f"{len(rows)} kernels, sum {total:.1f} us")
    for r in table:
        print(f"  {r['kernel']:<28} {r['launches']:>5} x {r['mean_us']:>8.3f} us = {r['total_us']:>9.1f} us "
              f"({100 * r['share']:.1f}%)")
    print("by kernel and grid:")
    for r in grids[:24]:
        print(f"  {r['kernel']:<28} {r['grid']:<16} {r['launches']:>5} x {r['mean_us']:>8.3f} us = {r['total_us']:>9.1f} us")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--order", default="invariant")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--summarize", metavar="CSV")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.summarize:
        summarize(a.summarize, a.json)
        return 0
    if not a.model:
        ap.error("give MODEL.gguf (or --summarize CSV)")
    profile(a.model, a.order, a.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
