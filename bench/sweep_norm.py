"""Sweep the launch geometry of the fused norm kernels, which changes no bit: real threads per CUDA
block (playing rmsnorm's tree of ``block_threads(n)`` threads) and q8_1 blocks per warp (hence CUDA
blocks per row). Per variant, graph-replayed passes of both models (``bench/replay_widths.py``),
their logits digests checked against the first variant's.

    python3 bench/sweep_norm.py MODEL.gguf [...] [--variants 1024:1,256:1,128:1] [--orders invariant]
        [--widths 1,3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_widths  # noqa: E402

from hiraishin.atomic import atomic_write  # noqa: E402
from hiraishin.benchmark import git_commit, parse_widths  # noqa: E402
from hiraishin.kernels.fused import launch as fused_launch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--variants", default="1024:1,512:1,256:1,128:1,128:2,256:2,128:4",
                    help="threads:q8_1 blocks per warp, the first the reference of the bits")
    ap.add_argument("--orders", default="invariant")
    ap.add_argument("--widths", default="1,3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    widths = parse_widths(args.widths)
    saved = fused_launch.NORM_BLOCK_THREADS, fused_launch.NORM_WARP_BLOCKS
    rows, ref = [], {}
    try:
        for v in args.variants.split(","):
            threads, warp_blocks = (int(p) for p in v.split(":"))
            fused_launch.NORM_BLOCK_THREADS, fused_launch.NORM_WARP_BLOCKS = threads, warp_blocks
            fused_launch._launches.clear()  # launch geometry is fixed when a launch is first built
            print(f"== norm kernels: {threads} threads per block, {warp_blocks} q8_1 blocks per warp", flush=True)
            for path in args.models:
                for r in replay_widths.measure(path, orders, widths, args.steps):
                    key = (r["model"], r["order"], r["width"])
                    ref.setdefault(key, r["logits_sha256"])
                    r.update(threads=threads, warp_blocks=warp_blocks, same_bits=ref[key] == r["logits_sha256"])
                    rows.append(r)
                    if not r["same_bits"]:
                        print(f"   BITS DIFFER from the first variant: {key}", flush=True)
    finally:
        fused_launch.NORM_BLOCK_THREADS, fused_launch.NORM_WARP_BLOCKS = saved
    if args.json:
        out = {"commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
        with atomic_write(args.json) as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
